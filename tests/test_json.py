"""Reading the JSON summaries beside saved archives: fields read without coercion, the
SHA-256 a summary records of its own contents, and files that are not regular files."""

import json
import math
import os

import numpy as np
import pytest

from jaxattn._json import (
    SUMMARY_SHA256,
    check_summary_sha256,
    is_finite_number,
    json_int,
    json_number,
    json_object,
    json_str,
    read_json_object,
    read_regular_file,
    read_summary,
    with_summary_sha256,
)


def test_fields_are_read_as_written_never_coerced():
    obj = {"a": 3, "b": 3.0, "c": 2.7, "d": True, "e": "3", "f": None, "g": 10**400, "h": 1e999}
    assert json_int(obj, "a") == 3 and json_int(obj, "b") == 3
    for key, shown in [
        ("c", "2.7"),
        ("d", "true"),
        ("e", '"3"'),
        ("f", "null"),
        ("h", "Infinity"),
    ]:
        with pytest.raises(ValueError, match=f"its '{key}' is not an integer: {shown}"):
            json_int(obj, key)
    with pytest.raises(ValueError, match="its 'g' is out of range: an integer of 401 digits"):
        json_int(obj, "g")
    with pytest.raises(ValueError, match="its 'a' is 3, below 4"):
        json_int(obj, "a", minimum=4)
    with pytest.raises(KeyError):
        json_int(obj, "missing")
    assert json_number(obj, "a") == 3.0 and json_number(obj, "c") == 2.7
    for key in ("d", "e", "f", "g", "h"):
        with pytest.raises(ValueError, match=f"its '{key}' is not a finite number"):
            json_number(obj, key)
    with pytest.raises(ValueError, match="its config 'c' is -2.7, not positive"):
        json_number({"c": -2.7}, "c", positive=True, where="config ")
    assert json_str(obj, "e", choices=("3", "4")) == "3"
    with pytest.raises(ValueError, match=r"its 'e' is '3', not one of \('x',\)"):
        json_str(obj, "e", choices=("x",))
    with pytest.raises(ValueError, match="its 'f' is a JSON null, not an object"):
        json_object(obj, "f")
    # The float limit itself is a number; one past it is not.
    top = int(np.finfo(float).max)
    assert is_finite_number(top) and not is_finite_number(top + 2**971)
    assert not is_finite_number(math.nan) and not is_finite_number(False)


def test_a_summary_records_the_sha256_of_its_own_contents(tmp_path):
    obj = {"t1": 50.0, "shape": (2, 3), "nan": math.nan, "big": 2**70, "nested": {"x": [1e-300]}}
    written = with_summary_sha256(obj)
    assert written["shape"] == [2, 3] and len(written[SUMMARY_SHA256]) == 64
    path = tmp_path / "s.json"
    # Whitespace and key order do not matter: the hash is of the canonical text.
    path.write_text(json.dumps(dict(reversed(list(written.items()))), indent=3))
    back = read_json_object(path)
    check_summary_sha256(back, str(path))
    # Any edit of a value, including one of the right type, is refused.
    for edit in ({"t1": 50.5}, {"big": 2**70 + 1}, {"nested": {"x": [1e-299]}}, {"extra": 1}):
        with pytest.raises(ValueError, match="s.json differ from the SHA-256 it records"):
            check_summary_sha256({**back, **edit}, str(path))
    with pytest.raises(ValueError, match="records summary_sha256 = None, not a SHA-256"):
        check_summary_sha256({**back, SUMMARY_SHA256: None}, str(path))
    check_summary_sha256({k: v for k, v in back.items() if k != SUMMARY_SHA256}, "old.json")
    # read_summary: the fields first (a wrong one is named), then the hash.
    fields = lambda o: json_number(o, "t1")  # noqa: E731
    assert read_summary(path, fields, "s is damaged") == 50.0
    path.write_text(json.dumps({**back, "t1": "x"}))
    with pytest.raises(ValueError, match=r"^s is damaged \(its 't1' is not a finite number"):
        read_summary(path, fields, "s is damaged")
    path.write_text(json.dumps({**back, "t1": 51.0}))
    with pytest.raises(ValueError, match=r"^s is damaged \(the contents of .* differ"):
        read_summary(path, fields, "s is damaged")
    path.write_text(json.dumps({k: v for k, v in back.items() if k != "t1"}))
    with pytest.raises(ValueError, match=r"^s is damaged \(it has no 't1'\)\.$"):
        read_summary(path, fields, "s is damaged")


def test_only_regular_files_are_read(tmp_path):
    path = tmp_path / "a.json"
    path.write_bytes(b"\xff\xfe{}")
    with pytest.raises(ValueError, match="not UTF-8 text"):
        read_json_object(path)
    path.write_text("[" * 100_000)
    with pytest.raises(ValueError, match="nested too deeply"):
        read_json_object(path)
    path.write_text('{"n": ' + "9" * 5000 + "}")
    with pytest.raises(ValueError, match="an integer of more than 4300 digits$"):
        read_json_object(path)
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="it holds a JSON array, not an object"):
        read_json_object(path)
    assert read_regular_file(path, limit=6) == b"[1, 2]"
    with pytest.raises(ValueError, match="holds 6 bytes, more than a summary's 5"):
        read_regular_file(path, limit=5)
    # A pipe would block and /dev/zero never ends: both are refused at once.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # no writer: opening it to read would wait forever
    with pytest.raises(ValueError, match=r"not a regular file \(it is a named pipe \(FIFO\)\)"):
        read_regular_file(fifo)
    with pytest.raises(ValueError, match="not a regular file"):
        read_json_object(fifo)
    link = tmp_path / "zero.npz"
    os.symlink("/dev/zero", link)
    with pytest.raises(ValueError, match=r"not a regular file \(it is a device\)"):
        read_regular_file(link)
    with pytest.raises(ValueError, match=r"not a regular file \(it is a folder\)"):
        read_regular_file(tmp_path)
