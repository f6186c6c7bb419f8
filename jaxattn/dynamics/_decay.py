r"""The contraction law of a clustering flow: the spread of the token directions and its fit
by an exponential and by a power law (Post-LN against Pre-LN, Karagodin, Ge, Polyanskiy,
Rigollet, *Normalization in attention dynamics*, arXiv 2510.22026).
"""

from __future__ import annotations

import numpy as np

__all__ = ["direction_spread", "decay_fits"]


def direction_spread(xs) -> np.ndarray:
    r"""The spread of the token directions, `V(t) = 1 − |(1/n) Σ_k θ_k(t)|²` with
    `θ_k = x_k/|x_k|` (zero exactly when every token points the same way).

    Computed as the directions' variance about their mean, `(1/n) Σ_k |θ_k − θ̄|²` (equal
    to `1 − |θ̄|²` for unit `θ_k`): never negative, zero at exact consensus, and accurate far
    below `1e-16`, where `1 − |θ̄|²` is rounding. Each token is scaled by its largest
    component before normalising, so any finite nonzero radius works (1e-300 to 1e300).

    **Arguments:** `xs` real tokens of shape `(times, n, d)`, `n ≥ 1` (any radius: Pre-LN
    states too).

    **Returns:** `V` of shape `(times,)` (NumPy, float64); NaN at a save where a token is
    not finite (the tail of a failed solve).

    **Raises:** `ValueError` for another shape, `n = 0`, a complex or non-numeric dtype, or
    a zero token (no direction), naming the first such token.
    """
    xs = np.asarray(xs)
    if xs.ndim != 3 or xs.shape[1] == 0:
        raise ValueError(
            f"direction_spread: xs must have shape (times, n, d) with n >= 1, got {xs.shape}."
        )
    if not (np.issubdtype(xs.dtype, np.floating) or np.issubdtype(xs.dtype, np.integer)):
        raise ValueError(f"direction_spread: xs must be real numbers, got dtype {xs.dtype}.")
    xs = xs.astype(np.float64)
    scale = np.max(np.abs(xs), axis=-1, keepdims=True)
    zero = np.argwhere(scale[..., 0] == 0)
    if zero.size:
        t, k = (int(v) for v in zero[0])
        raise ValueError(f"direction_spread: token {k} at save {t} is zero (no direction).")
    finite = np.all(np.isfinite(xs), axis=(1, 2))
    theta = np.where(finite[:, None, None], xs, 1.0) / np.where(np.isfinite(scale), scale, 1.0)
    theta /= np.linalg.norm(theta, axis=-1, keepdims=True)
    dev = theta - np.mean(theta, axis=1, keepdims=True)
    return np.where(finite, np.mean(np.sum(dev * dev, axis=-1), axis=1), np.nan)


def _fit(x, y):
    slope, intercept = np.polyfit(x, y, 1)
    pred = slope * x + intercept
    ss_res = float(np.sum((y - pred) ** 2))
    ss_tot = float(np.sum((y - np.mean(y)) ** 2))
    return float(slope), float(intercept), 1 - ss_res / ss_tot if ss_tot > 0 else float("nan")


def decay_fits(ts, spread, *, v_hi: float = 1e-2, v_lo: float = 1e-12) -> dict:
    r"""Fit the decay law of `spread(t)` on the late window `v_lo < V < v_hi` (`t > 0`):

    - exponential `log V = a − λ t` (rate `λ`, coefficient of determination `R²`);
    - power law `log V = b − p log t` (exponent `p`, its `R²`).

    The better fit (higher `R²`) names the law: `"exponential"` or `"algebraic"`; when the
    window spans less than one decade of `V` (a constant or barely decaying spread), or `V`
    grows on it, no decay law fits and the law is `"no_decay"` (the fits are still
    reported; their `R²` is NaN for a constant spread). Near
    one cluster of the softmax flow with `A = V = I`, Post-LN deviations decay like
    `e^{−t}`, so `V ~ e^{−2t}` (`λ ≈ 2`); under Pre-LN the radius grows like `t`, the
    angular speed falls like `1/t` and `V ~ t^{−2}` (`p ≈ 2`).

    **Arguments:** `ts` `(times,)`, strictly increasing; `spread` `(times,)` (e.g.
    `direction_spread`); the window bounds `v_hi`, `v_lo`.

    **Raises:** `ValueError` if `ts` and `spread` are not 1-d of one length or `ts` is not
    strictly increasing.

    **Returns:** a dict: `points` (samples in the window) and, with at least 5 of them,
    `t_window` `(first, last)`, `exp_rate`, `exp_intercept`, `exp_r2`, `power_exponent`,
    `power_intercept`, `power_r2`, `law`.

    Source: arXiv 2510.22026 (Post-LN exponential, Pre-LN algebraic contraction).
    """
    ts = np.asarray(ts, np.float64)
    spread = np.asarray(spread, np.float64)
    if ts.shape != spread.shape or ts.ndim != 1:
        raise ValueError(
            f"decay_fits: ts and spread must be 1-d of one length, got {ts.shape} and "
            f"{spread.shape}."
        )
    if ts.size > 1 and not np.all(np.diff(ts) > 0):
        raise ValueError("decay_fits: ts must be strictly increasing.")
    window = (spread < v_hi) & (spread > v_lo) & (ts > 0)
    if window.sum() < 5:
        return dict(points=int(window.sum()))
    t, logv = ts[window], np.log(spread[window])
    lam, a, r2_exp = _fit(t, logv)
    p, b, r2_pow = _fit(np.log(t), logv)
    return dict(
        points=int(window.sum()),
        t_window=(float(t[0]), float(t[-1])),
        exp_rate=-lam,
        exp_intercept=a,
        exp_r2=r2_exp,
        power_exponent=-p,
        power_intercept=b,
        power_r2=r2_pow,
        law=(
            "no_decay"
            if np.ptp(logv) < np.log(10.0) or lam >= 0
            else "exponential"
            if r2_exp > r2_pow
            else "algebraic"
        ),
    )
