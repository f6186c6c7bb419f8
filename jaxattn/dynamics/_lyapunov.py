r"""Lyapunov exponents of attention flows (particles on the sphere, the Ott–Antonsen ODE).

Method (Benettin et al., Meccanica 15, 9 (1980); Shimada & Nagashima, Prog. Theor. Phys. 61,
1605 (1979)): along the solution `x(t)` of `dx/dt = f(t, x)` carry `k` tangent vectors
`W = (w_1, …, w_k)` obeying the variational equation `dw_i/dt = J(x) P_T(x) w_i`
(`J = ∂f/∂x`, one `jax.jvp` per vector, the primal evaluated once), as one diffrax
solve of the augmented state `(x, W)`. Every `Δ = (t1 − t0)/num_renorm` the vectors are
re-orthonormalised, `W = Q R` (QR of the `(dim, k)` matrix), and `log|R_ii|` is
accumulated: after the transient, `λ_i = Σ log|R_ii| / (elapsed time)`, sorted
descending by construction (Gram–Schmidt order).

On the sphere `P_T(x)` projects every token's block onto its tangent space
`T_{x_k} S^{d−1}` (`v_k − <x̂_k, v_k> x̂_k`): directions normal to the spheres are excluded,
so the exponents are those of the flow on the product of spheres `(S^{d−1})^n`, of
dimension `n (d − 1)`. In the Ott–Antonsen reduction the state is `(Re R₂, Im R₂)` in the
closed unit disc (dimension 2).

All of it is traceable (a `lax.scan` over the segments, each a `diffrax.diffeqsolve`), so it
runs under `jax.jit` and `jax.vmap`; a failed solve gives NaN exponents and a `RESULTS`
code rather than an exception.
"""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from ..sphere import normalise, safe_norm
from ._ott_antonsen import _DISC_SLACK, _oa_rhs, check_ott_antonsen_inputs, oa_input_flags
from ._solve import (
    RESULTS,
    ProjectedSolver,
    _StallGuardPID,
    check_flow,
    check_particle_inputs,
    check_solve_dtype,
    check_tokens,
    check_usa_overflow,
    flow_manifold,
    input_result,
    is_builtin_flow,
    promote_result,
    warn_off_sphere,
)
from ._vector_field import _is_concrete

__all__ = [
    "LyapunovSpectrum",
    "lyapunov_spectrum",
    "lyapunov_spectrum_ott_antonsen",
    "OttAntonsenFlow",
    "chaos_verdict",
    "NUM_BLOCKS",
]

# `chaos_verdict`'s rule, `λ_1 > max(CHAOS_CONFIDENCE σ_1, CHAOS_FLOOR)` (also read by
# `decision_margin` for the distance of a sweep member's exponent to it).
CHAOS_CONFIDENCE = 3.0
CHAOS_FLOOR = 1e-3

# Blocks of the block-averaging standard error (see `LyapunovSpectrum.uncertainty`).
NUM_BLOCKS = 8


class LyapunovSpectrum(eqx.Module):
    r"""The `k` largest Lyapunov exponents of one trajectory, with a convergence estimate.

    **Fields** (a leading batch axis on every field under `vmap`):

    - `exponents` `(k,)`: `λ_1 ≥ … ≥ λ_k` (per unit of the solve's time), the average of
      `log|R_ii|` over the segments after the transient. NaN for a failed solve.
    - `uncertainty` `(k,)`: a convergence estimate `σ_i`, the larger of
      (a) the block-averaging standard error: the averaging window is cut into
      `NUM_BLOCKS = 8` blocks of equal time, each gives a local exponent `λ_i^(b)`,
      `σ_a = s_b / sqrt(8)` with `s_b` their sample standard deviation (`ddof = 1`); and
      (b) the drift of the running estimate: `max |λ_i(t) − λ_i(T)|` over the save points `t`
      in the second half of the window.
      (a) is the statistical error of a stationary (chaotic) average; (b) catches slow
      convergence that (a) misses: the `log t / t` decay of the shear along a family of
      closed orbits, the `1/t` bias of the transient, a trajectory still approaching its
      attractor.
    - `times` `(num_renorm,)`: the end times of the segments.
    - `history` `(num_renorm, k)`: the running estimate `λ_i(t)` at the end of each segment
      (NaN during the transient).
    - `local` `(num_renorm, k)`: the finite-time exponent of each segment,
      `log|R_ii| / Δ`.
    - `result`: a `RESULTS` code (the first failure met; `RESULTS.successful` if none).
    - `num_steps`, `num_accepted_steps`, `num_rejected_steps`: step statistics summed over
      the segments.
    - `final`: the state at `t1` (tokens `(n, d)`, or `(2,)` for the Ott–Antonsen state).
    """

    exponents: Float[Array, " k"]
    uncertainty: Float[Array, " k"]
    times: Float[Array, " num_renorm"]
    history: Float[Array, "num_renorm k"]
    local: Float[Array, "num_renorm k"]
    result: RESULTS
    num_steps: Int[Array, ""]
    num_accepted_steps: Int[Array, ""]
    num_rejected_steps: Int[Array, ""]
    final: Array

    @property
    def successful(self) -> Bool[Array, ""]:
        """`result == RESULTS.successful` (per member under `vmap`)."""
        return self.result == RESULTS.successful

    @property
    def sum(self) -> Float[Array, ""]:
        """`λ_1 + … + λ_k`: the mean growth rate of `k`-volumes (the time average of the
        divergence of the flow when `k` is the full dimension)."""
        return jnp.sum(self.exponents, axis=-1)


def chaos_verdict(
    spectrum: LyapunovSpectrum, *, confidence: float = CHAOS_CONFIDENCE, floor: float = CHAOS_FLOOR
) -> tuple[Bool[Array, "..."], dict]:
    r"""Decide whether a measured spectrum shows chaos.

    The rule: chaotic iff the solve succeeded, `λ_1 > confidence · σ_1` and `λ_1 > floor`,
    with `σ_1` the stated uncertainty (`LyapunovSpectrum.uncertainty`). `floor` (in inverse
    units of the solve's time) keeps numerically zero exponents of neutral directions
    (the flow direction, continuous symmetries, families of equilibria) from being read as
    chaos when the run is so regular that `σ_1` is tiny; a periodic orbit or a family of
    closed orbits has `λ_1 → 0` and fails it, clustering has `λ_1 ≤ 0`.

    Pure JAX: works on one spectrum or a batch (any leading axes), under `jit` and `vmap`.

    **Arguments:** `spectrum` a `LyapunovSpectrum`; `confidence` the `c` of the rule;
    `floor` the absolute threshold.

    **Returns:** `(is_chaotic, evidence)`: a boolean array of the batch shape, and a dict of
    arrays of that shape: `largest_exponent` (`λ_1`), `largest_uncertainty` (`σ_1`),
    `margin` (`λ_1 − max(c σ_1, floor)`, positive iff chaotic for a successful solve).
    """
    lam = spectrum.exponents[..., 0]
    sig = spectrum.uncertainty[..., 0]
    threshold = jnp.maximum(confidence * sig, floor)
    margin = lam - threshold
    ok = spectrum.result == RESULTS.successful
    is_chaotic = ok & jnp.isfinite(margin) & (margin > 0)
    return is_chaotic, dict(largest_exponent=lam, largest_uncertainty=sig, margin=margin)


# ------------------------------------------------------------------------------ internals


def _tangent(x, W, manifold):
    """Project the tangent vectors `W` (k, *state) onto the tangent space at `x`."""
    if manifold == "sphere":
        xh = normalise(x)
        return W - jnp.sum(W * xh, axis=-1, keepdims=True) * xh
    return W


class _Augmented(eqx.Module):
    """The state with its `k` tangent vectors as one array `y = [x, w_1, …, w_k]` (measured
    faster than the pair `(x, W)` with diffrax's Runge–Kutta stages for k = 2)."""

    field: eqx.Module
    manifold: str = eqx.field(static=True)

    def __call__(self, t, y, args):
        x, W = y[0], y[1:]
        Wt = _tangent(x, W, self.manifold)

        def f(z):
            return self.field(t, z, args)

        # vmap over the tangents only: the primal is unbatched and evaluated once.
        fx, JW = jax.vmap(lambda w: jax.jvp(f, (x,), (w,)), out_axes=(None, 0))(Wt)
        return jnp.concatenate([fx[None], JW], axis=0).astype(y.dtype)


class _Off(eqx.Module):
    """A field switched off (zero velocity) for a rejected member or after a failure."""

    field: eqx.Module
    off: Bool[Array, ""]

    def __call__(self, t, x, args):
        f = self.field(t, x, args)
        return jnp.where(self.off, jnp.zeros_like(f), f)


class _AugmentedProjection(ProjectedSolver):
    """After every step: tokens back onto the sphere (sphere); the Ott–Antonsen point back
    into the closed disc (disc). The solver state carries the largest distance removed
    (`ProjectedSolver`)."""

    solver: diffrax.AbstractSolver
    manifold: str = eqx.field(static=True)

    def project(self, y):
        x = y[0]
        if self.manifold == "sphere":
            # The tangent vectors stay tangent up to the truncation error (the field applies
            # P_T to them); they are projected at the end of every segment.
            dist = jnp.max(jnp.abs(safe_norm(x) - 1))
            return y.at[0].set(normalise(x)), dist
        if self.manifold == "disc":
            r2 = x[0] ** 2 + x[1] ** 2
            outside = r2 > 1
            scale = jnp.where(outside, 1 / jnp.sqrt(jnp.where(outside, r2, 1)), 1)
            return y.at[0].multiply(scale), jnp.where(outside, jnp.sqrt(r2) - 1, 0)
        return y, jnp.zeros((), y.dtype)


def _state_rms(scaled_error):
    """RMS norm of the state part of the augmented error only (tangents not controlled)."""
    return jnp.sqrt(jnp.mean(scaled_error[0] ** 2))


def _orthonormalise(W):
    """QR of the `(dim, k)` matrix of the flattened tangent vectors; returns the
    orthonormal vectors (same shape as `W`) and `log|R_ii|`."""
    k = W.shape[0]
    M = W.reshape(k, -1).T
    Q, R = jnp.linalg.qr(M)
    diag = jnp.diagonal(R)
    sign = jnp.where(diag < 0, -1.0, 1.0).astype(W.dtype)
    tiny = jnp.finfo(W.dtype).tiny
    logs = jnp.log(jnp.maximum(jnp.abs(diag), tiny))
    return (Q * sign).T.reshape(W.shape), logs


def _statistics(local, seg, counted, t_end):
    """Exponents, running estimates and uncertainty from the per-segment logs."""
    dtype = local.dtype
    counted_f = counted.astype(dtype)
    logs = local * seg * counted_f[:, None]
    elapsed = jnp.cumsum(seg * counted_f)
    run = jnp.cumsum(logs, axis=0) / jnp.where(elapsed > 0, elapsed, jnp.nan)[:, None]
    history = jnp.where(counted[:, None], run, jnp.nan)
    total = elapsed[-1]
    exponents = jnp.sum(logs, axis=0) / total
    # (a) block averaging over NUM_BLOCKS blocks of equal time of the averaging window.
    start = t_end - total
    ends = t_end - total + elapsed  # end time of each segment within the window
    block = jnp.clip(
        jnp.floor((ends - start - 0.5 * seg) / total * NUM_BLOCKS).astype(jnp.int32),
        0,
        NUM_BLOCKS - 1,
    )
    block_logs = jax.ops.segment_sum(logs, block, NUM_BLOCKS)
    block_time = jax.ops.segment_sum(seg * counted_f, block, NUM_BLOCKS)
    block_rate = block_logs / jnp.where(block_time > 0, block_time, jnp.nan)[:, None]
    se = jnp.std(block_rate, axis=0, ddof=1) / jnp.sqrt(NUM_BLOCKS)
    # (b) drift of the running estimate over the second half of the window.
    late = counted & (elapsed >= 0.5 * total)
    drift = jnp.max(jnp.where(late[:, None], jnp.abs(run - exponents), 0), axis=0)
    uncertainty = jnp.maximum(se, drift)
    return exponents, uncertainty, history


@eqx.filter_jit
def _spectrum(
    field,
    y0,
    W0,
    manifold,
    t0,
    t1,
    transient,
    num_renorm,
    solver,
    rtol,
    atol,
    max_steps,
    invalid,
    invalid_code,
    control_tangents,
):
    dtype = y0.dtype
    seg = (t1 - t0) / num_renorm
    W0, _ = _orthonormalise(_tangent(y0, W0, manifold))
    wrapper = _AugmentedProjection(solver, manifold)
    norm = optx.rms_norm if control_tangents else _state_rms
    # the stalled-clock guard of `simulate`: a float32 time far from zero that stops
    # advancing ends the segment with RESULTS.time_stalled (not max_steps_reached)
    controller = _StallGuardPID(rtol=rtol, atol=atol, norm=norm)

    def one_segment(carry, i):
        y, off, result, dt, steps = carry
        ta = t0 + i * seg
        tb = t0 + (i + 1) * seg
        term = diffrax.ODETerm(_Augmented(_Off(field, off), manifold))
        sol = diffrax.diffeqsolve(
            term,
            wrapper,
            t0=ta,
            t1=tb,
            dt0=dt,
            y0=y,
            saveat=diffrax.SaveAt(t1=True),
            stepsize_controller=controller,
            max_steps=max_steps,
            throw=False,
        )
        x_end, W_end = sol.ys[0, 0], sol.ys[0, 1:]
        code = promote_result(sol.result)
        failed = code != RESULTS.successful
        new_result = RESULTS.where(result == RESULTS.successful, code, result)
        x1 = jnp.where(failed, y[0], x_end)
        W1, logs = _orthonormalise(_tangent(x1, jnp.where(failed, y[1:], W_end), manifold))
        y_next = jnp.concatenate([x1[None], W1])
        accepted = sol.stats["num_accepted_steps"]
        # the next segment starts with the mean accepted step of this one (a hair longer, so
        # that a segment covered by one step is not followed by a rounding-sized second one)
        dt_next = jnp.where(accepted > 0, 1.001 * seg / jnp.maximum(accepted, 1), dt)
        dt_next = dt_next.astype(dtype)
        stats = jnp.stack(
            [sol.stats["num_steps"], accepted, sol.stats["num_rejected_steps"]]
        ).astype(jnp.int32)
        carry = (y_next, off | failed, new_result, dt_next, steps + stats)
        return carry, (logs / seg, tb)

    y_start = jnp.concatenate([y0[None], W0]).astype(dtype)
    init = (
        y_start,
        invalid,
        RESULTS.where(invalid, invalid_code, RESULTS.successful),
        (seg / 16).astype(dtype),
        jnp.zeros(3, jnp.int32),
    )
    (y_end, off, result, _, steps), (local, ends) = jax.lax.scan(
        one_segment, init, jnp.arange(num_renorm)
    )
    starts = ends - seg
    counted = starts >= t0 + transient - 1e-9 * seg
    exponents, uncertainty, history = _statistics(local, seg, counted, t1)
    bad = result != RESULTS.successful
    nan = jnp.asarray(jnp.nan, dtype)
    return LyapunovSpectrum(
        exponents=jnp.where(bad, nan, exponents),
        uncertainty=jnp.where(bad, nan, uncertainty),
        times=ends,
        history=jnp.where(bad, nan, history),
        local=jnp.where(bad, nan, local),
        result=result,
        num_steps=steps[0],
        num_accepted_steps=steps[1],
        num_rejected_steps=steps[2],
        final=jnp.where(bad, nan, y_end[0]),
    )


def _check_common(where, t0, t1, k, dim, num_renorm, transient, rtol, atol, max_steps):
    if not isinstance(k, (int, np.integer)) or not 1 <= int(k) <= dim:
        raise ValueError(
            f"{where}: k must be an integer with 1 <= k <= {dim} (the dimension of the "
            f"state manifold), got {k!r}."
        )
    if not isinstance(num_renorm, (int, np.integer)) or int(num_renorm) < 2 * NUM_BLOCKS:
        raise ValueError(
            f"{where}: num_renorm must be an integer >= {2 * NUM_BLOCKS} (the averaging "
            f"window is cut into {NUM_BLOCKS} blocks), got {num_renorm!r}."
        )
    for name, value in (("t0", t0), ("t1", t1), ("transient", transient)):
        if _is_concrete(value) and not np.all(np.isfinite(np.asarray(value))):
            raise ValueError(f"{where}: {name} must be finite, got {value}.")
    if _is_concrete(t0) and _is_concrete(t1) and not float(t1) > float(t0):
        raise ValueError(f"{where}: need t1 > t0 (forward time), got t0={t0}, t1={t1}.")
    if _is_concrete(transient) and _is_concrete(t0) and _is_concrete(t1):
        tr, span = float(transient), float(t1) - float(t0)
        seg = span / int(num_renorm)
        if tr < 0 or span - tr < 2 * NUM_BLOCKS * seg * (1 - 1e-9):
            raise ValueError(
                f"{where}: transient must be >= 0 and leave at least {2 * NUM_BLOCKS} "
                f"renormalisation segments of the horizon (t1 - t0 = {span:g}, segment "
                f"{seg:g}), got transient={tr:g}."
            )
    for name, value in (("rtol", rtol), ("atol", atol)):
        if _is_concrete(value) and not (np.isfinite(float(value)) and float(value) > 0):
            raise ValueError(f"{where}: {name} must be a finite positive number, got {value}.")
    if int(max_steps) < 1:
        raise ValueError(f"{where}: max_steps must be >= 1, got {max_steps}.")


# The tangent vectors are drawn from their own stream of the key (`fold_in`), never from
# the key itself: tokens drawn with the same key (`sample_uniform(jax.random.key(0), n, d)`,
# the usual first key) are the normalised draws of that key, so the first tangent vector
# was parallel to the first token and its tangent part pure rounding (exponents that moved
# with the compilation: eager and jit disagreed beyond their stated uncertainty).
TANGENT_STREAM = 0x4C59


def _initial_tangents(key, k, shape, dtype):
    key = jax.random.key(0) if key is None else key
    return jax.random.normal(jax.random.fold_in(key, TANGENT_STREAM), (k,) + tuple(shape), dtype)


def lyapunov_spectrum(
    field: eqx.Module,
    x0: Float[Array, "n d"],
    *,
    t1: float,
    k: int = 2,
    t0: float = 0.0,
    transient: float | None = None,
    num_renorm: int = 400,
    solver: diffrax.AbstractSolver = diffrax.Tsit5(),
    rtol: float = 1e-8,
    atol: float = 1e-10,
    max_steps: int = 4096,
    control_tangents: bool = False,
    key: PRNGKeyArray | None = None,
) -> LyapunovSpectrum:
    r"""The `k` largest Lyapunov exponents of a flow from `x0` (tangent vectors carried by
    JVPs along the diffrax solution, QR re-orthonormalisation every segment).

    $$\lambda_i = \lim_{T\to\infty} \frac1T \log \frac{\mathrm{vol}_i(DΦ_T\,w_1,…,w_i)}
    {\mathrm{vol}_{i-1}(DΦ_T\,w_1,…,w_{i-1})},$$

    estimated over `[t0 + transient, t1]` from `num_renorm` equal segments of `[t0, t1]`
    (the segments inside the transient align the vectors but are not averaged). For a flow
    on the sphere (`manifold` absent or `"sphere"`) the tangent vectors are projected onto
    the tangent space of `(S^{d−1})^n` at the current tokens, so the exponents are those of
    the flow on the product of spheres (`n (d − 1)` of them in all); for
    `manifold = "euclidean"` they are those of the flow in `R^{n×d}`. A flow on the sphere
    has a zero exponent along the flow direction (unless it converges to rest) and one per
    continuous symmetry or family of equilibria through the limit set.

    Works for any flow of the flow protocol (`AttentionDynamics` with any kernel and `d`,
    `MultiHeadDynamics`, a user's `eqx.Module` with `__call__(t, x, args) -> dx/dt`), under
    `jax.jit` and `jax.vmap` (over the flow's array leaves, `x0` and `key`). The cost is
    about `1 + k` flow evaluations per solver stage (`experiments/bench_lyapunov.py`).

    **Arguments:**

    - `field`: the flow.
    - `x0`: initial tokens, shape `(n, d)` (normalised on the sphere, with a `UserWarning`
      when concrete and off it by more than 1e-6, as `simulate`).
    - `t1`, `t0`: the horizon.
    - `k`: number of exponents, `1 ≤ k ≤ n (d − 1)` on the sphere (`n d` in `R^{n×d}`).
    - `transient`: time discarded at the start (default `0.1 (t1 − t0)`); it must leave at
      least `2 · NUM_BLOCKS = 16` segments.
    - `num_renorm`: number of segments (re-orthonormalisations), at least 16 and enough
      to leave 16 after the transient (with the default transient: at least 18); the segment
      `(t1 − t0)/num_renorm` must be short enough that `exp((λ_1 − λ_k) Δ)` stays far
      from `1/eps` (the vectors would collapse onto the leading direction).
    - `solver`, `rtol`, `atol`: as in `diffrax.diffeqsolve` (`PIDController(rtol, atol)`).
      `max_steps`: per segment.
    - `control_tangents`: include the tangent vectors in the step-size error control. By
      default only the state is controlled (the steps are those of the plain solve): the
      variational equation has the time scales of the flow itself, and the exponents are
      time averages that per-step errors of order `rtol` barely move (the tests compare
      against closed forms and Jacobian eigenvalues at the default). `True` costs more
      steps (≈ 1.4× on the three-token chaos candidate).
    - `key`: PRNG key for the random initial tangent vectors (default `jax.random.key(0)`);
      they are drawn from `jax.random.fold_in(key, 0x4C59)`, so a key that also
      drew the tokens does not give tangent vectors parallel to them.

    **Returns:** a `LyapunovSpectrum` (exponents sorted descending, their uncertainty, the
    running estimates, the result code).

    **Raises:** `ValueError` for a flow that is not a module (or cannot be traced, returns
    the wrong shape, non-finite or non-tangent values at `x0`), wrong `x0` shape or
    non-finite/zero tokens, `k` outside `[1, dim]`, `num_renorm < 16`, `t1 ≤ t0`, a
    transient that leaves fewer than 16 segments, non-positive tolerances, and (as
    `simulate`) a USA field whose weights overflow the dtype, naming the `score_shift`
    that fits (`usa_score_shift`). Under `jit`/`vmap` bad input gives NaN exponents and
    the code `simulate` reports (`RESULTS.nonfinite_argument`, `nonpositive_beta`,
    `usa_overflow`); a solver failure NaN exponents and its code: `max_steps_reached` in a
    segment, or `RESULTS.time_stalled` when the clock stops advancing (float32 far from
    t = 0, e.g. t0 = 1e5), as in `simulate`.

    Source: Benettin, Galgani, Giorgilli & Strelcyn, Meccanica 15, 9 (1980) (QR method);
    flow: Li et al. (2026), eq. (1), docs/theory.
    """
    where = "lyapunov_spectrum"
    if not isinstance(field, eqx.Module) or not callable(field):
        raise ValueError(
            f"{where}: field must be a flow, an equinox Module with __call__(t, x, args) -> "
            f"dx/dt, got {type(field).__name__}."
        )
    manifold = flow_manifold(field)
    d = field.d if isinstance(getattr(field, "d", None), int) else None
    x0, deviation = check_tokens(x0, d)
    float_leaves = jax.tree.leaves(eqx.filter(field, eqx.is_inexact_array))
    dtype = jnp.result_type(x0.dtype, *(leaf.dtype for leaf in float_leaves), float)
    check_solve_dtype(where, dtype)
    warn_off_sphere(where, manifold, deviation)
    x0 = x0.astype(dtype)
    if any(leaf.dtype != dtype for leaf in float_leaves):
        field = jax.tree.map(lambda a: a.astype(dtype) if eqx.is_inexact_array(a) else a, field)
    n, dd = x0.shape
    dim = n * (dd - 1) if manifold == "sphere" else n * dd
    if transient is None:
        transient = 0.1 * (t1 - t0)
    _check_common(where, t0, t1, k, dim, num_renorm, transient, rtol, atol, max_steps)
    check_usa_overflow(where, field, dtype)
    if not is_builtin_flow(field):
        check_flow(where, field, x0, jnp.asarray(t0, dtype), manifold)
    # the per-member checks of `simulate` (non-finite input, zero token, β ≤ 0, USA overflow)
    checks, x_start = check_particle_inputs(field, x0)
    W0 = _initial_tangents(key, int(k), x0.shape, dtype)
    return _spectrum(
        field,
        x_start,
        W0,
        manifold,
        jnp.asarray(t0, dtype),
        jnp.asarray(t1, dtype),
        jnp.asarray(transient, dtype),
        int(num_renorm),
        solver,
        rtol,
        atol,
        int(max_steps),
        checks.invalid,
        input_result(checks, RESULTS.successful),
        bool(control_tangents),
    )


class OttAntonsenFlow(eqx.Module):
    """The Ott–Antonsen ODE as a flow on the state `(Re R₂, Im R₂)` (shape `(2,)`)."""

    A: Float[Array, "2 2"]
    V: Float[Array, "2 2"]
    beta: Float[Array, ""]

    def __call__(self, t, y, args=None):
        return _oa_rhs(t, y, (self.A, self.V, self.beta))


def lyapunov_spectrum_ott_antonsen(
    A: Float[Array, "2 2"],
    V: Float[Array, "2 2"],
    R0,
    *,
    beta=1.0,
    t1: float,
    k: int = 2,
    t0: float = 0.0,
    transient: float | None = None,
    num_renorm: int = 400,
    solver: diffrax.AbstractSolver = diffrax.Tsit5(),
    rtol: float = 1e-8,
    atol: float = 1e-10,
    max_steps: int = 4096,
    control_tangents: bool = False,
    key: PRNGKeyArray | None = None,
) -> LyapunovSpectrum:
    r"""Lyapunov exponents of the Ott–Antonsen ODE of the d = 2 LSA flow,
    `dR/dt = iβΩ(R)R + (β/2)(H(R) − conj(H(R)) R²)`, as a flow on the closed unit disc
    (state `(Re R₂, Im R₂)`, so `k ≤ 2`; the two exponents sum to the time average of the
    divergence of the field). Every step is clipped back onto the disc, as in
    `solve_ott_antonsen`; `LyapunovSpectrum.final` is the final `(Re R₂, Im R₂)`.

    At a sink `R*` the exponents are the real parts of the eigenvalues of the Jacobian of
    the field at `R*` (as a map of `R²`), sorted descending.

    **Arguments:** `A`, `V` real 2×2; `R0` complex scalar with `|R0| ≤ 1`; `beta` scalar;
    the rest as in `lyapunov_spectrum`. jit- and vmap-safe (over `A`, `V`, `beta`, `R0`).

    **Returns:** a `LyapunovSpectrum`.

    **Raises:** `ValueError` as `lyapunov_spectrum`, and for non-2×2 `A`/`V`, non-scalar
    `beta`/`R0`, a concrete `|R0| > 1` or non-finite input. Traced bad input gives NaN
    exponents and `RESULTS.nonfinite_argument` / `RESULTS.outside_disc`.

    Source: Ott & Antonsen, Chaos 18, 037113 (2008); the docs, theory pages ("Ott–Antonsen");
    Benettin et al., Meccanica 15, 9 (1980).
    """
    where = "lyapunov_spectrum_ott_antonsen"
    A, V, beta, R0, dtype = check_ott_antonsen_inputs(where, A, V, beta, R0)
    if transient is None:
        transient = 0.1 * (t1 - t0)
    _check_common(where, t0, t1, k, 2, num_renorm, transient, rtol, atol, max_steps)
    y0 = jnp.stack([jnp.real(R0), jnp.imag(R0)]).astype(dtype)
    A, V, beta = A.astype(dtype), V.astype(dtype), beta.astype(dtype)
    # a traced β ≤ 0 is `nonpositive` (a concrete one was refused above)
    bad, nonpositive, y0 = oa_input_flags(A, V, beta, y0)
    outside = jnp.sum(y0**2) > (1 + _DISC_SLACK) ** 2
    scale = jnp.where(jnp.sum(y0**2) > 1, 1 / jnp.sqrt(jnp.maximum(jnp.sum(y0**2), 1)), 1)
    y0 = jnp.where(bad | outside | nonpositive, 0, y0 * scale)
    code = RESULTS.where(
        bad,
        RESULTS.nonfinite_argument,
        RESULTS.where(nonpositive, RESULTS.nonpositive_beta, RESULTS.outside_disc),
    )
    flow = OttAntonsenFlow(A, V, beta)
    W0 = _initial_tangents(key, int(k), (2,), dtype)
    return _spectrum(
        flow,
        y0,
        W0,
        "disc",
        jnp.asarray(t0, dtype),
        jnp.asarray(t1, dtype),
        jnp.asarray(transient, dtype),
        int(num_renorm),
        solver,
        rtol,
        atol,
        int(max_steps),
        bad | outside | nonpositive,
        code,
        bool(control_tangents),
    )
