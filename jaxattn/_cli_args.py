"""Arguments shared by the `jaxattn` commands: a `--seed` that JAX's PRNG takes and an
output folder that can be one, both checked before any work."""

import argparse
from pathlib import Path

SEED_RANGE = (-(2**63), 2**63 - 1)
"""Seeds `jax.random.key` accepts (a 64-bit signed integer)."""


def seed(text: str) -> int:
    """argparse type of a `--seed`: an integer in `SEED_RANGE` (a larger one ends in an
    `OverflowError` deep inside `jax.random`)."""
    value = int(text)  # argparse words a ValueError as "invalid seed value"
    lo, hi = SEED_RANGE
    if not lo <= value <= hi:
        raise argparse.ArgumentTypeError(f"{text} is outside the 64-bit integers a seed can be")
    return value


def check_out_folder(flag: str, path: str) -> None:
    """Refuse an output folder that cannot be one, before any work: an empty name (it
    would write into the current folder), an existing file, or a path below a file.

    **Raises:** `ValueError` naming `flag` and the path."""
    if not path:
        raise ValueError(f"{flag} is empty; give a folder.")
    where = Path(path)
    if where.exists() and not where.is_dir():
        raise ValueError(f"{flag} {path!r} is a file; give a folder.")
    for above in where.parents:
        if above.exists():
            if not above.is_dir():
                raise ValueError(f"{flag} {path!r} lies below {str(above)!r}, a file.")
            break
