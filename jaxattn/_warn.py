"""Warnings that point at the line of the user's code that caused them."""

import os
import sys
import warnings

import equinox
import jax

# Frames in these folders are the package's own or the libraries it calls through (an
# equinox module's `__init__` runs inside equinox's metaclass, a traced function inside
# jax): a warning skips them to reach the caller's line.
_INSIDE = tuple(
    os.path.dirname(os.path.abspath(f)) + os.sep for f in (__file__, equinox.__file__, jax.__file__)
)


def warn_at_caller(message: str, category: type[Warning] = UserWarning) -> None:
    """`warnings.warn(message, category)` attributed to the innermost frame outside jaxattn,
    equinox and jax: the user's line, however many of the package's own calls (a subclass's
    `__init__`, equinox's module machinery, a sweep's layers) lie between. A fixed
    `stacklevel` points into one of those when the call path changes."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_INSIDE):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level + 1)  # + 1: this function's frame
