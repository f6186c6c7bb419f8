r"""Batched runs of the attention flow over many parameters: one compiled function per
sweep shape, the batch axis sharded over every visible device, chunked with a progress
bar, written to disk chunk by chunk and resumable.

Three ways to run a member (`method=`):

- `"particles"`: the full particle flow (`simulate`), any `d`, any kernel.
- `"ott_antonsen"` (d = 2, LSA): the closed ODE for `R₂` on the wrapped-Cauchy manifold.
- `"watanabe_strogatz"` (d = 2, LSA): the exact finite-`n` reduction — three real ODEs
  (Möbius parameters `z`, `α`) plus the `n` constants `ζ_k`; `R₂(t)` equals the particle
  value to solver tolerance at a cost independent of the step count in `n`.

Lockstep. A `vmap` of an adaptive solve advances the batch in one `while_loop`: every
member pays for as many loop iterations as the slowest member takes. Two defences are
built in. (1) `time_scale="natural"` (default) integrates each member in its own time
unit `s = r t` with `r = β ‖A‖₂ ‖V‖₂` (LSA/OA/WS; the bound of the drive), which is
exactly the substitution `V → V / r` because the field is linear in `V`; every member then
covers the same number of its own time units, so step counts are alike and the regime
thresholds below are scale-free. (2) `group="pilot"` (d = 2, LSA) runs the cheap
Ott–Antonsen ODE of every member first and sorts members by its step count before
cutting the batch into chunks (`group="stiffness"` sorts by `β‖A‖‖V‖` instead), so
members of similar stiffness share a chunk. The benchmark `experiments/bench_sweep.py`
measures both.

Multi-host. After `jax.distributed.initialize()` every process calls `sweep` with the
same full parameter arrays; the batch of each chunk is laid out over `jax.devices()` (all
hosts) with `jax.make_array_from_callback`, the results are gathered with
`multihost_utils.process_allgather`, and only process 0 writes files and shows progress.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import time
from collections.abc import Callable
from typing import Any, Literal

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ..sphere import sample_uniform
from ._circle import kuramoto_daido_coupling
from ._solve import RESULTS, simulate
from ._vector_field import AttentionDynamics

__all__ = [
    "REGIME_NAMES",
    "SweepResult",
    "sweep",
    "classify_moments",
    "moment_features",
    "solve_ott_antonsen_batchable",
    "solve_watanabe_strogatz_batchable",
    "wrapped_cauchy_angles",
    "natural_rate",
    "result_message",
]

# Regime codes used by the sweep (same meaning and order as the paper's list in MATH.md).
REGIME_NAMES = (
    "convergent_clusters",  # Type 1: |R₂| → 1, arg R₂ → const
    "rotating_clusters",  # Type 2: |R₂| → 1, arg R₂ keeps turning
    "oscillation",  # Type 3: persistent oscillation
    "interior_convergence",  # convergence without clustering
    "undetermined",
)
TYPE1, TYPE2, TYPE3, INTERIOR, UNDETERMINED = range(5)

METHODS = ("particles", "ott_antonsen", "watanabe_strogatz")


def result_message(code: int) -> str:
    """The name of a `RESULTS` code (`"successful"`, `"max_steps_reached"`, ...)."""
    for name, item in RESULTS._name_to_item.items():
        if int(item._value) == int(code):
            return name
    return f"code {int(code)}"


# ---------------------------------------------------------------------------------------
# d = 2 reductions in a form that vmaps (fixed shapes, throw=False, per-member results)
# ---------------------------------------------------------------------------------------


def wrapped_cauchy_angles(key, n: int, R0, dtype=None):
    """Token angles `θ_k = φ_k / 2` with `φ` drawn from the wrapped Cauchy law whose mean
    resultant is `R0` (complex, `|R0| < 1`): `φ = arg R0 + 2 atan(((1−ρ)/(1+ρ)) tan(π(U−½)))`.

    **Returns:** angles of shape `(n,)`. Source: MATH.md, "Ott–Antonsen".
    """
    dtype = jnp.result_type(float) if dtype is None else dtype
    u = jax.random.uniform(key, (n,), dtype=dtype, minval=1e-7, maxval=1 - 1e-7)
    rho = jnp.abs(R0)
    phi = jnp.angle(R0) + 2 * jnp.arctan((1 - rho) / (1 + rho) * jnp.tan(jnp.pi * (u - 0.5)))
    return (0.5 * phi).astype(dtype)


def _to_real(z):
    return jnp.stack([jnp.real(z), jnp.imag(z)])


def _oa_rhs(t, y, args):
    A, V, beta = args
    R = y[0] + 1j * y[1]
    H, Omega = kuramoto_daido_coupling(R, A, V)
    dR = 1j * beta * Omega * R + 0.5 * beta * (H - jnp.conj(H) * R**2)
    return _to_real(dR).astype(y.dtype)


def _controller(rtol, atol):
    return diffrax.PIDController(rtol=rtol, atol=atol)


def solve_ott_antonsen_batchable(
    A,
    V,
    beta,
    R0,
    ts,
    *,
    solver: diffrax.AbstractSolver = diffrax.Tsit5(),
    rtol: float = 1e-8,
    atol: float = 1e-10,
    max_steps: int = 16384,
    adjoint: diffrax.AbstractAdjoint = diffrax.RecursiveCheckpointAdjoint(),
):
    r"""Solve the Ott–Antonsen ODE `dR/dt = iβΩ(R)R + (β/2)(H(R) − conj(H(R))R²)` from
    `R(0) = R0`, saving at `ts` (which starts at 0). Never raises: returns
    `(R(ts), result_code, num_steps)` so it can be vmapped over members.

    Source: MATH.md Part 1, "Ott–Antonsen"; Ott & Antonsen, Chaos 18 (2008).
    """
    dtype = jnp.result_type(A.dtype, float)
    y0 = _to_real(jnp.asarray(R0)).astype(dtype)
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(_oa_rhs),
        solver,
        t0=ts[0],
        t1=ts[-1],
        dt0=None,
        y0=y0,
        args=(A, V, beta),
        saveat=diffrax.SaveAt(ts=ts),
        stepsize_controller=_controller(rtol, atol),
        max_steps=max_steps,
        adjoint=adjoint,
        throw=False,
    )
    R = sol.ys[:, 0] + 1j * sol.ys[:, 1]
    return R, RESULTS.promote(sol.result)._value, sol.stats["num_steps"]


def _mobius(z, alpha, zeta):
    e = jnp.exp(1j * alpha) * zeta
    return (e + z) / (1 + jnp.conj(z) * e)


def _ws_rhs(t, y, args):
    A, V, beta, zeta_re = args
    zeta = zeta_re[0] + 1j * zeta_re[1]
    z = y[0] + 1j * y[1]
    alpha = y[2]
    R = jnp.mean(_mobius(z, alpha, zeta))
    H, Omega = kuramoto_daido_coupling(R, A, V)
    f = 0.5 * beta * H
    omega = beta * Omega
    dz = 1j * omega * z + f - jnp.conj(f) * z**2
    dalpha = omega - 2 * jnp.imag(jnp.conj(f) * z)
    return jnp.stack([jnp.real(dz), jnp.imag(dz), dalpha]).astype(y.dtype)


def solve_watanabe_strogatz_batchable(
    A,
    V,
    beta,
    theta0,
    ts,
    *,
    solver: diffrax.AbstractSolver = diffrax.Tsit5(),
    rtol: float = 1e-8,
    atol: float = 1e-10,
    max_steps: int = 16384,
):
    r"""Exact finite-`n` Watanabe–Strogatz reduction of the d = 2 LSA flow.

    With `w_k = e^{2iθ_k}`, every `w_k` obeys the same Riccati equation
    `dw/dt = f + iωw − f̄w²` (`f = βH/2`, `ω = βΩ`, MATH.md), so
    `w_k(t) = (e^{iα}ζ_k + z)/(1 + z̄ e^{iα}ζ_k)` with constants `ζ_k = w_k(0)` and

        dz/dt = iωz + f − f̄ z²,      dα/dt = ω − 2 Im(f̄ z),      z(0) = 0, α(0) = 0

    (`z` is the image of 0; `α` follows from the derivative of the Möbius map at 0).
    Three real ODEs; each right-hand side costs O(n) for `R₂ = mean w_k`.

    **Returns:** `(R₂(ts), (z, α)(ts), result_code, num_steps)`; never raises.

    Source: Watanabe & Strogatz, Physica D 74 (1994); Marvel, Mirollo & Strogatz,
    Chaos 19 (2009).
    """
    dtype = jnp.result_type(A.dtype, float)
    zeta = jnp.exp(2j * theta0)
    zeta_re = jnp.stack([jnp.cos(2 * theta0), jnp.sin(2 * theta0)]).astype(dtype)
    y0 = jnp.zeros(3, dtype)
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(_ws_rhs),
        solver,
        t0=ts[0],
        t1=ts[-1],
        dt0=None,
        y0=y0,
        args=(A, V, beta, zeta_re),
        saveat=diffrax.SaveAt(ts=ts),
        stepsize_controller=_controller(rtol, atol),
        max_steps=max_steps,
        throw=False,
    )
    z = sol.ys[:, 0] + 1j * sol.ys[:, 1]
    alpha = sol.ys[:, 2]
    R = jax.vmap(lambda zz, aa: jnp.mean(_mobius(zz, aa, zeta)))(z, alpha)
    return R, (z, alpha), RESULTS.promote(sol.result)._value, sol.stats["num_steps"]


# ---------------------------------------------------------------------------------------
# Regime classification from the second moment C = XᵀX / n (any d)
# ---------------------------------------------------------------------------------------


def moment_features(ts, *, R2=None, xs=None):
    r"""Scalar series that the regime classifier reads, for any `d`.

    From tokens `xs` (shape `(times, n, d)`): the moment `C(t) = XᵀX/n`, the order
    `o(t) = 2 λ_max(C) − 1` (= `|R₂|` in d = 2; `o = 1` iff all tokens lie on one antipodal
    pair `±u`), and the embedding `Y(t) = √2 C(t)` whose Euclidean distances equal
    `|ΔR₂|` in d = 2 (`C = ½[[1+Re R, Im R], [Im R, 1−Re R]]`). From `R2` (d = 2) the same
    series are read off `R₂` directly.

    **Returns:** `(order, Y)`: `order` shape `(times,)`, `Y` shape `(times, k)` (real).
    """
    if R2 is not None:
        return jnp.abs(R2), jnp.stack([jnp.real(R2), jnp.imag(R2)], axis=-1)
    n = xs.shape[1]
    C = jnp.einsum("tnd,tne->tde", xs, xs) / n
    lam = _top_eigenvalue(C)
    Y = math.sqrt(2) * C.reshape(C.shape[0], -1)
    return 2 * lam - 1, Y


def _top_eigenvalue(C, iterations: int = 100):
    # Power iteration (C is symmetric positive semi-definite), batched over leading axes;
    # far cheaper than a full eigendecomposition on CPU, and exact where it matters
    # (λ_max → 1 with the rest → 0 when tokens cluster). Started from the column of C
    # with the largest diagonal entry, which is not orthogonal to the top eigenvector.
    k = jnp.argmax(jnp.diagonal(C, axis1=-2, axis2=-1), axis=-1)
    v = jnp.take_along_axis(C, k[..., None, None], axis=-1)[..., 0]

    def body(_, v):
        w = jnp.einsum("...de,...e->...d", C, v)
        return w / jnp.maximum(jnp.linalg.norm(w, axis=-1, keepdims=True), 1e-30)

    v = v / jnp.maximum(jnp.linalg.norm(v, axis=-1, keepdims=True), 1e-30)
    v = jax.lax.fori_loop(0, iterations, body, v)
    return jnp.einsum("...d,...de,...e->...", v, C, v)


def classify_moments(
    ts,
    order,
    Y,
    *,
    cluster_tol: float = 2e-2,
    velocity_tol: float = 1e-3,
    amplitude_tol: float = 1e-3,
    persistence: float = 0.8,
):
    r"""Classify the long-run regime from the order series and the moment path (jit/vmap safe).

    Reads the last half of the run, split into quarters Q3 and Q4:

    - clustered: `min_{Q4} o > 1 − cluster_tol` and `o` not decreasing across Q4;
      then rotating (Type 2) if the moment keeps moving (`v₄ > velocity_tol`, `v` the
      mean speed `|dY/dt|` over Q4), else convergent clusters (Type 1);
    - not clustered: if `v₄ < velocity_tol` the state is at rest: Type 1 if
      `o_end > 1 − cluster_tol`, else interior convergence; oscillation (Type 3)
      if the excursion `s₄ = max_{Q4} |Y − Y(t_end)| > amplitude_tol` and it does not
      decay (`s₄ > persistence · s₃`); otherwise undetermined (slow transient).

    Thresholds are per unit of the member's time: with the sweep's natural time scale
    they are scale-free.

    **Returns:** `(regime, evidence)` with `evidence` a dict of scalars: `order_final`,
    `phase_velocity` (`v₄ / o`, = |d arg R₂/dt| for d = 2 clusters), `speed`,
    `oscillation_amplitude` (`s₄`), `period` (from mean crossings of `|Y − Y_end|`,
    NaN when fewer than 3 crossings).
    """
    T = ts.shape[0]
    h = T // 2
    q = T // 4
    dt = jnp.diff(ts)
    speed = jnp.linalg.norm(jnp.diff(Y, axis=0), axis=-1) / dt
    v4 = jnp.mean(speed[T - 1 - q :])
    o = order
    o_end = o[-1]
    clustered = (jnp.min(o[T - q :]) > 1 - cluster_tol) & (o_end >= o[T - q] - 0.25 * cluster_tol)
    dist_end = jnp.linalg.norm(Y - Y[-1], axis=-1)
    s4 = jnp.max(dist_end[T - q :])
    mid = T - q - 1
    s3 = jnp.max(jnp.linalg.norm(Y[T - 2 * q : T - q] - Y[mid], axis=-1))
    oscill = (s4 > amplitude_tol) & (s4 > persistence * s3) & (v4 > velocity_tol)
    at_rest = jnp.where(o_end > 1 - cluster_tol, TYPE1, INTERIOR)
    regime = jnp.where(
        clustered,
        jnp.where(v4 > velocity_tol, TYPE2, TYPE1),
        jnp.where(v4 < velocity_tol, at_rest, jnp.where(oscill, TYPE3, UNDETERMINED)),
    )
    # Period from the crossings of the window mean by |Y − Y_end| over the last half.
    sig = dist_end[h:]
    tw = ts[h:]
    sig = sig - jnp.mean(sig)
    cross = (sig[:-1] < 0) & (sig[1:] >= 0)
    frac = sig[:-1] / jnp.where(cross, sig[:-1] - sig[1:], 1.0)
    tc = tw[:-1] + frac * jnp.diff(tw)
    k = jnp.sum(cross)
    t_first = jnp.min(jnp.where(cross, tc, jnp.inf))
    t_last = jnp.max(jnp.where(cross, tc, -jnp.inf))
    period = jnp.where(k >= 3, (t_last - t_first) / jnp.maximum(k - 1, 1), jnp.nan)
    period = jnp.where((regime == TYPE2) | (regime == TYPE3), period, jnp.nan)
    bad = ~jnp.all(jnp.isfinite(o)) | ~jnp.all(jnp.isfinite(Y))
    regime = jnp.where(bad, UNDETERMINED, regime).astype(jnp.int32)
    evidence = dict(
        order_final=o_end,
        phase_velocity=v4 / jnp.maximum(o_end, 1e-3),
        speed=v4,
        oscillation_amplitude=s4,
        period=period,
    )
    return regime, evidence


# ---------------------------------------------------------------------------------------
# One member, and one compiled chunk
# ---------------------------------------------------------------------------------------


def natural_rate(A, V, beta, kernel: str = "lsa", score_shift=0.0):
    r"""The member's own rate `r`: a bound of `|dx/dt|` on the sphere.

    LSA: `β ‖A‖₂ ‖V‖₂`; USA: `‖V‖₂ exp(β‖A‖₂ − score_shift)`; SA: `‖V‖₂`. Integrating in
    `s = r t` is the substitution `V → V/r` (the field is linear in `V`).
    """
    nA = jnp.linalg.norm(A, ord=2)
    nV = jnp.linalg.norm(V, ord=2)
    if kernel == "lsa":
        r = jnp.abs(beta) * nA * nV
    elif kernel == "usa":
        r = nV * jnp.exp(jnp.abs(beta) * nA - score_shift)
    else:
        r = nV
    return jnp.where(jnp.isfinite(r) & (r > 0), r, 1.0)


@dataclasses.dataclass(frozen=True)
class _Config:
    method: str
    kernel: str
    n: int
    d: int
    t1: float
    num_save: int
    natural: bool
    r0: float
    init: str
    rtol: float
    atol: float
    max_steps: int
    score_shift: float
    score_shift_auto: bool
    cluster_tol: float
    velocity_tol: float
    amplitude_tol: float


def _member(A, V, beta, seed, cfg: _Config):
    dtype = A.dtype
    if cfg.score_shift_auto:
        # USA: the smallest shift that keeps exp(β σ_max(A) − shift) ≤ sqrt(largest float).
        bound = jnp.abs(beta) * jnp.linalg.norm(jnp.where(jnp.isfinite(A), A, 0), ord=2)
        shift = jnp.maximum(bound - 0.5 * math.log(float(jnp.finfo(dtype).max)), 0.0)
    else:
        shift = jnp.asarray(cfg.score_shift, dtype)
    ts = jnp.linspace(0.0, cfg.t1, cfg.num_save, dtype=dtype)
    key = jax.random.key(seed)
    k_phase, k_tokens = jax.random.split(key)
    R0 = cfg.r0 * jnp.exp(2j * jnp.pi * jax.random.uniform(k_phase, (), dtype=dtype))
    x0 = theta0 = None
    if cfg.method != "ott_antonsen":
        if cfg.d == 2 and cfg.init == "wrapped_cauchy":
            theta0 = wrapped_cauchy_angles(k_tokens, cfg.n, R0, dtype)
            x0 = jnp.stack([jnp.cos(theta0), jnp.sin(theta0)], axis=-1)
        else:
            x0 = sample_uniform(k_tokens, cfg.n, cfg.d, dtype=dtype)
            theta0 = jnp.arctan2(x0[:, 1], x0[:, 0])
    if not cfg.natural:
        rate = jnp.asarray(1.0, dtype)
    elif cfg.kernel == "lsa":
        rate = natural_rate(A, V, beta, "lsa").astype(dtype)
    else:
        # USA / SA: the bound ‖V‖ e^{β σ_max(A)} overstates typical speeds by orders of
        # magnitude; use ‖V‖₂ times the largest initial weight mass (1/n) Σ_j w_kj.
        f0 = AttentionDynamics(A, V, beta=beta, kernel=cfg.kernel, score_shift=shift)
        xs0 = jnp.where(jnp.isfinite(x0), x0, 0)
        s0 = f0.scores(xs0)
        mass = jnp.max(jnp.mean(jnp.exp(s0 - shift), axis=1)) if cfg.kernel == "usa" else 1.0
        r = jnp.linalg.norm(jnp.where(jnp.isfinite(V), V, 0), ord=2) * mass
        rate = jnp.where(jnp.isfinite(r) & (r > 0), r, 1.0).astype(dtype)
    Vs = V / rate
    R2 = None
    if cfg.method == "ott_antonsen":
        R2, result, steps = solve_ott_antonsen_batchable(
            A, Vs, beta, R0, ts, rtol=cfg.rtol, atol=cfg.atol, max_steps=cfg.max_steps
        )
        order, Y = moment_features(ts, R2=R2)
    else:
        if cfg.method == "watanabe_strogatz":
            R2, _, result, steps = solve_watanabe_strogatz_batchable(
                A, Vs, beta, theta0, ts, rtol=cfg.rtol, atol=cfg.atol, max_steps=cfg.max_steps
            )
            order, Y = moment_features(ts, R2=R2)
        else:
            field = AttentionDynamics(A, Vs, beta=beta, kernel=cfg.kernel, score_shift=shift)
            traj = simulate(
                field,
                x0,
                t1=cfg.t1,
                ts=ts,
                rtol=cfg.rtol,
                atol=cfg.atol,
                max_steps=cfg.max_steps,
                throw=False,
            )
            result, steps = traj.result._value, traj.num_steps
            if cfg.d == 2:
                zc = traj.xs[..., 0] + 1j * traj.xs[..., 1]
                R2 = jnp.mean(zc**2, axis=-1)
                order, Y = moment_features(ts, R2=R2)
            else:
                order, Y = moment_features(ts, xs=traj.xs)
    regime, ev = classify_moments(
        ts,
        order,
        Y,
        cluster_tol=cfg.cluster_tol,
        velocity_tol=cfg.velocity_tol,
        amplitude_tol=cfg.amplitude_tol,
    )
    failed = (result != 0) | ~jnp.all(jnp.isfinite(order))
    regime = jnp.where(failed, UNDETERMINED, regime)
    out = dict(
        regime=regime.astype(jnp.int32),
        result=jnp.asarray(result, jnp.int32),
        failed=failed,
        num_steps=jnp.asarray(steps, jnp.int32),
        rate=rate,
        order=order,
        R2=(jnp.full(ts.shape, jnp.nan, dtype) * (1 + 0j)) if R2 is None else R2,
        order_final=ev["order_final"],
        # Rates are returned per unit of physical time.
        phase_velocity=ev["phase_velocity"] * rate,
        speed=ev["speed"] * rate,
        oscillation_amplitude=ev["oscillation_amplitude"],
        period=ev["period"] / rate,
    )
    return out


@eqx.filter_jit
@eqx.debug.assert_max_traces(max_traces=None)  # counts traces; tests read the count
def _sweep_chunk(A, V, beta, seed, cfg: _Config):
    return jax.vmap(lambda a, v, b, s: _member(a, v, b, s, cfg))(A, V, beta, seed)


def num_traces() -> int:
    """How many times the compiled chunk function has been traced (for tests)."""
    return eqx.debug.get_num_traces(_sweep_chunk)


# ---------------------------------------------------------------------------------------
# Results container
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class SweepResult:
    """Per-member outcome of a sweep (NumPy arrays on the host, batch axis first).

    **Fields:** `A` `(batch, d, d)`, `V` `(batch, d, d)`, `beta` `(batch,)`, `seed`
    `(batch,)`; `regime` `(batch,)` (codes into `REGIME_NAMES`); evidence
    `order_final`, `phase_velocity`, `speed`, `oscillation_amplitude`, `period`
    (physical time units); `result` (a `RESULTS` code), `failed` (bool), `num_steps`,
    `rate` (the member's natural rate, 1 when `time_scale="physical"`); `order`
    `(batch, times)` (`|R₂|` in d = 2, `2λ_max(C) − 1` otherwise), `R2` `(batch, times)`
    complex (NaN when d > 2), `ts` `(batch, times)` physical save times; `shape` the
    cartesian shape (or `(batch,)`), `seconds` the wall time of the computed chunks.
    """

    A: np.ndarray
    V: np.ndarray
    beta: np.ndarray
    seed: np.ndarray
    regime: np.ndarray
    result: np.ndarray
    failed: np.ndarray
    num_steps: np.ndarray
    rate: np.ndarray
    order: np.ndarray
    R2: np.ndarray
    order_final: np.ndarray
    phase_velocity: np.ndarray
    speed: np.ndarray
    oscillation_amplitude: np.ndarray
    period: np.ndarray
    ts: np.ndarray
    shape: tuple
    seconds: float = 0.0
    chunks_computed: int = 0
    chunks_loaded: int = 0

    @property
    def regime_names(self) -> np.ndarray:
        return np.asarray(REGIME_NAMES, dtype=object)[self.regime]

    def counts(self) -> dict:
        """Number of members per regime name (plus `failed`)."""
        c = {name: int(np.sum(self.regime == i)) for i, name in enumerate(REGIME_NAMES)}
        c["failed"] = int(np.sum(self.failed))
        return c

    def failures(self) -> list[dict]:
        """Each failed member with its parameters and the reason."""
        out = []
        for i in np.flatnonzero(self.failed):
            out.append(
                dict(
                    index=int(i),
                    reason=result_message(int(self.result[i])) if self.result[i] else "non-finite",
                    A=self.A[i].tolist(),
                    V=self.V[i].tolist(),
                    beta=float(self.beta[i]),
                    seed=int(self.seed[i]),
                )
            )
        return out

    def reshape(self, field: str) -> np.ndarray:
        """A per-member field in the cartesian shape of the sweep."""
        x = getattr(self, field)
        return x.reshape(tuple(self.shape) + x.shape[1:])


_FIELDS = (
    "regime",
    "result",
    "failed",
    "num_steps",
    "rate",
    "order",
    "R2",
    "order_final",
    "phase_velocity",
    "speed",
    "oscillation_amplitude",
    "period",
)


# ---------------------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------------------


def _as_stack(x, name, d=None):
    x = np.asarray(x)
    if x.ndim == 2:
        x = x[None]
    if x.ndim != 3 or x.shape[1] != x.shape[2]:
        raise ValueError(f"sweep: {name} must have shape (d, d) or (batch, d, d), got {x.shape}.")
    if d is not None and x.shape[1] != d:
        raise ValueError(f"sweep: {name} is {x.shape[1]}×{x.shape[2]} but A is {d}×{d}.")
    return x


def _devices_mesh():
    devices = np.array(jax.devices())
    return Mesh(devices, ("batch",)), len(devices)


def _put(x, sharding):
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])


def _fetch(tree):
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        tree = multihost_utils.process_allgather(tree, tiled=True)
    return jax.tree_util.tree_map(np.asarray, tree)


def _atomic_write(path, write):
    tmp = path + ".tmp"
    write(tmp)
    os.replace(tmp, path)


def sweep(
    A,
    V,
    beta=1.0,
    seeds=0,
    *,
    method: Literal["particles", "ott_antonsen", "watanabe_strogatz"] = "particles",
    kernel: Literal["lsa", "usa", "sa"] = "lsa",
    batching: Literal["cartesian", "flat"] = "flat",
    n: int = 256,
    t1: float = 100.0,
    num_save: int = 201,
    time_scale: Literal["natural", "physical"] = "natural",
    group: Literal["auto", "pilot", "stiffness", "none"] = "auto",
    r0: float = 0.1,
    init: Literal["wrapped_cauchy", "uniform"] = "wrapped_cauchy",
    score_shift: float | Literal["auto"] = 0.0,
    rtol: float = 1e-7,
    atol: float = 1e-9,
    max_steps: int = 16384,
    chunk_size: int | None = 1024,
    out_dir: str | os.PathLike | None = None,
    resume: bool = True,
    progress: bool = True,
    dtype=None,
    cluster_tol: float = 2e-2,
    velocity_tol: float = 1e-3,
    amplitude_tol: float = 1e-3,
    on_chunk: Callable[[int, dict], Any] | None = None,
) -> SweepResult:
    r"""Run the attention flow for a batch of parameters and classify each member's regime.

    The members are `(A_i, V_i, β_i, seed_i)`. With `batching="flat"` the four inputs are
    broadcast against each other along the batch axis; with `batching="cartesian"` every
    combination is run (`shape = (nA, nV, nβ, nseeds)`). Each member starts from tokens
    drawn with `jax.random.key(seed)`: in d = 2 (with `init="wrapped_cauchy"`) a
    wrapped-Cauchy sample with `R₂(0) = r0 e^{iψ}` (random phase `ψ`), the same `R₀` the
    OA method starts from; otherwise uniform on the sphere.

    All members of a chunk are solved by one `vmap` inside one compiled function (one
    compilation per chunk shape and configuration); the chunk's batch axis is sharded
    over all visible devices (`NamedSharding` over a 1-D mesh named `"batch"`, the chunk
    padded to a multiple of the device count). Failing members (`max_steps`, non-finite
    input, NaN) are flagged (`failed`, `result`, `failures()`) and do not affect others:
    every member equals its solo run.

    **Arguments:**

    - `A`, `V`: shape `(d, d)` or `(batch, d, d)`.
    - `beta`: scalar or `(batch,)`; `seeds`: int or `(batch,)` ints.
    - `method`: `"particles"` (any d, any kernel), `"ott_antonsen"` or
      `"watanabe_strogatz"` (d = 2, LSA).
    - `t1`: horizon, in each member's natural time unit when `time_scale="natural"`
      (time `s = r t`, `r = natural_rate(...)`), else physical time.
    - `group`: how members are ordered before the batch is cut into chunks (results are
      returned in the input order): `"pilot"` (d = 2 LSA) by the step counts of an
      Ott–Antonsen pilot sweep of the same members (≈ 1000× cheaper), `"stiffness"` by the
      predicted cost `β‖A‖‖V‖·t1` (physical time), `"none"`; `"auto"` = `"pilot"` where
      it applies, else `"stiffness"`. With chunks of similar step counts the lockstep of
      `vmap` costs little.
    - `chunk_size`: members per compiled call (rounded up to a multiple of the device
      count); `None` = all at once.
    - `out_dir`: if given, each finished chunk is written there (`chunk_XXXXX.npz` +
      `.json`, plus `manifest.json`); with `resume=True` chunks already there (same
      sweep, checked by fingerprint) are loaded instead of recomputed.
    - `on_chunk(i, info)`: called after each chunk is finished and written.
    - `score_shift`: USA only, the constant subtracted from every score (a time
      rescaling by `e^{score_shift}`, see `AttentionDynamics`); `"auto"` uses, per
      member, the smallest shift with `β σ_max(A) − shift ≤ ½ log(largest float)` (zero
      unless the scores on the sphere could overflow `exp`).
    - natural time for USA/SA uses the rate `‖V‖₂ · max_k (1/n) Σ_j w_kj(x₀)` (USA) or
      `‖V‖₂` (SA) of each member (the bound `‖V‖ e^{β σ_max(A)}` overstates typical
      speeds by orders of magnitude).
    - `rtol, atol, max_steps`: forwarded to the solver.
    - classifier thresholds: see `classify_moments`.

    **Returns:** a `SweepResult`.

    **Raises:** `ValueError` for inconsistent shapes, an unknown method/kernel, a reduced
    method with `d ≠ 2` or a kernel other than LSA, and for an `out_dir` holding a
    different sweep.
    """
    if method not in METHODS:
        raise ValueError(f"sweep: method must be one of {METHODS}, got {method!r}.")
    if kernel not in ("lsa", "usa", "sa"):
        raise ValueError(f"sweep: kernel must be 'lsa', 'usa' or 'sa', got {kernel!r}.")
    if batching not in ("cartesian", "flat"):
        raise ValueError(f"sweep: batching must be 'cartesian' or 'flat', got {batching!r}.")
    if time_scale not in ("natural", "physical"):
        raise ValueError(f"sweep: time_scale must be 'natural' or 'physical', got {time_scale!r}.")
    A = _as_stack(A, "A")
    d = A.shape[1]
    V = _as_stack(V, "V", d)
    beta = np.atleast_1d(np.asarray(beta))
    seeds = np.atleast_1d(np.asarray(seeds)).astype(np.int64)
    if beta.ndim != 1 or seeds.ndim != 1:
        raise ValueError(
            f"sweep: beta and seeds must be scalars or 1-d, got shapes {beta.shape}, {seeds.shape}."
        )
    if method != "particles" and (d != 2 or kernel != "lsa"):
        raise ValueError(
            f"sweep: method={method!r} is the d = 2 LSA reduction; got d = {d}, kernel={kernel!r}."
        )
    if dtype is None:
        dtype = jnp.result_type(float)
    dtype = np.dtype(dtype)
    if int(n) < 1:
        raise ValueError(f"sweep: need n >= 1 tokens, got n={n}.")
    if num_save < 8:
        raise ValueError(f"sweep: num_save must be at least 8, got {num_save}.")

    if batching == "cartesian":
        shape = (A.shape[0], V.shape[0], beta.shape[0], seeds.shape[0])
        ia, iv, ib, isd = (g.ravel() for g in np.indices(shape))
    else:
        sizes = {A.shape[0], V.shape[0], beta.shape[0], seeds.shape[0]} - {1}
        if len(sizes) > 1:
            raise ValueError(
                "sweep: with batching='flat' the batch sizes of A, V, beta, seeds must agree "
                f"(or be 1); got {A.shape[0]}, {V.shape[0]}, {beta.shape[0]}, {seeds.shape[0]}."
            )
        B = max(sizes) if sizes else 1
        shape = (B,)
        ar = np.arange(B)
        ia, iv, ib, isd = (
            ar if m > 1 else np.zeros(B, int)
            for m in (A.shape[0], V.shape[0], beta.shape[0], seeds.shape[0])
        )
    Am = A[ia].astype(dtype)
    Vm = V[iv].astype(dtype)
    bm = beta[ib].astype(dtype)
    sm = seeds[isd].astype(np.uint32)
    B = Am.shape[0]

    cfg = _Config(
        method=method,
        kernel=kernel,
        n=int(n),
        d=int(d),
        t1=float(t1),
        num_save=int(num_save),
        natural=time_scale == "natural",
        r0=float(r0),
        init=init,
        rtol=float(rtol),
        atol=float(atol),
        max_steps=int(max_steps),
        score_shift=0.0 if score_shift == "auto" else float(score_shift),
        score_shift_auto=score_shift == "auto",
        cluster_tol=float(cluster_tol),
        velocity_tol=float(velocity_tol),
        amplitude_tol=float(amplitude_tol),
    )

    # Order members by predicted cost so that a chunk holds members of similar stiffness.
    if group == "auto":
        group = (
            "pilot" if (d == 2 and kernel == "lsa" and method != "ott_antonsen") else "stiffness"
        )
    if group == "pilot":
        if d != 2 or kernel != "lsa":
            raise ValueError("sweep: group='pilot' needs d = 2 and kernel='lsa'.")
        # The Ott–Antonsen ODE of the same members (≈ 1000× cheaper) predicts each
        # member's step count; sort by it.
        pilot = sweep(
            Am,
            Vm,
            bm,
            sm.astype(np.int64),
            method="ott_antonsen",
            batching="flat",
            t1=t1,
            num_save=num_save,
            time_scale=time_scale,
            group="stiffness",
            r0=r0,
            rtol=rtol,
            atol=atol,
            max_steps=max_steps,
            chunk_size=None,
            progress=False,
            dtype=dtype,
        )
        perm = np.argsort(pilot.num_steps, kind="stable")
    elif group == "stiffness":
        finite = np.isfinite(Am).all((1, 2)) & np.isfinite(Vm).all((1, 2))
        nA = np.linalg.norm(np.where(finite[:, None, None], Am, 0.0), ord=2, axis=(1, 2))
        nV = np.linalg.norm(np.where(finite[:, None, None], Vm, 0.0), ord=2, axis=(1, 2))
        cost = np.abs(bm) * nA * nV if time_scale == "physical" else np.ones(B)
        cost = np.where(np.isfinite(cost), cost, np.inf)
        perm = np.argsort(cost, kind="stable")
    elif group == "none":
        perm = np.arange(B)
    else:
        raise ValueError(
            f"sweep: group must be 'auto', 'pilot', 'stiffness' or 'none', got {group!r}."
        )

    mesh, ndev = _devices_mesh()
    sharding = NamedSharding(mesh, PartitionSpec("batch"))
    cs = B if chunk_size is None else min(int(chunk_size), B)
    cs = ndev * math.ceil(cs / ndev)
    num_chunks = math.ceil(B / cs)

    # Fingerprint: the inputs and every option that changes a member's result.
    h = hashlib.sha256()
    for arr in (Am, Vm, bm, sm, perm):
        h.update(np.ascontiguousarray(arr).tobytes())
    h.update(json.dumps(dataclasses.asdict(cfg), sort_keys=True).encode())
    h.update(f"{cs}-{dtype.name}".encode())
    fingerprint = h.hexdigest()
    writer = jax.process_index() == 0
    if out_dir is not None:
        out_dir = os.fspath(out_dir)
        os.makedirs(out_dir, exist_ok=True)
        manifest_path = os.path.join(out_dir, "manifest.json")
        if os.path.exists(manifest_path):
            with open(manifest_path) as f:
                old = json.load(f)
            if old.get("fingerprint") != fingerprint:
                if resume:
                    raise ValueError(
                        f"sweep: out_dir {out_dir!r} holds a different sweep (fingerprint "
                        "mismatch); pass a new out_dir or resume=False to overwrite."
                    )
            if not resume:
                for fname in os.listdir(out_dir):
                    if fname.startswith("chunk_"):
                        os.remove(os.path.join(out_dir, fname))
        if writer:
            manifest = dict(
                fingerprint=fingerprint,
                num_members=B,
                shape=list(shape),
                chunk_size=cs,
                num_chunks=num_chunks,
                devices=ndev,
                config=dataclasses.asdict(cfg),
                regime_names=list(REGIME_NAMES),
            )
            _atomic_write(manifest_path, lambda p: _write_json(p, manifest))

    outs: dict[str, np.ndarray] = {}
    seconds = 0.0
    computed = loaded = 0
    bar = None
    if progress and writer:
        from tqdm.auto import tqdm

        bar = tqdm(total=B, unit="member", desc=f"sweep {method}", smoothing=0.3)
    try:
        for c in range(num_chunks):
            idx = perm[c * cs : (c + 1) * cs]
            m = idx.shape[0]
            path = None if out_dir is None else os.path.join(out_dir, f"chunk_{c:05d}.npz")
            chunk = None
            fresh = False
            if path is not None and resume and os.path.exists(path):
                try:
                    with np.load(path) as z:
                        if np.array_equal(z["members"], idx):
                            chunk = {k: z[k] for k in _FIELDS}
                except Exception:  # a damaged file is recomputed
                    chunk = None
            if chunk is None:
                t_start = time.perf_counter()
                pad = np.concatenate([idx, np.full(cs - m, idx[0])])
                args = [_put(x[pad], sharding) for x in (Am, Vm, bm, sm)]
                res = _sweep_chunk(*args, cfg)
                chunk = {k: v[:m] for k, v in _fetch(res).items()}
                dt = time.perf_counter() - t_start
                seconds += dt
                computed += 1
                fresh = True
                if path is not None and writer:
                    _atomic_write(path, lambda p: _write_npz(p, members=idx, **chunk))
                    summary = _chunk_summary(c, idx, chunk, Am, Vm, bm, sm, dt)
                    _atomic_write(path[:-4] + ".json", lambda p: _write_json(p, summary))
            else:
                loaded += 1
            for k, v in chunk.items():
                if k not in outs:
                    outs[k] = np.empty((B,) + v.shape[1:], v.dtype)
                outs[k][idx] = v
            if bar is not None:
                bar.update(m)
                bar.set_postfix(failed=int(np.sum(outs["failed"][perm[: (c + 1) * cs]])))
            if on_chunk is not None:
                on_chunk(c, dict(members=idx, computed=fresh))
    finally:
        if bar is not None:
            bar.close()
    ts = np.linspace(0.0, cfg.t1, cfg.num_save)[None, :] / outs["rate"][:, None]
    return SweepResult(
        A=Am,
        V=Vm,
        beta=bm,
        seed=sm.astype(np.int64),
        ts=ts,
        shape=shape,
        seconds=seconds,
        chunks_computed=computed,
        chunks_loaded=loaded,
        **outs,
    )


def _write_npz(path, **arrays):
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def _write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1, default=_json_default)


def _json_default(x):
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(type(x))


def _chunk_summary(c, idx, chunk, Am, Vm, bm, sm, seconds):
    counts = {name: int(np.sum(chunk["regime"] == i)) for i, name in enumerate(REGIME_NAMES)}
    failures = []
    for j in np.flatnonzero(chunk["failed"]):
        i = int(idx[j])
        code = int(chunk["result"][j])
        failures.append(
            dict(
                index=i,
                reason=result_message(code) if code else "non-finite",
                A=Am[i].tolist(),
                V=Vm[i].tolist(),
                beta=float(bm[i]),
                seed=int(sm[i]),
            )
        )
    return dict(
        chunk=c,
        members=idx.tolist(),
        seconds=seconds,
        members_per_second=len(idx) / max(seconds, 1e-12),
        regime_counts=counts,
        failures=failures,
    )
