r"""The hidden Hamiltonian of the paper's Case 4 and the rotation rate of Case 3 (d = 2, LSA).

Case 4: `A = I`, `V = [[v11, v12], [−v12, −v11]]`. With `R = R₂ = x + iy` the
Ott–Antonsen field reads (β = 1; β only rescales time)

    ẋ = ½ v11 (1 − x² + 3y²) + ½ v12 y (3 + r²),     ẏ = −2 v11 x y − ½ v12 x (3 + r²),

with divergence `−3 v11 x` and `x ẋ + y ẏ = ½ v11 x (1 − r²)`. Hence `μ = (1 − r²)^{-3}`
is an integrating factor: `∇·(μ f) = μ(−3 v11 x) + 6 r (1−r²)^{-4}·(x ẋ + y ẏ)/r = 0`,
and `μ f = (β/4) J∇H` with the conserved quantity

    H(R) = (2 v11 Im R + v12 (1 + |R|²)) / (1 − |R|²)².

Derivation: integrate `∂H/∂x = −4μẏ` in `u = r²` (`∫(3+u)(1−u)^{-3}du = 2(1−u)^{-2} −
(1−u)^{-1}`); the `y`-derivative then matches `4μẋ` with no extra function of `y`.

On the circle `|R| → 1` the numerator tends to `2(v11 y + v12)`. If `|v11| < |v12|` it
keeps the sign of `v12` on the whole circle, `H → ±∞` at the boundary, the level sets are
closed curves around a centre on the axis `x = 0`: periodic orbits (Type 3). If
`|v11| > |v12|` the numerator changes sign on the circle, level sets reach the boundary
and orbits converge to the two-cluster states on it (clustering). `|v11| = |v12|` is the
saddle-node on the circle (`V` nilpotent; algebraic convergence).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx

from ._circle import _check_count, kuramoto_daido_coupling
from ._ott_antonsen import solve_ott_antonsen

__all__ = [
    "case4_hamiltonian",
    "case4_integrating_factor",
    "case4_centre",
    "case4_orbit",
    "case4_regime",
    "boundary_flow",
    "rotation_rate_on_circle",
    "measured_rotation_rate",
    "measured_period",
]


def _case4(v11, v12):
    v11 = jnp.asarray(v11, dtype=jnp.result_type(v11, float))
    v12 = jnp.asarray(v12, dtype=v11.dtype)
    A = jnp.eye(2, dtype=v11.dtype)
    V = jnp.stack([jnp.stack([v11, v12]), jnp.stack([-v12, -v11])])
    return A, V


def case4_hamiltonian(R, v11, v12):
    r"""The conserved quantity of the Case-4 Ott–Antonsen flow,
    `H(R) = (2 v11 Im R + v12 (1 + |R|²)) / (1 − |R|²)²`, for `|R| < 1`.

    Constant along every OA solution of `A = I`, `V = [[v11, v12], [−v12, −v11]]` (any β).

    **Arguments:** `R` complex (any shape), `v11`, `v12` scalars.

    **Returns:** real array of the shape of `R`; NaN where `|R| ≥ 1` (on and outside the
    circle, where `H` is not defined: it blows up at `|R| = 1`).
    """
    r2 = jnp.real(R) ** 2 + jnp.imag(R) ** 2
    inside = r2 < 1
    H = (2 * v11 * jnp.imag(R) + v12 * (1 + r2)) / jnp.where(inside, (1 - r2) ** 2, 1)
    return jnp.where(inside, H, jnp.nan)


def case4_integrating_factor(R):
    """`μ(R) = (1 − |R|²)^{-3}`: `μ · dR/dt = (β/4)(∂H/∂y − i ∂H/∂x)` for Case 4."""
    r2 = jnp.real(R) ** 2 + jnp.imag(R) ** 2
    return (1 - r2) ** -3


def case4_regime(v11, v12) -> str:
    """The Hamiltonian's verdict: `"oscillation"` if `|v11| < |v12|`, `"clustering"` if
    `|v11| > |v12|`, `"saddle_node"` on `|v11| = |v12|`."""
    a, b = abs(float(v11)), abs(float(v12))
    return "oscillation" if a < b else ("clustering" if a > b else "saddle_node")


def case4_centre(v11, v12, *, tol: float = 1e-13):
    r"""The centre of the closed orbits (`|v11| < |v12|`): the critical point of `H` on the
    axis `Re R = 0`, found by Newton's method on `h'(y) = 0`, `h(y) = H(iy)`
    (optimistix), started from `y = 0`.

    **Returns:** `(R_c, eigenvalues)`: the centre (complex) and the eigenvalues of the OA
    Jacobian there (β = 1), which are `±iω` with `ω` the small-orbit angular frequency.
    """
    v11 = float(v11)
    v12 = float(v12)
    dh = jax.grad(lambda y: case4_hamiltonian(1j * y, v11, v12))

    sol = optx.root_find(
        lambda y, _: dh(y), optx.Newton(rtol=tol, atol=tol), jnp.asarray(0.0), throw=False
    )
    Rc = 1j * sol.value
    A, V = _case4(v11, v12)
    jac = jax.jacfwd(lambda y: _oa_real(y, A, V, 1.0))(jnp.stack([0.0 * sol.value, sol.value]))
    return Rc, jnp.linalg.eigvals(jac)


def _oa_real(y, A, V, beta):
    R = y[0] + 1j * y[1]
    H, Omega = kuramoto_daido_coupling(R, A, V)
    dR = 1j * beta * Omega * R + 0.5 * beta * (H - jnp.conj(H) * R**2)
    return jnp.stack([jnp.real(dR), jnp.imag(dR)])


def measured_period(ts, R):
    """Period of a closed orbit from the upward crossings of `Im R` through its mean
    (linear interpolation), averaged over all complete periods. NaN if < 2 crossings."""
    ts = np.asarray(ts)
    s = np.imag(np.asarray(R))
    s = s - s.mean()
    up = np.flatnonzero((s[:-1] < 0) & (s[1:] >= 0))
    if up.size < 2:
        return float("nan")
    tc = ts[up] + s[up] / (s[up] - s[up + 1]) * (ts[up + 1] - ts[up])
    return float((tc[-1] - tc[0]) / (up.size - 1))


def case4_orbit(
    v11,
    v12,
    R0,
    *,
    beta: float = 1.0,
    t1: float = 60.0,
    num_save: int = 6001,
    rtol: float = 1e-11,
    atol: float = 1e-13,
):
    """Integrate the Case-4 OA flow from `R0` and measure the orbit.

    **Returns:** a dict with `ts`, `R` (complex), `H` (the Hamiltonian along the orbit),
    `H_drift` (`max |H − H(0)| / |H(0)|`), `period` (NaN unless the orbit is closed),
    `final_abs_R`.
    """
    A, V = _case4(v11, v12)
    ts = jnp.linspace(0.0, t1, num_save, dtype=A.dtype)
    sol = solve_ott_antonsen(
        A, V, R0, beta=beta, t1=t1, ts=ts, rtol=rtol, atol=atol, max_steps=1 << 20, throw=False
    )
    R, result, steps = sol.R, sol.result._value, sol.num_steps
    H = case4_hamiltonian(R, v11, v12)
    H = np.asarray(H)
    return dict(
        ts=np.asarray(ts),
        R=np.asarray(R),
        H=H,
        H_drift=float(np.max(np.abs(H - H[0])) / abs(H[0])),
        period=measured_period(ts, R) if case4_regime(v11, v12) == "oscillation" else float("nan"),
        final_abs_R=float(np.abs(np.asarray(R)[-1])),
        result=int(result),
        num_steps=int(steps),
    )


def boundary_flow(psi, A, V, beta=1.0):
    r"""Angular speed on the invariant circle `|R₂| = 1` (two antipodal clusters):
    with `R = e^{iψ}`, `dψ/dt = g(ψ) = Im(e^{−iψ} F(e^{iψ}))`, `F` the OA field.
    Zeros of `g` are two-cluster equilibria; if `g` has none the clusters rotate."""
    R = jnp.exp(1j * psi)
    H, Omega = kuramoto_daido_coupling(R, A, V)
    dR = 1j * beta * Omega * R + 0.5 * beta * (H - jnp.conj(H) * R**2)
    return jnp.imag(jnp.exp(-1j * psi) * dR)


def rotation_rate_on_circle(A, V, beta=1.0, *, num: int = 20001):
    r"""Mean angular velocity of `arg R₂` for rotating clusters (Case 3):
    `2π / ∮ dψ / g(ψ)` (trapezoid on a periodic grid of `num` angles, spectrally
    accurate). NaN when `g` changes sign (the clusters come to rest instead).

    **Raises:** `ValueError` if `num` is not an integer >= 16 (fewer angles cannot resolve
    `g`: `num = 1` gave the speed at one angle).
    """
    num = _check_count("rotation_rate_on_circle", "num", num, 16)
    psi = jnp.linspace(0.0, 2 * jnp.pi, num, endpoint=False)
    g = boundary_flow(psi, jnp.asarray(A), jnp.asarray(V), beta)
    g = np.asarray(g)
    if np.min(g) * np.max(g) <= 0:
        return float("nan")
    period = float(np.mean(1.0 / g) * 2 * np.pi)
    return 2 * np.pi / period


def measured_rotation_rate(ts, R, *, start: float = 0.5):
    """Slope of the unwrapped `arg R₂` over whole turns of the late part of a run.

    **Arguments:** `ts` increasing times, shape `(times,)`; `R` the order parameter at those
    times, shape `(times,)`; `start` the fraction of the run before the late part,
    `0 <= start < 1`.

    **Returns:** the rate in radians per unit time (negative for clockwise rotation); NaN
    when `R` is exactly 0 at a sample of the late part (its phase is undefined there).

    **Raises:** `ValueError` if `ts` and `R` are not 1-d of the same length, `ts` is not
    strictly increasing, the late part holds fewer than 2 samples, `start` is outside
    [0, 1) or a value is not finite.
    """
    where = "measured_rotation_rate"
    ts = np.asarray(ts, np.float64)
    R = np.asarray(R)
    if ts.ndim != 1 or R.shape != ts.shape:
        raise ValueError(
            f"{where}: ts and R must be 1-d of the same length, got shapes {ts.shape} and "
            f"{R.shape}."
        )
    try:
        frac = float(start)
    except (TypeError, ValueError):
        frac = float("nan")
    if not 0 <= frac < 1:
        raise ValueError(f"{where}: start must be a fraction in [0, 1), got {start!r}.")
    start = frac
    if not (np.all(np.isfinite(ts)) and np.all(np.isfinite(R))):
        raise ValueError(f"{where}: ts and R must be finite.")
    if not np.all(np.diff(ts) > 0):
        raise ValueError(f"{where}: ts must be strictly increasing.")
    ph = np.unwrap(np.angle(R))
    k0 = int(start * (len(ts) - 1))
    if len(ts) - k0 < 2:
        raise ValueError(
            f"{where}: the late part (from start = {start} of {len(ts)} samples) holds "
            f"{len(ts) - k0} sample(s); need at least 2."
        )
    if np.any(R[k0:] == 0):
        return float("nan")
    # Use the largest span that contains an integer number of turns.
    turns = np.floor(np.abs(ph[-1] - ph[k0]) / (2 * np.pi))
    if turns < 1:
        return float((ph[-1] - ph[k0]) / (ts[-1] - ts[k0]))
    target = ph[-1] - np.sign(ph[-1] - ph[k0]) * turns * 2 * np.pi
    t_at = np.interp(
        target,
        ph[k0:] if ph[-1] > ph[k0] else ph[k0:][::-1],
        ts[k0:] if ph[-1] > ph[k0] else ts[k0:][::-1],
    )
    return float((ph[-1] - target) / (ts[-1] - t_at))
