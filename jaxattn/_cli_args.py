"""Arguments shared by the `jaxattn` commands: a `--seed` that JAX's PRNG takes and an
output folder that can be one, both checked before any work."""

import argparse
import tempfile
from pathlib import Path

SEED_RANGE = (0, 2**32 - 1)
"""Seeds of the `jaxattn` commands: those that give distinct PRNG keys whether or not JAX
runs with 64-bit integers (without them `jax.random.key` keeps the low 32 bits, so seeds
0, 2**32 and -2**63 are one key; beyond 64 bits it raises `OverflowError`), and the range
of a sweep's member seeds."""


def seed(text: str) -> int:
    """argparse type of a `--seed`: an integer in `SEED_RANGE`."""
    value = int(text)  # argparse words a ValueError as "invalid seed value"
    lo, hi = SEED_RANGE
    if not lo <= value <= hi:
        raise argparse.ArgumentTypeError(
            f"{text} is outside [0, 2**32 - 1], the seeds that give distinct keys"
        )
    return value


def check_out_folder(flag: str, path: str) -> None:
    """Refuse an output folder that cannot be one, before any work: an empty or blank name
    (it would write into the current folder, or make a folder named by spaces), an
    existing file, a link to nothing, a path below a file, or a folder (or, for a new one,
    the nearest existing folder above it) in which nothing can be written.

    **Raises:** `ValueError` naming `flag` and the path."""
    if not path.strip():
        raise ValueError(f"{flag} is {'empty' if not path else 'blank'}; give a folder.")
    where = Path(path)
    if where.is_symlink() and not where.exists():
        raise ValueError(f"{flag} {path!r} is a link to nothing; give a folder.")
    if where.exists() and not where.is_dir():
        raise ValueError(f"{flag} {path!r} is a file; give a folder.")
    existing = where
    while not existing.exists():
        existing = existing.parent  # Path(".") exists, so this ends
    if not existing.is_dir():
        raise ValueError(f"{flag} {path!r} lies below {str(existing)!r}, a file.")
    try:  # the one sure test that the results can be written there
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        raise ValueError(
            f"{flag} {path!r}: nothing can be written in {str(existing)!r} ({err.strerror})."
        ) from None
