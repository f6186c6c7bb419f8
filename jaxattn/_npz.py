"""Reading NumPy files (`.npz` archives, `.npy` arrays) that jaxattn wrote or a user brings.

Nothing is ever unpickled (`allow_pickle=False` throughout). A file that is neither a zip
archive nor a `.npy` array, such as a damaged or truncated download or a text file under
the wrong name, is refused from its first bytes with a message that says so: NumPy itself
would read such bytes as a pickle and answer that the file "contains pickled (object)
data", suggesting `allow_pickle=True`, which is the wrong advice for a damaged file.
"""

import hashlib
import io
import os
import re

import numpy as np

ZIP_MAGIC = b"PK\x03\x04"  # a zip archive's first local file header (`.npz`)
EMPTY_ZIP_MAGIC = b"PK\x05\x06"  # an archive with no member (`np.savez` of nothing)
NPY_MAGIC = b"\x93NUMPY"  # the `.npy` format's magic string


class NotNumpyFile(ValueError):
    """A file whose first bytes are those of no `.npz` archive (or `.npy` array)."""


class MissingArray(KeyError, ValueError):
    """An array a reader needs is not in the archive (an empty or foreign `.npz`).

    A `KeyError` (it is a missing key) and a `ValueError` (the file is wrong, not the
    caller), whose text names the array: a bare `KeyError` would print only `'name'`.
    """

    def __str__(self) -> str:
        return f"the archive holds no array {self.args[0]!r}"


class NpzArrays(dict):
    """The arrays of an `.npz` archive by name (a `dict`); looking up an array it does not
    hold raises `MissingArray`."""

    def __missing__(self, key):
        raise MissingArray(key)

    def pop(self, key, *default):
        if key not in self and not default:
            raise MissingArray(key)
        return super().pop(key, *default)


_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def recorded_sha256(meta: dict, where: str, key: str = "npz_sha256") -> str | None:
    """The SHA-256 an archive's summary `meta` (read from the file `where`) records under
    `key`, or None for a summary written before hashes were recorded (no such key). A key
    that is present must hold a hash as `hashlib` writes it.

    **Raises:** `ValueError` when the recorded value is not 64 lower-case hex digits (the
    summary was edited or is damaged).
    """
    if key not in meta:
        return None
    recorded = meta[key]
    if not isinstance(recorded, str) or not _SHA256_HEX.fullmatch(recorded):
        shown = repr(recorded)
        raise ValueError(
            f"{where} records {key} = {shown if len(shown) <= 80 else shown[:76] + ' ...'}, "
            "not a SHA-256 (64 lower-case hex digits): the summary was edited or is damaged"
        )
    return recorded


def check_sha256(data: bytes, recorded: str | None, where: str) -> None:
    """Check the bytes `data` of an archive against `recorded`, the SHA-256 its summary
    `where` records (`recorded_sha256`; None, for a summary without one, is not checked).

    **Raises:** `ValueError` when the archive's SHA-256 differs from the recorded one (the
    archive was altered after it was written).
    """
    if recorded is not None and hashlib.sha256(data).hexdigest() != recorded:
        raise ValueError(
            f"its SHA-256 differs from the one recorded in {where}: it was altered after "
            "it was written"
        )


def check_recorded_sha256(meta: dict, data: bytes, where: str) -> None:
    """`check_sha256` against the SHA-256 recorded in the summary `meta` read from `where`.

    **Raises:** `ValueError` as `recorded_sha256` and `check_sha256`.
    """
    check_sha256(data, recorded_sha256(meta, where), where)


def read_error_reason(err: BaseException) -> str:
    """One line on why reading untrusted bytes failed, for an error message: this module's
    own words for a file that is no NumPy file, else the exception's type and text (json,
    zipfile, zlib and NumPy raise a dozen unrelated types on a truncated or corrupt file),
    whitespace folded and cut at 300 characters."""
    if isinstance(err, NotNumpyFile):
        return str(err)
    if isinstance(err, ValueError) and "allow_pickle=False" in str(err):
        # NumPy's text for an object array inside a file: true, but it reads as advice to
        # unpickle, which jaxattn never does with a file it did not write.
        return "an array of Python objects, which is never unpickled (allow_pickle=False)"
    return " ".join(f"{type(err).__name__}: {err}".split())[:300]


def check_numpy_bytes(head: bytes, *, npy: bool = False) -> None:
    """Raise unless `head` (a file's first bytes, at least 6 of them when there are) starts
    a `.npz` archive, or with `npy=True` also a `.npy` array.

    **Raises:** `NotNumpyFile` (a `ValueError`) naming what the bytes are not (the caller
    prefixes the file).
    """
    if head.startswith((ZIP_MAGIC, EMPTY_ZIP_MAGIC)) or (npy and head.startswith(NPY_MAGIC)):
        return
    kinds = "a NumPy .npz archive or .npy array" if npy else "a NumPy .npz archive"
    if not head:
        raise NotNumpyFile(f"the file is empty, not {kinds}")
    magic = f"an .npz is a zip archive, beginning with {ZIP_MAGIC!r}"
    if npy:
        magic += f"; an .npy begins with {NPY_MAGIC!r}"
    raise NotNumpyFile(
        f"not {kinds}: it begins with {head[:8]!r} ({magic}); the file is damaged or of "
        "another kind"
    )


def load_npz_bytes(data: bytes) -> NpzArrays:
    """Every array of the `.npz` archive held in `data`, read (zip CRCs checked), as an
    `NpzArrays` (a `dict` whose missing names raise `MissingArray`).

    **Raises:** `ValueError` when `data` is not an `.npz` archive (`check_numpy_bytes`) or
    one of its members is not a `.npy` array (NumPy would hand back its raw bytes), and
    NumPy's or `zipfile`'s errors for an archive damaged inside.
    """
    check_numpy_bytes(data[:8])
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        arrays = NpzArrays((k, z[k]) for k in z.files)
    for k, v in arrays.items():
        if not isinstance(v, np.ndarray):
            raise ValueError(f"its member {k!r} is not a NumPy array (the archive is foreign)")
    return arrays


def load_npz(path: str | os.PathLike) -> NpzArrays:
    """Every array of the `.npz` archive at `path` (read whole, then closed).

    **Raises:** `OSError` when it cannot be opened, the errors of `load_npz_bytes` else.
    """
    with open(path, "rb") as f:
        data = f.read()
    return load_npz_bytes(data)


def load_numpy_file(path: str | os.PathLike) -> np.ndarray | NpzArrays:
    """The array of a `.npy` file or the arrays of an `.npz` archive at `path`, told by
    content (not by the file's name).

    **Raises:** as `load_npz`, naming both formats.
    """
    with open(path, "rb") as f:
        data = f.read()
    check_numpy_bytes(data[:8], npy=True)
    if data.startswith(NPY_MAGIC):
        return np.load(io.BytesIO(data), allow_pickle=False)
    return load_npz_bytes(data)
