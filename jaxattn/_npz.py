"""Reading NumPy files (`.npz` archives, `.npy` arrays) that jaxattn wrote or a user brings.

Nothing is ever unpickled (`allow_pickle=False` throughout). A file that is neither a zip
archive nor a `.npy` array, such as a damaged or truncated download or a text file under
the wrong name, is refused from its first bytes with a message that says so: NumPy itself
would read such bytes as a pickle and answer that the file "contains pickled (object)
data", suggesting `allow_pickle=True`, which is the wrong advice for a damaged file.
"""

import io
import os

import numpy as np

ZIP_MAGIC = b"PK\x03\x04"  # a zip archive's first local file header (`.npz`)
EMPTY_ZIP_MAGIC = b"PK\x05\x06"  # an archive with no member (`np.savez` of nothing)
NPY_MAGIC = b"\x93NUMPY"  # the `.npy` format's magic string


class NotNumpyFile(ValueError):
    """A file whose first bytes are those of no `.npz` archive (or `.npy` array)."""


def read_error_reason(err: BaseException) -> str:
    """One line on why reading untrusted bytes failed, for an error message: this module's
    own words for a file that is no NumPy file, else the exception's type and text (json,
    zipfile, zlib and NumPy raise a dozen unrelated types on a truncated or corrupt file),
    whitespace folded and cut at 300 characters."""
    if isinstance(err, NotNumpyFile):
        return str(err)
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


def load_npz_bytes(data: bytes) -> dict[str, np.ndarray]:
    """Every array of the `.npz` archive held in `data`, read (zip CRCs checked).

    **Raises:** `ValueError` when `data` is not an `.npz` archive (`check_numpy_bytes`) or
    one of its members is not a `.npy` array (NumPy would hand back its raw bytes), and
    NumPy's or `zipfile`'s errors for an archive damaged inside.
    """
    check_numpy_bytes(data[:8])
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    for k, v in arrays.items():
        if not isinstance(v, np.ndarray):
            raise ValueError(f"its member {k!r} is not a NumPy array (the archive is foreign)")
    return arrays


def load_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every array of the `.npz` archive at `path` (read whole, then closed).

    **Raises:** `OSError` when it cannot be opened, the errors of `load_npz_bytes` else.
    """
    with open(path, "rb") as f:
        data = f.read()
    return load_npz_bytes(data)


def load_numpy_file(path: str | os.PathLike) -> np.ndarray | dict[str, np.ndarray]:
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
