"""Reading the JSON summaries jaxattn writes beside its archives (a sweep's manifest and
chunk summaries, a regime map's settings), field by field.

A summary can be edited or damaged after it was written. Each reader below takes the
value as JSON gave it and either returns it as the type the package wrote or raises a
`ValueError` that names the field and what it holds: nothing is coerced (`2.7` is not
an integer, `null` is not a name), so an edited file is refused rather than read as
something it does not say.
"""

import json
import math


def read_json_object(path) -> dict:
    """The JSON object in the file `path`.

    **Raises:** `ValueError` (a `json.JSONDecodeError` for bad JSON) for text that is not
    UTF-8, not JSON, nested too deeply to read, or not a JSON object; `OSError` if the
    file cannot be opened.
    """
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except UnicodeDecodeError as err:  # its repr holds every byte of the file
        raise ValueError(
            f"not UTF-8 text (byte {err.object[err.start]:#04x} at position {err.start})"
        ) from None
    except RecursionError:
        raise ValueError("JSON nested too deeply to read") from None
    if not isinstance(obj, dict):
        raise ValueError(f"it holds a JSON {_json_kind(obj)}, not an object")
    return obj


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


def _shown(value) -> str:
    text = json.dumps(value, allow_nan=True)
    return text if len(text) <= 40 else text[:37] + "..."


def json_int(obj: dict, key: str, *, minimum: int | None = None, where: str = "") -> int:
    """`obj[key]` as an integer: a JSON number without a fractional part (`3`, or `3.0`
    as another writer may give it), at least `minimum`.

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
    if type(value) not in (int, float) or not math.isfinite(value):
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
