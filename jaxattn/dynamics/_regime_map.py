r"""Regime maps of a family of flows: a 1-D or 2-D grid over named parameters, K initial
conditions per cell, per-cell basin fractions, failures kept apart, and the stated theory
boundary where the family has one.

A *family* is a function of named parameters returning either `(A, V, beta)` (an
`AttentionDynamics` of the chosen kernel is built from it) or a flow module. The built-in
families (`FAMILIES`) are the paper's slices and two ensembles; any callable taking the
axis values as keywords is a family too.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import equinox as eqx
import jax
import numpy as np

from .._json import (
    SUMMARY_SHA256,
    is_finite_number,
    json_int,
    json_list,
    json_number,
    json_object,
    json_str,
    read_json_object,
    read_regular_file,
    read_summary,
)
from .._npz import check_sha256, load_npz_bytes, read_error_reason, recorded_sha256
from .._warn import warn_at_caller
from ._circle import _check_count
from ._regimes import REGIMES
from ._sweep import (
    FAILED,
    METHODS,
    NOT_RUN,
    REGIME_NAMES,
    Integration,
    Judge,
    Members,
    Runner,
    SweepResult,
    _atomic_write,
    _bad_codes,
    _codes_in_range,
    _npz_bytes,
    _write_bytes,
    _write_json,
    attention_members,
    available_memory,
    sweep,
)
from ._theory import case1_criterion, case2_criterion, case4_criterion, stated_prediction

__all__ = ["Family", "FAMILIES", "RegimeMap", "regime_map", "parse_axis"]

_I2 = np.eye(2)
_J2 = np.array([[0.0, -1.0], [1.0, 0.0]])
_CLUSTERING = int(REGIMES.clustering._value)
_ROTATING = int(REGIMES.rotating._value)
_INTERIOR = int(REGIMES.interior._value)


@dataclasses.dataclass(frozen=True)
class Family:
    """A named family of attention flows.

    - `name`, `description`: what it is (the description names every parameter).
    - `params`: the parameters and their defaults, in order.
    - `build(**params) -> (A, V, beta)`: the member at those parameter values.
    - `predict(A, V, beta) -> codes`: the stated theory's regime codes (−1: no claim;
      `0 .. len(REGIME_NAMES) - 1`: the regimes), shape `(batch,)`, for stacked members
      `(batch, d, d)`, `(batch, d, d)`, `(batch,)`, or `None` when the family has no stated
      theory (a family whose `build` returns a flow module has none).
    """

    name: str
    description: str
    params: dict
    build: Callable[..., tuple]
    predict: Callable[..., int] | None = None


def _criterion_codes(criterion):
    """Vectorised codes of a stated criterion (−1 where it makes no claim)."""

    def predict(A, V, beta):
        del beta
        pred = jax.vmap(criterion)(np.asarray(A, float), np.asarray(V, float))
        return np.where(np.asarray(pred.claims), np.asarray(pred.regime._value), -1)

    return predict


def _case1_A(trace, det):
    # A representative with trace t and determinant D: [[t/2, 1], [t²/4 − D, t/2]].
    return np.array([[trace / 2, 1.0], [trace * trace / 4 - det, trace / 2]])


def _case2_V(l1, l2, angle):
    c, s = math.cos(angle), math.sin(angle)
    Q = np.array([[c, -s], [s, c]])
    return Q @ np.diag([l1, l2]) @ Q.T


def _case4_V(v11, v12):
    return np.array([[v11, v12], [-v12, -v11]])


def _rotating_predict(A, V, beta):
    # V = a I + b J: d|R|/dt = (aβ/2)(1 − |R|²)|R|, phase speed (bβ/2)(|R|² + 3) (OA).
    a, b = np.asarray(V)[:, 0, 0] * beta, np.asarray(V)[:, 1, 0] * beta
    rot = np.where(b != 0, _ROTATING, _CLUSTERING)
    return np.where(a > 0, rot, np.where(a < 0, _INTERIOR, -1))


def _random_build(a0, sA, v0, sV, beta, draw, d):
    d = int(d)
    rng = np.random.default_rng(int(draw))
    GA, GV = rng.standard_normal((2, d, d)) / math.sqrt(d)
    return a0 * np.eye(d) + sA * GA, v0 * np.eye(d) + sV * GV, beta


def _entries_build(a11, a12, a21, a22, v11, v12, v21, v22, beta):
    return np.array([[a11, a12], [a21, a22]]), np.array([[v11, v12], [v21, v22]]), beta


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            "case1",
            "Case 1: V = I, A = [[trace/2, 1], [trace²/4 − det, trace/2]] (trace, det of A)",
            dict(trace=1.0, det=1.0, beta=1.0),
            lambda trace, det, beta: (_case1_A(trace, det), _I2, beta),
            _criterion_codes(case1_criterion),
        ),
        Family(
            "case2",
            "Case 2: A = I, V = Q diag(l1, l2) Qᵀ, Q the rotation by `angle`",
            dict(l1=1.0, l2=-1.0, angle=0.4, beta=1.0),
            lambda l1, l2, angle, beta: (_I2, _case2_V(l1, l2, angle), beta),
            _criterion_codes(case2_criterion),
        ),
        Family(
            "case4",
            "Case 4: A = I, V = [[v11, v12], [−v12, −v11]]",
            dict(v11=0.3, v12=1.0, beta=1.0),
            lambda v11, v12, beta: (_I2, _case4_V(v11, v12), beta),
            _criterion_codes(case4_criterion),
        ),
        Family(
            "rotating",
            "rotating family: A = I, V = a I + b J, J = [[0, −1], [1, 0]]",
            dict(a=1.0, b=1.0, beta=1.0),
            lambda a, b, beta: (_I2, a * _I2 + b * _J2, beta),
            _rotating_predict,
        ),
        Family(
            "random",
            "Gaussian ensemble: A = a0 I + sA G_A/√d, V = v0 I + sV G_V/√d, "
            "G i.i.d. N(0, 1) from seed `draw`",
            dict(a0=0.0, sA=1.0, v0=0.0, sV=1.0, beta=1.0, draw=0, d=2),
            _random_build,
        ),
        Family(
            "entries",
            "entries of A = [[a11, a12], [a21, a22]] and V = [[v11, v12], [v21, v22]]",
            dict(a11=1.0, a12=0.0, a21=0.0, a22=1.0, v11=1.0, v12=0.0, v21=0.0, v22=1.0, beta=1.0),
            _entries_build,
            _criterion_codes(stated_prediction),
        ),
    )
}


def largest_base_seed(inits: int) -> int:
    """The largest `seed` of `regime_map` with `inits` initial conditions per cell: its
    members' seeds `seed·inits + k` (k < inits) must lie in [0, 2**32), the sweep's range."""
    return (2**32 - 1) // int(inits) - 1


def parse_axis(spec: str) -> tuple[str, np.ndarray]:
    """Parse `"name=lo:hi:num"` (a grid of `num` cell centres from lo to hi) or
    `"name=v1,v2,..."` into `(name, values)`.

    **Raises:** `ValueError` naming the spec when it does not have that form.
    """
    name, sep, rng = str(spec).partition("=")
    name = name.strip()
    try:
        if not sep or not name:
            raise ValueError
        if ":" in rng:
            lo, hi, num = rng.split(":")
            if int(num) > MAX_AXIS_POINTS:
                raise ValueError(
                    f"axis {spec!r}: {int(num)} points; at most {MAX_AXIS_POINTS} per axis."
                )
            lo, hi = float(lo), float(hi)
            if not (math.isfinite(lo) and math.isfinite(hi)):
                # (checked here: linspace would warn of the inf arithmetic first)
                raise ValueError(f"axis {spec!r}: its ends must be finite numbers.")
            with np.errstate(over="ignore", invalid="ignore"):
                values = np.linspace(lo, hi, int(num))
            if not np.all(np.isfinite(values)):
                raise ValueError(
                    f"axis {spec!r}: its ends must be finite numbers whose grid is finite "
                    f"(hi - lo = {hi - lo:g} overflows)."
                )
        else:
            values = np.array([float(v) for v in rng.split(",")])
    except ValueError as err:
        if "per axis" in str(err) or "must be finite" in str(err):
            raise
        raise ValueError(
            f"axis {spec!r}: expected NAME=LO:HI:NUM (e.g. a=-1:1:64) or NAME=V1,V2,..."
        ) from None
    return name, values


def _axes(axes) -> tuple[tuple[str, np.ndarray], ...]:
    if isinstance(axes, Mapping):
        items = list(axes.items())
    elif isinstance(axes, str):
        items = [parse_axis(axes)]
    else:
        items = [parse_axis(a) if isinstance(a, str) else tuple(a) for a in axes]
    if not 1 <= len(items) <= 2:
        raise ValueError(f"regime_map: give 1 or 2 axes, got {len(items)}.")
    out = []
    for item in items:
        if len(item) != 2:
            raise ValueError(f"regime_map: an axis is (name, values), got {item!r}.")
        name, values = item
        values = np.asarray(values, dtype=float)
        if values.ndim != 1 or values.size == 0 or not np.all(np.isfinite(values)):
            raise ValueError(
                f"regime_map: axis {name!r} needs a non-empty 1-d grid of finite values."
            )
        if values.size > 1 and not np.all(np.diff(values) > 0):
            raise ValueError(f"regime_map: axis {name!r} must be strictly increasing.")
        out.append((str(name), values))
    if len(out) == 2 and out[0][0] == out[1][0]:
        raise ValueError(f"regime_map: both axes are {out[0][0]!r}.")
    return tuple(out)


def _family_params(family) -> tuple[str, dict, Callable, Callable | None]:
    """(name, defaults, build, predict) of a family given by name, `Family` or callable."""
    if isinstance(family, str):
        if family not in FAMILIES:
            raise ValueError(
                f"regime_map: unknown family {family!r}; built-in families are "
                f"{sorted(FAMILIES)} (or pass a callable)."
            )
        family = FAMILIES[family]
    if isinstance(family, Family):
        return family.name, dict(family.params), family.build, family.predict
    if not callable(family):
        raise ValueError(f"regime_map: family must be a name or a callable, got {family!r}.")
    defaults = {}
    try:
        for p in inspect.signature(family).parameters.values():
            if p.default is not inspect.Parameter.empty:
                defaults[p.name] = p.default
    except (TypeError, ValueError):
        pass
    name = getattr(family, "__qualname__", type(family).__name__)
    return name, defaults, family, None


def _check_names(where, names, defaults, accepts_any):
    if accepts_any:
        return
    unknown = [k for k in names if k not in defaults]
    if unknown:
        raise ValueError(
            f"{where}: unknown parameter(s) {unknown}; this family has {list(defaults)}."
        )


def _accepts_any(fn) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.kind == p.VAR_KEYWORD for p in params) or not any(
        p.default is not inspect.Parameter.empty for p in params
    )


@dataclasses.dataclass
class RegimeMap:
    """Per-cell regimes of a family over a 1-D or 2-D parameter grid (NumPy arrays).

    `cells = tuple(len(values) for _, values in axes)`: `(nx,)` or `(nx, ny)`, the
    first axis is x.

    **Fields:**

    - `family`, `method`, `kernel`: what was mapped; `fixed`: the parameters held fixed;
      `axes`: `((name, cell centres), ...)`; `inits`: initial conditions per cell (K).
    - `regime` `cells + (K,)`: `REGIMES` codes, `FAILED` (−1) or `NOT_RUN` (−2);
      `failed` `cells + (K,)` bool.
    - `fractions` `cells + (len(REGIME_NAMES),)`: the fraction of the K inits in each
      regime (basin fractions); failed members are in none of them.
    - `failed_fraction` `cells`; `dominant` `cells` (the regime with the largest
      fraction, −1 where every init failed); `multistable` `cells` bool (no regime holds
      ≥ 90 % of the cell's non-failed inits).
    - `predicted` `cells` or `None`: the stated theory's regime code per cell (−1 where
      it makes no claim); `boundaries`: the theory's boundaries in axis coordinates
      (`dict(label, x, y)`; in 1-D `x` holds the crossing points and `y` is `None`).
    - `seconds`: wall time; `sweep`: the underlying `SweepResult` (None after `load`
      of a map saved without its sweep folder).
    """

    family: str
    method: str
    kernel: str
    axes: tuple
    fixed: dict
    inits: int
    regime: np.ndarray
    failed: np.ndarray
    fractions: np.ndarray
    failed_fraction: np.ndarray
    dominant: np.ndarray
    multistable: np.ndarray
    predicted: np.ndarray | None
    boundaries: list
    seconds: float = 0.0
    sweep: SweepResult | None = None

    @property
    def cells(self) -> tuple:
        return tuple(len(v) for _, v in self.axes)

    @property
    def regime_names(self) -> tuple:
        return REGIME_NAMES

    def disagreements(self) -> np.ndarray:
        """Cells where the dominant measured regime contradicts a stated claim (a
        clustering claim is met by clusters at rest or rotating; undetermined, failed and
        unclaimed cells never disagree)."""
        if self.predicted is None:
            return np.zeros(self.cells, bool)
        dom, pred = self.dominant, self.predicted
        decided = (dom >= 0) & (dom != int(REGIMES.undetermined._value))
        ok = (dom == pred) | ((pred == _CLUSTERING) & (dom == _ROTATING))
        return (pred >= 0) & decided & ~ok

    def summary(self) -> dict:
        """Counts of dominant regimes, multistable and failed cells, theory agreement."""
        dom = self.dominant
        out = dict(
            cells=int(dom.size),
            members=int(self.regime.size),
            dominant={n: int(np.sum(dom == i)) for i, n in enumerate(REGIME_NAMES)},
            multistable_cells=int(self.multistable.sum()),
            failed_members=int(self.failed.sum()),
            seconds=self.seconds,
        )
        if self.predicted is not None:
            claims = self.predicted >= 0
            out["cells_with_claim"] = int(claims.sum())
            # Only decided cells are compared: failed and undetermined ones neither agree
            # nor disagree.
            decided = (dom >= 0) & (dom != int(REGIMES.undetermined._value))
            out["cells_compared"] = int((claims & decided).sum())
            out["disagreements"] = int(self.disagreements().sum())
        return out

    def save(self, out_dir) -> str:
        """Write `regime_map.npz` (arrays) and `regime_map.json` (settings, boundaries,
        summary) to `out_dir`; returns the folder. The sweep's own chunks, if the map ran
        with an `out_dir`, are in `out_dir/sweep`."""
        out_dir = os.fspath(out_dir)
        os.makedirs(out_dir, exist_ok=True)
        arrays = dict(
            regime=self.regime,
            failed=self.failed,
            fractions=self.fractions,
            failed_fraction=self.failed_fraction,
            dominant=self.dominant,
            multistable=self.multistable,
        )
        if self.predicted is not None:
            arrays["predicted"] = self.predicted
        for i, (_, values) in enumerate(self.axes):
            arrays[f"axis_{i}"] = values

        data = _npz_bytes(**arrays)  # hashed, then written, as a sweep's chunks are
        _atomic_write(os.path.join(out_dir, "regime_map.npz"), lambda p: _write_bytes(p, data))
        meta = dict(
            # `load` refuses an archive altered after it was written.
            npz_sha256=hashlib.sha256(data).hexdigest(),
            family=self.family,
            method=self.method,
            kernel=self.kernel,
            axes=[name for name, _ in self.axes],
            fixed=self.fixed,
            inits=self.inits,
            regime_names=list(REGIME_NAMES),
            boundaries=[
                dict(
                    label=b["label"],
                    x=np.asarray(b["x"]).tolist(),
                    y=None if b.get("y") is None else np.asarray(b["y"]).tolist(),
                )
                for b in self.boundaries
            ],
            seconds=self.seconds,
            summary=self.summary(),
        )
        fingerprint = _sweep_fingerprint(os.path.join(out_dir, "sweep"))
        if fingerprint is not None:
            # `load` keeps only this sweep: another map's `sweep/` folder is refused.
            meta["sweep_fingerprint"] = fingerprint
        _atomic_write(os.path.join(out_dir, "regime_map.json"), lambda p: _write_json(p, meta))
        return out_dir

    @classmethod
    def load(cls, out_dir) -> RegimeMap:
        """Read a map written by `save` (and its sweep from `out_dir/sweep` if present).

        **Raises:** `ValueError` naming the file for a folder without a map, a damaged
        file (a summary missing a setting or holding one of the wrong type included: no
        field is coerced), a summary edited after it was written (the SHA-256 of its
        contents, recorded since 2026-12-07, differs), an archive altered after it was
        written (its SHA-256, recorded in `regime_map.json` since 2026-12-06, differs;
        older maps are checked for consistency, kinds and ranges only), or a map written
        with a different list of regimes. A `sweep` folder that cannot be read or holds
        another map's members leaves the map loaded without it (`sweep=None`) and a
        `UserWarning` saying why.
        """
        out_dir = os.fspath(out_dir)
        if os.path.isfile(out_dir):
            raise ValueError(
                f"RegimeMap.load: {out_dir!r} is a file; give the folder that holds "
                "regime_map.json and regime_map.npz."
            )
        jpath = os.path.join(out_dir, "regime_map.json")
        npath = os.path.join(out_dir, "regime_map.npz")
        if not os.path.isfile(jpath) or not os.path.isfile(npath):
            raise ValueError(
                f"RegimeMap.load: {out_dir!r} holds no regime map "
                "(regime_map.json and regime_map.npz)."
            )
        names, recorded, settings, sweep_fingerprint = read_summary(
            jpath,
            lambda meta: _map_settings(meta, jpath),
            f"RegimeMap.load: {jpath} is damaged or foreign",
        )
        inits = settings["inits"]
        try:
            data = read_regular_file(npath)
            arrays = load_npz_bytes(data)  # a damaged file is named so before any hash
            check_sha256(data, recorded, jpath)
        except Exception as err:
            raise ValueError(
                f"RegimeMap.load: {npath} is damaged ({read_error_reason(err)})."
            ) from None
        try:
            axes = tuple((n, arrays.pop(f"axis_{i}")) for i, n in enumerate(names))
            _check_axes(axes)
            cells = tuple(len(v) for _, v in axes)
            _check_map_arrays(arrays, cells, inits)
        except Exception as err:
            why = read_error_reason(err)
            if recorded is not None:
                # The archive is the one that was written (its SHA-256 is the recorded
                # one): the summary's axes or inits were edited.
                raise ValueError(
                    f"RegimeMap.load: {jpath} is damaged or foreign: it does not fit "
                    f"{npath}, whose SHA-256 is the one it records ({why})."
                ) from None
            raise ValueError(
                f"RegimeMap.load: {npath} is damaged or does not fit {jpath} ({why})."
            ) from None
        sw = _load_map_sweep(os.path.join(out_dir, "sweep"), arrays["regime"], sweep_fingerprint)
        return cls(
            axes=axes,
            regime=arrays["regime"],
            failed=arrays["failed"],
            fractions=arrays["fractions"],
            failed_fraction=arrays["failed_fraction"],
            dominant=arrays["dominant"],
            multistable=arrays["multistable"],
            predicted=arrays.get("predicted"),
            sweep=sw,
            **settings,
        )


def _sweep_fingerprint(sweep_dir: str) -> str | None:
    """The fingerprint in the manifest of the sweep folder `sweep_dir` (None without a
    readable one)."""
    try:
        fingerprint = read_json_object(os.path.join(sweep_dir, "manifest.json"))["fingerprint"]
    except (OSError, ValueError, KeyError):
        return None
    return fingerprint if isinstance(fingerprint, str) else None


def _load_map_sweep(sweep_dir: str, regime: np.ndarray, fingerprint: str | None):
    """The sweep saved with a map (`sweep_dir`), or None with a `UserWarning` saying why
    when it cannot be read or is not the map's: its manifest must hold the `fingerprint`
    the map recorded (maps saved since 2026-12-07), its members be the map's cells times
    inits and agree with the map's `regime` wherever they were loaded. A map saved
    without a sweep folder gives None silently."""
    why = None
    if os.path.islink(sweep_dir) and not os.path.exists(sweep_dir):
        why = f"{sweep_dir} is a link to nothing"
    elif os.path.exists(sweep_dir) and not os.path.isdir(sweep_dir):
        why = f"{sweep_dir} is a file, not a sweep folder"
    elif not os.path.isdir(sweep_dir):
        return None
    elif fingerprint is not None and _sweep_fingerprint(sweep_dir) not in (None, fingerprint):
        # Checked before loading: another sweep's chunks would each be skipped with a
        # warning of their own (their fingerprint is not the manifest's) before this is
        # said. (An unreadable manifest is named by SweepResult.load below.)
        why = f"{sweep_dir} is not the sweep this map recorded (its fingerprint differs)"
    else:
        try:
            sw = SweepResult.load(sweep_dir)
        except ValueError as err:
            why = str(err)
        else:
            got = sw.regime.reshape(-1)
            if got.size != regime.size:
                why = f"{sweep_dir} holds {got.size} members, the map {regime.size}"
            elif np.any((got != regime.reshape(-1)) & sw.completed):
                why = (
                    f"the regimes of {sweep_dir} differ from the map's (it is another map's "
                    "sweep, or one of the two was edited)"
                )
            else:
                return sw
    # The map's own files are sound: keep the map, say why its members are not.
    warn_at_caller(
        f"RegimeMap.load: the map is read without its sweep (per-member trajectories and "
        f"evidence): {why}"
    )
    return None


def _map_settings(meta: dict, jpath: str) -> tuple[list, str | None, dict, str | None]:
    """`(axis names, recorded SHA-256, settings, sweep fingerprint)` of a map's
    `regime_map.json` (`meta`, read from `jpath`), each field checked for the type
    `RegimeMap.save` writes: an edited summary is refused by name, never coerced
    (`"inits": 2.7` is not 2).

    **Raises:** `KeyError` for a missing field, `ValueError` naming a wrong one."""
    names = json_list(meta, "axes")
    if not 1 <= len(names) <= 2 or not all(type(n) is str for n in names):
        raise ValueError(f"its 'axes' is not a list of one or two names: {names!r:.80}")
    if len(set(names)) != len(names):
        raise ValueError(f"its 'axes' repeats a name: {names}")
    if meta["regime_names"] != list(REGIME_NAMES):
        raise ValueError(
            f"it was written with regimes {meta['regime_names']!r:.120}, this version has "
            f"{list(REGIME_NAMES)}"
        )
    recorded = recorded_sha256(meta, jpath)
    if recorded is None and SUMMARY_SHA256 in meta:
        # A summary that hashes itself was written since 2026-12-07, with its archive's hash.
        raise ValueError("it records no npz_sha256, which every map since 2026-12-06 records")
    boundaries = []
    for i, b in enumerate(json_list(meta, "boundaries")):
        where = f"boundaries[{i}] "
        if not isinstance(b, dict):
            raise ValueError(f"its {where.strip()} is not an object")
        label = json_str(b, "label", where=where)
        x = _json_coordinates(json_list(b, "x", where=where), f"{where}'x'")
        y = b["y"]
        if y is not None:
            y = _json_coordinates(json_list(b, "y", where=where), f"{where}'y'")
        boundaries.append(dict(label=label, x=x, y=y))
    settings = dict(
        family=json_str(meta, "family"),
        method=json_str(meta, "method", choices=METHODS),
        kernel=json_str(meta, "kernel") if "kernel" in meta else "lsa",
        fixed=json_object(meta, "fixed"),
        inits=json_int(meta, "inits", minimum=1),
        seconds=json_number(meta, "seconds", minimum=0.0) if "seconds" in meta else 0.0,
        boundaries=boundaries,
    )
    sweep_fingerprint = json_str(meta, "sweep_fingerprint") if "sweep_fingerprint" in meta else None
    return names, recorded, settings, sweep_fingerprint


def _json_coordinates(values: list, what: str) -> np.ndarray:
    """A boundary's coordinates (a JSON array of finite numbers) as floats.

    **Raises:** `ValueError` naming `what` for anything else."""
    if not all(is_finite_number(v) for v in values):
        raise ValueError(f"its {what} is not a list of finite numbers")
    return np.array(values, float)


def _check_map_arrays(arrays: dict, cells: tuple, inits: int) -> None:
    """Raise `ValueError` unless the arrays of a saved map fit its grid (`cells`) and
    inits, and the per-cell summaries are those of its regimes (`basin_fractions`): a file
    cut or edited after it was written is refused, not shown."""
    for name, shape in (("regime", cells + (inits,)), ("failed", cells + (inits,))):
        if arrays[name].shape != shape:
            raise ValueError(f"{name} has shape {arrays[name].shape}, not {shape}")
    _check_kinds(arrays)
    if not np.array_equal(arrays["failed"], arrays["regime"] == FAILED):
        raise ValueError("failed does not match the saved regimes' FAILED codes (altered)")
    derived = basin_fractions(arrays["regime"])
    for name, want in zip(("fractions", "failed_fraction", "dominant", "multistable"), derived):
        got = arrays[name]
        if got.shape != want.shape:
            raise ValueError(f"{name} has shape {got.shape}, not {want.shape}")
        if not np.allclose(got, want, rtol=0, atol=1e-12):
            raise ValueError(f"{name} does not follow from the saved regimes (altered)")
    if "predicted" in arrays and arrays["predicted"].shape != cells:
        raise ValueError(f"predicted has shape {arrays['predicted'].shape}, not {cells}")


# The NumPy kinds `RegimeMap.save` writes: integer codes, bool flags, float fractions.
_MAP_KINDS = dict(
    regime="iu",
    failed="b",
    fractions="f",
    failed_fraction="f",
    dominant="iu",
    multistable="b",
    predicted="iu",
)


def _check_kinds(arrays: dict) -> None:
    """Raise `ValueError` unless a saved map's arrays (its axes taken out) are those `save`
    writes, of their kinds, with codes in range (what a map saved before its archive was
    hashed is checked against)."""
    unknown = sorted(set(arrays) - set(_MAP_KINDS))
    if unknown:
        raise ValueError(f"it holds arrays save never writes: {unknown}")
    for name, kinds in _MAP_KINDS.items():
        if name in arrays and arrays[name].dtype.kind not in kinds:
            raise ValueError(f"{name} is an array of {arrays[name].dtype}, not of kind {kinds!r}")
    if not _codes_in_range(arrays["regime"], NOT_RUN):
        raise ValueError(f"regime holds codes outside {NOT_RUN}..{len(REGIME_NAMES) - 1}")
    predicted = arrays.get("predicted")
    if predicted is not None and not _codes_in_range(predicted, -1):
        raise ValueError(f"predicted holds codes outside -1..{len(REGIME_NAMES) - 1}")


def _check_axes(axes: tuple) -> None:
    """Raise `ValueError` unless every axis of a saved map is a 1-D array of finite real
    values, strictly increasing (as `regime_map` requires)."""
    for name, v in axes:
        if v.ndim != 1 or v.dtype.kind not in "iuf" or not np.all(np.isfinite(v)):
            raise ValueError(f"axis {name!r} is not a 1-D array of finite real values")
        if np.any(np.diff(v) <= 0):
            raise ValueError(f"axis {name!r} is not strictly increasing")


def basin_fractions(regime) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per-cell fractions of a `cells + (K,)` array of sweep regime codes (`K >= 1` inits
    per cell; any array-like).

    **Returns:** `(fractions, failed_fraction, dominant, multistable)` as in `RegimeMap`.

    **Raises:** `TypeError` for codes that are not numbers; `ValueError` for a 0-d
    `regime` (no inits axis), `K = 0`, or a code that is not a whole number in
    `NOT_RUN .. len(REGIME_NAMES) - 1` (`REGIMES` codes, `FAILED`, `NOT_RUN`).
    """
    where = "basin_fractions"
    regime = np.asarray(regime)
    if regime.ndim == 0:
        raise ValueError(
            f"{where}: regime must have shape cells + (K,) (its last axis the K inits of a "
            f"cell), got a 0-d array {regime.item()!r}."
        )
    K = regime.shape[-1]
    if K == 0:
        raise ValueError(
            f"{where}: regime has shape {regime.shape}: no inits per cell (K = 0); each cell "
            "needs K >= 1 regime codes."
        )
    regime = _whole_codes(where, "the regime codes", regime, NOT_RUN, "FAILED, -2: NOT_RUN")
    fractions = np.stack([np.mean(regime == i, axis=-1) for i in range(len(REGIME_NAMES))], -1)
    failed_fraction = np.mean((regime == FAILED) | (regime == NOT_RUN), axis=-1)
    dominant = np.where(failed_fraction >= 1, -1, np.argmax(fractions, axis=-1))
    alive = np.maximum(1 - failed_fraction, 1 / K)
    multistable = (failed_fraction < 1) & (np.max(fractions, axis=-1) / alive < 0.9)
    return fractions, failed_fraction, dominant, multistable


def _whole_codes(where: str, what: str, codes: np.ndarray, lowest: int, below: str) -> np.ndarray:
    """`codes` as integers, checked to be whole numbers in `lowest .. len(REGIME_NAMES) - 1`
    (`below` names the meaning of the codes below 0).

    **Raises:** `TypeError` for codes that are not real numbers, `ValueError` naming `what`
    for others (fractions, NaN, out of range)."""
    if codes.dtype.kind not in "iuf":
        raise TypeError(f"{where}: {what} must be integer regime codes, got {codes.dtype}.")
    top = len(REGIME_NAMES) - 1
    bad = _bad_codes(codes, lowest)
    if bad.size:
        shown = bad[:5].tolist()
        raise ValueError(
            f"{where}: {what} must be whole numbers in {lowest}..{top} "
            f"(0..{top}: the regimes {list(REGIME_NAMES)}; -1: {below}), got {shown}."
        )
    return codes.astype(np.int64)


def _stack_cells(where, name, what, arrays, points, *, float_=True):
    """The family's `arrays` of every cell stacked on a leading axis.

    **Raises:** `ValueError` naming the family and two cells when the shapes differ (a
    family whose d changes across the map, which one sweep cannot hold)."""
    arrays = [np.asarray(a, float) if float_ else np.asarray(a) for a in arrays]
    for a, p in zip(arrays, points):
        if a.shape != arrays[0].shape:
            raise ValueError(
                f"{where}: family {name!r} returned {what} of shape {arrays[0].shape} at "
                f"{points[0]} but {a.shape} at {p}; every cell of a map must have the same "
                "shapes (one d)."
            )
    return np.stack(arrays)


def _predict_at(where, name, build, predict, base, points):
    """The family's `predict` codes at `points`, one per point.

    **Raises:** `ValueError` naming the family when `predict` does not return one whole
    code in `-1 .. len(REGIME_NAMES) - 1` per point."""
    built = [build(**{**base, **p}) for p in points]
    if not all(isinstance(b, tuple) and len(b) == 3 for b in built):
        raise ValueError(
            f"{where}: family {name!r} has a predict (A, V, beta) -> codes, but does not return "
            "(A, V, beta) at every point; a family of flow modules has no predict."
        )
    A = np.stack([np.asarray(b[0], float) for b in built])
    V = np.stack([np.asarray(b[1], float) for b in built])
    beta = np.array([float(b[2]) for b in built])
    codes = np.asarray(predict(A, V, beta))
    if codes.shape != (len(points),):
        raise ValueError(
            f"{where}: the predict of family {name!r} returned shape {codes.shape} for "
            f"{len(points)} members; expected ({len(points)},), one regime code per member."
        )
    what = f"the codes returned by the predict of family {name!r}"
    return _whole_codes(where, what, codes, -1, "no claim")


def _boundaries(where, name, build, predict, axes, fixed, resolution=161) -> list[dict]:
    """The stated theory's boundaries in axis coordinates, from its predictions on a fine
    grid: contour lines between predicted regions (2-D) or the crossing points (1-D).
    Clusters at rest and rotating clusters count as one (clustering) region; claim-free
    sets thinner than the fine grid (e.g. a saddle-node line) are not drawn as regions."""
    if predict is None:
        return []
    names = [n for n, _ in axes]
    # The fine grid spans the cells' edges, not just their centres.
    span = [
        (v[0] - (v[1] - v[0]) / 2, v[-1] + (v[-1] - v[-2]) / 2) if v.size > 1 else (v[0], v[0])
        for _, v in axes
    ]
    if len(axes) == 1:
        gx = np.linspace(*span[0], 4 * resolution + 1)
        code = _predict_at(where, name, build, predict, fixed, [{names[0]: float(x)} for x in gx])
        code = np.where(code == _ROTATING, _CLUSTERING, code)
        keep = code >= 0
        gx, code = gx[keep], code[keep]
        change = np.flatnonzero(code[1:] != code[:-1])
        xs = 0.5 * (gx[change] + gx[change + 1])
        return [dict(label="stated theory boundary", x=xs, y=None)] if xs.size else []
    import contourpy

    # Different resolutions on the two axes keep the fine grid off diagonal lines.
    gx = np.linspace(*span[0], resolution)
    gy = np.linspace(*span[1], resolution - 2)
    pts = [{names[0]: float(x), names[1]: float(y)} for y in gy for x in gx]
    code = _predict_at(where, name, build, predict, fixed, pts).reshape(gy.size, gx.size)
    code = np.where(code == _ROTATING, _CLUSTERING, code)
    steps = np.array([np.ptp(gx) / (gx.size - 1), np.ptp(gy) / (gy.size - 1)])
    values = np.unique(code)
    out: list[dict] = []
    for value in values[:-1] if values.size > 1 else []:
        gen = contourpy.contour_generator(gx, gy, (code == value).astype(float))
        for seg in gen.lines(0.5):
            if len(seg) < 2 or np.all(np.ptp(seg, axis=0) < 3 * steps):
                continue  # a dot of a thin claim-free set, not a boundary
            # Adjacent regions share their boundary: keep a curve once.
            dup = any(
                np.max(np.min(np.hypot(*(seg[:, None, :] - o[None, :, :]).T), axis=0))
                < 1.5 * steps.max()
                for o in (np.stack([b["x"], b["y"]], -1) for b in out)
            )
            if not dup:
                out.append(dict(label="stated theory boundary", x=seg[:, 0], y=seg[:, 1]))
    return out


# An axis written LO:HI:NUM has at most this many points (a typo must not fill memory).
MAX_AXIS_POINTS = 10**6


def _check_map_size(where, cells, inits, num_save):
    """Refuse a map whose cells and members would not fit in host memory, before a cell is
    built: each cell holds its parameters (about 2 KiB on the host) and each member its
    saved series (`|R₂|` and `R₂`, 24 bytes a save) and evidence (about 1 KiB)."""
    num_cells = math.prod(cells)
    need = num_cells * (2048 + inits * (24 * int(num_save) + 1024))
    free = available_memory()
    if need > free / 2:
        raise ValueError(
            f"{where}: {num_cells} cells x {inits} inits need about {need / 2**30:.2f} GiB on the "
            f"host, more than half of the {free / 2**30:.2f} GiB available; use fewer cells or "
            "inits (or map in pieces)."
        )


def regime_map(
    family: str | Family | Callable[..., Any] = "case4",
    axes: Mapping[str, Any] | Sequence[Any] | str = (("v11", np.linspace(-2, 2, 16)),),
    *,
    fixed: Mapping[str, float] | None = None,
    method: str = "particles",
    kernel: str = "lsa",
    n: int = 64,
    inits: int = 4,
    seed: int = 0,
    init: str = "disc",
    r0: float = 0.9,
    t1: float = 100.0,
    num_save: int = 201,
    integration: Integration | None = None,
    judge: Judge | None = None,
    runner: Runner | None = None,
    out_dir: str | os.PathLike | None = None,
    progress: bool = True,
) -> RegimeMap:
    r"""Map the long-run regimes of a family of flows over a 1-D or 2-D parameter grid.

    Every cell runs `inits` (K) members from different initial conditions (seeds
    `seed·K + k`, the same K in every cell: common random numbers make neighbouring
    cells comparable), through one `sweep`; the map holds each cell's basin fractions.

    **Arguments:**

    - `family`: a built-in name (`FAMILIES`: `"case1"`, `"case2"`, `"case4"`,
      `"rotating"`, `"random"`, `"entries"`), a `Family`, or any callable taking the
      parameters as keywords and returning `(A, V, beta)` or a flow module.
    - `axes`: `{name: values}` or `[(name, values), ...]` or `"name=lo:hi:num"` strings;
      one or two axes of cell centres (strictly increasing).
    - `fixed`: values of the other parameters (defaults: the family's).
    - `method`: `"particles"` (any d), `"ott_antonsen"`, `"watanabe_strogatz"` (d = 2 LSA).
    - `kernel`: for `(A, V, beta)` families, the `AttentionDynamics` kernel.
    - `n`, `inits`, `seed`, `init`, `r0`: tokens per member, initial conditions per
      cell, base seed, initial law and radius (see `Members`; the default `"disc"` law
      draws `R₂(0)` uniformly in the disc of radius `r0`, so the K inits explore the
      phase space).
    - `t1`, `num_save`: horizon (natural time units) and save points, unless
      `integration` is given; `judge`, `runner`: as in `sweep`.
    - `out_dir`: the sweep is written to `out_dir/sweep` (resumable by rerunning) and
      the map saved to `out_dir` (`RegimeMap.save`).

    **Returns:** a `RegimeMap`.

    **Raises:** `ValueError` naming the problem: an unknown family or parameter, bad
    axes, a `seed` outside `[0, largest_base_seed(inits)]` (the members' seeds must be
    sweep seeds, in [0, 2**32)), a family returning something other than `(A, V, beta)` or
    a flow module, a `Family` whose `predict` does not return one whole code in
    `-1 .. len(REGIME_NAMES) - 1` per member (or has a `predict` but builds flow modules;
    checked before the sweep runs), and every error of `sweep`.

    Source: the regimes of Li et al. (2026); basin fractions as in the multistability
    literature (fraction of initial conditions attracted to each regime).
    """
    where = "regime_map"
    name, defaults, build, predict = _family_params(family)
    axes = _axes(axes)
    fixed = dict(fixed or {})
    both = sorted(set(fixed) & {n for n, _ in axes})
    if both:
        raise ValueError(f"{where}: {both} given both as an axis and as a fixed value.")
    accepts_any = _accepts_any(build) and not isinstance(family, (str, Family))
    _check_names(where, [n for n, _ in axes] + list(fixed), defaults, accepts_any)
    inits = _check_count(where, "inits", inits)
    largest = largest_base_seed(inits)
    if not (isinstance(seed, (int, np.integer)) and 0 <= int(seed) <= largest):
        raise ValueError(
            f"{where}: seed must be an integer in [0, {largest}] with inits = {inits} (the "
            f"members' seeds seed·inits + k lie in [0, 2**32)), got {seed!r}."
        )
    base = {**defaults, **fixed}
    cells = tuple(len(v) for _, v in axes)
    saves = num_save if integration is None else integration.num_save
    _check_map_size(where, cells, inits, saves)
    grid = [dict(zip([n for n, _ in axes], pt)) for pt in np.ndindex(*cells)]
    points = [{k: float(axes[i][1][j]) for i, (k, j) in enumerate(g.items())} for g in grid]
    built = []
    for p in points:
        try:
            built.append(build(**{**base, **p}))
        except TypeError as err:
            raise ValueError(f"{where}: family {name!r} cannot be called with {p}: {err}")
    first = built[0]
    t_start = time.perf_counter()
    if runner is None:
        runner = Runner(
            out_dir=None if out_dir is None else os.path.join(os.fspath(out_dir), "sweep"),
            progress=progress,
        )
    if integration is None:
        integration = Integration(t1, num_save)
    seeds = (int(seed) * inits + np.arange(inits)).astype(np.int64)
    mkw = dict(n=n, method=method, init=init, r0=r0)
    if isinstance(first, tuple) and len(first) == 3:
        A = _stack_cells(where, name, "A", [b[0] for b in built], points)
        V = _stack_cells(where, name, "V", [b[1] for b in built], points)
        beta = np.array([float(b[2]) for b in built])
        members = attention_members(
            np.repeat(A, inits, 0),
            np.repeat(V, inits, 0),
            np.repeat(beta, inits),
            np.tile(seeds, len(built)),
            kernel=kernel,
            dtype=integration.dtype,
            **mkw,
        )
    elif isinstance(first, eqx.Module):
        stacked = jax.tree_util.tree_map(
            lambda *xs: (
                np.repeat(_stack_cells(where, name, "an array", xs, points, float_=False), inits, 0)
                if eqx.is_array_like(xs[0])
                else xs[0]
            ),
            *built,
        )
        members = Members(stacked, seeds=np.tile(seeds, len(built)), **mkw)
        kernel = getattr(first, "kernel", type(first).__name__)
    else:
        got = f"a tuple of {len(first)}" if isinstance(first, tuple) else type(first).__name__
        raise ValueError(
            f"{where}: family {name!r} must return (A, V, beta) or a flow module, got {got}."
        )
    # The stated theory's claims and boundaries come first: a predict that returns the
    # wrong shape or codes is refused before the sweep runs, never after it.
    predicted = None
    if predict is not None:
        predicted = _predict_at(where, name, build, predict, base, points).reshape(cells)
    boundaries = _boundaries(where, name, build, predict, axes, base)
    res = sweep(members, integration=integration, judge=judge, runner=runner)
    regime = res.regime.reshape(cells + (inits,))
    failed = res.failed.reshape(cells + (inits,))
    fractions, failed_fraction, dominant, multistable = basin_fractions(regime)
    out = RegimeMap(
        family=name,
        method=method,
        kernel=str(kernel),
        axes=axes,
        fixed={k: v for k, v in base.items() if k not in dict(axes)},
        inits=inits,
        regime=regime,
        failed=failed,
        fractions=fractions,
        failed_fraction=failed_fraction,
        dominant=dominant,
        multistable=multistable,
        predicted=predicted,
        boundaries=boundaries,
        seconds=time.perf_counter() - t_start,
        sweep=res,
    )
    if out_dir is not None:
        out.save(out_dir)
    return out
