r"""Chaos in three tokens: the USA chaos candidate, its Poincaré section and exponents.

The candidate (issue 9): USA attention in d = 2 with `n = 3` tokens,
`A = [[0, 0], [−2, 1]]`, `V = [[0, 1], [−2, 0]]`, `β = 1`. Its phase space is the 3-torus of
the token angles `(θ₁, θ₂, θ₃)` (USA is not invariant under `x ↦ −x`, so angles are taken
mod 2π), and it has no continuous symmetry (`A`, `V` do not commute with rotations), so
a chaotic attractor shows one positive, one zero (flow direction) and one negative exponent.
"""

import jax
import jax.numpy as jnp
import numpy as np

from ._lyapunov import chaos_verdict, lyapunov_spectrum
from ._solve import simulate
from ._vector_field import AttentionDynamics

__all__ = ["CHAOS_CANDIDATE", "chaos_candidate", "poincare_section", "chaos_section"]

CHAOS_CANDIDATE = dict(
    A=((0.0, 0.0), (-2.0, 1.0)), V=((0.0, 1.0), (-2.0, 0.0)), beta=1.0, kernel="usa", n=3
)


def chaos_candidate(dtype=jnp.float64) -> AttentionDynamics:
    """The three-token USA chaos candidate as an `AttentionDynamics` (d = 2, n = 3 tokens
    are the caller's): `A = [[0, 0], [−2, 1]]`, `V = [[0, 1], [−2, 0]]`, `β = 1`, USA."""
    c = CHAOS_CANDIDATE
    return AttentionDynamics(
        jnp.asarray(c["A"], dtype), jnp.asarray(c["V"], dtype), beta=c["beta"], kernel="usa"
    )


def poincare_section(ts, theta, *, index: int = 0, phase: float = 0.0, direction: int = -1):
    r"""Points of a Poincaré section of a flow on a torus of angles.

    The section is `Σ = {θ_index ≡ phase (mod 2π)}`, crossed in the sense `direction`
    (`−1`: `θ_index` decreasing through `phase`, `+1`: increasing). Between consecutive save
    times where the unwrapped `θ_index − phase` passes a multiple of 2π in that sense, the
    other angles are interpolated linearly (error O(Δt²) for save step Δt) and returned
    wrapped into `[−π, π)`.

    **Arguments:** `ts` `(times,)`; `theta` `(times, n)` angles (radians, any branch; they
    are unwrapped along time); `index` the angle that defines the section; `phase`;
    `direction` ±1.

    **Returns:** `(t_cross, points)`: crossing times `(m,)` and the other `n − 1` angles
    `(m, n − 1)` at the crossings.

    **Raises:** `ValueError` for mismatched shapes, a bad `index` or `direction`.
    """
    ts = np.asarray(ts, np.float64)
    theta = np.asarray(theta, np.float64)
    if theta.ndim != 2 or ts.shape != (theta.shape[0],):
        raise ValueError(
            f"poincare_section: need ts (times,) and theta (times, n), got {ts.shape} and "
            f"{theta.shape}."
        )
    n = theta.shape[1]
    if not 0 <= index < n:
        raise ValueError(f"poincare_section: index must be in [0, {n}), got {index}.")
    if direction not in (-1, 1):
        raise ValueError(f"poincare_section: direction must be -1 or +1, got {direction}.")
    un = np.unwrap(theta, axis=0)
    s = (un[:, index] - phase) / (2 * np.pi)
    a, b = s[:-1], s[1:]
    if direction > 0:
        hit = np.floor(b) > np.floor(a)
        level = np.floor(b)
    else:
        hit = np.floor(a) > np.floor(b)
        level = np.floor(a)
    i = np.nonzero(hit)[0]
    w = (level[i] - a[i]) / (b[i] - a[i])
    others = [j for j in range(n) if j != index]
    pts = un[i][:, others] * (1 - w[:, None]) + un[i + 1][:, others] * w[:, None]
    t = ts[i] * (1 - w) + ts[i + 1] * w
    return t, np.mod(pts + np.pi, 2 * np.pi) - np.pi


def chaos_section(*, quick: bool, seed: int = 0) -> dict:
    r"""The numbers of the atlas section "Chaos in three tokens".

    For `K` random initial angles (uniform on the 3-torus, from `seed`; `K = 2` quick, 4
    full) the Lyapunov spectrum (`k = 3`, all exponents) of the candidate over `[0, T]`
    (`T = 400` quick, 4000 full; 10 % transient; renormalisation every `Δ = 2`), the chaos
    verdict (`chaos_verdict`: `λ₁ > 3σ₁` and `λ₁ > 10⁻³`), and, for the first start, a
    trajectory saved every 0.02 and its Poincaré section `θ₁ ≡ 0 (mod 2π)` crossed in the
    sense of `θ₁`'s mean motion after the transient (decreasing in the runs we made: the
    tokens turn clockwise on average).

    **Returns:** a dict with
    `flow` (A, V, beta, kernel), `t1`, `transient`, `num_renorm`, `theta0` `(K, 3)`,
    `exponents` `(K, 3)`, `uncertainty` `(K, 3)`, `chaotic` `(K,)` bool, `margin` `(K,)`,
    `sum` `(K,)` (λ₁ + λ₂ + λ₃, the mean divergence), `successful` `(K,)`, `num_steps` `(K,)`,
    `times` `(num_renorm,)` and `history` `(num_renorm, 3)` (running estimates of the first
    start), `ts` `(times,)`, `theta` `(times, 3)` (angles of the first start, unwrapped),
    `poincare` `(m, 2)` (`θ₂, θ₃` in `[−π, π)` at the crossings), `poincare_times` `(m,)`,
    `section` (a sentence defining the section), `seconds`.
    """
    import time

    start = time.perf_counter()
    K = 2 if quick else 4
    t1 = 400.0 if quick else 4000.0
    num_renorm = int(t1 / 2)
    transient = 0.1 * t1
    rng = np.random.default_rng(seed)
    theta0 = rng.uniform(-np.pi, np.pi, size=(K, 3))
    with jax.enable_x64(True):
        field = chaos_candidate(jnp.float64)
        x0 = jnp.stack([jnp.cos(theta0), jnp.sin(theta0)], -1)
        keys = jax.random.split(jax.random.key(seed), K)

        @jax.jit
        @jax.vmap
        def run(x, key):
            return lyapunov_spectrum(
                field, x, t1=t1, k=3, num_renorm=num_renorm, transient=transient, key=key
            )

        sp = run(x0, keys)
        chaotic, ev = chaos_verdict(sp)
        t_plot = 200.0 if quick else 1000.0
        tr = simulate(
            field,
            x0[0],
            t1=t1,
            num_save=int(t1 / 0.02) + 1,
            rtol=1e-9,
            atol=1e-11,
            max_steps=2**20,
        )
        xs = np.asarray(tr.xs)
        ts = np.asarray(tr.ts)
        # concrete numbers while float64 is on
        sp = jax.tree.map(np.asarray, sp)
        chaotic, margin = np.asarray(chaotic), np.asarray(ev["margin"])
        successful, total = np.asarray(sp.result._value == 0), np.sum(sp.exponents, axis=-1)
    theta = np.unwrap(np.arctan2(xs[..., 1], xs[..., 0]), axis=0)
    keep = ts >= transient
    # cross the section in the sense of θ₁'s mean motion over the kept window
    direction = -1 if theta[keep][-1, 0] < theta[keep][0, 0] else 1
    t_cross, pts = poincare_section(ts[keep], theta[keep], index=0, phase=0.0, direction=direction)
    sense = "decreasing" if direction < 0 else "increasing"
    plot = keep & (ts <= transient + t_plot)
    return dict(
        flow=dict(
            A=np.asarray(CHAOS_CANDIDATE["A"]).tolist(),
            V=np.asarray(CHAOS_CANDIDATE["V"]).tolist(),
            beta=1.0,
            kernel="usa",
            n=3,
            d=2,
        ),
        t1=t1,
        transient=transient,
        num_renorm=num_renorm,
        theta0=theta0,
        exponents=sp.exponents,
        uncertainty=sp.uncertainty,
        chaotic=chaotic,
        margin=margin,
        sum=total,
        successful=successful,
        num_steps=sp.num_steps,
        times=sp.times[0],
        history=sp.history[0],
        ts=ts[plot],
        theta=theta[plot],
        poincare=pts,
        poincare_times=t_cross,
        section=f"θ₁ ≡ 0 (mod 2π), crossed with θ₁ {sense}; (θ₂, θ₃) in [−π, π) at the crossings",
        seconds=time.perf_counter() - start,
    )
