"""Long-run regimes of the attention flow and their classification from a finite run.

The classifier looks only at a late window of the run and uses *rates*, not levels: a run
is called clustered only if the clustering gap `1 − |R₂|²` still shrinks geometrically at
a steady rate (or has reached rounding level), and at rest only if the motion dies out
geometrically. Algebraic convergence (the saddle-node of the Case-4 family), metastable
plateaus and slowly damped oscillations therefore come out as `REGIMES.undetermined`
rather than as a guess.

Everything here is traceable: no Python control flow on values, so `classify_regime` and
`classify_order_parameter` run under `jax.jit` and `jax.vmap`, and their float evidence has
finite gradients everywhere, including at exact consensus (all tokens equal).
"""

import functools
import operator
from collections.abc import Mapping

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Complex, Float, Int

from .._warn import warn_at_caller
from ..sphere import _atan2, _sort, _step_angle, normalise
from ._lyapunov import CHAOS_CONFIDENCE, CHAOS_FLOOR
from ._solve import RESULTS, Trajectory
from ._vector_field import _WRITTEN_OUT_D, _row_sum

__all__ = [
    "REGIMES",
    "RegimeEvidence",
    "classify_regime",
    "classify_tokens",
    "classify_order_parameter",
    "regime_name",
    "clustering_gap",
    "cluster_structure",
    "default_gap_floor",
    "decision_margin",
]


class REGIMES(eqx.Enumeration):
    """The long-run regimes of the attention flow (Li et al. 2026, d = 2 LSA; used in any d).

    - `clustering`: Type 1, convergence to fixed clusters (antipodal pairs for LSA; one
      cluster for USA/SA with A = V = I); `|R₂| → 1`, `arg R₂ → const`.
    - `rotating`: Type 2, clusters that keep rotating (possibly at a non-uniform speed along
      the circle); `|R₂| → 1`, `arg R₂` keeps drifting.
    - `oscillation`: Type 3, persistent oscillation (a periodic orbit of `R₂`).
    - `interior`: convergence without clustering, `R₂` tends to a point inside the disc
      (the tokens come to rest in a spread-out configuration).
    - `chaotic`: the largest Lyapunov exponent is positive beyond its uncertainty
      (`chaos_verdict` of a `lyapunov_spectrum`). The trajectory classifiers here cannot
      see exponents and never return it; a sweep sets it only when asked to measure them.
    - `undetermined`: the horizon does not settle it (algebraic convergence near a
      bifurcation, plateau, damped or irregular motion, failed solve).
    """

    clustering = "convergent clusters (Type 1): the clusters come to rest"
    rotating = "rotating clusters (Type 2): clusters form and keep turning"
    oscillation = "oscillation (Type 3): persistent periodic motion without clustering"
    interior = "convergence without clustering: the tokens come to rest spread out"
    chaotic = "chaotic: positive largest Lyapunov exponent beyond its uncertainty"
    undetermined = "undetermined: no regime is established over the late window"


_NAMES = {int(item._value): name for name, item in REGIMES._name_to_item.items()}
_CODE = {name: value for value, name in _NAMES.items()}


def regime_name(regime) -> str | np.ndarray:
    """The short name (`"clustering"`, `"rotating"`, …) of a concrete `REGIMES` item.

    For a batched item (after `vmap`) returns a numpy array of names.
    """
    value = np.asarray(regime._value)
    if value.ndim == 0:
        return _NAMES[int(value)]
    return np.vectorize(lambda v: _NAMES[int(v)])(value)


class RegimeEvidence(eqx.Module):
    """What the classifier measured over the late window of a run.

    **Fields** (scalars; NaN where not measurable, `-1` for counts not measured):

    - `final_order`: `|R₂|` at the last time (in d > 2 its generalisation
      `ρ = sqrt((d tr Q² − 1)/(d − 1))`, `Q = XᵀX/n`, which equals `|R₂|` in d = 2).
    - `final_gap`: `1 − ρ²` at the last time (zero exactly on one antipodal pair).
    - `gap_decay`: e-folds by which the gap fell between the first and last third of the
      late window (≥ 2 plus a steady rate, or ≥ 2 ending at the floor, is read as geometric
      convergence).
    - `gap_rate_ratio`: decay rate of `log gap` over the second interval divided by that over
      the first (≈ 1 for geometric convergence, < 0.9 for algebraic `t^{-p}`).
    - `motion_decay`, `motion_rate_ratio`: the same two numbers for the motion (mean token
      speed for a trajectory, `|dR₂/dt|` for an `R₂` series).
    - `final_motion`: mean motion over the last third of the window.
    - `drift_rate`: `d arg R₂ / dt` over the last third of the window (NaN in d > 2).
    - `drift_change`: relative change of the drift rate (of the mean motion in d > 2)
      between the first and the last third of the window (small for steady rotation).
      Reported only; the rules use the motion, which is robust to non-uniform rotation.
    - `period`: mean time between up-crossings of the oscillation signal (`Re R₂` minus its
      mean, or the gap in d > 2) in the late window; NaN with fewer than two crossings.
    - `amplitude`: half the peak-to-peak range of that signal over the late window.
    - `amplitude_ratio`: peak-to-peak range in the second half of the window over that in
      the first half (≈ 1 for a sustained oscillation, < 1 if damped).
    - `num_clusters`: number of groups of final tokens within `cluster_tol` of each other.
    - `antipodal_pairs`: number of clusters that have an antipodal cluster (counted once).
    - `rotation_rate`: angular speed of the tokens over the last third of the window
      (radians per unit time; `|drift_rate|/2` for an `R₂` series).
    """

    final_order: Float[Array, ""]
    final_gap: Float[Array, ""]
    gap_decay: Float[Array, ""]
    gap_rate_ratio: Float[Array, ""]
    motion_decay: Float[Array, ""]
    motion_rate_ratio: Float[Array, ""]
    final_motion: Float[Array, ""]
    drift_rate: Float[Array, ""]
    drift_change: Float[Array, ""]
    period: Float[Array, ""]
    amplitude: Float[Array, ""]
    amplitude_ratio: Float[Array, ""]
    num_clusters: Int[Array, ""]
    antipodal_pairs: Int[Array, ""]
    rotation_rate: Float[Array, ""]

    def as_dict(self) -> dict:
        """Concrete evidence as a dict of Python numbers (for JSON summaries)."""
        out = {}
        for name in self.__dataclass_fields__:
            v = np.asarray(getattr(self, name))
            if v.ndim:
                out[name] = v.tolist()
            elif np.issubdtype(v.dtype, np.integer):
                out[name] = int(v)
            else:
                out[name] = None if not np.isfinite(v) else float(v)
        return out


# ----------------------------------------------------------------------------- helpers


def _safe_sqrt(x):
    pos = x > 0
    return jnp.where(pos, jnp.sqrt(jnp.where(pos, x, 1)), 0)


def _safe_div(a, b):
    ok = b != 0
    return jnp.where(ok, a / jnp.where(ok, b, 1), jnp.nan)


def _relative_change(a, b):
    """`|b − a| / max(|a|, |b|)`, zero (with zero gradient) when both vanish."""
    scale = jnp.maximum(jnp.abs(a), jnp.abs(b))
    ok = scale > 0
    return jnp.where(ok, jnp.abs(b - a) / jnp.where(ok, scale, 1), 0)


def _safe_angle(z):
    re, im = jnp.real(z), jnp.imag(z)
    ok = (re * re + im * im) > 0
    return jnp.where(ok, jnp.arctan2(jnp.where(ok, im, 0), jnp.where(ok, re, 1)), 0)


def _check_times(where, ts):
    """Concrete save times must be finite and strictly increasing (traced ones can't be
    checked)."""
    try:
        t = np.asarray(ts, dtype=np.float64)
    except Exception:  # traced
        return
    if not (np.all(np.isfinite(t)) and np.all(np.diff(t) > 0)):
        raise ValueError(f"{where}: ts must be finite and strictly increasing.")


def _check_order_parameter(where, R2):
    """An order parameter is complex and a mean of unit phasors, `|R₂| ≤ 1`: a real
    series (the phase is lost) or a concrete one leaving the unit disc beyond solver noise
    (a wrong normalisation) is refused. Non-finite entries are left to the classifier (a
    failed run reads undetermined; a warning when no value at all is finite); traced
    values can't be checked."""
    if not jnp.issubdtype(R2.dtype, jnp.complexfloating):
        raise ValueError(
            f"{where}: R2 must be complex, R₂ = (1/n) Σ exp(2iθ_j); got dtype {R2.dtype}."
        )
    try:
        r = np.abs(np.asarray(R2))
    except Exception:  # traced
        return
    if r.size == 0:
        return  # the window check names the missing samples
    _warn_if_nothing_finite(where, r, "R2")
    r = np.where(np.isfinite(r), r, 0.0)
    i = int(np.argmax(r))
    if r[i] > 1 + 1e-3:
        raise ValueError(
            f"{where}: |R₂| = {r[i]:.6g} > 1 at save {i}; an order parameter is a mean of "
            f"unit phasors (|R₂| ≤ 1)."
        )


def _warn_if_nothing_finite(where, values: np.ndarray, name: str) -> None:
    """Warn when a concrete series holds no finite value at all: the regime is then
    undetermined by construction, which a caller should hear (the saves a failed solve
    never reached are NaN or inf)."""
    if not np.isfinite(values).any():
        warn_at_caller(
            f"{where}: every value of {name} is NaN or inf (the saves of a solve that failed "
            "at its start?); the regime is undetermined."
        )


def _check_tokens_nonzero(where, xs):
    """Concrete tokens must have nonzero norm (they are points of the sphere, normalised
    here); traced ones can't be checked. Non-finite tokens are left to the classifier
    (with a warning when no value at all is finite)."""
    try:
        x = np.asarray(xs)
    except Exception:  # traced
        return
    if x.size:
        _warn_if_nothing_finite(where, x, "xs")
    zero = np.argwhere(np.sum(x * x, axis=-1) == 0)  # as `normalise` sees it
    if zero.size:
        t, k = (int(v) for v in zero[0])
        raise ValueError(
            f"{where}: token {k} has zero norm at save {t}, or one whose square underflows "
            f"({zero.shape[0]} such tokens in all); tokens are points of the unit sphere."
        )


def default_gap_floor(dtype) -> float:
    """Default clustering-gap floor of the classifiers: `max(sqrt(eps), 1e-6)`.

    Saved states are dense output between solver steps and jitter at the solver tolerance:
    near the circle `1 − |R₂|²` wobbles at ~2 rtol (±3e-8 at rtol 1e-8), which must read as
    "on the circle". The sweep uses `max(default_gap_floor, 10 rtol)`.
    """
    return max(float(np.sqrt(np.finfo(dtype).eps)), 1e-6)


def _positive(where, name, value, *, allow_none=False):
    """A concrete, finite, positive number (not a bool), as a float; `None` if allowed."""
    if value is None and allow_none:
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {name} must be a finite positive number, got {value!r}.")
    if isinstance(value, bool) or not (np.isfinite(v) and v > 0):
        raise ValueError(f"{where}: {name} must be a finite positive number, got {value!r}.")
    return v


def _check_classifier_settings(where, num_times, window, gap_floor, rest_tol):
    """The public classifiers' settings, refused by name (traced tolerances can't be
    checked: the atlas passes one computed under `jit`)."""
    for name, value in (("gap_floor", gap_floor), ("rest_tol", rest_tol)):
        if not isinstance(value, jax.core.Tracer):
            _positive(where, name, value, allow_none=True)
    try:
        _window_start(num_times, window)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None


def _window_start(num_times: int, window: float) -> int:
    if not 0 < window <= 1:
        raise ValueError(f"window must be in (0, 1], got {window}.")
    start = int(np.floor(num_times * (1 - window)))
    if num_times - start < 9:
        held = num_times - start
        raise ValueError(
            f"the late window holds {held} save time{'' if held == 1 else 's'}; need at "
            f"least 9 (got {num_times} time{'' if num_times == 1 else 's'} and "
            f"window={window}). Save more times (ts / num_save)."
        )
    return start


def _thirds(x):
    """Split the last axis into three (nearly) equal consecutive parts."""
    m = x.shape[-1]
    a, b = m // 3, (2 * m) // 3
    return x[..., :a], x[..., a:b], x[..., b:]


def _rate_evidence(ts, y, floor):
    """E-folds of decay of a positive series `y` (floored at `floor`) between the first and
    last third of the window, and the ratio of the later to the earlier decay rate.

    Each third is summarised by the log of its mean: exact for geometric decay (equal-length
    thirds of equally spaced samples shift by the same factor), and not thrown off by an
    oscillating series that passes close to zero, as a mean of logs would be.
    """
    t1, t2, t3 = _thirds(ts)
    floored = jnp.where(y > floor, y, floor)
    l1, l2, l3 = (jnp.log(jnp.mean(p)) for p in _thirds(floored))
    c1, c2, c3 = jnp.mean(t1), jnp.mean(t2), jnp.mean(t3)
    rate_a = _safe_div(l1 - l2, c2 - c1)
    rate_b = _safe_div(l2 - l3, c3 - c2)
    return l1 - l3, _safe_div(rate_b, rate_a)


def _crossings(ts, signal):
    """Up-crossings of zero: count, and mean period (NaN with fewer than two crossings)."""
    s0, s1 = signal[:-1], signal[1:]
    up = (s0 < 0) & (s1 >= 0)
    denom = jnp.where(up, s1 - s0, 1)
    frac = jnp.where(up, -s0 / denom, 0)
    tc = ts[:-1] + frac * (ts[1:] - ts[:-1])
    count = jnp.sum(up)
    first = jnp.min(jnp.where(up, tc, jnp.inf))
    last = jnp.max(jnp.where(up, tc, -jnp.inf))
    span = jnp.where(count >= 2, last - first, 0)
    period = jnp.where(count >= 2, span / jnp.maximum(count - 1, 1), jnp.nan)
    return count, period


def _peak_to_peak(x):
    return jnp.max(x) - jnp.min(x)


# ------------------------------------------------------------------------- the rules
# Every elementary test of the classifier: (name, quantity, comparison, threshold, kind).
# A threshold is a number or the name of a floor ("gap_floor", "motion_floor",
# "spread_floor" = 100 gap_floor). `kind` says how `decision_margin` measures the distance
# of the quantity to its threshold: "level" and "ratio" by |log(q/θ)|, "efolds" (already
# a log) by |q − θ|, "count" (crossings) through the periods held by the window.
_EFOLDS = 2.0  # e-folds across the window that read as convergence
_RULES = (
    ("at_floor", "late_gap", operator.le, "gap_floor", "level"),
    ("gap_efolds", "gap_decay", operator.ge, _EFOLDS, "efolds"),
    ("gap_rate_above", "gap_rate_ratio", operator.gt, 0.9, "ratio"),
    ("gap_rate_below", "gap_rate_ratio", operator.lt, 1.5, "ratio"),
    ("reached", "abs_final_gap", operator.le, "gap_floor", "level"),
    ("rest_level", "final_motion", operator.le, "motion_floor", "level"),
    ("motion_efolds", "motion_decay", operator.ge, _EFOLDS, "efolds"),
    ("motion_rate_above", "motion_rate_ratio", operator.gt, 0.9, "ratio"),
    ("motion_rate_below", "motion_rate_ratio", operator.lt, 1.5, "ratio"),
    ("motion_persists", "motion_decay", operator.lt, 0.25, "efolds"),
    ("spread", "min_gap", operator.gt, "spread_floor", "level"),
    ("gap_stable", "abs_gap_decay", operator.lt, 0.05, "efolds"),
    ("recurrent", "crossings", operator.ge, 3, "count"),
    ("swing", "peak_to_peak", operator.gt, "spread_floor", "level"),
    ("periodic_above", "amplitude_ratio", operator.gt, 0.7, "ratio"),
    ("periodic_below", "amplitude_ratio", operator.lt, 1 / 0.7, "ratio"),
    ("motion_steady", "abs_motion_decay", operator.lt, 0.1, "efolds"),
)


def _default_rest_tol(dtype) -> float:
    """Default `rest_tol` of the classifiers: `max(1e-5, 10 sqrt(eps))`."""
    return max(1e-5, 10 * float(np.sqrt(jnp.finfo(dtype).eps)))


def _thresholds(gap_floor, motion_floor):
    return dict(gap_floor=gap_floor, motion_floor=motion_floor, spread_floor=100 * gap_floor)


def _atoms(quantities, *, gap_floor, motion_floor) -> dict:
    """The elementary tests of `_RULES` (JAX or NumPy booleans, as the inputs are)."""
    thr = _thresholds(gap_floor, motion_floor)
    return {
        name: cmp(quantities[q], thr[t] if isinstance(t, str) else t)
        for name, q, cmp, t, _ in _RULES
    }


def _verdicts(a):
    """`(is_cluster, is_rotating, is_interior, is_oscillation)` from the tests of `_atoms`;
    the one combination of the rules, shared by the classifier (traced) and by
    `decision_margin` (NumPy)."""
    # Geometric convergence: ≥ 2 e-folds across the window at a steady rate (an algebraic
    # t^-p approach slows down, ratio < 0.9), or ≥ 2 e-folds that end at the floor (the
    # rate looks unsteady only because the series stopped at rounding level).
    clustered = a["at_floor"] | (
        a["gap_efolds"] & ((a["gap_rate_above"] & a["gap_rate_below"]) | a["reached"])
    )
    at_rest = a["rest_level"] | (
        a["motion_efolds"] & a["motion_rate_above"] & a["motion_rate_below"]
    )
    # Persistent: moving and not decaying (a slow growth, e.g. the beat of a finite-n
    # quasi-periodic orbit, is fine; an orbit leaving its amplitude band is caught by
    # `sustained`).
    persistent = ~a["rest_level"] & a["motion_persists"]
    # Sustained: a periodic signal with an undamped amplitude, or (quasi-periodic motion,
    # e.g. many incommensurate blocks in high d) a recurrent signal while the gap holds
    # still and the motion keeps a steady level.
    periodic = a["periodic_above"] & a["periodic_below"]
    steady_motion = a["gap_stable"] & a["motion_steady"]
    sustained = a["recurrent"] & a["swing"] & (periodic | steady_motion)
    is_cluster = clustered & at_rest
    is_rotating = clustered & ~at_rest & persistent
    is_interior = ~clustered & a["spread"] & a["gap_stable"] & at_rest
    is_oscillation = ~clustered & a["spread"] & ~at_rest & persistent & sustained
    return is_cluster, is_rotating, is_interior, is_oscillation


def _codes(atoms) -> np.ndarray:
    """NumPy: the `REGIMES` value decided by the tests (priority as in `_decide`)."""
    is_cluster, is_rotating, is_interior, is_oscillation = _verdicts(atoms)
    return np.select(
        [is_cluster, is_rotating, is_interior, is_oscillation],
        [_CODE[k] for k in ("clustering", "rotating", "interior", "oscillation")],
        _CODE["undetermined"],
    )


def _log_distance(q, thr):
    """`|log(q/θ)|`; infinite for `q ≤ 0` (a level at zero or a ratio of rates of
    opposite sign is as far from a positive threshold as it gets); NaN stays NaN."""
    q = np.asarray(q, np.float64)
    thr = np.asarray(thr, np.float64)
    pos = q > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.abs(np.log(np.where(pos, q, 1.0) / thr))
    return np.where(pos, d, np.where(np.isnan(q), np.nan, np.inf))


def _rule_distance(kind, q, thr, periods):
    if kind == "efolds":
        return np.abs(np.asarray(q, np.float64) - thr)
    if kind == "count":
        # `c ≥ θ` up-crossings in a window holding `x` periods: any phase gives `c ≥ θ`
        # when `x ≥ θ`, none when `x < θ − 1`; in between the phase decides (distance 0).
        x = np.asarray(periods, np.float64)
        above = _log_distance(x, thr)
        below = _log_distance(x, thr - 1)
        return np.where(x >= thr, above, np.where(x < thr - 1, below, 0.0))
    return _log_distance(q, thr)


def _series_extras(ts, gap, *, window, rest_tol, motion=None, signal=None, final_motion=None):
    """NumPy, batched over a leading axis: the window quantities `decision_margin` needs
    that `RegimeEvidence` does not hold, from the series the classifier read (`ts`
    `(batch, times)`, `gap`, and in d = 2 the motion `|dR₂/dt|` `(batch, times − 1)` and
    the signal `Re R₂`). Without the motion, the motion floor is its lower bound
    `rest_tol max(final_motion, 1/Δt)`; without the signal, crossings are left out."""
    ts = np.asarray(ts, np.float64)
    gap = np.asarray(gap, np.float64)
    start = _window_start(ts.shape[-1], window)
    gw = gap[..., start:]
    mean_dt = (ts[..., -1] - ts[..., 0]) / (ts.shape[-1] - 1)
    if motion is not None:
        motion = np.asarray(motion, np.float64)
        scale = np.max(np.where(np.isfinite(motion), motion, 0.0), axis=-1)
    else:
        scale = np.asarray(final_motion, np.float64)
    out = dict(
        motion_floor=rest_tol * np.fmax(scale, 1 / mean_dt),
        window_span=ts[..., -1] - ts[..., start],
        late_gap=np.max(np.abs(_thirds(gw)[2]), axis=-1),
        min_gap=np.min(gw, axis=-1),
    )
    if signal is not None:
        sw = np.asarray(signal, np.float64)[..., start:]
        sw = sw - np.mean(sw, axis=-1, keepdims=True)
        out["crossings"] = np.sum((sw[..., :-1] < 0) & (sw[..., 1:] >= 0), axis=-1)
    return out


def _field(evidence, name):
    if isinstance(evidence, RegimeEvidence):
        return np.asarray(getattr(evidence, name))
    return np.asarray(evidence[name])


def _chaos_override(codes, chaos):
    return codes if chaos is None else np.where(chaos, _CODE["chaotic"], codes)


def _host_rules(
    where,
    evidence,
    *,
    gap_floor,
    motion_floor,
    window_span,
    crossings=None,
    late_gap=None,
    min_gap=None,
    chaos_floor=CHAOS_FLOOR,
) -> dict:
    """NumPy: the rules' quantities, tests and decided `REGIMES` values for stored
    evidence (see `decision_margin` for the arguments and the defaults)."""
    needed = (
        "final_gap",
        "gap_decay",
        "gap_rate_ratio",
        "motion_decay",
        "motion_rate_ratio",
        "final_motion",
        "period",
        "amplitude",
        "amplitude_ratio",
    )
    try:
        ev = {k: _field(evidence, k).astype(np.float64) for k in needed}
    except (KeyError, AttributeError) as err:
        raise ValueError(f"{where}: evidence lacks the field {err}.") from None
    shape = np.broadcast_shapes(*(v.shape for v in ev.values()))
    final_gap, period = ev["final_gap"], ev["period"]
    window_span = np.asarray(window_span, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        per_window = window_span / period
    if crossings is None:
        crossings = np.where(np.isfinite(per_window), np.round(per_window), 0)
    crossings = np.asarray(crossings)
    periods = np.where((crossings >= 2) & np.isfinite(per_window), per_window, crossings + 0.5)
    q = dict(
        ev,
        late_gap=np.abs(final_gap) if late_gap is None else np.asarray(late_gap, np.float64),
        abs_final_gap=np.abs(final_gap),
        abs_gap_decay=np.abs(ev["gap_decay"]),
        abs_motion_decay=np.abs(ev["motion_decay"]),
        min_gap=final_gap if min_gap is None else np.asarray(min_gap, np.float64),
        crossings=crossings,
        peak_to_peak=2 * ev["amplitude"],
    )
    gap_floor = np.asarray(gap_floor, np.float64)
    motion_floor = np.asarray(motion_floor, np.float64)
    with np.errstate(invalid="ignore"):
        atoms = {
            k: np.broadcast_to(v, shape)
            for k, v in _atoms(q, gap_floor=gap_floor, motion_floor=motion_floor).items()
        }
    chaos = chaos_distance = None
    if not isinstance(evidence, RegimeEvidence) and {
        "lyapunov_max",
        "lyapunov_uncertainty",
    } <= set(evidence):
        lam = np.asarray(evidence["lyapunov_max"], np.float64)
        sig = np.asarray(evidence["lyapunov_uncertainty"], np.float64)
        chaos_thr = np.fmax(CHAOS_CONFIDENCE * sig, chaos_floor)
        with np.errstate(invalid="ignore"):
            chaos = np.broadcast_to(np.isfinite(lam) & (lam > chaos_thr), shape)
        chaos_distance = np.broadcast_to(_log_distance(lam, chaos_thr), shape)
    return dict(
        shape=shape,
        quantities=q,
        periods=periods,
        thresholds=_thresholds(gap_floor, motion_floor),
        atoms=atoms,
        chaos=chaos,
        chaos_distance=chaos_distance,
        regime=_chaos_override(_codes(atoms), chaos),
    )


def decision_margin(
    evidence: RegimeEvidence | Mapping[str, np.ndarray],
    *,
    gap_floor: float | np.ndarray,
    motion_floor: float | np.ndarray,
    window_span: float | np.ndarray,
    crossings: np.ndarray | None = None,
    late_gap: np.ndarray | None = None,
    min_gap: np.ndarray | None = None,
    regime: REGIMES | np.ndarray | None = None,
    chaos_floor: float | np.ndarray = CHAOS_FLOOR,
) -> tuple[np.ndarray, np.ndarray]:
    r"""How close a classification was to one of the classifier's thresholds.

    The classifiers (`classify_order_parameter`, `classify_regime`, `classify_tokens`,
    a sweep) decide a regime by a fixed combination of elementary tests, each a measured
    quantity against a threshold: the late gap against `gap_floor` (at the floor,
    reached), the gap's and the motion's e-folds against 2, 0.25, 0.1 and 0.05, their
    rate ratios against 0.9 and 1.5, the final motion against the motion floor, the
    smallest gap and the signal's swing against `100 gap_floor`, the amplitude ratio
    against 0.7 and 1/0.7, the up-crossings against 3 (and, in a sweep that measured them,
    the largest Lyapunov exponent against `max(3σ, floor)`, as `chaos_verdict`). A test is
    *deciding* if reversing it alone changes the regime. The margin is the smallest
    distance of a deciding test's quantity to its threshold:

    - levels and ratios: `|log(q/θ)|` (≈ the relative distance `|q − θ|/θ`);
    - e-fold counts (already logarithms): `|q − θ|`;
    - the crossing count `c ≥ 3`: with `x = window_span / period` periods in the window,
      `log(x/3)` above, `log(2/x)` below, and 0 for `2 ≤ x < 3`, where one crossing more
      or less depends on the phase alone (without a period, `x = c + ½`).

    All in e-folds: a margin of 0.05 means a 5 % change of one quantity (or of its
    threshold: a dtype's default floors, the horizon) reverses the decision. Runs of the
    same member in float32 and float64, or with a slightly different horizon, may decide
    differently when the margin is small (`SweepResult.near_boundary` flags margins
    below 0.05 by default: the rate ratio of an exact geometric convergence is `0.105`
    from its `0.9` threshold, so a tolerance of `0.1` or more flags it).

    Computed on the host with NumPy from the stored evidence: nothing of the compiled
    classifier changes.

    **Arguments:**

    - `evidence`: a `RegimeEvidence` (one run or a batch) or a mapping of its field names
      to arrays of a common batch shape (`SweepResult.evidence`); a mapping that also
      holds `lyapunov_max` and `lyapunov_uncertainty` adds the chaos test.
    - `gap_floor`: the gap floor the classifier used (`default_gap_floor(dtype)` if it
      was given none; a sweep: `max(default_gap_floor(dtype), 10 rtol)`).
    - `motion_floor`: the motion floor it used, `rest_tol · max(largest motion, 1/Δt)`
      (Δt the mean save interval), in the evidence's time unit.
    - `window_span`: the duration of the late window, same unit.
    - `crossings`: the up-crossings of the oscillation signal in the window; default:
      `round(window_span / period)` where a period was measured, else 0.
    - `late_gap`: the largest `|gap|` over the last third of the window; default
      `|final_gap|`.
    - `min_gap`: the smallest gap over the window; default `final_gap`.
    - `regime`: the regime the classifier decided; where the rules re-evaluated here
      decide otherwise (a quantity on a threshold to rounding, or a default above that
      is off), the margin is 0.
    - `chaos_floor`: the `floor` of `chaos_verdict`, in the evidence's inverse time unit.

    **Returns:** `(margin, rule)`: NumPy arrays of the batch shape; `margin` in e-folds
    (`inf` when no single test can change the regime, NaN for a run without a measurement,
    e.g. a failed sweep member), `rule` the name of the nearest deciding test (`""` when
    none; `"rules disagree"` for the case of `regime` above).

    **Raises:** `ValueError` if `evidence` lacks a field the rules read.

    Source: the classifier's rules (`classify_order_parameter`); the float32/float64
    disagreement it flags is item "near-boundary flag" of the project's reliability trial.
    """
    rules = _host_rules(
        "decision_margin",
        evidence,
        gap_floor=gap_floor,
        motion_floor=motion_floor,
        window_span=window_span,
        crossings=crossings,
        late_gap=late_gap,
        min_gap=min_gap,
        chaos_floor=chaos_floor,
    )
    atoms, chaos, shape = rules["atoms"], rules["chaos"], rules["shape"]
    base = rules["regime"]
    margin = np.full(shape, np.inf)
    rule = np.full(shape, "", dtype=object)

    def consider(name, pivotal, distance):
        nearer = pivotal & (np.nan_to_num(distance, nan=np.inf) < margin)
        margin[nearer] = distance[nearer]
        rule[nearer] = name

    thr, q = rules["thresholds"], rules["quantities"]
    for name, qn, _, t, kind in _RULES:
        flipped = dict(atoms, **{name: ~atoms[name]})
        distance = _rule_distance(
            kind, q[qn], thr[t] if isinstance(t, str) else t, rules["periods"]
        )
        pivotal = _chaos_override(_codes(flipped), chaos) != base
        consider(name, pivotal, np.broadcast_to(distance, shape))
    if chaos is not None:
        consider("chaotic", _chaos_override(_codes(atoms), ~chaos) != base, rules["chaos_distance"])
    if regime is not None:
        value = regime._value if isinstance(regime, REGIMES) else regime
        disagree = np.broadcast_to(np.asarray(value) != base, shape)
        margin[disagree] = 0.0
        rule[disagree] = "rules disagree"
    missing = ~np.isfinite(np.broadcast_to(rules["quantities"]["final_gap"], shape))
    margin[missing] = np.nan
    rule[missing] = ""
    return margin, rule


def _decide(
    *,
    ts,
    gap,
    motion,
    drift_change,
    signal,
    final_order,
    drift_rate,
    rotation_rate,
    num_clusters,
    antipodal_pairs,
    window,
    gap_floor,
    rest_tol,
):
    """Shared decision rules on a late window of the gap, the motion and a scalar signal."""
    dtype = gap.dtype
    if gap_floor is None:
        gap_floor = default_gap_floor(dtype)
    start = _window_start(ts.shape[0], window)
    tw, gw = ts[start:], gap[start:]
    # motion lives on the intervals between save times; use interval midpoints.
    tm = 0.5 * (ts[1:] + ts[:-1])
    mstart = max(start - 1, 0)
    tmw, mw = tm[mstart:], motion[mstart:]

    gap_decay, gap_ratio = _rate_evidence(tw, gw, gap_floor)
    motion_scale = jnp.max(jnp.where(jnp.isfinite(motion), motion, 0))
    # At rest = moving less than `rest_tol` radians per save interval, or less than
    # `rest_tol` times the largest motion seen. Dense output between the solver's (large, at
    # rest) steps jitters at the level of the solver tolerance (~1e-8 rad at rtol 1e-7),
    # which must not read as rotation.
    if rest_tol is None:
        rest_tol = _default_rest_tol(dtype)
    mean_dt = (ts[-1] - ts[0]) / (ts.shape[0] - 1)
    motion_floor = rest_tol * jnp.maximum(motion_scale, 1 / mean_dt)
    motion_decay, motion_ratio = _rate_evidence(tmw, mw, motion_floor)
    final_motion = jnp.mean(_thirds(mw)[2])
    final_gap = gw[-1]

    sw = signal[start:]
    sw = sw - jnp.mean(sw)
    count, period = _crossings(tw, sw)
    half = sw.shape[0] // 2
    p2p = _peak_to_peak(sw)
    amp_ratio = _safe_div(_peak_to_peak(sw[half:]), _peak_to_peak(sw[:half]))
    period = jnp.where(p2p > 100 * gap_floor, period, jnp.nan)
    quantities = dict(
        late_gap=jnp.max(jnp.abs(_thirds(gw)[2])),
        abs_final_gap=jnp.abs(final_gap),
        gap_decay=gap_decay,
        abs_gap_decay=jnp.abs(gap_decay),
        gap_rate_ratio=gap_ratio,
        final_motion=final_motion,
        motion_decay=motion_decay,
        abs_motion_decay=jnp.abs(motion_decay),
        motion_rate_ratio=motion_ratio,
        min_gap=jnp.min(gw),
        crossings=count,
        peak_to_peak=p2p,
        amplitude_ratio=amp_ratio,
    )
    atoms = _atoms(quantities, gap_floor=gap_floor, motion_floor=motion_floor)
    is_cluster, is_rotating, is_interior, is_oscillation = _verdicts(atoms)
    # a failed run (NaN tokens) or a broken series is undetermined, whatever the rules say
    valid = jnp.all(jnp.isfinite(gw)) & jnp.all(jnp.isfinite(mw)) & jnp.all(jnp.isfinite(sw))
    is_cluster, is_rotating, is_interior, is_oscillation = (
        valid & c for c in (is_cluster, is_rotating, is_interior, is_oscillation)
    )
    regime = REGIMES.undetermined
    regime = REGIMES.where(is_oscillation, REGIMES.oscillation, regime)
    regime = REGIMES.where(is_interior, REGIMES.interior, regime)
    regime = REGIMES.where(is_rotating, REGIMES.rotating, regime)
    regime = REGIMES.where(is_cluster, REGIMES.clustering, regime)
    evidence = RegimeEvidence(
        final_order=final_order,
        final_gap=final_gap,
        gap_decay=gap_decay,
        gap_rate_ratio=gap_ratio,
        motion_decay=motion_decay,
        motion_rate_ratio=motion_ratio,
        final_motion=final_motion,
        drift_rate=drift_rate,
        drift_change=drift_change,
        period=period,
        amplitude=0.5 * p2p,
        amplitude_ratio=amp_ratio,
        num_clusters=jnp.asarray(num_clusters, jnp.int32),
        antipodal_pairs=jnp.asarray(antipodal_pairs, jnp.int32),
        rotation_rate=rotation_rate,
    )
    return regime, evidence


def _drift(ts, phase, start):
    """Mean `d phase/dt` over the first and last thirds of the late window, and their change."""
    t1, _, t3 = _thirds(ts[start:])
    p1, _, p3 = _thirds(phase[start:])
    r1 = _safe_div(p1[-1] - p1[0], t1[-1] - t1[0])
    r3 = _safe_div(p3[-1] - p3[0], t3[-1] - t3[0])
    return r3, _relative_change(r1, r3)


def _token_motion(ts, xs):
    """Mean geodesic speed of the tokens on each save interval, shape `(times − 1,)`."""
    return jnp.mean(_step_angle(xs[1:], xs[:-1]), axis=-1) / (ts[1:] - ts[:-1])


def _tail_start(num_times: int, window: float) -> int:
    """First save of the tail whose token motion gives `rotation_rate` in d = 2: the last
    third of the save intervals from the late window on (the states before it are not read,
    except through `R₂` and the gap)."""
    mstart = max(_window_start(num_times, window) - 1, 0)
    return mstart + (2 * (num_times - 1 - mstart)) // 3


def _classify_circle(ts, R2, gap, speeds, x_last, *, window, cluster_tol, gap_floor, rest_tol):
    """The d = 2 rules from the series of `R₂` and of the gap at every save time, the
    tokens' mean speeds `speeds` on the save intervals from `_tail_start(times, window)` on
    (`_token_motion` of those saves, shape `(times − tail − 1,)`) and the last tokens
    `x_last` (unit, shape `(n, 2)`): what `classify_tokens` reads of a circle flow, so that
    a solver that gives `R₂` without the tokens (Watanabe–Strogatz) reconstructs only
    the last ones."""
    start = _window_start(ts.shape[0], window)
    phase = jnp.unwrap(_safe_angle(R2))
    drift_rate, drift_change = _drift(ts, phase, start)
    # The rules read the motion of R₂ (as classify_order_parameter does): a spread
    # configuration turning rigidly at the drift Ω (R₂ at rest inside the disc) is
    # convergence without clustering, as in the paper; the tokens' own angular speed
    # is kept as `rotation_rate`.
    dR = jnp.diff(R2)
    rule_motion = _safe_sqrt(jnp.real(dR) ** 2 + jnp.imag(dR) ** 2) / (ts[1:] - ts[:-1])
    num, pairs = cluster_structure(x_last, cluster_tol=cluster_tol)
    return _decide(
        ts=ts,
        gap=gap,
        motion=rule_motion,
        drift_change=drift_change,
        signal=jnp.real(R2),
        final_order=_safe_sqrt(jnp.real(R2[-1]) ** 2 + jnp.imag(R2[-1]) ** 2),
        drift_rate=drift_rate,
        rotation_rate=jnp.mean(speeds),
        num_clusters=num,
        antipodal_pairs=pairs,
        window=window,
        gap_floor=gap_floor,
        rest_tol=rest_tol,
    )


def _late_start(num_times: int, window: float, d: int) -> int:
    """First save whose tokens `classify_tokens` reads (besides the moment `Q`, or `R₂`
    and the gap, at every save): d = 2 the tail of `_tail_start`; d > 2 the late window
    (the first and last thirds of its token motion give `drift_change`)."""
    if d == 2:
        return _tail_start(num_times, window)
    return max(_window_start(num_times, window) - 1, 0)


def _classify_moment(ts, Q, gap, xs_late, *, window, cluster_tol, gap_floor, rest_tol):
    """The d > 2 rules from the moment `Q = XᵀX/n` (shape `(times, d, d)`) and the gap at
    every save and the unit tokens `xs_late` from `_late_start(times, window, d)` on."""
    start = _window_start(ts.shape[0], window)
    # The tokens' angular speed on the intervals the rules read (from the late window on).
    mw = _token_motion(ts[ts.shape[0] - xs_late.shape[0] :], xs_late)
    m1, _, m3 = (jnp.mean(p) for p in _thirds(mw))
    drift_change = _relative_change(m1, m3)
    # The motion of the moment Q = XᵀX/n (√2‖dQ/dt‖_F, which is |dR₂/dt| in d = 2), and
    # as oscillation signal the coordinate of Q along its largest excursion from the
    # window mean: a tokens' rigid rotation that leaves Q at rest is not motion, and an
    # orbit of Q shows up even when the clustering gap hardly changes.
    dQ = jnp.diff(Q, axis=0)
    rule_motion = np.sqrt(2) * _safe_sqrt(jnp.sum(dQ * dQ, axis=(-2, -1))) / (ts[1:] - ts[:-1])
    dev = Q - jnp.mean(Q[start:], axis=0)
    size = jnp.sum(dev * dev, axis=(-2, -1))
    direction = dev[start + jnp.argmax(size[start:])]
    norm = _safe_sqrt(jnp.sum(direction * direction))
    signal = jnp.sum(dev * direction, axis=(-2, -1)) / jnp.where(norm > 0, norm, 1)
    num, pairs = cluster_structure(xs_late[-1], cluster_tol=cluster_tol)
    return _decide(
        ts=ts,
        gap=gap,
        motion=rule_motion,
        drift_change=drift_change,
        signal=signal,
        final_order=_safe_sqrt(1 - gap[-1]),
        drift_rate=jnp.asarray(jnp.nan, gap.dtype),
        rotation_rate=jnp.mean(_thirds(mw)[2]),
        num_clusters=num,
        antipodal_pairs=pairs,
        window=window,
        gap_floor=gap_floor,
        rest_tol=rest_tol,
    )


def _token_series(x):
    """What the rules read of unit tokens `x` (shape `(..., n, d)`) at every save: the
    moment `Q = XᵀX/n` (shape `(..., d, d)`) and, in d = 2, `R₂ = mean e^{2iθ_k}` (shape
    `(...)`; None for d > 2). A sweep saves these (and the late tokens) instead of every
    token at every save."""
    Q = _moment(x)
    R2 = jnp.mean((x[..., 0] + 1j * x[..., 1]) ** 2, axis=-1) if x.shape[-1] == 2 else None
    return Q, R2


def _direction_moments(y, token_major: bool):
    """The moment `Q = (1/n) Σ_k u_k u_kᵀ` of the directions `u_k = y_k/|y_k|` of the
    tokens `y` (shape `(n, d)`, or `(d, n)` stored token-major; a zero token counts as
    zero), as the flat vector of its entries `Q_ab`, `a ≤ b` (row-major order, shape
    `(d(d+1)/2,)`): what a sweep saves of a particle member at every save time
    (`_series_from_moments` reads it). For token-major `d ≤ 4` it is one sum over the
    tokens of the row products `y_a y_b / |y|²`: no square root and no normalised copy of
    the state (that copy, its second normalisation and the separate sums for `Q` and `R₂`
    cost about 1 µs per save at n = 256, d = 2, one core). Equal to `_token_series` of the
    normalised tokens to rounding."""
    if token_major and y.shape[0] <= _WRITTEN_OUT_D:
        d = y.shape[0]
        r2 = _row_sum([y[a] * y[a] for a in range(d)])
        w = 1 / jnp.where(r2 > 0, r2, jnp.inf)
        rows = [y[a] * y[b] * w for a in range(d) for b in range(a, d)]
        return jnp.mean(jnp.stack(rows), axis=-1)
    Q = _moment(normalise(y.T if token_major else y))
    return Q[np.triu_indices(Q.shape[-1])]


def _series_from_moments(m, d: int):
    """`_token_series` (`Q`, shape `(..., d, d)`, and in d = 2 `R₂ = Q₀₀ − Q₁₁ + 2i Q₀₁`;
    None for d > 2) from `_direction_moments` vectors `m` (shape `(..., d(d+1)/2)`)."""
    a, b = np.triu_indices(d)
    Q = jnp.zeros(m.shape[:-1] + (d, d), m.dtype).at[..., a, b].set(m).at[..., b, a].set(m)
    R2 = (Q[..., 0, 0] - Q[..., 1, 1]) + 2j * Q[..., 0, 1] if d == 2 else None
    return Q, R2


def _classify_series(ts, Q, R2, xs_late, *, window, cluster_tol, gap_floor, rest_tol):
    """`classify_tokens` from what it reads: `_token_series` at every save time `ts` and
    the unit tokens `xs_late` at the saves from `_late_start(len(ts), window, d)` on."""
    gap = _gap_from_moment(Q)
    kw = dict(window=window, cluster_tol=cluster_tol, gap_floor=gap_floor, rest_tol=rest_tol)
    if Q.shape[-1] == 2:
        speeds = _token_motion(ts[ts.shape[0] - xs_late.shape[0] :], xs_late)
        regime, evidence = _classify_circle(ts, R2, gap, speeds, xs_late[-1], **kw)
    else:
        regime, evidence = _classify_moment(ts, Q, gap, xs_late, **kw)
    if xs_late.shape[-2] == 1:
        # One token is a degenerate configuration, not a cluster (`classify_tokens` warns):
        # undetermined here too, so that a sweep member reads as its solo run.
        regime = REGIMES.where(jnp.ones((), bool), REGIMES.undetermined, regime)
    return regime, evidence


# ----------------------------------------------------------------------------- public


def clustering_gap(xs: Float[Array, "... n d"]) -> Float[Array, "..."]:
    r"""The clustering gap `1 − ρ²`, with `ρ² = (d tr Q² − 1)/(d − 1)` and `Q = XᵀX / n`.

    `tr Q² = (1/n²) Σ_kj <x_k, x_j>²`, so the gap is zero exactly when all tokens lie on one
    antipodal pair `±u`, and one for the isotropic `Q = I/d`. In d = 2, `ρ = |R₂|` exactly.
    A polynomial in the tokens: smooth everywhere (finite gradients at consensus).

    **Arguments:** `xs` tokens of shape `(..., n, d)` (normalised before use).

    **Returns:** the gap, shape `(...)`.

    **Raises:** `ValueError` if `xs` has fewer than two axes or `n = 0` tokens (the gap of no
    tokens is undefined; it used to be NaN).
    """
    xs = jnp.asarray(xs)
    if xs.ndim < 2 or xs.shape[-2] == 0:
        raise ValueError(
            f"clustering_gap: xs must have shape (..., n, d) with n >= 1 tokens, got shape "
            f"{xs.shape} (n = {xs.shape[-2] if xs.ndim >= 2 else 'none'})."
        )
    return _gap_from_moment(_moment(normalise(xs)))


def _moment(x):
    """`Q = XᵀX / n` of unit tokens `x` of shape `(..., n, d)`, shape `(..., d, d)`."""
    return jnp.einsum("...ki,...kj->...ij", x, x) / x.shape[-2]


def _gap_from_moment(Q):
    d = Q.shape[-1]
    return d * (1 - jnp.sum(Q * Q, axis=(-2, -1))) / (d - 1)


def _circle_cluster_structure(x, cluster_tol):
    """d = 2: groups of sorted token angles without a gap wider than the tolerance; O(n log n)."""
    n = x.shape[0]
    tol = 2 * float(np.arcsin(min(cluster_tol / 2, 1.0)))  # chordal -> angular distance
    two_pi = 2 * jnp.pi
    phi = _sort(jnp.mod(_atan2(x[:, 1], x[:, 0]), two_pi))
    gaps = jnp.diff(jnp.concatenate([phi, phi[:1] + two_pi]))  # gap k: point k to k + 1
    breaks = gaps >= tol
    num = jnp.where(jnp.any(breaks), jnp.sum(breaks), 1)
    starts = jnp.roll(breaks, 1)  # point k opens a group when the gap before it is a break
    # Does the antipode of a group's first point fall on (or within) another group?
    target = jnp.mod(phi + jnp.pi, two_pi)
    idx = jnp.searchsorted(phi, target, method="scan_unrolled")  # the same search, unrolled
    right = jnp.where(idx < n, phi[jnp.minimum(idx, n - 1)], phi[0] + two_pi)
    left = jnp.where(idx > 0, phi[jnp.maximum(idx - 1, 0)], phi[n - 1] - two_pi)
    near = jnp.minimum(right - target, target - left) < tol
    inside = ~breaks[(idx - 1) % n]
    partnered = jnp.sum(starts & (near | inside))
    pairs = jnp.where(jnp.any(breaks), partnered // 2, 0)
    return num, pairs


def cluster_structure(
    x: Float[Array, "n d"], *, cluster_tol: float = 1e-3
) -> tuple[Int[Array, ""], Int[Array, ""]]:
    """Number of clusters and of antipodal cluster pairs of a token configuration.

    d > 2: token `k` starts a cluster if no token `j < k` is within chordal distance
    `cluster_tol` of it; a cluster has an antipodal partner if some other cluster's first
    token is within `cluster_tol` of `−x_k` (O(n²) memory). d = 2: a cluster is a run of the
    sorted angles with no gap of `cluster_tol` or more (angular distance for the chordal
    one), an antipodal pair two clusters whose first points sit within `cluster_tol` of
    each other's antipode (O(n log n), so sweeps with n = 10⁴ stay cheap). Both agree
    for tight, well-separated clusters; the d = 2 rule chains points closer than the
    tolerance, so a dense spread-out configuration counts as few wide clusters.

    **Arguments:** `x` tokens of shape `(n, d)`; `cluster_tol` a chordal distance.

    **Returns:** `(num_clusters, antipodal_pairs)` as int32 scalars (zero for NaN tokens).

    **Raises:** `ValueError` for a shape other than `(n, d)` with `d ≥ 2`, or `n = 0` (no
    tokens have no cluster structure; it used to return `(0, 0)`).
    """
    if jnp.ndim(x) != 2 or jnp.shape(x)[1] < 2:
        raise ValueError(
            f"cluster_structure: x must have shape (n, d) with d >= 2, got {jnp.shape(x)}."
        )
    if jnp.shape(x)[0] == 0:
        raise ValueError(f"cluster_structure: x has n = 0 tokens, shape {jnp.shape(x)}.")
    x = normalise(x)
    n, d = x.shape
    if d == 2:
        num, pairs = _circle_cluster_structure(x, cluster_tol)
    else:
        G = x @ x.T
        tol2 = cluster_tol**2
        near = (2 - 2 * G) < tol2
        anti = (2 + 2 * G) < tol2
        lower = jnp.tril(jnp.ones((n, n), bool), k=-1)
        leader = ~jnp.any(near & lower, axis=1)
        num = jnp.sum(leader)
        pairs = jnp.sum(leader & jnp.any(anti & lower & leader[None, :], axis=1))
    # a NaN configuration has no clusters
    ok = jnp.all(jnp.isfinite(x))
    return (
        jnp.where(ok, num, 0).astype(jnp.int32),
        jnp.where(ok, pairs, 0).astype(jnp.int32),
    )


def classify_order_parameter(
    ts: Float[Array, " times"],
    R2: Complex[Array, " times"],
    *,
    window: float = 0.5,
    gap_floor: float | None = None,
    rest_tol: float | None = None,
) -> tuple[REGIMES, RegimeEvidence]:
    r"""Classify a d = 2 run (particles or Ott–Antonsen) from its order parameter `R₂(t)`.

    With the gap `g = 1 − |R₂|²` and the motion `m = |dR₂/dt|` (finite differences) over
    the late `window` of the series:

    - `clustering` (Type 1): `g → 0` geometrically (≥ 2 e-folds at a steady rate, or down
      to rounding level) and `m → 0` geometrically;
    - `rotating` (Type 2): `g → 0` geometrically while `m` stays away from zero and does
      not decay (falls by less than 0.25 e-folds across the window);
    - `interior`: `g` constant and away from 0, `m → 0` geometrically;
    - `oscillation` (Type 3): `g` away from 0, `m` not decaying, `Re R₂` crosses its mean
      at least three times with an undamped amplitude (or, for quasi-periodic motion, with
      `g` holding still and `m` at a steady level: less than 0.1 e-folds either way);
    - otherwise `undetermined` (e.g. `1 − |R₂| ∝ t^{-p}` at a saddle-node).

    Jit-, vmap- and grad-safe (no value-dependent Python control flow; safe logs/angles).

    **Arguments:**

    - `ts`: increasing times, shape `(times,)`, ideally equally spaced.
    - `R2`: complex order parameter `R₂(t)`, shape `(times,)`.
    - `window`: fraction of the series (from the end) that is examined; it must hold at
      least 9 samples. Save densely enough to resolve the motion (≥ ~10 samples per
      rotation or oscillation period), or the drift and period estimates alias.
    - `gap_floor`: gap below which `R₂` counts as on the circle (rounding or solver
      noise); default `default_gap_floor(dtype)` = `max(sqrt(eps), 1e-6)`, above the
      ~1e-7 wobble of saved states at the solvers' default tolerances. Pass
      `10 * rtol` or more for a looser solve.
    - `rest_tol`: motion below `rest_tol` (radians, or units of `R₂`) per save interval,
      or below `rest_tol` times the largest motion, counts as rest; default
      `max(1e-5, 10 sqrt(eps))`, above the jitter of dense output at rtol ~1e-7.

    **Returns:** `(regime, evidence)`: a `REGIMES` item and a `RegimeEvidence`
    (`num_clusters` and `antipodal_pairs` are `-1`: not measurable from `R₂`).

    **Raises:** `ValueError` for mismatched shapes, concrete `ts` that are not finite and
    strictly increasing, a real-valued `R2`, a concrete `R2` with `|R₂| > 1 + 1e-3` (not a
    mean of unit phasors), or a window with fewer than 9 samples.

    Source: Li et al., *On the Diverse Dynamical Behaviors Arising in Deep Linear
    Transformers* (2026), regimes of the order parameter `R₂`.
    """
    ts = jnp.asarray(ts)
    R2 = jnp.asarray(R2)
    if ts.ndim != 1 or R2.shape != ts.shape:
        raise ValueError(
            f"classify_order_parameter: ts and R2 must be 1-d of equal length, got "
            f"ts {ts.shape} and R2 {R2.shape}."
        )
    _check_times("classify_order_parameter", ts)
    _check_classifier_settings("classify_order_parameter", ts.shape[0], window, gap_floor, rest_tol)
    _check_order_parameter("classify_order_parameter", R2)
    rdtype = jnp.real(R2).dtype
    ts = ts.astype(rdtype)
    re, im = jnp.real(R2), jnp.imag(R2)
    r2 = re * re + im * im
    gap = 1 - r2
    dt = ts[1:] - ts[:-1]
    dR = jnp.diff(R2)
    motion = _safe_sqrt(jnp.real(dR) ** 2 + jnp.imag(dR) ** 2) / dt
    phase = jnp.unwrap(_safe_angle(R2))
    start = _window_start(ts.shape[0], window)
    drift_rate, drift_change = _drift(ts, phase, start)
    final_order = _safe_sqrt(r2[-1])
    return _decide(
        ts=ts,
        gap=gap,
        motion=motion,
        drift_change=drift_change,
        signal=re,
        final_order=final_order,
        drift_rate=drift_rate,
        rotation_rate=0.5 * jnp.abs(drift_rate),
        num_clusters=-1,
        antipodal_pairs=-1,
        window=window,
        gap_floor=gap_floor,
        rest_tol=rest_tol,
    )


def classify_regime(
    trajectory: Trajectory,
    *,
    window: float = 0.5,
    cluster_tol: float = 1e-3,
    gap_floor: float | None = None,
    rest_tol: float | None = None,
) -> tuple[REGIMES, RegimeEvidence]:
    r"""Classify the long-run regime of a particle run, in any dimension d.

    The same rate-based rules as `classify_order_parameter`, applied to the clustering gap
    `g = 1 − ρ²` (`clustering_gap`; `= 1 − |R₂|²` in d = 2) and to a motion `m(t)`: in
    d = 2 the motion of the order parameter `|dR₂/dt|` (so a particle run and its
    Ott–Antonsen or Watanabe–Strogatz counterpart are judged by identical rules, and a
    spread configuration turning rigidly with `R₂` at rest is convergence without
    clustering); in d > 2 the motion of the moment `Q = XᵀX/n`, `√2 ‖dQ/dt‖_F` (which is
    `|dR₂/dt|` in d = 2). Rotation is read from a steady nonzero motion on the clustered
    state; oscillation from the periodic signal `Re R₂` (d = 2) or, in d > 2, the
    coordinate of `Q` along its largest excursion from its window mean. The tokens' mean
    angular speed between save times, `(1/n) Σ_k dist(x_k(t_i), x_k(t_{i+1})) / Δt`, is
    reported as `rotation_rate` in every d. The cluster structure of the final tokens
    (`cluster_structure`) is reported as evidence; clusters are not required to be
    antipodal (USA and SA with `A = V = I` form one cluster).

    A failed or rejected run (NaN tokens) is `undetermined`. A trajectory whose solve did
    not succeed (`trajectory.result`, e.g. `simulate(..., throw=False)` out of steps) is
    classified from what it saved, with a `UserWarning` when the result is concrete (not
    traced): its evidence describes the saved part only. A single token (`n = 1`) is
    a degenerate configuration, not a cluster (its gap is zero by definition), reported as
    `undetermined` with a `UserWarning` at trace time, whatever it does. Jit-, vmap- and
    grad-safe.

    **Arguments:**

    - `trajectory`: a `Trajectory` from `simulate` (save times equally spaced is best).
    - `window`: fraction of the save times (from the end) that is examined (≥ 9 samples).
    - `cluster_tol`: chordal distance under which final tokens count as one cluster.
    - `gap_floor`, `rest_tol`: as in `classify_order_parameter`.

    **Returns:** `(regime, evidence)`: a `REGIMES` item and a `RegimeEvidence`.

    **Raises:** `ValueError` if `trajectory` is not a `Trajectory`, its times are not strictly
    increasing, it has no tokens, a concrete token has zero norm, or the window is too short.

    Source: Li et al. (2026), regimes Type 1–3; Geshkovski et al., arXiv 2312.10794
    (clustering in any d).
    """
    if not isinstance(trajectory, Trajectory):
        raise ValueError(
            f"classify_regime: expected a Trajectory, got {type(trajectory).__name__}."
        )
    failed = _concrete_failures(trajectory.result)
    if failed:
        warn_at_caller(
            f"classify_regime: the trajectory's solve did not succeed ({failed}); it is "
            "classified from the saves it reached, and its evidence describes only those "
            "(a sweep reports such a member as failed)."
        )
    return classify_tokens(
        trajectory.ts,
        trajectory.xs,
        window=window,
        cluster_tol=cluster_tol,
        gap_floor=gap_floor,
        rest_tol=rest_tol,
    )


def _concrete_failures(result) -> str:
    """What went wrong in a concrete, unsuccessful `RESULTS` item: its message (one solve)
    or how many solves of a batch failed; `""` when it succeeded or is traced (inside
    `jit`/`vmap`: nothing to tell)."""
    if any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(result)):
        return ""
    ok = np.asarray(result == RESULTS.successful)
    if ok.all():
        return ""
    if ok.ndim == 0:
        return RESULTS[result]
    return f"{int((~ok).sum())} of {ok.size} solves"


def classify_tokens(
    ts: Float[Array, " times"],
    xs: Float[Array, "times n d"],
    *,
    window: float = 0.5,
    cluster_tol: float = 1e-3,
    gap_floor: float | None = None,
    rest_tol: float | None = None,
) -> tuple[REGIMES, RegimeEvidence]:
    r"""`classify_regime` for a bare token series: tokens `xs` of shape `(times, n, d)` at
    times `ts` of shape `(times,)` (e.g. `WatanabeStrogatzSolution.angles()` turned into
    points of the circle). Same rules, arguments, returns and errors as `classify_regime`.
    """
    where = "classify_tokens"
    ts = jnp.asarray(ts)
    xs = jnp.asarray(xs)
    if ts.ndim != 1 or xs.ndim != 3 or xs.shape[0] != ts.shape[0]:
        raise ValueError(
            f"{where}: xs must have shape (times, n, d) matching ts, got xs "
            f"{xs.shape} and ts {ts.shape}."
        )
    if xs.shape[1] < 1 or xs.shape[2] < 2:
        raise ValueError(f"{where}: need n >= 1 tokens in d >= 2, got xs of shape {xs.shape}.")
    if xs.shape[1] == 1:
        warn_at_caller(
            f"{where}: n = 1 token is a degenerate configuration (one token is not a cluster; "
            f"its clustering gap is zero by definition); the regime is reported as "
            f"undetermined."
        )
    if not jnp.issubdtype(xs.dtype, jnp.floating):
        raise ValueError(f"{where}: xs must be real floating point, got dtype {xs.dtype}.")
    _check_times(where, ts)
    _check_classifier_settings(where, ts.shape[0], window, gap_floor, rest_tol)
    _check_tokens_nonzero(where, xs)
    ts = ts.astype(xs.dtype)
    d = xs.shape[-1]
    xs = normalise(xs)
    Q, R2 = _token_series(xs)
    regime, evidence = _classify_series(
        ts,
        Q,
        R2,
        xs[_late_start(ts.shape[0], window, d) :],
        window=window,
        cluster_tol=cluster_tol,
        gap_floor=gap_floor,
        rest_tol=rest_tol,
    )
    return regime, evidence  # n = 1: undetermined (`_classify_series`; warned above)


@functools.partial(jax.jit, static_argnames=("window", "gap_floor", "rest_tol"))
def _classify_order_parameter_batch(ts, R2, *, window, gap_floor, rest_tol):
    """`classify_order_parameter` of a batch of `(ts, R2)` rows; the `REGIMES` values
    (re-judging stored series with other floors, `SweepResult.floor_sensitive`)."""

    def one(t, r):
        regime, _ = classify_order_parameter(
            t, r, window=window, gap_floor=gap_floor, rest_tol=rest_tol
        )
        return regime._value

    return jax.vmap(one)(ts, R2)
