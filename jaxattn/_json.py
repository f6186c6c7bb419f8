"""Reading the JSON summaries jaxattn writes beside its archives (a sweep's manifest and
chunk summaries, a regime map's settings), field by field.

A summary can be edited or damaged after it was written. Each reader below takes the
value as JSON gave it and either returns it as the type the package wrote or raises a
`ValueError` that names the field and what it holds: nothing is coerced (`2.7` is not
an integer, `null` is not a name), so an edited file is refused rather than read as
something it does not say.
"""

import hashlib
import json
import math
import os
import stat

from ._npz import recorded_sha256

# The key under which a summary records the SHA-256 of its own contents (every other key).
SUMMARY_SHA256 = "summary_sha256"


def special_file_kind(mode: int) -> str | None:
    """What a file of `os.stat` mode `mode` is when it is not a regular file ("a folder",
    "a named pipe (FIFO)", "a device", "a socket"); None for a regular file. Checked before
    a file is opened: opening a pipe for reading waits for a writer, and a device such as
    `/dev/zero` never ends."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a socket" if stat.S_ISSOCK(mode) else "not a plain file"


def read_regular_file(path, *, limit: int | None = None) -> bytes:
    """The bytes of the file `path`, which must be a regular file (a link to one is
    followed): a FIFO would block and a device such as `/dev/zero` never ends.

    **Raises:** `ValueError` for something that is not a regular file, or one larger than
    `limit` bytes; `OSError` when it cannot be opened.
    """
    info = os.stat(path)  # before opening (`special_file_kind`)
    kind = special_file_kind(info.st_mode)
    if kind is not None:
        raise ValueError(f"it is not a regular file (it is {kind})")
    if limit is not None and info.st_size > limit:
        raise ValueError(f"it holds {info.st_size} bytes, more than a summary's {limit}")
    with open(path, "rb") as f:
        return f.read()


def read_json_object(path) -> dict:
    """The JSON object in the file `path` (a regular file of at most 256 MiB).

    **Raises:** `ValueError` (a `json.JSONDecodeError` for bad JSON) for a file that is
    not a regular file, text that is not UTF-8, not JSON, nested too deeply to read, or
    not a JSON object; `OSError` if the file cannot be opened.
    """
    data = read_regular_file(path, limit=256 * 2**20)
    try:
        obj = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as err:  # its repr holds every byte of the file
        raise ValueError(
            f"not UTF-8 text (byte {err.object[err.start]:#04x} at position {err.start})"
        ) from None
    except RecursionError:
        raise ValueError("JSON nested too deeply to read") from None
    except ValueError as err:
        if "int_max_str_digits" in str(err):  # Python's advice is to lift its own limit
            raise ValueError("it holds an integer of more than 4300 digits") from None
        raise
    if not isinstance(obj, dict):
        raise ValueError(f"it holds a JSON {_json_kind(obj)}, not an object")
    return obj


def read_summary(path, fields, damaged: str):
    """`fields(obj)` for the JSON object `obj` in the file `path`, whose own SHA-256
    (`check_summary_sha256`) is checked after `fields` has read it (a field of the wrong
    type is then named, not just "edited").

    **Raises:** `ValueError` `f"{damaged} ({why})."` when the file cannot be read, lacks a
    field (`KeyError` from `fields`), holds a wrong one (`ValueError`) or was edited.
    """
    try:
        obj = read_json_object(path)
        out = fields(obj)
        check_summary_sha256(obj, path)
        return out
    except KeyError as err:
        why = f"it has no {err.args[0]!r}"
    except (ValueError, OSError) as err:
        why = str(err)
    raise ValueError(f"{damaged} ({why}).")


def _contents_sha256(obj: dict) -> str:
    """SHA-256 of a summary's contents (every key but `SUMMARY_SHA256`), as canonical JSON
    text (sorted keys): the same for the object written and for the object read back."""
    rest = {k: v for k, v in obj.items() if k != SUMMARY_SHA256}
    return hashlib.sha256(json.dumps(rest, sort_keys=True).encode()).hexdigest()


def with_summary_sha256(obj: dict, default=None) -> dict:
    """`obj` as JSON reads it back (tuples as lists, `default` applied to what JSON cannot
    hold), with the SHA-256 of its contents recorded under `SUMMARY_SHA256`."""
    plain = json.loads(json.dumps(obj, default=default))
    plain[SUMMARY_SHA256] = _contents_sha256(plain)
    return plain


def check_summary_sha256(obj: dict, where: str) -> None:
    """Check a summary read from the file `where` against the SHA-256 of its contents that
    it records (`with_summary_sha256`); a summary without one (written before 2026-12-07)
    is not checked.

    **Raises:** `ValueError` when the recorded value is not a SHA-256 or differs from the
    contents' (the file was edited after it was written)."""
    recorded = recorded_sha256(obj, where, key=SUMMARY_SHA256)  # the format checked there
    if recorded is not None and _contents_sha256(obj) != recorded:
        raise ValueError(
            f"the contents of {where} differ from the SHA-256 it records ({SUMMARY_SHA256}): "
            "it was edited after it was written"
        )


def _json_kind(value) -> str:
    """How JSON names the type of a decoded value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def is_finite_number(value) -> bool:
    """Whether a decoded JSON value is a number that a float holds finitely (an integer of
    400 digits is not: `float()` of it overflows)."""
    if type(value) is int:
        return abs(value) <= _FLOAT_MAX
    return type(value) is float and math.isfinite(value)


_FLOAT_MAX = int(float.fromhex("0x1.fffffffffffffp+1023"))


def _shown(value) -> str:
    if type(value) is int and abs(value) > _FLOAT_MAX:
        return f"an integer of {len(str(abs(value)))} digits"
    text = json.dumps(value, allow_nan=True)
    return text if len(text) <= 40 else text[:37] + "..."


def json_int(obj: dict, key: str, *, minimum: int | None = None, where: str = "") -> int:
    """`obj[key]` as an integer: a JSON number without a fractional part (`3`, or `3.0`
    as another writer may give it) that an int64 holds, at least `minimum`.

    **Raises:** `KeyError` when the key is missing; `ValueError` naming `key` for
    anything else (a string, a boolean, `null`, `2.7`, `1e999`).
    """
    value = obj[key]
    name = f"{where}{key!r}"
    exact = type(value) is int or (
        type(value) is float and math.isfinite(value) and value == int(value)
    )
    if not exact:
        raise ValueError(f"its {name} is not an integer: {_shown(value)}")
    value = int(value)
    if abs(value) >= 2**63:  # nothing the package writes; NumPy's int64 would overflow
        raise ValueError(f"its {name} is out of range: {_shown(value)}")
    if minimum is not None and value < minimum:
        raise ValueError(f"its {name} is {value}, below {minimum}")
    return value


def json_number(
    obj: dict, key: str, *, minimum: float | None = None, positive: bool = False, where: str = ""
) -> float:
    """`obj[key]` as a finite float (a JSON number), at least `minimum`, above 0 with
    `positive`.

    **Raises:** `KeyError` when the key is missing; `ValueError` naming `key` for a
    value that is not a finite number in range.
    """
    value = obj[key]
    name = f"{where}{key!r}"
    if not is_finite_number(value):
        raise ValueError(f"its {name} is not a finite number: {_shown(value)}")
    value = float(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"its {name} is {value}, below {minimum}")
    if positive and value <= 0:
        raise ValueError(f"its {name} is {value}, not positive")
    return value


def json_str(obj: dict, key: str, *, choices=None, where: str = "") -> str:
    """`obj[key]` as a string, one of `choices` when given.

    **Raises:** `KeyError` when the key is missing; `ValueError` naming `key` otherwise.
    """
    value = obj[key]
    name = f"{where}{key!r}"
    if type(value) is not str:
        raise ValueError(f"its {name} is not a string: {_shown(value)}")
    if choices is not None and value not in choices:
        raise ValueError(f"its {name} is {value!r}, not one of {tuple(choices)}")
    return value


def json_object(obj: dict, key: str, *, where: str = "") -> dict:
    """`obj[key]` as a dict (a JSON object).

    **Raises:** `KeyError` when the key is missing; `ValueError` naming `key` otherwise.
    """
    value = obj[key]
    if not isinstance(value, dict):
        raise ValueError(f"its {where}{key!r} is a JSON {_json_kind(value)}, not an object")
    return value


def json_list(obj: dict, key: str, *, where: str = "") -> list:
    """`obj[key]` as a list (a JSON array).

    **Raises:** `KeyError` when the key is missing; `ValueError` naming `key` otherwise.
    """
    value = obj[key]
    if not isinstance(value, list):
        raise ValueError(f"its {where}{key!r} is a JSON {_json_kind(value)}, not an array")
    return value
