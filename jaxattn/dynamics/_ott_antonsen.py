"""The Ott–Antonsen reduction of the d = 2 LSA flow: one complex ODE for R₂.

With `φ = 2θ` the d = 2 LSA flow is the identical-oscillator model
`dφ_k/dt = ω(R) + Im(H̃(R) e^{−iφ_k})` (see `_circle.py`). If the law of `φ` is a
wrapped Cauchy (Poisson kernel) with mean resultant `z`, its moments are
`E[e^{imφ}] = z^m` (m ≥ 0), so the drift of `R = E[e^{iφ}]` closes:

    dR/dt = E[i e^{iφ} dφ/dt] = iωR + (H̃ − conj(H̃) E[e^{2iφ}])/2 = iωR + (H̃ − conj(H̃) R²)/2,

and the Poisson-kernel family is invariant (Ott & Antonsen 2008). The unit disc is invariant
too: `d|R|²/dt = β Re(conj(R) H)(1 − |R|²)` vanishes on `|R| = 1`.
"""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Complex, Float, PRNGKeyArray

from .._custom_types import Matrix
from ..sphere import _atan2, _sincos
from ._circle import _check_2x2, _check_scalar, kuramoto_daido_coupling
from ._segments import Problem, solve_problem
from ._solve import (
    RESULTS,
    ProjectedSolver,
    Solution,
    check_solve_dtype,
    pid_controller,
    promote_result,
    raise_on_failure,
    save_times,
    step_statistics,
)
from ._vector_field import _is_concrete

__all__ = [
    "ott_antonsen_field",
    "OttAntonsenSolution",
    "solve_ott_antonsen",
    "sample_wrapped_cauchy",
    "DiscProjection",
]

# Initial points this far outside the closed unit disc are treated as rounding and clipped;
# anything further out is rejected.
_DISC_SLACK = 1e-12


def ott_antonsen_field(R: Complex[Array, "..."], A: Matrix, V: Matrix, beta=1.0):
    """Right-hand side of the Ott–Antonsen ODE for `R = R₂`.

    `dR/dt = i β Ω(R) R + (β/2) (H(R) − conj(H(R)) R²)`, exact on the manifold of
    wrapped-Cauchy laws of `φ = 2θ` (mean resultant `R`).

    **Arguments:** `R` complex (any shape), `A`, `V` of shape `(2, 2)`, `beta` scalar.

    **Returns:** `dR/dt`, same shape as `R`.

    Source: the docs, theory pages ("Ott–Antonsen"); Ott & Antonsen, Chaos 18, 037113 (2008).
    """
    H, Omega = kuramoto_daido_coupling(R, A, V)
    return 1j * beta * Omega * R + 0.5 * beta * (H - jnp.conj(H) * R**2)


def _clip_disc(y):
    """Map the point `(y[0], y[1])` into the closed unit disc; other entries untouched.

    Returns the clipped state and the overshoot `max(|(y0, y1)| − 1, 0)`. Gradient-safe at
    the origin and on the circle.
    """
    r2 = y[0] ** 2 + y[1] ** 2
    outside = r2 > 1
    r = jnp.sqrt(jnp.where(outside, r2, 1))
    scale = jnp.where(outside, 1 / r, 1)
    return y.at[:2].multiply(scale), jnp.where(outside, r - 1, 0)


class DiscProjection(ProjectedSolver):
    """Wraps a diffrax solver and clips a disc-valued part of the state after every step.

    The state is a real vector whose first two entries are `(Re ζ, Im ζ)` of a point
    of the closed unit disc (the Ott–Antonsen `R`, the Watanabe–Strogatz `ζ`). The disc is
    invariant for the exact flow; a numerical step may overshoot its boundary by rounding
    or truncation error. After each step the point is mapped back to `|ζ| ≤ 1`. The
    reduced vector fields are smooth across the circle and are evaluated at the raw state
    (a clipped evaluation would put a kink at `|ζ| = 1` that the step-size controller reads
    as stiffness); an FSAL stage reused after a clip is off by the overshoot, rounding-sized
    in a healthy solve. The solver state carries the largest overshoot.
    """

    solver: diffrax.AbstractSolver

    def project(self, y):
        return _clip_disc(y)


class OttAntonsenSolution(Solution):
    """A solution of the Ott–Antonsen ODE.

    **Fields:**

    - `ts`: save times, shape `(times,)`.
    - `R`: the order parameter `R₂(t)` at the save times, complex, shape `(times,)`
      (NaN for a rejected input).
    - `result`: a `RESULTS` code (`RESULTS.successful` when all went well).
    - `num_steps`, `num_accepted_steps`, `num_rejected_steps`: step statistics.
    - `disc_overshoot`: the largest `|R| − 1 > 0` that a step (or the initial value) produced
      before it was clipped back onto the closed disc; rounding-sized in a healthy solve.
    """

    R: Complex[Array, " times"]
    disc_overshoot: Float[Array, ""]

    @property
    def final(self) -> Complex[Array, ""]:
        """`R₂` at the last save time."""
        return self.R[-1]


def _oa_rhs(t, y, args):
    del t
    A, V, beta = args
    # Evaluated at the raw state: the field is a polynomial in R, smooth across the circle.
    # (Clipping here as well put a kink at |R| = 1 that the error estimate read as
    # stiffness: near clustered states twice the steps and 20× the error.)
    dR = ott_antonsen_field(y[0] + 1j * y[1], A, V, beta)
    return jnp.stack([jnp.real(dR), jnp.imag(dR)]).astype(y.dtype)


class OttAntonsenChecks(eqx.Module):
    """What `finish_ott_antonsen` needs of `prepare_ott_antonsen`: the input checks."""

    bad: Bool[Array, ""]
    outside: Bool[Array, ""]
    overshoot0: Float[Array, ""]
    nonpositive: Bool[Array, ""]  # a (finite) β ≤ 0: refused when concrete, a code when traced
    # Finite inputs whose field is already non-finite at R₂(0) (weights so large that the
    # products overflow): `nonfinite_flow` at once, on every path (a sweep member steps
    # without the stall guard and would otherwise run to max_steps).
    overflow: Bool[Array, ""]


def oa_input_flags(A, V, beta, y0):
    """The per-member checks of an Ott–Antonsen input (traceable; shared by
    `prepare_ott_antonsen` and `lyapunov_spectrum_ott_antonsen`): `bad`, a non-finite
    `A`, `V`, `beta` or state `y0 = (Re R0, Im R0)`; `nonpositive`, a finite `beta ≤ 0`;
    and `y0` with its non-finite entries set to 0."""
    bad = ~(
        jnp.all(jnp.isfinite(A))
        & jnp.all(jnp.isfinite(V))
        & jnp.isfinite(beta)
        & jnp.all(jnp.isfinite(y0))
    )
    nonpositive = ~bad & ~(beta > 0)
    return bad, nonpositive, jnp.where(jnp.isfinite(y0), y0, 0)


def oa_start(A, V, beta, R0, dtype):
    """The checked start of an Ott–Antonsen solve (traceable; shared by
    `prepare_ott_antonsen` and `solve_homogenised_ott_antonsen`): `(checks, invalid, y0)`,
    the `OttAntonsenChecks` for `finish_ott_antonsen`, whether the member is rejected, and
    `y0 = (Re R0, Im R0)` clipped to the closed disc (0 for a rejected member, which then
    runs a zero field from the origin: cheap, and cannot poison a batch). `beta` is a
    scalar (for several heads: their smallest, NaN if any is not finite)."""
    y0 = jnp.stack([jnp.real(R0), jnp.imag(R0)]).astype(dtype)
    bad, nonpositive, y0 = oa_input_flags(A, V, beta, y0)
    y0, over0 = _clip_disc(y0)
    outside = over0 > _DISC_SLACK
    invalid = bad | outside | nonpositive
    checks = OttAntonsenChecks(
        bad=bad,
        outside=outside,
        overshoot0=over0,
        nonpositive=nonpositive,
        overflow=jnp.zeros_like(bad),  # set by `prepare_ott_antonsen`, which has the field
    )
    return checks, invalid, jnp.where(invalid, 0, y0)


def prepare_ott_antonsen(A, V, beta, R0, dtype, solver, rtol, atol, *, stall_guard=False):
    """The Ott–Antonsen `Problem` for `R₂(0) = R0`, with the per-member input checks
    (`oa_start`); `stall_guard` for a standalone solve (`pid_controller`)."""
    checks, invalid, y0 = oa_start(A, V, beta, R0, dtype)
    overflow = ~invalid & ~jnp.all(jnp.isfinite(_oa_rhs(0.0, y0, (A, V, beta))))
    checks = eqx.tree_at(lambda c: c.overflow, checks, overflow)
    invalid = invalid | overflow
    args = (jnp.where(invalid, 0, A), jnp.where(invalid, 0, V), jnp.where(invalid, 0, beta))
    problem = Problem(
        term=diffrax.ODETerm(_oa_rhs),
        solver=DiscProjection(solver),
        y0=y0,
        args=args,
        controller=pid_controller(rtol, atol, stall_guard=stall_guard),
        save_solver_state=True,
    )
    return problem, checks


def finish_ott_antonsen(checks: OttAntonsenChecks, sol, ts) -> OttAntonsenSolution:
    """The `OttAntonsenSolution` of a finished solve (whole or segmented)."""
    invalid = checks.bad | checks.outside | checks.nonpositive | checks.overflow
    R = sol.ys[:, 0] + 1j * sol.ys[:, 1]
    # Saved states are interpolated between steps and can leave the closed disc by about
    # the tolerance; |R₂| ≤ 1 by definition, so clip them (a member on the circle read
    # from an overshooting R₂ was judged differently in a rotated frame).
    R = R / jnp.maximum(1, jnp.abs(R))
    R = jnp.where(invalid, jnp.nan, R)
    result = promote_result(sol.result)
    result = RESULTS.where(checks.overflow, RESULTS.nonfinite_flow, result)
    result = RESULTS.where(checks.outside & ~checks.bad, RESULTS.outside_disc, result)
    result = RESULTS.where(checks.nonpositive, RESULTS.nonpositive_beta, result)
    result = RESULTS.where(checks.bad, RESULTS.nonfinite_argument, result)
    overshoot = jnp.where(invalid, jnp.nan, jnp.maximum(checks.overshoot0, sol.solver_state[1]))
    return OttAntonsenSolution(
        ts=ts,
        R=R,
        result=result,
        **step_statistics(sol),
        disc_overshoot=overshoot,
    )


@eqx.filter_jit
def _solve_oa(A, V, beta, R0, ts, t0, t1, dt0, solver, rtol, atol, max_steps, adjoint):
    problem, checks = prepare_ott_antonsen(
        A, V, beta, R0, ts.dtype, solver, rtol, atol, stall_guard=True
    )
    sol = solve_problem(problem, t0, t1, dt0, ts, adjoint, max_steps)
    return finish_ott_antonsen(checks, sol, ts), checks.outside


def check_ott_antonsen_inputs(where: str, A, V, beta, R0):
    """Shapes and (concrete) values of the Ott–Antonsen inputs, shared by the solver and
    the Lyapunov spectrum. **Returns:** `(A, V, beta, R0, dtype)` with `dtype` their common
    real floating dtype. **Raises:** `ValueError` prefixed with `where` for non-2×2
    matrices, a non-scalar `beta`/`R0`, a concrete `beta ≤ 0`, a concrete non-finite `R0`
    or `|R0| > 1`, or half precision (`check_solve_dtype`)."""
    A, V = _check_2x2(where, A=A, V=V)
    beta = _check_scalar(where, "beta", beta, positive=True)
    R0 = jnp.asarray(R0)
    if R0.ndim != 0:
        raise ValueError(f"{where}: R0 must be a complex scalar, got shape {R0.shape}.")
    if _is_concrete(R0):
        r0 = complex(np.asarray(R0))
        if not np.isfinite(r0):
            raise ValueError(f"{where}: R0 is not finite ({r0}).")
        if abs(r0) > 1 + _DISC_SLACK:
            raise ValueError(
                f"{where}: |R0| = {abs(r0):.10g} > 1; the order parameter R₂ lies in the "
                f"closed unit disc."
            )
    dtype = jnp.result_type(A, V, beta, jnp.real(R0), float)  # a Python beta stays weak
    check_solve_dtype(where, dtype)
    return A, V, beta, R0, dtype


def solve_ott_antonsen(
    A: Float[Array, "2 2"],
    V: Float[Array, "2 2"],
    R0,
    *,
    beta=1.0,
    t1: float,
    t0: float = 0.0,
    ts: Float[Array, " times"] | None = None,
    num_save: int = 101,
    dt0: float | None = None,
    solver: diffrax.AbstractSolver = diffrax.Tsit5(),
    rtol: float = 1e-8,
    atol: float = 1e-10,
    max_steps: int = 16384,
    adjoint: diffrax.AbstractAdjoint = diffrax.RecursiveCheckpointAdjoint(),
    throw: bool = True,
) -> OttAntonsenSolution:
    r"""Integrate the Ott–Antonsen ODE of the d = 2 LSA flow from `R₂(0) = R0`.

    $$\frac{dR}{dt} = i\beta\,\Omega(R)\,R + \frac\beta2\big(H(R) - \overline{H(R)}\,R^2\big),$$

    `H`, `Ω` as in `kuramoto_daido_coupling`. The state is `(Re R, Im R)`; every step is
    clipped back onto the closed unit disc (`DiscProjection`; the disc is invariant, the
    overshoot is reported in `disc_overshoot`). `R0` on the circle `|R0| = 1` is allowed
    (a two-cluster state; the circle is invariant).

    jit-, vmap- and grad-safe: differentiable in `A`, `V`, `beta`, `R0` (through `adjoint`);
    sweeps vmap it over `A`, `V` (one compile), with `throw=False` each member keeps its
    own `result`.

    **Arguments:**

    - `A`, `V`: real 2×2 matrices.
    - `R0`: initial order parameter, complex scalar with `|R0| ≤ 1`.
    - `beta`: inverse temperature (scalar).
    - `t1`, `t0`: end and start time; `ts` save times (shape `(times,)`), default
      `num_save` equally spaced times.
    - `dt0`, `solver`, `rtol`, `atol`, `max_steps`, `adjoint`: as in `diffrax.diffeqsolve`
      (adaptive steps through `diffrax.PIDController(rtol, atol)`, with `simulate`'s guard:
      a clock that stops advancing ends the solve with `RESULTS.time_stalled`, a field
      that turns non-finite with `RESULTS.nonfinite_flow`, at once where it is non-finite
      at `R0`; the members of a compacting sweep step without the guard and read
      `max_steps_reached` where the field turns non-finite or stalls later on).
    - `throw`: raise if the solve is not successful: a `RuntimeError` naming the `RESULTS`
      code (e.g. `max_steps` reached), or under `jit`/`vmap` a subclass of it
      (`EquinoxRuntimeError`, or `JaxRuntimeError` under plain `jax.jit`).

    **Returns:** an `OttAntonsenSolution` (`R` complex of shape `(times,)`).

    **Raises:** `ValueError` if `A` or `V` is not 2×2, `beta` or `R0` is not a scalar, `ts`
    is not 1-d, or (concrete values) anything is non-finite, `beta ≤ 0` (an inverse
    temperature, refused as `simulate` refuses it) or `|R0| > 1`. Under `jit`/`vmap`
    a non-finite argument gives `R = NaN` and `result = RESULTS.nonfinite_argument`,
    `beta ≤ 0` gives `R = NaN` and `RESULTS.nonpositive_beta` (as in `simulate`),
    `|R0| > 1` gives `R = NaN` and `RESULTS.outside_disc`; `max_steps` gives
    `RESULTS.max_steps_reached`.

    Source: Ott & Antonsen, Chaos 18, 037113 (2008), eq. (11) for the Kuramoto case;
    the docs, theory pages ("Ott–Antonsen").
    """
    where = "solve_ott_antonsen"
    A, V, beta, R0, dtype = check_ott_antonsen_inputs(where, A, V, beta, R0)
    ts = save_times(where, ts, t0, t1, num_save, dtype, rtol=rtol, atol=atol, max_steps=max_steps)
    sol, outside = _solve_oa(
        A.astype(dtype),
        V.astype(dtype),
        beta.astype(dtype),
        R0,
        ts,
        jnp.asarray(t0, dtype),
        jnp.asarray(t1, dtype),
        None if dt0 is None else jnp.asarray(dt0, dtype),
        solver,
        rtol,
        atol,
        int(max_steps),
        adjoint,
    )
    if throw:
        R = eqx.error_if(sol.R, outside, f"{where}: |R0| > 1; R₂ lies in the closed unit disc.")
        R = raise_on_failure(where, sol.result, R, "OttAntonsenSolution.result", sol, (t0, t1))
        sol = eqx.tree_at(lambda s: s.R, sol, R)
    return sol


def sample_wrapped_cauchy(
    key: PRNGKeyArray, n: int, R0, *, symmetric: bool = True, dtype=None
) -> Float[Array, " n"]:
    r"""Angles `θ_k` whose doubles `φ_k = 2θ_k` are i.i.d. wrapped Cauchy with mean resultant `R0`.

    The wrapped Cauchy (Poisson kernel) law
    $p(φ) = \frac{1 − |R_0|^2}{2π |e^{iφ} − R_0|^2}$ has moments `E[e^{imφ}] = R0^m`; it is
    the image of the uniform law under the disc automorphism `u ↦ (R0 + u)/(1 + conj(R0) u)`,
    which is how it is sampled (exactly). So `order_parameter(θ, 2) = R0 + O(1/√n)`, with
    `E|R̂ − R0|² = (1 − |R0|²)/n`.

    Each `φ_k` fixes a token only up to `θ_k ↦ θ_k + π`; with `symmetric=True` (default) the
    token is put at `φ_k/2` or `φ_k/2 + π` with probability 1/2 each (the law of the tokens
    is then antipodally symmetric, as the d = 2 LSA flow is); with `symmetric=False` all
    `θ_k = φ_k/2 ∈ (−π/2, π/2]`.

    **Arguments:**

    - `key`: a JAX PRNG key.
    - `n`: number of tokens (≥ 1).
    - `R0`: complex mean resultant with `|R0| < 1`.
    - `symmetric`: randomise the antipodal lift (see above).
    - `dtype`: real floating dtype of the angles (JAX's default float if omitted).

    **Returns:** angles of shape `(n,)` in `(−π, π]`.

    **Raises:** `ValueError` if `n` is not an integer ≥ 1, `dtype` is not float32 or
    float64, `R0` is not a scalar, or a concrete `R0` is non-finite or has `|R0| ≥ 1`, in
    float64 or once rounded to `dtype` (the wrapped Cauchy law degenerates to a point mass
    at `|R0| = 1`). A traced `R0` with `|R0| ≥ 1` raises an `EquinoxRuntimeError` at run
    time.

    Source: Ott & Antonsen, Chaos 18 (2008) (Poisson-kernel manifold); docs/theory.
    """
    return _wrapped_cauchy(key, n, R0, symmetric, dtype, "sample_wrapped_cauchy")[0]


def _wrapped_cauchy(key, n, R0, symmetric, dtype, where):
    """`sample_wrapped_cauchy`'s angles `θ` and the tokens `(cos θ, sin θ)`, shape `(n, 2)`:
    the same angles, and the tokens to rounding from the sampled point `e^{2iθ}` in square
    roots and divisions (no trigonometry: XLA's float64 `cos`/`sin`, `exp` of a complex and
    `atan2` are scalar code on the CPU, ~5–7 µs each at n = 256, a few per cent of a
    Watanabe–Strogatz sweep member; `e^{iu}` and the argument are `sphere._sincos` and
    `sphere._atan2`, equal to them to rounding)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise ValueError(f"{where}: the number of tokens n must be an integer, got {n!r}.")
    if int(n) < 1:
        raise ValueError(f"{where}: need n >= 1 tokens, got n={n}.")
    if dtype is None:
        dtype = jnp.result_type(float)
    try:
        real = jnp.dtype(dtype) in (jnp.dtype(jnp.float32), jnp.dtype(jnp.float64))
    except TypeError:  # not a dtype at all
        real = False
    if not real:
        raise ValueError(f"{where}: dtype must be float32 or float64, got {dtype!r}.")
    dtype = jnp.dtype(dtype)
    cdtype = jnp.result_type(dtype, jnp.complex64)
    R0 = jnp.asarray(R0)
    if R0.ndim != 0:
        raise ValueError(f"{where}: R0 must be a complex scalar, got shape {R0.shape}.")
    if _is_concrete(R0):
        r0 = complex(np.asarray(R0))
        if not np.isfinite(r0):
            raise ValueError(f"{where}: R0 is not finite ({r0}).")
        # |R0| < 1 in the precision of the angles: in float32 a |R0| just below 1 rounds
        # to 1, the point mass.
        if abs(r0) >= 1 or abs(np.asarray(r0, cdtype)) >= 1:
            raise ValueError(
                f"{where}: need |R0| < 1 for a wrapped Cauchy law (in {dtype.name}), got "
                f"|R0| = {abs(r0):.10g}."
            )
    R0 = eqx.error_if(
        R0.astype(cdtype), ~(jnp.abs(R0) < 1), f"{where}: need finite R0 with |R0| < 1."
    )
    k_u, k_flip = jax.random.split(key)
    u = jax.random.uniform(k_u, (int(n),), dtype=dtype, minval=-jnp.pi, maxval=jnp.pi)
    sin_u, cos_u = _sincos(u)  # e^{iu}; u in [−π, π] by construction
    v = jax.lax.complex(cos_u, sin_u).astype(cdtype)
    z = (R0 + v) / (1 + jnp.conj(R0) * v)
    half = 0.5 * _atan2(jnp.imag(z), jnp.real(z)).astype(dtype)
    # e^{i half} with half = arg(z)/2 in [−π/2, π/2] (so cos half ≥ 0), from z/|z| = x + iy:
    # the larger of cos half = √((1 + x)/2) and |sin half| = √((1 − x)/2) by its square root
    # (no cancellation), the other as y/(2 · it); the sign of y (signed zero included) is
    # the sign of arg z, as `jnp.angle` reads it.
    zr, zi = jnp.real(z).astype(dtype), jnp.imag(z).astype(dtype)
    size = jnp.sqrt(zr * zr + zi * zi)
    x, y = zr / size, zi / size
    right = x >= 0
    big = jnp.sqrt(0.5 * (1 + jnp.where(right, x, -x)))
    big = jnp.where(right, big, jnp.copysign(big, y))
    other = y / (2 * big)
    c, s = jnp.where(right, big, other), jnp.where(right, other, big)
    # arg z = −π (z on the negative real axis with a negative-zero imaginary part, or an
    # angle just above −π rounded to it: 12 of 3·10⁶ float32 angles at R0 = −0.99) would
    # give θ = −π/2, outside (−π/2, π/2]: it is the same φ = 2θ as π, so θ = π/2, and the
    # token is the antipode of the one computed (c ≈ 0).
    low = half <= -jnp.pi / 2
    half = jnp.where(low, jnp.asarray(jnp.pi / 2, half.dtype), half)
    c, s = jnp.where(low, -c, c), jnp.where(low, -s, s)
    if symmetric:
        flip = jax.random.bernoulli(k_flip, 0.5, (int(n),))
        half = jnp.where(flip, jnp.where(half > 0, half - jnp.pi, half + jnp.pi), half)
        # A tiny positive half rounds to −π there: the same token as π, kept in (−π, π].
        half = jnp.where(half <= -jnp.pi, jnp.asarray(jnp.pi, half.dtype), half)
        c, s = jnp.where(flip, -c, c), jnp.where(flip, -s, s)
    return half, jnp.stack([c, s], axis=-1)
