"""The one place where `diffrax.diffeqsolve` is called for the particle flow."""

import math
import warnings

import diffrax
import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from ..sphere import normalise, safe_norm
from ._vector_field import AttentionDynamics, _is_concrete

__all__ = [
    "RESULTS",
    "ProjectedSolver",
    "Solution",
    "SphereProjection",
    "Trajectory",
    "simulate",
    "check_tokens",
]


class RESULTS(diffrax.RESULTS):  # pyright: ignore
    """Outcome of a jaxattn solve: diffrax's codes plus input problems found in the batch.

    Under `vmap` each member carries its own code; with `throw=False` nothing is raised.
    """

    nonfinite_argument = "non-finite entries (NaN or inf) in A, V, beta or the initial tokens"
    zero_token = "an initial token is the zero vector and cannot be placed on the sphere"
    outside_disc = "the initial order parameter lies outside the closed unit disc (|R0| > 1)"
    degenerate_configuration = (
        "degenerate initial angles for the Watanabe–Strogatz reduction: half or more of the "
        "doubled phases coincide, so the Möbius barycentre does not exist"
    )
    usa_overflow = (
        "USA weights exp(beta <x, A y>) exceed the floating-point range; pass score_shift "
        "(a time rescaling) to AttentionDynamics or use float64"
    )


class ProjectedSolver(diffrax.AbstractWrappedSolver):
    """Base for solvers that map every step of a wrapped diffrax solver back onto an
    invariant set of the exact flow (the sphere, the unit disc).

    Subclasses implement `project(y) -> (y_projected, distance)`. The solver state carries
    the largest `distance` met so far (how far single steps strayed before projection).
    The vector fields should be smooth across the invariant set (the attention field
    normalises the tokens; the disc reductions are rational in `ζ`), so that the error
    estimate of the wrapped solver stays meaningful; an FSAL stage reused after a
    projection is off by the projected distance, rounding-sized in a healthy solve.
    """

    solver: eqx.AbstractVar[diffrax.AbstractSolver]

    def project(self, y):
        raise NotImplementedError

    @property
    def scan_kind(self):
        # diffrax forwards `isinstance` checks through wrapped solvers; for a wrapped
        # Runge–Kutta solver `DirectAdjoint` and `ForwardMode` then read (and set, through
        # `eqx.tree_at`) `solver.scan_kind`, which lives on the wrapped solver.
        return self.solver.scan_kind

    @property
    def term_structure(self):
        return self.solver.term_structure

    @property
    def interpolation_cls(self):  # pyright: ignore
        return self.solver.interpolation_cls

    @property
    def term_compatible_contr_kwargs(self):
        return self.solver.term_compatible_contr_kwargs

    def order(self, terms):
        return self.solver.order(terms)

    def strong_order(self, terms):
        return self.solver.strong_order(terms)

    def error_order(self, terms):
        return self.solver.error_order(terms)

    def init(self, terms, t0, t1, y0, args):
        distance = jnp.zeros((), jnp.result_type(y0))
        return self.solver.init(terms, t0, t1, y0, args), distance

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        inner_state, distance = solver_state
        y1, y_error, dense_info, inner_state, result = self.solver.step(
            terms, t0, t1, y0, args, inner_state, made_jump
        )
        y1, step_distance = self.project(y1)
        distance = jnp.maximum(distance, step_distance)
        return y1, y_error, dense_info, (inner_state, distance), result

    def func(self, terms, t0, y0, args):
        return self.solver.func(terms, t0, y0, args)


class SphereProjection(ProjectedSolver):
    """Wraps a diffrax solver and maps every accepted step back onto the sphere.

    After each step of `solver` the state is replaced by `x/|x|` row by row. Because the
    attention field is evaluated at `x/|x|` it is unchanged by this map. The solver state
    carries the largest per-step distance `| |x_k| − 1 |` from the sphere before projection
    (the drift that projection removed).
    """

    solver: diffrax.AbstractSolver

    def project(self, y):
        return normalise(y), jnp.max(jnp.abs(safe_norm(y) - 1))


class Solution(eqx.Module):
    """What every jaxattn solve returns besides its states: save times, the `RESULTS`
    code and diffrax's step statistics. Subclassed by `Trajectory` (particles),
    `OttAntonsenSolution` and `WatanabeStrogatzSolution`."""

    ts: Float[Array, " times"]
    result: RESULTS
    num_steps: Int[Array, ""]
    num_accepted_steps: Int[Array, ""]
    num_rejected_steps: Int[Array, ""]

    @property
    def successful(self) -> Bool[Array, ""]:
        """`result == RESULTS.successful` (per member under `vmap`)."""
        return self.result == RESULTS.successful


def step_statistics(sol: diffrax.Solution) -> dict:
    """The step counts of a diffrax solution, as keyword arguments of `Solution`."""
    return {k: sol.stats[k] for k in ("num_steps", "num_accepted_steps", "num_rejected_steps")}


class Trajectory(Solution):
    """A solution of the attention flow.

    **Fields:**

    - `ts`: save times, shape `(times,)` (solver time; equals physical time unless the
      USA `score_shift` is nonzero, then `t_physical = ts · exp(−score_shift)`).
    - `xs`: tokens at the save times, shape `(times, n, d)`, unit rows (NaN for a member
      whose input was rejected).
    - `result`: a `RESULTS` code (`RESULTS.successful` when all went well).
    - `num_steps`, `num_accepted_steps`, `num_rejected_steps`: step statistics.
    - `sphere_deviation`: the drift off the sphere. With projection (default) the largest
      `| |x_k| − 1 |` that any single step produced before it was projected back; without
      projection, the largest `| |x_k(t)| − 1 |` over save times and tokens of the raw
      numerical solution.
    - `initial_deviation`: `max | |x_k(0)| − 1 |` of the initial tokens as given (they are
      normalised before solving).
    """

    xs: Float[Array, "times n d"]
    sphere_deviation: Float[Array, ""]
    initial_deviation: Float[Array, ""]

    @property
    def final(self) -> Float[Array, "n d"]:
        """Tokens at the last save time, shape `(n, d)`."""
        return self.xs[-1]


def check_tokens(x0, d: int | None = None, *, name: str = "x0"):
    """Trace-time checks of an initial state; concrete values are checked too.

    **Raises:** `ValueError` for a wrong shape, `n = 0`, a wrong `d`, and (for concrete
    arrays only) non-finite or zero tokens, naming the first offending index.

    **Returns:** `x0` as an array and the maximal deviation `max | |x_k| − 1 |` if concrete
    (else `None`).
    """
    x0 = jnp.asarray(x0)
    if x0.ndim != 2:
        raise ValueError(f"{name} must have shape (n, d), got shape {x0.shape}.")
    n, dx = x0.shape
    if n == 0:
        raise ValueError(f"{name} has n = 0 tokens; need at least one.")
    if d is not None and dx != d:
        raise ValueError(f"{name} has d = {dx} columns but A and V are {d}×{d}.")
    if not jnp.issubdtype(x0.dtype, jnp.floating):
        raise ValueError(f"{name} must be a floating array, got dtype {x0.dtype}.")
    deviation = None
    if _is_concrete(x0):
        xn = np.asarray(x0)
        finite = np.all(np.isfinite(xn), axis=1)
        if not finite.all():
            k = int(np.argmin(finite))
            raise ValueError(f"{name}: token {k} has non-finite entries {xn[k].tolist()[:6]}.")
        norms = np.linalg.norm(xn, axis=1)
        if np.any(norms == 0):
            k = int(np.argmax(norms == 0))
            raise ValueError(
                f"{name}: token {k} is the zero vector; it has no place on the sphere."
            )
        deviation = float(np.max(np.abs(norms - 1)))
    return x0, deviation


def _usa_log_limit(dtype) -> float:
    # Keep a margin of e^10 below the largest float for the solver's stage sums.
    return math.log(float(jnp.finfo(dtype).max)) - 10.0


@eqx.filter_jit
def _solve(field, x0, ts, t0, t1, dt0, solver, rtol, atol, max_steps, adjoint, project):
    dtype = x0.dtype
    n = x0.shape[0]
    norms = safe_norm(x0)
    bad_input = ~(
        jnp.all(jnp.isfinite(x0))
        & jnp.all(jnp.isfinite(field.A))
        & jnp.all(jnp.isfinite(field.V))
        & jnp.isfinite(field.beta)
    )
    zero_token = jnp.any(norms == 0)
    if field.kernel == "usa":
        A_safe = jnp.where(jnp.isfinite(field.A), field.A, 0)
        V_safe = jnp.where(jnp.isfinite(field.V), field.V, 0)
        log_bound = (
            jnp.abs(field.beta) * jnp.linalg.norm(A_safe, ord=2)
            - field.score_shift
            + jnp.log(jnp.linalg.norm(V_safe, ord=2) + 1)
        )
        overflow = log_bound > _usa_log_limit(dtype)
    else:
        overflow = jnp.array(False)
    invalid = bad_input | zero_token | overflow
    # A rejected member is solved with a harmless stand-in (zero field, unit tokens) so it
    # costs nothing, and its outputs are NaN: it cannot slow down or poison a batch.
    e1 = jnp.zeros_like(x0).at[:, 0].set(1)
    x_start = jnp.where(invalid, e1, normalise(jnp.where(jnp.isfinite(x0), x0, 0)))
    field_run = eqx.tree_at(
        lambda f: (f.A, f.V, f.beta),
        field,
        (
            jnp.where(invalid, 0, field.A),
            jnp.where(invalid, 0, field.V),
            jnp.where(invalid, 0, field.beta),
        ),
    )
    run_solver = SphereProjection(solver) if project else solver
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(field_run),
        run_solver,
        t0=t0,
        t1=t1,
        dt0=dt0,
        y0=x_start,
        saveat=diffrax.SaveAt(ts=ts, solver_state=project),
        stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol),
        adjoint=adjoint,
        max_steps=max_steps,
        throw=False,
    )
    ys = sol.ys
    if project:
        deviation = sol.solver_state[1]
    else:
        deviation = jnp.max(jnp.abs(safe_norm(ys) - 1))
    xs = normalise(ys)
    result = RESULTS.promote(sol.result)
    result = RESULTS.where(overflow, RESULTS.usa_overflow, result)
    result = RESULTS.where(zero_token, RESULTS.zero_token, result)
    result = RESULTS.where(bad_input, RESULTS.nonfinite_argument, result)
    xs = jnp.where(invalid, jnp.nan, xs)
    del n
    return Trajectory(
        ts=ts,
        xs=xs.astype(dtype),
        result=result,
        **step_statistics(sol),
        sphere_deviation=jnp.where(invalid, jnp.nan, deviation),
        initial_deviation=jnp.max(jnp.abs(norms - 1)),
    )


def save_times(where, ts, t0, t1, num_save, dtype, *, rtol=None, atol=None, max_steps=None):
    """Check the time interval, save times and tolerances of a solve; build default `ts`.

    Shared by `simulate`, `solve_ott_antonsen` and `solve_watanabe_strogatz`. Concrete values
    are checked (traced ones cannot be): `t0`, `t1` finite with `t1 > t0`, `ts` a non-empty
    1-d array, finite, non-decreasing and inside `[t0, t1]`, `rtol`, `atol` finite and
    positive, `max_steps ≥ 1`.

    **Returns:** `ts` as an array of `dtype` (default: `num_save` equally spaced times).

    **Raises:** `ValueError` naming the argument, prefixed with `where`.
    """
    if t1 is None:
        raise ValueError(f"{where}: t1 is required.")
    for name, value in (("t0", t0), ("t1", t1)):
        if _is_concrete(value) and not np.isfinite(np.asarray(value)).all():
            raise ValueError(f"{where}: {name} must be finite, got {value}.")
    if _is_concrete(t0) and _is_concrete(t1) and not float(t1) > float(t0):
        raise ValueError(f"{where}: need t1 > t0 (forward time), got t0={t0}, t1={t1}.")
    for name, value in (("rtol", rtol), ("atol", atol)):
        if value is not None and _is_concrete(value):
            if not (np.isfinite(float(value)) and float(value) > 0):
                raise ValueError(f"{where}: {name} must be a finite positive number, got {value}.")
    if max_steps is not None and int(max_steps) < 1:
        raise ValueError(f"{where}: max_steps must be >= 1, got {max_steps}.")
    if ts is None:
        return jnp.linspace(t0, t1, int(num_save), dtype=dtype)
    ts = jnp.asarray(ts, dtype=dtype)
    if ts.ndim != 1 or ts.shape[0] == 0:
        raise ValueError(f"{where}: ts must be a non-empty 1-d array, got shape {ts.shape}.")
    if _is_concrete(ts):
        tsn = np.asarray(ts, dtype=np.float64)
        if (
            not np.isfinite(tsn).all()
            or np.any(np.diff(tsn) < 0)
            or (_is_concrete(t0) and tsn[0] < float(t0))
            or (_is_concrete(t1) and tsn[-1] > float(t1))
        ):
            raise ValueError(f"{where}: ts must be finite, non-decreasing and inside [t0, t1].")
    return ts


def simulate(
    field: AttentionDynamics,
    x0: Float[Array, "n d"],
    *,
    t1: float,
    t0: float = 0.0,
    ts: Float[Array, " times"] | None = None,
    num_save: int = 101,
    dt0: float | None = None,
    solver: diffrax.AbstractSolver = diffrax.Tsit5(),
    rtol: float = 1e-7,
    atol: float = 1e-9,
    max_steps: int = 65536,
    adjoint: diffrax.AbstractAdjoint = diffrax.RecursiveCheckpointAdjoint(),
    project: bool = True,
    throw: bool = True,
) -> Trajectory:
    r"""Solve the attention flow `dx_k/dt = P⊥_{x_k}((1/n) Σ_j w_kj V x_j)` from `x0`.

    The tokens are kept on S^{d-1}: the field is evaluated at `x/|x|` (so `|x_k|` is an
    exact invariant of the continuous flow) and, with `project=True`, every step is mapped
    back onto the sphere (`SphereProjection`), which keeps `|x_k| = 1` to rounding over
    long horizons; `Trajectory.sphere_deviation` reports the residual drift.

    Initial tokens off the sphere are normalised (with a `UserWarning` when concrete and
    off by more than `1e-6`); the deviation is kept in `Trajectory.initial_deviation`.

    Differentiable in `field.A`, `field.V`, `field.beta` and `x0` (through `adjoint`,
    default `RecursiveCheckpointAdjoint`), jit-able and vmappable over all of them.

    **Arguments:**

    - `field`: an `AttentionDynamics` (any kernel, any `d ≥ 2`).
    - `x0`: initial tokens, shape `(n, d)`, `n ≥ 1`, float32 or float64.
    - `t1`, `t0`: end and start time.
    - `ts`: save times, shape `(times,)`, inside `[t0, t1]`; default `num_save` equally
      spaced times from `t0` to `t1`.
    - `dt0`, `solver`, `rtol`, `atol`, `max_steps`, `adjoint`: as in `diffrax.diffeqsolve`
      (adaptive steps through `diffrax.PIDController(rtol, atol)`).
    - `project`: renormalise after every step (recommended).
    - `throw`: raise if the solve is not successful. With `throw=False` the failure is
      reported in `Trajectory.result` only, member by member under `vmap`.

    **Returns:** a `Trajectory`.

    **Raises:** `ValueError` for wrong shapes, `n = 0`, non-finite or zero initial tokens
    (the index is named), non-finite `t0`/`t1` or `t1 ≤ t0`, `ts` outside `[t0, t1]`,
    non-positive `rtol`/`atol`, non-finite `A`, `V`, `beta`, or a USA field whose weights would
    overflow. With `throw=True` and traced inputs, these and solver failures (e.g.
    `max_steps` reached) raise an `EquinoxRuntimeError` naming the `RESULTS` code.

    Source: Li et al. (2026), eq. (1); Geshkovski et al., arXiv 2312.10794, eq. (1.1).
    """
    if not isinstance(field, AttentionDynamics):
        raise ValueError(f"field must be an AttentionDynamics, got {type(field).__name__}.")
    x0, deviation = check_tokens(x0, field.d)
    if deviation is not None and deviation > 1e-6:
        warnings.warn(
            f"simulate: initial tokens are off the unit sphere (max | |x_k| - 1 | = "
            f"{deviation:.3g}); they were normalised before solving.",
            UserWarning,
            stacklevel=2,
        )
    dtype = jnp.result_type(x0.dtype, field.A.dtype)
    x0 = x0.astype(dtype)
    if field.A.dtype != dtype:
        field = eqx.tree_at(
            lambda f: (f.A, f.V, f.beta, f.score_shift),
            field,
            (f.astype(dtype) for f in (field.A, field.V, field.beta, field.score_shift)),
        )
    if field.kernel == "usa" and _is_concrete(field.A) and _is_concrete(field.beta):
        log_bound = (
            float(abs(field.beta)) * float(np.linalg.norm(np.asarray(field.A), 2))
            - float(field.score_shift)
            + math.log(float(np.linalg.norm(np.asarray(field.V), 2)) + 1)
        )
        if np.isfinite(log_bound) and log_bound > _usa_log_limit(dtype):
            bound = float(field.score_bound())
            raise ValueError(
                f"simulate: USA scores reach beta*sigma_max(A) = {bound:.4g}, past the range "
                f"of exp in {jnp.dtype(dtype).name} (log max ≈ {_usa_log_limit(dtype) + 10:.1f}). "
                f"Pass score_shift={bound:.4g} to AttentionDynamics (`--score-shift` on the "
                f"command line; time is then rescaled by exp(score_shift)) or use float64."
            )
    ts = save_times(
        "simulate", ts, t0, t1, num_save, dtype, rtol=rtol, atol=atol, max_steps=max_steps
    )
    traj = _solve(
        field,
        x0,
        ts,
        jnp.asarray(t0, dtype),
        jnp.asarray(t1, dtype),
        None if dt0 is None else jnp.asarray(dt0, dtype),
        solver,
        rtol,
        atol,
        int(max_steps),
        adjoint,
        bool(project),
    )
    if throw:
        traj = eqx.tree_at(
            lambda tr: tr.xs,
            traj,
            traj.result.error_if(traj.xs, traj.result != RESULTS.successful),
        )
    return traj
