"""The one place where `diffrax.diffeqsolve` is called for the particle flow."""

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import diffrax
import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from .._warn import warn_at_caller
from ..sphere import normalise, safe_norm
from ._segments import Problem, solve_problem
from ._vector_field import AttentionDynamics, _is_concrete, unit_columns

__all__ = [
    "RESULTS",
    "ProjectedSolver",
    "Solution",
    "SphereProjection",
    "Trajectory",
    "simulate",
    "check_tokens",
    "environment_record",
    "memory_available",
    "memory_estimate",
    "promote_result",
    "usa_score_shift",
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
        "USA weights exp(beta <x, A y> - score_shift) can exceed the floating-point range of "
        "the solve's dtype; pass a larger score_shift to AttentionDynamics or "
        "MultiHeadDynamics (a time rescaling; usa_score_shift gives the smallest that fits)"
    )
    nonpositive_beta = "beta <= 0: beta is an inverse temperature and must be positive"
    time_stalled = (
        "the time stopped advancing: the step the controller asked for was below the "
        "floating-point spacing of t, so the same step was retried without progress. Either "
        "t is coarse in this dtype (e.g. spacing 0.0078 near t = 1e5 in float32: start the "
        "run at t0 = 0, solve in float64 or loosen rtol/atol), or the solution changes ever "
        "faster there (it blows up in finite time or the flow is singular: no setting helps); "
        "more max_steps will not help"
    )
    # Appended last: the codes above keep their numbers (saved sweeps store them).
    nonfinite_flow = (
        "the flow returned non-finite values (NaN or inf) during the solve and smaller steps "
        "did not avoid them: the vector field itself is NaN or overflows there (e.g. weights "
        "so large that the scores overflow, or a flow that divides by zero), so neither "
        "max_steps nor the tolerances will help"
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

    def _own_first_stage(self, terms, t0, y0, args, inner_state):
        """The wrapped FSAL Runge–Kutta state with the first stage `f(t0, y0)` evaluated
        here, for the members on their first step only.

        diffrax evaluates that stage for every member of a vmapped batch as soon as one
        member is on its first step (`unvmap_any(first_step)`). After a projection the
        stage it then recomputes differs by rounding from the stage a member carries
        (evaluated before the projection), so a member's steps depended on whether another
        member of its batch had just started: in a compacting pool, on which members
        shared it (WS, 512 pairs: 6 members took 1–3 steps more or fewer than in lockstep,
        R₂ off by up to 3e-7); in lockstep, on another member's rejected first step.
        Evaluated here and handed over as a carried stage, each member's steps are its own.
        (Not in `init`: diffeqsolve stops gradients through the initial solver state, so
        the first stage must be computed inside a step.)
        """
        if not (isinstance(self.solver, diffrax.AbstractRungeKutta) and inner_state is not None):
            return inner_state
        first, f0 = inner_state
        fresh = jax.lax.cond(
            eqxi.unvmap_any(first),
            lambda: self.solver.func(terms, t0, y0, args),
            lambda: f0,
        )
        f0 = jax.tree.map(lambda a, b: jnp.where(first, a, b), fresh, f0)
        return jnp.zeros_like(first), f0

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        inner_state, distance = solver_state
        inner_state = self._own_first_stage(terms, t0, y0, args, inner_state)
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


class _TokenMajorSphereProjection(SphereProjection):
    """`SphereProjection` of a state stored token-major, shape `(d, n)` (`_TokenMajor`)."""

    def project(self, y):
        u, r = unit_columns(y)
        return u, jnp.max(jnp.abs(r - 1))


class _TokenMajor(eqx.Module):
    """A flow on tokens `(n, d)` integrated on the state `y = xᵀ` of shape `(d, n)`.

    The same arithmetic (the field sees `yᵀ`; states agree with the token-row solve to
    ~1e-14), but XLA lays out every intermediate so that each coordinate is a contiguous
    run of `n` numbers: for small d the field's elementwise work vectorises over tokens.
    Measured on CPU, float64, d = 2, LSA: 1.4–2.3× per field evaluation, a whole solve
    (t1 = 50, 201 saves) 1.34× at n = 256 and 1.46× at n = 1024; a compact sweep of 256
    random pairs 1.17× (median of 3 interleaved rounds, load ~5;
    `experiments/bench_compaction.py --layout`)."""

    field: Any

    @property
    def manifold(self):
        return getattr(self.field, "manifold", "sphere")

    def __call__(self, t, y, args=None):
        if isinstance(self.field, AttentionDynamics):
            return self.field.token_major(t, y, args)
        return self.field(t, y.T, args).T


class Environment(Mapping):
    """A read-only, hashable record of where and how a result was computed (the
    `Trajectory.environment` static field): `environment_record()` plus the solve's
    `dtype`. Lists become tuples; `dict(env)` gives the JSON-ready dict."""

    __slots__ = ("_items",)

    def __init__(self, record: Mapping):
        self._items = tuple(
            (str(k), tuple(v) if isinstance(v, list) else v) for k, v in record.items()
        )

    def __getitem__(self, key):
        for k, v in self._items:
            if k == key:
                return v
        raise KeyError(key)

    def __iter__(self):
        return (k for k, _ in self._items)

    def __len__(self):
        return len(self._items)

    def __hash__(self):
        return hash(self._items)

    def __eq__(self, other):
        return isinstance(other, Mapping) and dict(self._items) == dict(other)

    def __repr__(self):
        return f"Environment({dict(self._items)!r})"


def solve_environment(dtype) -> Environment:
    """`environment_record()` with the solve's `dtype`, as a `Trajectory.environment`."""
    return Environment(dict(environment_record(), dtype=jnp.dtype(dtype).name))


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
      whose input was rejected); the raw states for a flow with `manifold = "euclidean"`.
    - `result`: a `RESULTS` code (`RESULTS.successful` when all went well).
    - `num_steps`, `num_accepted_steps`, `num_rejected_steps`: step statistics.
    - `sphere_deviation`: the drift off the sphere. With projection (default) the largest
      `| |x_k| − 1 |` that any single step produced before it was projected back; without
      projection, the largest `| |x_k(t)| − 1 |` over save times and tokens of the raw
      numerical solution; NaN for a flow with `manifold = "euclidean"`.
    - `initial_deviation`: `max | |x_k(0)| − 1 |` of the initial tokens as given (they are
      normalised before solving).
    - `environment`: where and how the solve was compiled, a read-only mapping (`dict(...)`
      for JSON): `environment_record()` (`backend`, `device_count`, `devices`,
      `matmul_precision`, `x64`, versions) plus `dtype`, the solve's float type. Host-side
      static information (a static field: not a leaf, so `jit`, `vmap` and `grad` of
      `simulate` see the same pytree), recorded when the solve is traced; `None` for a
      `Trajectory` built by hand.
    """

    xs: Float[Array, "times n d"]
    sphere_deviation: Float[Array, ""]
    initial_deviation: Float[Array, ""]
    environment: Environment | None = eqx.field(static=True, default=None)

    @property
    def final(self) -> Float[Array, "n d"]:
        """Tokens at the last save time, shape `(n, d)`."""
        return self.xs[-1]


def warn_off_sphere(where: str, manifold: str, deviation: float | None) -> None:
    """The `UserWarning` (at the caller) that concrete initial tokens of a flow on the
    sphere were off it by more than 1e-6 (`deviation` from `check_tokens`; `None` when
    traced) and were normalised; shared by `simulate` and `lyapunov_spectrum`."""
    if manifold == "sphere" and deviation is not None and deviation > 1e-6:
        warn_at_caller(
            f"{where}: initial tokens are off the unit sphere (max | |x_k| - 1 | = "
            f"{deviation:.3g}); they were normalised before solving."
        )


def check_tokens(x0, d: int | None = None, *, name: str = "x0", allow_zero: bool = False):
    """Trace-time checks of an initial state; concrete values are checked too.

    **Raises:** `ValueError` for a wrong shape, `n = 0`, a wrong `d`, and (for concrete
    arrays only) non-finite or (unless `allow_zero`) zero tokens, naming the first
    offending index.

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
        norms = _row_norms(xn)
        if not allow_zero and np.any(norms == 0):
            k = int(np.argmax(norms == 0))
            raise ValueError(
                f"{name}: token {k} is the zero vector; it has no place on the sphere."
            )
        deviation = float(np.max(np.abs(norms - 1)))
    return x0, deviation


def _row_exponents(x: np.ndarray) -> np.ndarray:
    """Per row of `x`, the binary exponent `e` with `max_i |x_i| < 2**e` (0 for a zero
    row): `x * 2**-e` is `x` scaled exactly into [-1, 1]."""
    top = np.max(np.abs(x), axis=1)
    return np.frexp(np.where(top > 0, top, 1))[1]


def _row_norms(x: np.ndarray) -> np.ndarray:
    """`|x_k|` of every row in float64, without the overflow or underflow of its squares
    (tokens of 1e300 or 1e-300 have norms 1e300 and 1e-300, not inf and 0)."""
    x = np.asarray(x, np.float64)
    e = _row_exponents(x)
    with np.errstate(over="ignore"):  # a norm beyond float64 is inf: a true deviation
        return np.ldexp(np.linalg.norm(np.ldexp(x, -e[:, None]), axis=1), e)


def _scaled_into_range(x0):
    """Tokens `x0` with every row scaled by a power of 2 so that its largest entry lies in
    [1/2, 1): the same directions exactly (a power of 2 scales without rounding), and
    squares that neither overflow nor underflow when the solver normalises them, in the
    dtype JAX will hold them in (float32 for float64 input without 64-bit JAX: 1e300
    would become inf in the cast). `x0` itself when no row needs it, or when it is not a
    concrete 2-d floating array (traced, wrong shape or kind: left to `check_tokens`)."""
    if not _is_concrete(x0):
        return x0
    xn = np.asarray(x0)
    if xn.ndim != 2 or not np.issubdtype(xn.dtype, np.floating) or xn.size == 0:
        return x0
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        squares = np.sum(xn.astype(np.float64) ** 2, axis=1)
    held = np.finfo(jax.dtypes.canonicalize_dtype(xn.dtype))
    fits = (squares > float(held.tiny)) & (squares < float(held.max))
    # (rows with a non-finite entry or all zero are refused by name in `check_tokens`)
    if np.all(fits | ~np.all(np.isfinite(xn), axis=1) | np.all(xn == 0, axis=1)):
        return x0
    e = _row_exponents(np.where(np.isfinite(xn), xn, 0))
    scaled = np.ldexp(xn, -e[:, None]).astype(xn.dtype)
    return jnp.asarray(scaled) if isinstance(x0, jax.Array) else scaled


class _Guarded(eqx.Module):
    """A flow whose velocity is replaced by zero for a rejected member (so that a batch
    member with bad input costs nothing and cannot poison the batch)."""

    field: eqx.Module
    off: Bool[Array, ""]

    def __call__(self, t, x, args):
        f = self.field(t, x, args)
        return jnp.where(self.off, jnp.zeros_like(f), f)


def flow_manifold(field) -> str:
    """The state manifold of a flow: its `manifold` member, `"sphere"` when absent.

    **Raises:** `ValueError` naming the flow if the member is neither `"sphere"` nor
    `"euclidean"`.
    """
    manifold = getattr(field, "manifold", "sphere")
    if manifold not in ("sphere", "euclidean"):
        raise ValueError(
            f"flow {type(field).__name__}: manifold must be 'sphere' or 'euclidean', got "
            f"{manifold!r}."
        )
    return manifold


def check_flow(where: str, field, x0, t0, manifold: str, *, require_finite: bool = True) -> None:
    """Cheap checks of a flow at the initial tokens, before solving.

    Always (trace time): `field(t0, x0, None)` can be traced by JAX and returns a floating
    array of the shape of `x0`. When `x0` and the flow's arrays are concrete, the flow is
    evaluated once: its velocity must be finite (unless `require_finite=False`, as in a
    sweep, where a member with non-finite input fails alone with its own status; such
    tokens are then skipped), and for a sphere flow tangent at the normalised tokens,
    `|<x̂_k, f_k>| ≤ √eps (1 + |f_k|)`.

    **Raises:** `ValueError` naming the flow (its class) and the problem.
    """
    name = type(field).__name__
    if not isinstance(field, eqx.Module) or not callable(field):
        raise ValueError(
            f"{where}: field must be a flow, an equinox Module with __call__(t, x, args) -> "
            f"dx/dt, got {name}."
        )
    x_eval = normalise(x0) if manifold == "sphere" else x0
    try:
        out = eqx.filter_eval_shape(field, t0, x_eval, None)
    except (jax.errors.JAXTypeError, jax.errors.JAXIndexError, TypeError, ValueError) as err:
        # ValueError: JAX's own shape errors inside the flow (e.g. an array leaf whose shape
        # does not fit the tokens, "Incompatible shapes for broadcasting").
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(
            f"{where}: the flow {name} cannot be traced by JAX on tokens of shape {x0.shape} "
            "(its __call__ must be jittable: no Python control flow on values, no NumPy "
            f"conversion of its inputs; its arrays must fit the tokens' shape): {first}."
        ) from err
    shape = getattr(out, "shape", None)
    if shape != x0.shape or not jnp.issubdtype(getattr(out, "dtype", jnp.int32), jnp.floating):
        got = (
            f"shape {shape}, dtype {getattr(out, 'dtype', None)}"
            if shape is not None
            else (type(out).__name__)
        )
        raise ValueError(
            f"{where}: the flow {name} must return dx/dt of the tokens' shape {x0.shape} "
            f"(floating), got {got}."
        )
    concrete = _is_concrete(x0) and all(
        _is_concrete(leaf) for leaf in jax.tree.leaves(eqx.filter(field, eqx.is_array))
    )
    if not concrete:
        return
    f = np.asarray(field(t0, x_eval, None))
    finite = np.all(np.isfinite(f), axis=1)
    if not finite.all() and require_finite:
        k = int(np.argmin(finite))
        raise ValueError(
            f"{where}: the flow {name} returned non-finite values (NaN or inf) at the initial "
            f"tokens (first at token {k})."
        )
    if manifold == "sphere":
        xn = np.asarray(x_eval)
        radial = np.abs(np.sum(xn * f, axis=1))
        tol = float(np.sqrt(np.finfo(f.dtype).eps)) * (1 + np.linalg.norm(f, axis=1))
        off = finite & (radial > tol)
        if np.any(off):
            k = int(np.argmax(np.where(off, radial - tol, -np.inf)))
            raise ValueError(
                f"{where}: the flow {name} leaves the tangent space of the sphere: "
                f"<x_k, dx_k/dt> = {float(np.sum(xn[k] * f[k])):.3g} at token {k} (a sphere "
                f"flow must return tangent vectors, e.g. P⊥_x v = v - <x, v> x; a flow whose "
                f"token norms evolve declares manifold = 'euclidean')."
            )


def environment_record() -> dict:
    """Where and how a result was computed, for result files and manifests.

    **Returns:** a JSON-ready dict: `backend` (`jax.default_backend()`), `device_count`,
    `devices` (their kinds), `matmul_precision` (`jax_default_matmul_precision`, `None` =
    the backend default, which on GPUs/TPUs may use reduced-precision passes for float32),
    `x64` (float64 enabled), and the versions of jax, jaxlib, diffrax and equinox.
    """
    import jax

    def version(module):
        try:
            return __import__(module).__version__
        except Exception:  # not installed / no version
            return None

    return dict(
        backend=jax.default_backend(),
        device_count=jax.device_count(),
        devices=sorted({d.device_kind for d in jax.devices()}),
        matmul_precision=jax.config.jax_default_matmul_precision,
        x64=bool(jax.config.jax_enable_x64),
        jax=jax.__version__,
        jaxlib=version("jaxlib"),
        diffrax=diffrax.__version__,
        equinox=version("equinox"),
    )


def memory_available(device=None) -> int | None:
    """Bytes free for a new computation on `device` (default: the first device):
    `bytes_limit − bytes_in_use` of an accelerator's allocator, or `MemAvailable` of
    `/proc/meminfo` on a CPU. `None` when neither can be read."""
    import jax

    device = jax.devices()[0] if device is None else device
    try:
        stats = device.memory_stats()
    except Exception:  # some backends do not implement it
        stats = None
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
    return meminfo_available()


def meminfo_available() -> int | None:
    """Bytes of host RAM available: `MemAvailable` of `/proc/meminfo` (None when it cannot
    be read)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def memory_estimate(field, n: int, num_save: int, *, d: int | None = None, dtype=None) -> int:
    r"""Estimated peak bytes of one `simulate` solve (forward only, one member).

    `itemsize · (c n² + (num_save + 16) n d + 4 d²)`: the `(n, n)` score and weight
    matrices of the USA and SA kernels (`c = 2`; `c = 0` for LSA, evaluated in O(n d²)),
    the saved states and ~16 token-sized solver buffers (Tsit5 stages, error estimate,
    projection). Measured with XLA's `memory_analysis` of the compiled solve on CPU
    (float64, n = 512 … 2048): temporaries 1.02–1.10 n² words for SA/USA (`c = 2` leaves
    room for a backend that does not fuse the exponential into the matmul) and 13–14 n d
    words for LSA. A reverse-mode gradient stores `checkpoints` states in addition; a
    vmapped batch of B members needs about B times this.

    **Arguments:** `field` a flow (its `kernel`, `"lsa"` when absent, decides the n² term);
    `n` tokens; `num_save` save times; `d` dimension (default `field.d`); `dtype` (default
    the field's float type).

    **Returns:** bytes, an int.
    """
    d = int(field.d if d is None else d)
    if dtype is None:
        leaves = jax_leaves_dtype(field)
        dtype = leaves if leaves is not None else jnp.result_type(float)
    itemsize = np.dtype(dtype).itemsize
    quadratic = 2 if getattr(field, "kernel", "lsa") in ("usa", "sa") else 0
    n, num_save = int(n), int(num_save)
    return itemsize * (quadratic * n * n + (num_save + 16) * n * d + 4 * d * d)


def jax_leaves_dtype(field):
    """The common float type of a flow's array leaves (None if it has none)."""
    import jax

    leaves = [x for x in jax.tree_util.tree_leaves(field) if eqx.is_inexact_array(x)]
    return jnp.result_type(*leaves) if leaves else None


class _StallGuardPID(diffrax.PIDController):
    """`diffrax.PIDController` that ends the solve when the time stops advancing.

    When the float spacing of `t` is coarse against the steps (float32 far from zero:
    0.0078 near t = 1e5), the time can stop advancing: a step `t0 + dt` that rounds to `t0`
    (zero length, and every later step too), or a rejected step that is retried with the
    very same `(t0, t1)` (diffrax rounds a step ending within 100 spacings of the horizon
    to the horizon, or a rejected one to the midpoint, so the smaller step never comes).
    Either repeats until `max_steps` ("try increasing max_steps", which cannot help). The
    controller state carries the previous `(t0, t1)`; a repeat or a zero step ends the solve
    at once with `dt_min_reached`, which `promote_result` reports as
    `RESULTS.time_stalled` (jaxattn never sets `dtmin`, so the code is unambiguous). A
    stall short of the end of a step whose values were not finite (the flow is NaN or
    overflows beyond that time) ends it with `nonfinite` instead, reported as
    `RESULTS.nonfinite_flow`: smaller steps or float64 cannot help there.
    """

    def init(self, terms, t0, t1, y0, dt0, args, func, error_order):
        t_next, state = super().init(terms, t0, t1, y0, dt0, args, func, error_order)
        dtype = jnp.result_type(t0, t1, float)
        # (t0, t1) of the previous step, and the end of the latest step whose values were
        # not finite (-inf: none yet)
        last = jnp.array([jnp.nan, jnp.nan, -jnp.inf], dtype)
        return t_next, (state, last)

    def adapt_step_size(self, t0, t1, y0, y1_candidate, args, y_error, error_order, state):
        inner, last = state
        keep, next_t0, next_t1, made_jump, inner, result = super().adapt_step_size(
            t0, t1, y0, y1_candidate, args, y_error, error_order, inner
        )
        stalled = (t1 <= t0) | ((t0 == last[0]) & (t1 == last[1]))
        # A stall in front of non-finite values is the flow's fault, not the clock's: a
        # step whose values are NaN or inf is rejected and shrunk, again and again, until
        # it stalls (at once, or with finite values just short of where the flow breaks).
        # Read from the error estimate alone, by its sum (a NaN or inf stage makes it
        # non-finite): one cheap reduction per step, ~2.5 % of a particle solve at n = 256
        # (checking every entry of the state and the estimate cost ~4 %).
        finite = jnp.isfinite(sum(jnp.sum(leaf) for leaf in jax.tree.leaves(y_error)))
        t_bad = jnp.where(finite, last[2], t1)
        code = diffrax.RESULTS.where(
            t_bad >= t0, diffrax.RESULTS.nonfinite, diffrax.RESULTS.dt_min_reached
        )
        result = diffrax.RESULTS.where(stalled, code, result)
        last = jnp.stack([t0, t1, t_bad]).astype(last.dtype)
        return keep, next_t0, next_t1, made_jump, (inner, last), result


def pid_controller(rtol, atol, *, stall_guard: bool) -> diffrax.PIDController:
    """The step-size controller of the reduced-equation solvers: `_StallGuardPID` for a
    standalone solve (a stalled clock or an overflowing field ends at once with
    `time_stalled` / `nonfinite_flow`, the steps are otherwise the same), the plain
    `diffrax.PIDController` for sweep members, whose two- or three-variable step the
    guard's few small kernels slow by 22-47 % (bench_compaction)."""
    return (_StallGuardPID if stall_guard else diffrax.PIDController)(rtol=rtol, atol=atol)


def promote_result(result) -> RESULTS:
    """diffrax's result as a jaxattn `RESULTS` code; `dt_min_reached` (which jaxattn's
    solvers never request through `dtmin`, but the stalled-time guard of `ProjectedSolver`
    returns) becomes `RESULTS.time_stalled`, and `nonfinite` (the guard's code for a stall
    on non-finite values) `RESULTS.nonfinite_flow`."""
    result = RESULTS.promote(result)
    result = RESULTS.where(result == RESULTS.nonfinite, RESULTS.nonfinite_flow, result)
    return RESULTS.where(result == RESULTS.dt_min_reached, RESULTS.time_stalled, result)


def raise_on_failure(where: str, result: RESULTS, x, result_field: str, sol, span: tuple):
    """`x` unchanged if `result` is `RESULTS.successful`; else an error that names the
    code: what `throw=True` does for the solvers.

    Outside `jit`/`vmap` (a concrete `result`) it is a plain `RuntimeError` raised here,
    with the way to keep the result (`throw=False`, the code in `result_field`) and, from
    the solution `sol` (a `Solution`, whose `x` holds one row per save time) and the solve's
    `span = (t0, t1)`, how far the solve got: its steps and the last save time it reached;
    for `max_steps_reached` also a lower bound on the steps the horizon needs
    (`progress_message`). Traced, the check runs with the program (`error_if`) and raises
    a `RuntimeError` subclass with the code's message: equinox's `EquinoxRuntimeError`
    (`eqx.filter_jit`, `vmap`) or `jax.errors.JaxRuntimeError` (plain `jax.jit`).

    **Raises:** `RuntimeError` (concrete `result`) as above.
    """
    if result.is_traced():
        return result.error_if(x, result != RESULTS.successful)
    codes = np.asarray(result._value).reshape(-1)
    bad = codes[codes != int(RESULTS.successful._value)]
    if bad.size == 0:
        return x
    message = RESULTS._index_to_message[int(bad[0])].rstrip(".")
    progress = ""
    if codes.size == 1:
        progress = progress_message(sol, x, int(bad[0]), *span)
    raise RuntimeError(
        f"{where}: the solve did not succeed: {message}.{progress} Pass "
        f"throw=False to get the result anyway, with its code in {result_field}."
    )


def progress_message(sol, x, code: int, t0, t1) -> str:
    """How far a failed (concrete, unbatched) solve from `t0` to `t1` got, as a sentence for
    its error: the steps it took and the last save time whose state `x[k]` is finite
    (diffrax leaves the saves it never reached non-finite). For `max_steps_reached` also a
    lower bound on the steps the horizon needs at the pace so far: it stopped before the
    first save it did not reach, so it covered less than that much of `t1 - t0`. A bound
    above 1e8, or 50+ steps none of them accepted, reads as a stiff or extreme field, which
    more steps cannot help; where the save times are too sparse for a useful bound (one
    barely above the steps taken) it says so. Empty where `sol` has no concrete times and steps."""
    try:
        ts = np.asarray(sol.ts, np.float64).reshape(-1)
        steps = int(np.asarray(sol.num_steps))
        accepted = int(np.asarray(sol.num_accepted_steps))
        rows = np.asarray(x).reshape(ts.shape[0], -1)
        t0, t1 = float(t0), float(t1)
    except Exception:  # traced, or shapes this sentence does not know: the plain message
        return ""
    finite = np.all(np.isfinite(rows), axis=1)
    reached = ts.shape[0] if finite.all() else int(np.argmin(finite))
    if reached == 0:
        where = f"it reached no save time (the first is t = {ts[0]:.6g}; t1 = {t1:.6g})"
    else:
        where = f"the last save reached is t = {ts[reached - 1]:.6g} (t1 = {t1:.6g})"
    out = f" It stopped after {steps} steps ({accepted} accepted); {where}."
    if code != int(RESULTS.max_steps_reached._value):
        return out
    stiff = (
        " The field is stiff or extremely large there (check the size of the weights and "
        "of beta), or shorten t1."
    )
    if accepted == 0 and steps >= 50:
        return out + " None was accepted: more max_steps cannot help." + stiff
    # It stopped before the first save it did not reach (or before t1, all saves reached).
    before = ts[reached] if reached < ts.shape[0] else t1
    covered = before - t0
    need = steps * (t1 - t0) / covered if covered > 0 else np.inf
    if need > 1e8 and accepted > 0:
        return (
            out
            + f" At that pace t = {t1:.6g} needs over {need:.2g} steps: more max_steps cannot help."
            + stiff
        )
    if not need >= 1.1 * steps:
        return out + " The save times are too sparse to bound the steps it needs: raise max_steps."
    return (
        out
        + f" At that pace t = {t1:.6g} needs at least {need:.2g} steps: raise max_steps above that."
    )


def usa_overflow_message(where: str, field, dtype) -> str:
    """The refusal of a USA field whose weights can overflow `dtype`, with the smallest
    `score_shift` that fits (`usa_score_shift`) and, in float32 only, float64 as the other
    way out. The shift is `usa_score_shift`, or more where the value maps are so large
    that `check_usa_overflow` would refuse that one too (rounded up, so that the printed
    number passes)."""
    bound = _concrete_score_bound(field)
    shift = _shift_that_fits(field, dtype)
    name = jnp.dtype(dtype).name
    heads = np.ndim(field.A) == 3
    lines = (
        f"{where}: USA scores reach beta*sigma_max(A) = {bound:.4g}"
        f"{' (the largest over the heads)' if heads else ''} with score_shift = "
        f"{float(field.score_shift):.4g}; exp of that overflows {name} (log of its max ≈ "
        f"{math.log(float(jnp.finfo(dtype).max)):.1f}). Pass score_shift={shift:.6g} to "
        f"{type(field).__name__} ("
        + (
            "usa_score_shift"
            if heads
            else "usa_score_shift; `--score-shift auto` on the command line"
        )
        + f"). It rescales time by exp(score_shift): the horizon t1 then covers the physical "
        f"time t1 * exp(-{shift:.4g})"
    )
    if np.dtype(dtype).itemsize < 8:
        f64 = _shift_that_fits(field, np.float64)
        lines += (
            ", or solve in float64 (no shift needed)."
            if f64 == 0
            else f", or solve in float64 (needs score_shift={f64:.6g})."
        )
    else:
        lines += "."
    return lines


def _shift_that_fits(field, dtype) -> float:
    """`usa_score_shift`, raised to what `check_usa_overflow` needs where the value maps'
    norms add to the bound; rounded up to 6 significant digits."""
    shift = max(
        usa_score_shift(field, dtype), _usa_log_bound_unshifted(field) - _usa_log_limit(dtype)
    )
    if shift <= 0:
        return 0.0
    step = 10.0 ** (math.floor(math.log10(shift)) - 5)
    return math.ceil(shift / step) * step


def _usa_log_bound_unshifted(field) -> float:
    """`max_h β_h σ_max(A_h) + log max(Σ_h σ_max(V_h) ‖W_o^(h)‖₂, 1)` of a field with
    concrete finite weights: the log of a bound of the USA field before the shift."""
    values = np.linalg.norm(np.asarray(field.V, np.float64), 2, axis=(-2, -1))
    W_o = getattr(field, "W_o", None)
    if W_o is not None:
        values = values * np.linalg.norm(np.asarray(W_o, np.float64), 2, axis=(-2, -1))
    return _concrete_score_bound(field) + math.log(max(float(np.sum(values)), 1.0))


def _usa_log_limit(dtype) -> float:
    # Largest admissible log of the USA field bound exp(β σ_max(A) − shift) · max(σ_max(V), 1):
    # a factor 64 below the largest float covers the solver's stage sums.
    return math.log(float(jnp.finfo(dtype).max)) - math.log(64.0)


def _concrete_score_bound(field) -> float:
    """`β σ_max(A)` of a field with concrete `A` and `beta`; the largest over the heads of a
    multi-head field (`A` of shape `(heads, d, d)`, `beta` a scalar or `(heads,)`)."""
    sigma = np.linalg.norm(np.asarray(field.A, np.float64), 2, axis=(-2, -1))
    return float(np.max(np.abs(np.asarray(field.beta, np.float64)) * sigma))


def usa_score_shift(field, dtype=None) -> float:
    r"""The USA `score_shift` that `jaxattn` uses when asked for `"auto"`:
    `max(0, β σ_max(A) − ½ log(float max))` (the largest `β_h σ_max(A_h)` over the heads of
    a `MultiHeadDynamics`).

    It leaves half the exponent range between the largest weight `exp(β σ_max(A) − shift)`
    and the float limit (so the field, the stage sums and the weights of less aligned pairs
    stay representable), and is zero whenever the unshifted scores fit. Time is rescaled by
    `exp(shift)`: the horizon `t1` covers the physical time `t1 · exp(−shift)`.

    **Arguments:** `field` an `AttentionDynamics` or `MultiHeadDynamics` with concrete `A`
    and `beta`; `dtype` the solve's float type (default: that of `field.A`).

    **Returns:** the shift, a Python float.
    """
    dtype = field.A.dtype if dtype is None else dtype
    bound = _concrete_score_bound(field)
    return max(0.0, bound - 0.5 * math.log(float(jnp.finfo(dtype).max)))


class ParticleChecks(eqx.Module):
    """What `finish_particles` needs of `prepare_particles`: the input checks."""

    invalid: Bool[Array, ""]
    bad_input: Bool[Array, ""]
    zero_token: Bool[Array, ""]
    overflow: Bool[Array, ""]
    nonpositive_beta: Bool[Array, ""]
    initial_deviation: Float[Array, ""]
    project: bool = eqx.field(static=True)
    sphere: bool = eqx.field(static=True)
    token_major: bool = eqx.field(static=True, default=False)


def usa_log_bound(field) -> Float[Array, ""]:
    r"""`max_h β_h σ_max(A_h) − score_shift + log max(Σ_h σ_max(V_h) ‖W_o^(h)‖₂, 1)`: the
    log of a bound of a USA field's size `exp(β <x, A y> − score_shift) · |V y|` on the
    sphere, for one head (`AttentionDynamics`: `β σ_max(A) − score_shift + log max(σ_max(V),
    1)`) or several (`MultiHeadDynamics`), traceable; non-finite entries read as 0, so that
    they are reported as non-finite input rather than as an overflow. Compared with
    `_usa_log_limit(dtype)` by `check_particle_inputs` (per member); the concrete twin is
    `_usa_log_bound_unshifted` (`check_usa_overflow`)."""

    def finite(a):
        return jnp.where(jnp.isfinite(a), a, 0)

    sigma = jnp.linalg.norm(finite(field.A), ord=2, axis=(-2, -1))
    values = jnp.linalg.norm(finite(field.V), ord=2, axis=(-2, -1))
    W_o = getattr(field, "W_o", None)
    if W_o is not None:
        values = values * jnp.linalg.norm(finite(W_o), ord=2, axis=(-2, -1))
    return (
        jnp.max(jnp.abs(field.beta) * sigma)
        - field.score_shift
        + jnp.log(jnp.maximum(jnp.sum(values), 1))
    )


def is_builtin_flow(field) -> bool:
    """Whether `field` is one of jaxattn's attention flows (`AttentionDynamics`,
    `MultiHeadDynamics`): tangent and finite by construction for checked weights, so the
    solvers skip `check_flow`'s probe. (The probe's tangency test is relative to the
    velocity; a USA drive that is huge and nearly radial, as with a large `score_shift`,
    leaves a rounding error of the projection beyond it.)"""
    from ._families import MultiHeadDynamics  # that module imports this one

    return isinstance(field, (AttentionDynamics, MultiHeadDynamics))


def check_usa_overflow(where: str, field, dtype) -> None:
    """Refuse, before solving, a USA `AttentionDynamics` or `MultiHeadDynamics` with
    concrete finite `A`, `V`, `beta` whose weights can overflow `dtype` (shared by
    `simulate` and `lyapunov_spectrum`; a traced field is checked per member
    by `check_particle_inputs`). For several heads the bound takes the largest score and
    the sum of the value maps' norms (times `‖W_o‖₂`).

    **Raises:** `ValueError` prefixed with `where`, giving the smallest `score_shift` that
    fits (`usa_overflow_message`)."""
    if not (is_builtin_flow(field) and field.kernel == "usa"):
        return
    W_o = getattr(field, "W_o", None)
    arrays = (field.A, field.V, field.beta, field.score_shift) + (() if W_o is None else (W_o,))
    if not all(_is_concrete(a) for a in arrays):
        return
    if not all(np.all(np.isfinite(np.asarray(a))) for a in arrays):
        return  # non-finite input: reported as such
    if _usa_log_bound_unshifted(field) - float(field.score_shift) > _usa_log_limit(dtype):
        raise ValueError(usa_overflow_message(where, field, dtype))


class _TimeRescaled(eqx.Module):
    """`flow` in the time `s = r t`: `dx/ds = f(s/r, x)/r` (a sweep member's natural time).
    `check_particle_inputs` checks the wrapped flow (the rescaling changes no weight)."""

    flow: Any
    rate: jax.Array

    @property
    def manifold(self):
        return getattr(self.flow, "manifold", "sphere")

    def __call__(self, t, x, args=None):
        return self.flow(t / self.rate, x, args) / self.rate


def check_particle_inputs(field, x0, *, project: bool = False):
    """The per-member input checks of a particle solve (traceable; shared by
    `prepare_particles` and `lyapunov_spectrum`): non-finite input, a zero token on the
    sphere, USA overflow (`usa_log_bound`), β ≤ 0 (a traced β; a concrete one is refused
    at construction).

    **Returns:** `(checks, x_start)`: a `ParticleChecks` and the initial state to solve
    from (normalised on the sphere; unit tokens `e_1` for a rejected member, so that it
    costs nothing and cannot poison a batch). `input_result` turns `checks` into the
    member's `RESULTS` code.
    """
    dtype = x0.dtype
    norms = safe_norm(x0)
    sphere = flow_manifold(field) == "sphere"
    # A sweep member in natural time is its flow wrapped in `_TimeRescaled`: the weights
    # (USA overflow, beta) are those of the wrapped flow.
    base = field.flow if isinstance(field, _TimeRescaled) else field
    builtin = is_builtin_flow(base)  # AttentionDynamics, MultiHeadDynamics
    bad_input = jnp.all(jnp.isfinite(x0))
    for leaf in jax.tree.leaves(eqx.filter(field, eqx.is_inexact_array)):
        bad_input = bad_input & jnp.all(jnp.isfinite(leaf))
    bad_input = ~bad_input
    zero_token = jnp.any(norms == 0) if sphere else jnp.array(False)
    if builtin and base.kernel == "usa":
        overflow = usa_log_bound(base) > _usa_log_limit(dtype)
    else:
        overflow = jnp.array(False)
    beta = base.beta if builtin else None
    nonpositive_beta = jnp.array(False) if beta is None else jnp.any(~(beta > 0))
    invalid = bad_input | zero_token | overflow | nonpositive_beta
    e1 = jnp.zeros_like(x0).at[:, 0].set(1)
    x_finite = jnp.where(jnp.isfinite(x0), x0, 0)
    x_start = jnp.where(invalid, e1, normalise(x_finite) if sphere else x_finite)
    checks = ParticleChecks(
        invalid=invalid,
        bad_input=bad_input,
        zero_token=zero_token,
        overflow=overflow,
        nonpositive_beta=nonpositive_beta,
        initial_deviation=jnp.max(jnp.abs(norms - 1)),
        project=bool(project) and sphere,
        sphere=sphere,
    )
    return checks, x_start


def input_result(checks: ParticleChecks, result) -> RESULTS:
    """`result` overridden by the input check that failed (the first of non-finite input,
    zero token, β ≤ 0, USA overflow)."""
    result = RESULTS.where(checks.overflow, RESULTS.usa_overflow, result)
    result = RESULTS.where(checks.nonpositive_beta, RESULTS.nonpositive_beta, result)
    result = RESULTS.where(checks.zero_token, RESULTS.zero_token, result)
    return RESULTS.where(checks.bad_input, RESULTS.nonfinite_argument, result)


def token_major_pays(n: int, d: int) -> bool:
    """Whether the particle state is integrated token-major (`_TokenMajor`): for few
    dimensions and many tokens. Measured per field evaluation on CPU, float64 ((n, d)
    against (d, n) time): 1.4–2.3× at n = 256, d = 2 (LSA), 1.6–2.1× at n = 1024, d = 2,
    1.2–1.5× at n = 32, d = 3 (SA), 0.9–1.3× at n = 32, d = 2 and 0.95× at n = 32,
    d = 128. With `AttentionDynamics.token_major` (LSA on the rows of the state) a whole
    compact sweep of 256 random pairs (d = 2, n = 256, one core, interleaved medians of
    three rounds) runs 1.34× faster in physical time and 1.35× in natural time than with
    token rows, with the same regimes and step counts."""
    return n >= 64 and d <= 16


def prepare_particles(
    field, x0, solver, rtol, atol, project, token_major: bool = False
) -> tuple[Problem, ParticleChecks]:
    """The particle flow's `Problem` from `x0`, with the per-member input checks.

    `token_major=True` integrates the state `xᵀ` (shape `(d, n)`, `_TokenMajor`): the
    same arithmetic, laid out for speed; `finish_particles` transposes the saves back.

    A rejected member (non-finite input, a zero token on the sphere, USA overflow, β ≤ 0)
    is solved with a harmless stand-in (zero field, unit tokens) so that it costs nothing
    and cannot poison a batch; `finish_particles` reports it.
    """
    checks, x_start = check_particle_inputs(field, x0, project=project)
    invalid = checks.invalid
    if isinstance(field, AttentionDynamics):
        field_run = eqx.tree_at(
            lambda f: (f.A, f.V, f.beta),
            field,
            (
                jnp.where(invalid, 0, field.A),
                jnp.where(invalid, 0, field.V),
                jnp.where(invalid, 0, field.beta),
            ),
        )
    else:
        field_run = _Guarded(field, invalid)
    projection = SphereProjection
    if token_major:
        checks = dataclasses.replace(checks, token_major=True)
        field_run, x_start, projection = (
            _TokenMajor(field_run),
            x_start.T,
            _TokenMajorSphereProjection,
        )
    problem = Problem(
        term=diffrax.ODETerm(field_run),
        solver=projection(solver) if checks.project else solver,
        y0=x_start,
        args=None,
        controller=_StallGuardPID(rtol=rtol, atol=atol),
        save_solver_state=checks.project,
    )
    return problem, checks


def finish_particles(checks: ParticleChecks, sol, ts) -> "Trajectory":
    """The `Trajectory` of a finished solve (`diffrax.Solution` or a segmented one)."""
    dtype = ts.dtype
    ys = jnp.swapaxes(sol.ys, -1, -2) if checks.token_major else sol.ys
    if checks.project:
        deviation = sol.solver_state[1]
    elif checks.sphere:
        deviation = jnp.max(jnp.abs(safe_norm(ys) - 1))
    else:  # the token norms are part of the state: no drift to report
        deviation = jnp.asarray(jnp.nan, dtype)
    xs = normalise(ys) if checks.sphere else ys
    result = input_result(checks, promote_result(sol.result))
    xs = jnp.where(checks.invalid, jnp.nan, xs)
    return Trajectory(
        ts=ts,
        xs=xs.astype(dtype),
        result=result,
        **step_statistics(sol),
        sphere_deviation=jnp.where(checks.invalid, jnp.nan, deviation),
        initial_deviation=checks.initial_deviation,
        environment=solve_environment(dtype),
    )


@eqx.filter_jit
def _solve(field, x0, ts, t0, t1, dt0, solver, rtol, atol, max_steps, adjoint, project):
    major = token_major_pays(*x0.shape)
    problem, checks = prepare_particles(field, x0, solver, rtol, atol, project, major)
    sol = solve_problem(problem, t0, t1, dt0, ts, adjoint, max_steps)
    return finish_particles(checks, sol, ts)


def check_rtol_below_one(where: str, rtol) -> None:
    """Raise `ValueError` (prefixed with `where`) for a relative tolerance of 1 or more,
    which controls nothing: a run at `rtol = 10` drifts off the sphere by 6.7."""
    if float(rtol) >= 1:
        raise ValueError(
            f"{where}: rtol must be below 1 (a relative error of 100 % or more controls "
            f"nothing), got {rtol}."
        )


def check_solve_dtype(where: str, dtype) -> None:
    """Refuse a solve in half precision (float16, bfloat16): 3 significant digits are
    below any useful tolerance (the adaptive steps shrink until `max_steps`) and the
    complex arithmetic and linear algebra have no half-precision kernels (they failed deep
    inside JAX). Shared by the solvers through `save_times`, and by `lyapunov_spectrum`
    and `watanabe_strogatz_constants`.

    **Raises:** `ValueError` naming the dtype, prefixed with `where`."""
    dt = jnp.dtype(dtype)
    if jnp.issubdtype(dt, jnp.inexact) and jnp.finfo(dt).bits < 32:
        raise ValueError(
            f"{where}: the inputs make a {dt.name} solve; half precision is not supported "
            f"(about 3 significant digits, below any useful tolerance). Cast the inputs (the "
            f"weights and the initial state) to float32 or float64."
        )


def save_times(where, ts, t0, t1, num_save, dtype, *, rtol=None, atol=None, max_steps=None):
    """Check the time interval, save times and tolerances of a solve; build default `ts`.

    Shared by `simulate`, `solve_ott_antonsen` and `solve_watanabe_strogatz`. Concrete values
    are checked (traced ones cannot be): `t0`, `t1` finite with `t1 > t0`, `ts` a non-empty
    1-d array, finite, non-decreasing and inside `[t0, t1]`, `rtol`, `atol` finite and
    positive, `rtol < 1`, `max_steps ≥ 1`.

    **Returns:** `ts` as an array of `dtype` (default: `num_save` equally spaced times).

    **Raises:** `ValueError` naming the argument, prefixed with `where`; for a
    half-precision `dtype` (`check_solve_dtype`).
    """
    check_solve_dtype(where, dtype)
    if t1 is None:
        raise ValueError(f"{where}: t1 is required.")
    for name, value in (("t0", t0), ("t1", t1)):
        if _is_concrete(value) and not np.isfinite(np.asarray(value)).all():
            raise ValueError(f"{where}: {name} must be finite, got {value}.")
    if _is_concrete(t0) and _is_concrete(t1) and not float(t1) > float(t0):
        raise ValueError(f"{where}: need t1 > t0 (forward time), got t0={t0}, t1={t1}.")
    for name, value in (("rtol", rtol), ("atol", atol)):
        if isinstance(value, (str, bytes)):
            raise ValueError(f"{where}: {name} must be a number, got {value!r}.")
        if value is not None and _is_concrete(value):
            if not (np.isfinite(float(value)) and float(value) > 0):
                raise ValueError(f"{where}: {name} must be a finite positive number, got {value}.")
    if rtol is not None and _is_concrete(rtol):
        check_rtol_below_one(where, rtol)
    if max_steps is not None and int(max_steps) < 1:
        raise ValueError(f"{where}: max_steps must be >= 1, got {max_steps}.")
    if ts is None:
        if int(num_save) < 2:
            raise ValueError(
                f"{where}: num_save must be >= 2 (the default grid saves t0 and t1), got "
                f"{num_save}; pass ts=[t1] to save the final state only."
            )
        ts = jnp.linspace(t0, t1, int(num_save), dtype=dtype)
        if _is_concrete(ts) and np.any(np.diff(np.asarray(ts)) < 0):
            # Far from t = 0 in float32 (spacing 1 near t = 1e7) the grid's rounding can go
            # backwards, which diffrax refuses deep inside; rounding the float64 grid keeps
            # it non-decreasing (the solve then reports `time_stalled` if the clock stops).
            grid = np.linspace(float(t0), float(t1), int(num_save))
            ts = jnp.asarray(grid.astype(jnp.dtype(dtype)))
        return ts
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
    field: eqx.Module,
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
    r"""Solve the attention flow `dx_k/dt = P⊥_{x_k}((1/n) Σ_j w_kj V x_j)` from `x0`, or
    any flow of the flow protocol (see `jaxattn.dynamics.AttentionDynamics`' module: an
    `eqx.Module` with `__call__(t, x, args) -> dx/dt` and an optional `manifold`).

    The tokens are kept on S^{d-1}: the field is evaluated at `x/|x|` (so `|x_k|` is an
    exact invariant of the continuous flow) and, with `project=True`, every step is mapped
    back onto the sphere (`SphereProjection`), which keeps `|x_k| = 1` to rounding over
    long horizons; `Trajectory.sphere_deviation` reports the residual drift.

    Initial tokens off the sphere are normalised (with a `UserWarning` when concrete and
    off by more than `1e-6`); the deviation is kept in `Trajectory.initial_deviation`.

    A flow with `manifold = "euclidean"` (e.g. `normalisation="pre_ln"`) is integrated
    as given: `x0` is not normalised, no step is projected, `Trajectory.xs` holds the raw
    states and `sphere_deviation` is NaN. Before solving, a flow other than
    `AttentionDynamics` is checked once at `x0` (`check_flow`: traceable, right shape,
    finite, tangent to the sphere for a sphere flow).

    Differentiable in `field.A`, `field.V`, `field.beta` and `x0` (through `adjoint`,
    default `RecursiveCheckpointAdjoint`), jit-able and vmappable over all of them.

    **Arguments:**

    - `field`: an `AttentionDynamics` (any kernel, any `d ≥ 2`) or any flow (`MultiHeadDynamics`,
      `TimeVaryingDynamics`, `PLGAFlow`, a user's module).
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
    non-positive `rtol`/`atol`, non-finite `A`, `V`, `beta`, half-precision inputs (float16,
    bfloat16), or a USA field whose weights would overflow; for a flow that is not a module,
    cannot be traced, returns the wrong shape, non-finite values or (on the sphere)
    non-tangent vectors at `x0` (the flow is named).
    With `throw=True` a solve that does not succeed (e.g. `max_steps` reached) raises a
    `RuntimeError` naming the `RESULTS` code; under `jit`/`vmap` (traced inputs) these and
    the input problems above raise a `RuntimeError` subclass naming it instead (equinox's
    `EquinoxRuntimeError`, or `jax.errors.JaxRuntimeError` under plain `jax.jit`).

    Source: Li et al. (2026), eq. (1); Geshkovski et al., arXiv 2312.10794, eq. (1.1).
    """
    if not isinstance(field, eqx.Module) or not callable(field):
        raise ValueError(
            "simulate: field must be a flow, an equinox Module with __call__(t, x, args) -> "
            f"dx/dt, got {type(field).__name__}."
        )
    manifold = flow_manifold(field)
    builtin = is_builtin_flow(field)
    d = field.d if isinstance(getattr(field, "d", None), int) else None
    rescaled = False
    if manifold == "sphere":
        # Far off (1e300, 1e-300): their squares would overflow to inf or underflow to 0
        # when normalised (all-zero tokens reported successful), or the tokens themselves
        # in a cast to float32. Scaled on the host first, exactly.
        x_given, x0 = x0, _scaled_into_range(x0)
        rescaled = x0 is not x_given
    x0, deviation = check_tokens(x0, d, allow_zero=manifold == "euclidean" and not builtin)
    if rescaled and deviation is not None:  # that of the tokens as given
        deviation = float(np.max(np.abs(_row_norms(np.asarray(x_given)) - 1)))
    float_leaves = jax.tree.leaves(eqx.filter(field, eqx.is_inexact_array))
    dtype = jnp.result_type(x0.dtype, *(leaf.dtype for leaf in float_leaves))
    check_solve_dtype("simulate", dtype)
    warn_off_sphere("simulate", manifold, deviation)
    x0 = x0.astype(dtype)
    if any(leaf.dtype != dtype for leaf in float_leaves):
        field = jax.tree.map(lambda a: a.astype(dtype) if eqx.is_inexact_array(a) else a, field)
    check_usa_overflow("simulate", field, dtype)
    if not builtin:
        check_flow("simulate", field, x0, jnp.asarray(t0, dtype), manifold)
    # BacksolveAdjoint re-solves the flow and its adjoint backwards in continuous time. It
    # cannot follow the per-step projection (a discrete map, not part of the ODE; diffrax
    # fails with a TypeError about WrapTerm). Without projection it is supported: an
    # optimise-then-discretise gradient, equal to the discrete adjoints' to O(rtol)
    # (measured: 1.5e-6 relative at rtol 1e-6, 4e-10 at rtol 1e-9; tests/
    # test_dynamics_reliability.py).
    if isinstance(adjoint, diffrax.BacksolveAdjoint) and project and manifold == "sphere":
        raise ValueError(
            "simulate: diffrax.BacksolveAdjoint cannot be used with project=True: it re-solves "
            "the flow backwards in continuous time and cannot follow the per-step projection "
            "onto the sphere. Pass project=False (its gradient then agrees with the other "
            "adjoints to O(rtol)), or use RecursiveCheckpointAdjoint (default), DirectAdjoint "
            "or ForwardMode."
        )
    ts = save_times(
        "simulate", ts, t0, t1, num_save, dtype, rtol=rtol, atol=atol, max_steps=max_steps
    )
    if getattr(field, "kernel", "lsa") in ("usa", "sa") and isinstance(
        getattr(field, "d", None), int
    ):
        need = memory_estimate(field, x0.shape[0], ts.shape[0], dtype=dtype)
        free = memory_available()
        if free is not None and need > free:
            raise ValueError(
                f"simulate: the {field.kernel.upper()} kernel needs O(n²) memory for its "
                f"scores: n = {x0.shape[0]} tokens, {jnp.dtype(dtype).name}, about "
                f"{need / 2**30:.3g} GiB (memory_estimate), but {free / 2**30:.3g} GiB are "
                f"available (memory_available). Use fewer tokens, float32, or the LSA kernel "
                f"(O(n d²))."
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
    if rescaled:  # the deviation of the tokens as given, not of their rescaled copy
        held = traj.initial_deviation.dtype
        value = deviation if deviation <= float(jnp.finfo(held).max) else np.inf
        traj = eqx.tree_at(lambda tr: tr.initial_deviation, traj, jnp.asarray(value, held))
    if throw:
        xs = raise_on_failure("simulate", traj.result, traj.xs, "Trajectory.result", traj, (t0, t1))
        traj = eqx.tree_at(lambda tr: tr.xs, traj, xs)
    return traj
