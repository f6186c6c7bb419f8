"""Progress bars that suit where they are shown: a terminal, a notebook or a log file."""

import sys

# How often a bar is redrawn when its stream is not a terminal (a log file, a pipe, CI):
# each redraw there is another copy of the bar in the file, not an update in place.
LOG_INTERVAL = 30.0


def progress_bar(**kwargs):
    """A `tqdm` bar (`tqdm.auto`: a widget in a notebook, text elsewhere) with `kwargs`.

    Written to a stream that is not a terminal (the default stream is `sys.stderr`), a text
    bar is redrawn at most every `LOG_INTERVAL` seconds (`mininterval`, unless given): tqdm
    redraws ten times a second, and in a log each redraw is one more copy of the bar
    (`maxinterval` follows, so that tqdm's monitor thread does not redraw it sooner).
    Callers set postfixes with `refresh=False`: tqdm redraws on every `set_postfix` else.
    """
    from tqdm.auto import tqdm
    from tqdm.autonotebook import tqdm as base

    stream = kwargs.setdefault("file", sys.stderr)
    isatty = getattr(stream, "isatty", None)
    in_terminal = bool(isatty()) if callable(isatty) else False
    if base.__module__ != "tqdm.notebook" and not in_terminal:
        kwargs.setdefault("mininterval", LOG_INTERVAL)
        kwargs.setdefault("maxinterval", max(LOG_INTERVAL, kwargs["mininterval"]))
    return tqdm(**kwargs)
