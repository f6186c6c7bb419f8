"""Reading NumPy files without ever unpickling: `.npz` / `.npy` told from their first bytes,
a damaged or foreign file named as such (not as NumPy's "pickled data")."""

import hashlib
import pickle
import zipfile

import numpy as np
import pytest

from jaxattn._npz import (
    MissingArray,
    check_numpy_bytes,
    check_recorded_sha256,
    load_npz,
    load_npz_bytes,
    load_numpy_file,
    read_error_reason,
)


class _Unpickled:
    """Unpickling this creates the file `marker`: proof that a file was unpickled."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_archives_and_arrays_round_trip(tmp_path):
    a, b = np.arange(6.0).reshape(2, 3), np.array([True, False])
    np.savez(tmp_path / "x.npz", a=a, b=b)
    np.savez_compressed(tmp_path / "y.npz", a=a)
    np.savez(tmp_path / "empty.npz")
    np.save(tmp_path / "z.npy", a)
    got = load_npz(tmp_path / "x.npz")
    assert sorted(got) == ["a", "b"]
    np.testing.assert_array_equal(got["a"], a)
    np.testing.assert_array_equal(got["b"], b)
    np.testing.assert_array_equal(load_npz(tmp_path / "y.npz")["a"], a)
    assert load_npz(tmp_path / "empty.npz") == {}
    np.testing.assert_array_equal(load_numpy_file(tmp_path / "z.npy"), a)
    np.testing.assert_array_equal(load_numpy_file(tmp_path / "x.npz")["b"], b)
    # An .npy is not an .npz archive.
    with pytest.raises(ValueError, match="not a NumPy .npz archive"):
        load_npz(tmp_path / "z.npy")


def test_damaged_and_foreign_files_are_named_not_unpickled(tmp_path):
    marker = tmp_path / "unpickled"
    cases = {
        "garbage": b"garbage",
        "pickle": pickle.dumps(_Unpickled(marker)),
        "text": b"a,b\n1,2\n",
    }
    for name, data in cases.items():
        path = tmp_path / f"{name}.npz"
        path.write_bytes(data)
        for load in (load_npz, load_numpy_file):
            with pytest.raises(ValueError, match=r"not a NumPy .npz archive.* damaged or of") as e:
                load(path)
            assert "allow_pickle" not in str(e.value), name
    assert not marker.exists()
    (tmp_path / "empty.npz").write_bytes(b"")
    with pytest.raises(ValueError, match="the file is empty"):
        load_npz(tmp_path / "empty.npz")
    # A zip archive cut short is still refused (by zipfile or NumPy), never unpickled.
    np.savez(tmp_path / "whole.npz", a=np.arange(100.0))
    cut = (tmp_path / "whole.npz").read_bytes()[:60]
    with pytest.raises((zipfile.BadZipFile, ValueError, EOFError)):
        load_npz_bytes(cut)
    # A zip archive whose member is not a .npy array (NumPy would return its bytes).
    with zipfile.ZipFile(tmp_path / "foreign.npz", "w") as zf:
        zf.writestr("x.npy", b"junk")
    with pytest.raises(ValueError, match="its member 'x' is not a NumPy array"):
        load_npz(tmp_path / "foreign.npz")
    # An object array inside an archive is refused by NumPy (allow_pickle=False).
    obj = np.empty(1, dtype=object)
    obj[0] = _Unpickled(marker)
    np.savez(tmp_path / "objects.npz", o=obj)
    with pytest.raises(ValueError, match="allow_pickle") as e:
        load_npz(tmp_path / "objects.npz")
    assert not marker.exists()
    # Readers word it as what the file holds, not as NumPy's hint to load it unsafely.
    assert read_error_reason(e.value) == (
        "an array of Python objects, which is never unpickled (allow_pickle=False)"
    )


def test_check_numpy_bytes_names_what_it_expects():
    check_numpy_bytes(b"PK\x03\x04rest")
    check_numpy_bytes(b"\x93NUMPY\x01\x00", npy=True)
    with pytest.raises(ValueError, match="not a NumPy .npz archive: it begins with"):
        check_numpy_bytes(b"\x93NUMPY\x01\x00")
    with pytest.raises(ValueError, match="not a NumPy .npz archive or .npy array"):
        check_numpy_bytes(b"{}", npy=True)


def test_a_missing_array_and_a_recorded_hash_are_named(tmp_path):
    np.savez(tmp_path / "empty.npz")
    arrays = load_npz(tmp_path / "empty.npz")
    # An archive without the array a reader needs (an empty or foreign one): the error
    # names the array, and is both a KeyError and a ValueError (a wrong file).
    with pytest.raises(MissingArray) as e:
        arrays["fingerprint"]
    assert isinstance(e.value, KeyError) and isinstance(e.value, ValueError)
    assert str(e.value) == "the archive holds no array 'fingerprint'"
    assert read_error_reason(e.value) == "MissingArray: the archive holds no array 'fingerprint'"
    assert arrays.get("fingerprint") is None and "fingerprint" not in arrays
    with pytest.raises(MissingArray, match="holds no array 'axis_0'"):
        arrays.pop("axis_0")  # as a lookup does
    assert arrays.pop("axis_0", None) is None
    # The SHA-256 recorded in a summary: absent (written before hashes were) is not
    # checked; present, it must be a hash and the archive's.
    data = b"PK\x05\x06" + bytes(18)
    digest = hashlib.sha256(data).hexdigest()
    check_recorded_sha256({}, data, "s.json")
    check_recorded_sha256({"npz_sha256": digest}, data, "s.json")
    with pytest.raises(ValueError, match=r"in s.json: it was altered after it was written"):
        check_recorded_sha256({"npz_sha256": digest}, data + b"x", "s.json")
    for bad in (None, "", digest[:-1], digest.upper(), 17):
        with pytest.raises(ValueError, match=r"s.json records npz_sha256 = .*not a SHA-256"):
            check_recorded_sha256({"npz_sha256": bad}, data, "s.json")
