r"""Batched runs of an attention flow over many members: one compiled function per chunk
shape, chunks sized from each member's predicted cost and a memory estimate, each chunk
solved independently on every visible device, written to disk chunk by chunk, resumable
and reloadable from its folder alone.

A sweep is composed from four small parts, the way `diffrax.diffeqsolve` composes a
solver, a step-size controller, `SaveAt` and an adjoint:

- `Members` — *what* is run: a batch of flows (any `eqx.Module` vector field whose array
  leaves carry a leading batch axis, e.g. a batch of `AttentionDynamics`), one seed per
  member, the number of tokens, the initial law and the method (`"particles"`, or the
  d = 2 LSA reductions `"ott_antonsen"` / `"watanabe_strogatz"`).
- `Integration` — *how each member is solved*: horizon, save points, time scale,
  tolerances, `max_steps`, dtype.
- `Judge` — *how each member is judged*: the regime classifier's settings.
- `Runner` — *how the batch is run*: compaction (default) or lockstep, chunking, a
  memory budget, out_dir/resume, progress bar.

`sweep(Members(...), integration=..., judge=..., runner=...)` composes them. The older
keyword call `sweep(A, V, beta, seeds, method=..., n=..., ...)` remains as a thin layer
that builds the four parts.

Every member runs the package's own solver problem for its method (that of `simulate`,
`solve_ott_antonsen`, `solve_watanabe_strogatz` with `throw=False`) and is classified by
the rules of `classify_tokens` (particles, WS) or `classify_order_parameter` (OA), so a
sweep member and a hand-made run of the same parameters agree (in float64 to rounding; in
float32 the vectorised arithmetic of a chunk may round differently from a solo run, so
states agree to a few float32 ulps and step counts may differ by a few steps).

What is computed is what the rules read. Particles: the moment `Q = XᵀX/n` (and `R₂` in
d = 2) at every save and the tokens only from the late window's tail on (d = 2: the last
third of its intervals; d > 2: the window), which the compact path saves instead of every
token at every save; the particle state is integrated token-major, `(d, n)`, for small d
(`_solve.token_major_pays`). Watanabe–Strogatz: `R₂` from the Möbius parameters at every
save (O(n) in real arithmetic) and the tokens of the tail only. Both give the regime and
evidence of `classify_tokens` of every token (tests: to 1e-12).

Compaction (the default for particles and Watanabe–Strogatz members,
`Runner(strategy="compact")`; Ott–Antonsen members run lockstep unless asked). A `vmap`
of an adaptive solve advances a batch in one `while_loop`: every member would pay for as
many loop iterations as the slowest member of its batch (lockstep). Instead, each device
prepares its members of a chunk (the `Problem` of `prepare_particles` / `prepare_ott_antonsen` /
`prepare_watanabe_strogatz`, the very problem the public solvers build, except that the
reduced solvers' members step without the stall guard, `_solve.pid_controller`: a field
non-finite from the start still reads `nonfinite_flow`, one that turns non-finite or stalls
later `max_steps_reached`; the lockstep path calls the public solvers, guard included),
keeps `slots` of them in a pool and advances the pool `segment_steps` (K) steps at a time
(`_segments.advance_segments`, vmapped), all inside one compiled `while_loop`. After a
segment, members that finished or failed are written back and their slots refilled from the
device's queue (`start_segments` states, most costly member first by the predicted cost,
members dealt round robin over the devices); when the queue is empty the pool drains. Then
all members of the chunk are finished (`finish_*`) and classified at once. A segmented
solve takes exactly the steps of the whole solve, so a member's saves, step counts, result
and regime are those of its solo run in float64 up to the rounding of a differently
compiled program (~1e-13 on the test cases). Nor does a member depend on the members
beside it (bitwise, in the same program): every projected solve evaluates its own first
Runge–Kutta stage (`_solve.ProjectedSolver`), which diffrax would re-evaluate for a whole
vmapped batch whenever one member is on its first step — at a projected state that
differs by rounding from the stage the others carry, so a member entering the pool moved
its companions' steps (before: 6 of 512 random WS members took 1–3 steps more or fewer
than in lockstep, R₂ off by up to 3e-7). On those 512 pairs (d = 2, n = 256, t1 = 50),
compact and lockstep now take the same steps for every member, particles and WS, both
time scales; `R₂` differs by at most 5e-10 (particles), 2e-14 (WS natural time) and 2e-8
(WS physical time: a few sensitive members amplify the rounding), all regimes equal.
`lockstep_efficiency = Σ steps_i / (slots · Σ_segments max_slot steps)` (summed over
devices; the loop iterations the pool ran, each costing every slot; 1 = no slot ever idle).
The defaults (on CPU one slot per device for particles, whose solve then runs whole, and 16
slots with `segment_steps` 32 for WS) were
measured (`Runner` docstring; `experiments/bench_compaction.py --scan`); K divides
`max_steps` (`gcd`), so a member stops at `max_steps` exactly.

Lockstep (`Runner(strategy="lockstep")`, and members with `Judge(lyapunov=k)`): each chunk
is one `vmap` of the public solvers. Its defences: (1) `time_scale="natural"` integrates
each member in its own time unit `s = r t` (`r` a bound of its speed), so members cover
similar numbers of steps; (2) members are ordered by a predicted cost (the step counts of a
cheap Ott–Antonsen pilot for d = 2 LSA, else `β‖A‖‖V‖`) and the ordered batch is cut into
chunks whose predicted lockstep efficiency `Σ steps_i / (size · max steps)` reaches a
target, with sizes from a few powers of two (one compilation each) capped by a memory
estimate. The measured efficiency is reported (`SweepResult.lockstep_efficiency`).

Devices. Each chunk is laid out over all visible devices and solved with `shard_map`:
every device runs its own members' solver loops, with no collective inside them, so a
device never waits for the slowest member of another. Results are bitwise equal for any
device count. After `jax.distributed.initialize()` every process calls `sweep` with the
same full inputs; results are gathered with `multihost_utils.process_allgather` and only
process 0 writes files and shows progress.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import json
import math
import operator
import os
import re
import time
from collections.abc import Callable
from typing import Any, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .._json import (
    SUMMARY_SHA256,
    check_summary_sha256,
    is_finite_number,
    json_int,
    json_number,
    json_object,
    json_str,
    read_json_object,
    read_regular_file,
    read_summary,
    with_summary_sha256,
)
from .._npz import (
    check_recorded_sha256,
    check_sha256,
    load_npz_bytes,
    read_error_reason,
    recorded_sha256,
)
from .._progress import progress_bar
from .._warn import warn_at_caller
from ..sphere import normalise, sample_uniform
from ._lyapunov import chaos_verdict, lyapunov_spectrum, lyapunov_spectrum_ott_antonsen
from ._ott_antonsen import (
    _wrapped_cauchy,
    finish_ott_antonsen,
    prepare_ott_antonsen,
    solve_ott_antonsen,
)
from ._regimes import (
    REGIMES,
    RegimeEvidence,
    _classify_circle,
    _classify_series,
    _direction_moments,
    _gap_from_moment,
    _late_start,
    _positive,
    _series_from_moments,
    _tail_start,
    _token_series,
    _window_start,
    classify_order_parameter,
    default_gap_floor,
)
from ._segments import advance_segments, segments_solution, start_segments
from ._solve import (
    RESULTS,
    _TimeRescaled,
    check_flow,
    check_rtol_below_one,
    finish_particles,
    flow_manifold,
    meminfo_available,
    memory_available,
    prepare_particles,
    simulate,
    token_major_pays,
)
from ._solve import environment_record as _solve_environment
from ._tsit5 import UnrolledTsit5
from ._vector_field import AttentionDynamics, kernel_rate, narrowing
from ._watanabe_strogatz import _double_angle as _ws_double_angle
from ._watanabe_strogatz import _order_parameter_w as _ws_order_parameter
from ._watanabe_strogatz import _points as _ws_points
from ._watanabe_strogatz import _token_speeds as _ws_token_speeds
from ._watanabe_strogatz import (
    finish_watanabe_strogatz,
    prepare_watanabe_strogatz,
    solve_watanabe_strogatz,
    watanabe_strogatz_constants,
)

__all__ = [
    "REGIME_NAMES",
    "FAILED",
    "NOT_RUN",
    "Members",
    "Integration",
    "Judge",
    "Runner",
    "SweepResult",
    "sweep",
    "natural_rate",
    "regime_label",
    "result_message",
]

# Regime codes of a sweep are the values of `REGIMES`; these are their short names in code
# order, so `REGIME_NAMES[code]` names a member's regime. Two codes outside `REGIMES` mark
# members that have no regime: `FAILED` (the solve failed: no measurement) and `NOT_RUN`
# (a member of an interrupted sweep that was never computed). They are negative so they
# can never be mistaken for a regime (`regime_label` names every code).
REGIME_NAMES = tuple(REGIMES._name_to_item)
UNDETERMINED = int(REGIMES.undetermined._value)
FAILED = -1
NOT_RUN = -2

METHODS = ("particles", "ott_antonsen", "watanabe_strogatz")
INITS = ("wrapped_cauchy", "uniform", "disc")

# Evidence fields (`RegimeEvidence`) that carry a unit of time, converted from the member's
# natural time back to physical time.
_RATES = ("final_motion", "drift_rate", "rotation_rate")
_TIMES = ("period",)
EVIDENCE_FIELDS = tuple(RegimeEvidence.__dataclass_fields__) + (
    "lyapunov_max",
    "lyapunov_uncertainty",
)
CHAOTIC = int(REGIMES.chaotic._value)


def regime_label(code: int) -> str:
    """The name of a sweep regime code: a `REGIMES` short name, `"failed"` or `"not run"`."""
    code = int(code)
    if code == FAILED:
        return "failed"
    if code == NOT_RUN:
        return "not run"
    return REGIME_NAMES[code]


def result_message(code: int) -> str:
    """The name of a `RESULTS` code (`"successful"`, `"max_steps_reached"`, ...)."""
    for name, item in RESULTS._name_to_item.items():
        if int(item._value) == int(code):
            return name
    return f"code {int(code)}"


def natural_rate(A, V, beta, kernel: str = "lsa", score_shift=0.0):
    r"""The rate `r` of an `AttentionDynamics(A, V, beta, kernel)`: a bound of `|dx/dt|` on
    the sphere (`kernel_rate` without initial tokens). LSA: `β ‖A‖₂ ‖V‖₂`; USA:
    `‖V‖₂ exp(β‖A‖₂ − score_shift)`; SA: `‖V‖₂`. Integrating in `s = r t` is the
    substitution `V → V/r` (the field is linear in `V`).
    """
    return kernel_rate(A, V, beta, kernel, score_shift)


def _member_dtype(where: str, dtype) -> np.dtype:
    """`dtype` as a NumPy dtype, if members can run in it: float32 or float64. Half
    precision (float16, bfloat16) is refused by name: the reductions' complex arithmetic and
    the linear algebra have no half-precision kernels, which failed deep inside JAX."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise ValueError(f"{where}: dtype {dtype!r} is not a NumPy dtype.") from None
    if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ValueError(f"{where}: dtype must be float32 or float64, got {dt}.")
    return dt


def _count(where, name, value, lo=1):
    if isinstance(value, (bool, str, bytes)) or not float(value).is_integer() or int(value) < lo:
        raise ValueError(f"{where}: {name} must be an integer >= {lo}, got {value!r}.")
    return int(value)


# ---------------------------------------------------------------------------------------
# The four parts of a sweep
# ---------------------------------------------------------------------------------------


def _flow_d(flow, batched: bool) -> int | None:
    """The token dimension of a flow: `A`'s last axis, or the flow's own `d`."""
    A = getattr(flow, "A", None)
    if A is not None and hasattr(A, "shape") and len(A.shape) >= 2:
        return int(A.shape[-1])
    d = getattr(flow, "d", None)
    if isinstance(d, (int, np.integer)) and not isinstance(d, bool) and not batched:
        return int(d)
    return None


class Members(eqx.Module):
    r"""What a sweep runs: a batch of flows, one seed per member, the initial law, the method.

    **Arguments:**

    - `flow`: the flows, one per member. Any `eqx.Module` vector field
      `flow(t, x, args) -> dx/dt` on tokens `x` of shape `(n, d)` (the flow protocol of
      `simulate`) whose array leaves all carry a leading batch axis of the same size
      (`batched=True`, e.g. built with `eqx.filter_vmap(make_flow)(params)`), or a single
      flow shared by all members (`batched=False`; members then differ by seed only).
      For a batch of `AttentionDynamics`, `A`, `V` have shape `(batch, d, d)` and `beta`,
      `score_shift` shape `(batch,)`.
    - `seeds`: int or `(batch,)` ints in `[0, 2³²)`; member `i`'s initial state comes
      from `jax.random.key(seeds[i])`, split into a key for `R₂(0)` and one for the tokens
      (what a callable `init` receives). `Members.initial_state(i)` returns it.
    - `n`: tokens per member.
    - `method`: `"particles"` (any flow, any d), `"ott_antonsen"` or `"watanabe_strogatz"`
      (the d = 2 LSA reductions: the flow must be an LSA `AttentionDynamics` with d = 2).
    - `init`: the initial law. `"wrapped_cauchy"` (d = 2: doubled angles i.i.d. wrapped
      Cauchy with `R₂(0) = r0 e^{iψ}`, random phase `ψ`, the same `R₀` the OA method
      starts from; uniform on the sphere in d > 2), `"disc"` (as `"wrapped_cauchy"` with
      `R₂(0)` uniform in the disc of radius `r0`: diverse initial states for basin
      fractions), `"uniform"` (uniform on the sphere; not for OA), or a callable
      `init(key, n, d, dtype) -> (n, d)` tokens (particles only).
    - `r0`: `|R₂(0)|` (or the disc radius), in `[0, 1)`.
    - `d`: the token dimension, needed only for a flow without an `A` leaf.
    - `shape`: the logical shape of the batch (e.g. a cartesian grid), product = batch.

    **Raises:** `ValueError` naming the argument for an unknown method or law, a flow
    that is not an `eqx.Module`, array leaves without a common batch axis, seeds out of
    range or of the wrong length (with `batched=True`, a single flow shared by all members
    is named as such), a `d` other than the flow's, a reduced method on a flow other than
    d = 2 LSA `AttentionDynamics`, or `n` too small. `sweep` then checks member 0 of a
    user's flow as `simulate` checks a flow (`check_flow`) before anything is compiled.
    """

    flow: Any
    seeds: np.ndarray
    n: int = eqx.field(static=True)
    d: int = eqx.field(static=True)
    method: str = eqx.field(static=True)
    init: Any = eqx.field(static=True)
    r0: float = eqx.field(static=True)
    shape: tuple = eqx.field(static=True)
    batched: bool = eqx.field(static=True)

    def __init__(
        self,
        flow,
        *,
        seeds=0,
        n: int = 256,
        method: Literal["particles", "ott_antonsen", "watanabe_strogatz"] = "particles",
        init: str | Callable = "wrapped_cauchy",
        r0: float = 0.1,
        d: int | None = None,
        shape: tuple | None = None,
        batched: bool = True,
    ):
        where = "Members"
        if method not in METHODS:
            raise ValueError(f"{where}: method must be one of {METHODS}, got {method!r}.")
        if not isinstance(flow, eqx.Module) or not callable(flow):
            raise ValueError(
                f"{where}: flow must be an eqx.Module vector field flow(t, x, args), got "
                f"{type(flow).__name__}."
            )
        if not (callable(init) or init in INITS):
            raise ValueError(f"{where}: init must be one of {INITS} or a callable, got {init!r}.")
        if callable(init) and method != "particles":
            raise ValueError(f"{where}: a callable init law needs method='particles'.")
        if init == "uniform" and method == "ott_antonsen":
            raise ValueError(
                f"{where}: init='uniform' has R₂(0) ≈ 0, a fixed point of the Ott–Antonsen "
                "ODE; use 'wrapped_cauchy' or 'disc'."
            )
        if isinstance(n, (bool, str, bytes)) or not float(n).is_integer():
            raise ValueError(f"{where}: n must be an integer number of tokens, got n={n!r}.")
        if int(n) < 1:
            raise ValueError(f"{where}: need n >= 1 tokens, got n={n}.")
        if method == "watanabe_strogatz" and int(n) < 3:
            raise ValueError(f"{where}: the Watanabe–Strogatz reduction needs n >= 3, got n={n}.")
        if not 0 <= float(r0) < 1:
            raise ValueError(f"{where}: r0 = |R₂(0)| must lie in [0, 1), got r0={r0}.")
        seeds = np.atleast_1d(np.asarray(seeds))
        if (
            seeds.ndim != 1
            or not np.issubdtype(seeds.dtype, np.integer)
            or np.any(seeds < 0)
            or np.any(seeds >= 2**32)
        ):
            raise ValueError(
                f"{where}: seeds must be integers in [0, 2**32), got {seeds.tolist()[:8]} "
                f"(dtype {seeds.dtype})."
            )
        leaves = [x for x in jax.tree_util.tree_leaves(flow) if eqx.is_array_like(x)]
        leaves = [np.shape(x) for x in leaves if not isinstance(x, (bool, int, float))]
        if batched:
            sizes = {s[0] if len(s) else None for s in leaves}
            if None in sizes or len(sizes) != 1:
                raise ValueError(
                    f"{where}: with batched=True every array leaf of the flow needs the same "
                    f"leading batch axis; got leaf shapes {leaves[:6]}."
                )
            B = sizes.pop()
            if seeds.shape[0] not in (1, B):
                raise ValueError(
                    f"{where}: {seeds.shape[0]} seeds for a batch of {B} flows (batched=True "
                    f"reads the leading axis of the flow's array leaves, shapes {leaves[:6]}, "
                    "as the batch); give one seed or one per member, or, for a single flow "
                    "shared by all members (members differing by seed only), pass "
                    "batched=False."
                )
        else:
            B = seeds.shape[0]
        if B == 0:
            raise ValueError(f"{where}: empty batch (no members).")
        seeds = np.broadcast_to(seeds.astype(np.uint32), (B,)).copy()
        flow_d = _flow_d(flow, batched)
        if d is not None and flow_d is not None and int(d) != flow_d:
            raise ValueError(
                f"{where}: d={d} does not match the flow's token dimension {flow_d} (read from "
                "its A or d); leave d out or give the flow's."
            )
        if d is None:
            d = flow_d
        if d is None:
            raise ValueError(f"{where}: give d= (the flow has no A leaf to read it from).")
        if int(d) < 2:
            raise ValueError(f"{where}: need d >= 2, got d={d}.")
        if method != "particles":
            ok = isinstance(flow, AttentionDynamics) and flow.kernel == "lsa" and int(d) == 2
            if not ok:
                got = (
                    f"kernel={flow.kernel!r}"
                    if isinstance(flow, AttentionDynamics)
                    else f"the flow {type(flow).__name__} (not AttentionDynamics)"
                )
                raise ValueError(
                    f"{where}: method={method!r} is the d = 2 LSA reduction of "
                    f"AttentionDynamics; got d = {d}, {got}. Use method='particles' for "
                    "other flows."
                )
        if shape is None:
            shape = (B,)
        shape = tuple(int(s) for s in shape)
        if math.prod(shape) != B:
            raise ValueError(f"{where}: shape {shape} does not hold {B} members.")
        self.flow = flow
        self.seeds = seeds
        self.n = int(n)
        self.d = int(d)
        self.method = method
        self.init = init
        self.r0 = float(r0)
        self.shape = shape
        self.batched = bool(batched)

    @property
    def size(self) -> int:
        """Number of members."""
        return int(self.seeds.shape[0])

    def initial_state(self, i: int, dtype=None) -> jax.Array:
        r"""Member `i`'s initial state exactly as the sweep draws it: tokens `x0` of shape
        `(n, d)` (particles, Watanabe–Strogatz: the points whose angles it reduces), or the
        complex `R₂(0)` (Ott–Antonsen).

        To reproduce the member alone, solve its flow from this state with `simulate` (or
        the reductions) at the sweep's tolerances. In physical time the sweep solves the
        flow itself; in natural time (`Integration`'s default) it solves it in the time
        `s = r t`, `r = flow.natural_rate(x0)` (`SweepResult.rate`): for
        `AttentionDynamics` the flow with `V / r`, to `s = t1`.

        **Arguments:** `i`, the member's flat index in `[0, size)`; `dtype`, float32 or
        float64, the dtype the member runs in (default: JAX's default float, the dtype of a sweep
        without `Integration(dtype=...)`, whatever the flow's own dtype). The draws depend on
        the dtype.

        **Raises:** `ValueError` for an index out of range or a bool, or a dtype other than
        float32 and float64; `TypeError` for a non-integer index.
        """
        if isinstance(i, (bool, np.bool_)):
            raise ValueError(f"Members.initial_state: the member index must be an int, got {i}.")
        i = operator.index(i)
        if not 0 <= i < self.size:
            raise ValueError(
                f"Members.initial_state: member {i} is not in [0, {self.size}) "
                f"(a batch of {self.size})."
            )
        if dtype is None:  # as `Integration.resolved_dtype`: the sweep casts the flow to it
            dtype = jnp.result_type(float)
        else:
            dtype = _member_dtype("Members.initial_state", dtype)
        x0, _, R0 = _initial_state(jax.random.key(self.seeds[i]), self, jnp.dtype(dtype))
        return R0 if self.method == "ott_antonsen" else x0


class Integration(eqx.Module):
    r"""How each member of a sweep is solved.

    **Arguments:**

    - `t1`: horizon, in each member's natural time unit when `time_scale="natural"`
      (time `s = r t`; `r = natural_rate(...)` for `AttentionDynamics`, the flow's own
      `natural_rate(x0)` where it defines one, else 1), else in physical time.
    - `num_save`: equally spaced save times on `[0, t1]` (the classifier reads the late
      window of these).
    - `time_scale`: `"natural"` or `"physical"`.
    - `rtol`, `atol`, `max_steps`: forwarded to the solver (PID controller).
    - `dtype`: float32 or float64, the members' dtype (default: JAX's default float).

    **Raises:** `ValueError` naming the argument for a non-positive or non-finite
    horizon/tolerance, `max_steps < 1`, an unknown time scale or a dtype other than float32
    and float64.
    """

    t1: float = eqx.field(static=True)
    num_save: int = eqx.field(static=True)
    time_scale: str = eqx.field(static=True)
    rtol: float = eqx.field(static=True)
    atol: float = eqx.field(static=True)
    max_steps: int = eqx.field(static=True)
    dtype: Any = eqx.field(static=True)

    def __init__(
        self,
        t1: float = 100.0,
        num_save: int = 201,
        *,
        time_scale: Literal["natural", "physical"] = "natural",
        rtol: float = 1e-7,
        atol: float = 1e-9,
        max_steps: int = 16384,
        dtype=None,
    ):
        where = "Integration"
        if time_scale not in ("natural", "physical"):
            raise ValueError(
                f"{where}: time_scale must be 'natural' or 'physical', got {time_scale!r}."
            )
        self.t1 = _positive(where, "t1", t1)
        self.num_save = _count(where, "num_save", num_save, 2)
        self.time_scale = time_scale
        self.rtol = _positive(where, "rtol", rtol)
        check_rtol_below_one(where, self.rtol)
        self.atol = _positive(where, "atol", atol)
        self.max_steps = _count(where, "max_steps", max_steps)
        if dtype is not None:
            dtype = _member_dtype(where, dtype)
        self.dtype = dtype

    def resolved_dtype(self) -> np.dtype:
        """The members' dtype: `dtype`, or JAX's default float (float64 under x64)."""
        return np.dtype(jnp.result_type(float) if self.dtype is None else self.dtype)


class Judge(eqx.Module):
    r"""How each member of a sweep is judged: the regime classifier's settings.

    **Arguments:**

    - `window`: the late fraction of the save times the classifier reads, in `(0, 1]`.
    - `cluster_tol`: the angular tolerance of the final cluster structure (radians).
    - `gap_floor`: the clustering gap read as "on the circle"; `None` means
      `max(default_gap_floor(dtype), 10 rtol)` (saved states jitter at the solver
      tolerance).
    - `rest_tol`: the motion read as "at rest"; `None` for the classifier's default.
    - `lyapunov`: `k > 0` also measures the `k` largest Lyapunov exponents of each
      member (`lyapunov_spectrum`, particles; `lyapunov_spectrum_ott_antonsen`, OA) from
      its initial state over the same horizon, with `lyapunov_renorm` re-orthonormalisation
      segments, and labels the member `chaotic` when `chaos_verdict` says so (the
      largest exponent positive beyond its uncertainty); the exponents are in
      `SweepResult.evidence["lyapunov_max"]` / `["lyapunov_uncertainty"]` (physical
      units). `0` (default) skips it (the spectrum costs a few solves).

    Particle and Watanabe–Strogatz members are classified from their tokens by
    `classify_tokens`, Ott–Antonsen members from `R₂(t)` by `classify_order_parameter`;
    the rules are rate-based and read per unit of the member's own time.

    **Raises:** `ValueError` naming a non-positive or non-finite setting.
    """

    window: float = eqx.field(static=True)
    cluster_tol: float = eqx.field(static=True)
    gap_floor: float | None = eqx.field(static=True)
    rest_tol: float | None = eqx.field(static=True)
    lyapunov: int = eqx.field(static=True)
    lyapunov_renorm: int = eqx.field(static=True)

    def __init__(
        self,
        *,
        window: float = 0.5,
        cluster_tol: float = 1e-3,
        gap_floor: float | None = None,
        rest_tol: float | None = None,
        lyapunov: int = 0,
        lyapunov_renorm: int = 200,
    ):
        where = "Judge"
        self.lyapunov = _count(where, "lyapunov", lyapunov, 0)
        self.lyapunov_renorm = _count(where, "lyapunov_renorm", lyapunov_renorm, 2)
        self.window = _positive(where, "window", window)
        if self.window > 1:
            raise ValueError(
                f"{where}: window must be in (0, 1] (the late fraction of the run the rules "
                f"read), got {window!r}."
            )
        self.cluster_tol = _positive(where, "cluster_tol", cluster_tol)
        self.gap_floor = _positive(where, "gap_floor", gap_floor, allow_none=True)
        self.rest_tol = _positive(where, "rest_tol", rest_tol, allow_none=True)


# Compaction defaults (measured: see the `Runner` docstring). `slots=None` is, on CPU, one
# slot per device for particles and 16 for Watanabe–Strogatz (measured fastest there), and
# `ACCELERATOR_SLOTS` on GPU/TPU. Auto chunks hold at most `CPU_CHUNK` members per device on
# CPU and `ACCELERATOR_CHUNK` on an accelerator, whose step costs about the same for 10^3
# members as for 10^5. Measured on one H200 (jax 0.11.2, float32, random pairs, d = 2,
# t1 = 50, 101 saves, `experiments/gpu_sizes.py`, 2026-12-04), members/s against the earlier
# accelerator defaults (chunks of 1024, 128 slots):
# - Ott–Antonsen, 10^5 members, lockstep: 13 784 -> 287 655 (one chunk of 10^5; chunks of
#   16384: 110 688; compact with 16384 slots: 259 629).
# - Watanabe–Strogatz, 10^4 members, n = 1024: 7 488 -> 61 718 (4096 slots, one chunk;
#   1024 slots: 44 028; lockstep, one chunk: 31 073).
# - Particles, 10^4 members, n = 1024: 1 259 -> 5 159 (1024 slots, one chunk; 4096 slots:
#   3 019).
# Same regimes and no failures in every configuration.
# Ott–Antonsen members asked to compact on CPU: a pool of 32 slots stepped 128 steps at a
# time (`experiments/bench_compaction.py` and a 32 x 16 grid of smooth (A, V), 512 members
# each, n = 256, t1 = 50, float64, one pinned core, best of 3, members/s lockstep -> pool:
# random pairs 3686 -> 10109 physical, 7155 -> 12241 natural; the grid, whose members take
# alike steps (mean 86, max 111), 11818 -> 15184 physical, 17758 -> 16610 natural; regimes
# equal everywhere). 1 slot ran 5309 / 7957 on the random pairs, 16 slots with K = 32:
# 8687 / 12706, 64 slots 7114 / 15205, 256 slots 2633 / 8373 (the drain of a wide pool).
# The pool's first call compiles about 6 s longer than lockstep's (200 pairs, fresh
# processes: 11.3-12.5 s against 5.4-5.7 s), which its steps repay only from about 4·10^4
# (physical time) to 10^5 (natural) members, so OA members stay lockstep by default.
SEGMENT_STEPS = 32
CPU_SEGMENT_STEPS = {
    "particles": SEGMENT_STEPS,
    "watanabe_strogatz": SEGMENT_STEPS,
    "ott_antonsen": 128,
}
ACCELERATOR_SLOTS = {"particles": 1024, "watanabe_strogatz": 4096, "ott_antonsen": 16384}
CPU_SLOTS = {"particles": 1, "watanabe_strogatz": 16, "ott_antonsen": 32}
CPU_CHUNK = 1024
ACCELERATOR_CHUNK = 1 << 17
# On the CPU a compacting pool prepares (initial states, Möbius constants) and classifies
# its members `CPU_BLOCK` at a time (`lax.map`), not all at once: the classification's
# (members, n) arrays then stay in cache (Watanabe–Strogatz, 512 members, n = 256: R₂ at
# the saves and the token speeds 135 -> 109 µs per member, bitwise the same). On an
# accelerator `ACCELERATOR_BLOCK` at a time: its chunks reach 131072 members, and the d = 2
# cluster structure's vmapped search folds an index constant of (members, n, 2) at compile
# time (seen on the H200: 1.8 s for 10^4 members at n = 1024; 10^5 would fold 800 MB), so
# blocks bound that constant and the (members, n) temporaries.
CPU_BLOCK = 16
ACCELERATOR_BLOCK = 8192
# The solver of every sweep member: Tsit5 with its stages written out (`UnrolledTsit5`).
# Sweeps are forward solves, and on the CPU the kernels of diffrax's stage loop, dispatched
# one by one on every iteration, were most of a small member's step. Measured on one core,
# 512 random pairs, d = 2, n = 256, 2026-12-07 (experiments/bench_compaction.py, default
# XLA runtime): particles 386 -> 588 members/s in physical time and 555 -> 806 in natural
# time (a member's step 15.7 -> 9.1 µs), with the same regimes and steps and R2 to 1e-9;
# Ott–Antonsen lockstep 1.4-1.55x, Watanabe–Strogatz 1.1x (same regimes; a few members'
# steps differ by rounding: docs/how-to/sweep-gpu.md). Its interpolation written out too:
# particles 590 -> 608-626 and 795-799 -> 825-866 members/s (interleaved runs). Before
# (2026-12-03) the stages ran in a plain `lax` loop instead of diffrax's checkpointed one
# (1.13x, bitwise the same).
SWEEP_SOLVER = UnrolledTsit5()
# Ott–Antonsen and Watanabe–Strogatz members in a pool stepped in segments save their state
# by interpolating each segment's dense output afterwards (`advance_segments(dense_saves=
# True)`), not in diffrax's loop over save times after every step: under `vmap` that loop
# ran as long as the slot with the most saves in the step and cost about 1.4 µs per save and
# member. Measured on one core, 512 random pairs, n = 256, WS at the defaults, 2026-12-04:
# 954 -> 1279 members/s in physical time, 1417 -> 1684 in natural time, with bitwise the
# same steps, R₂ and regimes (a save can differ by an ulp: the same interpolation, compiled
# differently). Particle members save through their save functions, in the loop.
DENSE_SAVES = True
# A particle member solved on its own (a pool of one slot, the CPU default) saves its whole
# state at every save time when that buffer holds at most this many bytes, and its moment
# series and late tokens are taken from it after the solve (`_split_particle_saves`): one
# loop over the save times instead of two (the moment at every save, the tokens from
# `_late_start` on), and no moment inside it. Measured on one core, 512 random pairs,
# n = 256 (800 KiB): see docs/how-to/sweep-gpu.md. A pool of several slots (under `vmap`,
# whose loops select over the whole save buffer) keeps the two grids.
WHOLE_SAVE_BYTES = 8 * 2**20


class Runner(eqx.Module):
    r"""How the batch of a sweep is run.

    **Arguments:**

    - `strategy`: `"auto"` (default): `"compact"` for particles and Watanabe–Strogatz
      members, `"lockstep"` for Ott–Antonsen members (2 real ODEs). Their pool (32 slots,
      128 steps a segment on CPU, `CPU_SEGMENT_STEPS`) steps 1.7–2.7× faster than
      lockstep on the 512 random pairs of `experiments/bench_compaction.py` (0.94–1.28× on
      a grid of alike members; 2026-12-06) but compiles about 6 s longer, so it pays from
      about 4·10^4–10^5 members (or when one process repeats a sweep): ask for it then. On
      one H200 one lockstep chunk ran 287 655 members/s, the pool 259 629. `"compact"`:
      each device steps a pool of `slots` members `segment_steps` steps at a time and
      refills finished (or failed) members' slots from its queue, so no member waits for
      another (module docstring); `"lockstep"`:
      one vmapped solve per chunk, each member stepping until the slowest of its chunk
      finishes. Members with `Judge(lyapunov=k)` always run lockstep.
    - `slots`: members in the pool of each device (compact; at most the chunk's members
      per device); `None` (default): on CPU 1 for particles, 16 for Watanabe–Strogatz
      and 32 for Ott–Antonsen members; on an accelerator 1024 for particles and 4096 for
      Watanabe–Strogatz (measured on one H200, n = 1024, float32: 4.1× and 8.2× the
      members/s of the earlier 128 slots in chunks of 1024), and 16384 for Ott–Antonsen
      members asked to compact (259 629 members/s; their lockstep default in one chunk
      ran 287 655, 21× the earlier chunks of 1024; `ACCELERATOR_SLOTS`). On CPU,
      WS members carry 3 real numbers per save, so a wider pool spreads the per-step
      cost of the solver loop (measured, 256 random pairs, n = 256, 2 cores under load
      ~5: slots 1: 152, 4: 161, 16: 331, 64: 71 members/s, the last with efficiency
      0.31 as the pool drains).
    - `segment_steps`: solver steps per segment, K (compact; `gcd(K, max_steps)` is used);
      `None` (default): `max_steps` for a pool of one slot (one member never waits for
      another, so its solve runs whole: measured on one core, 256 random pairs, d = 2,
      n = 256, particles, medians of three interleaved rounds: K = 32: 201, 64: 214,
      128: 236, 512: 242 members/s; each segment re-enters the solver and merges the
      saves) and `SEGMENT_STEPS` (32) for a wider pool, except Ott–Antonsen members
      on CPU: 128 (`CPU_SEGMENT_STEPS`; 32 slots, 512 random pairs, physical / natural
      members/s: K = 32: 9225 / 13290, 64: 10019 / 15888, 128: 10109 / 12241; a grid of
      alike members: 12254 / 12348, 12524 / 12329, 15184 / 16610). Earlier measurements on CPU for
      particles (128 random pairs, d = 2, n = 256, t1 = 50, float64,
      physical time, 2 cores under load ~7, when every token was saved; members/s,
      efficiency): lockstep 16.1, 0.41; slots 32/K 16: 13.3, 0.73; 16/16: 16.3, 0.88;
      8/32: 19.2, 0.89; 4/64: 49, 0.80; 2/32: 67, 0.90; 1/32: 77, 0.90; 1/64: 82, 0.80;
      1/128: 82, 0.73. Saving only what the judge reads (module docstring), slots 1 and 4
      run alike and 16 at half the speed (load ~5: 65, 60, 31 members/s): one member per
      slot stays the CPU default (since the row-wise LSA field, 2 and 4 slots with K = 32
      run at 0.75 and 0.66 of one), and K = 32 keeps a wider pool's efficiency near 0.9.
    - `chunk_size`: with compaction, `"auto"` (default) is the largest chunk the memory
      budget allows (up to 1024 members per device on CPU, 131072 on an accelerator):
      the unit written to `out_dir` and resumed. With lockstep, `"auto"`: members are
      ordered by their predicted cost (`group`) and cut into chunks; on CPU of a few
      power-of-two sizes, the largest whose predicted lockstep efficiency reaches
      `efficiency`, capped by `memory_budget`; on an accelerator, whose step costs about
      the same for 10^5 members as for 10^3, as large as on compaction;
      an int: fixed chunks of that many members (rounded up to a multiple of the device
      count); `None`: the whole batch at once.
    - `group`: how members are ordered before chunking (results come back in input
      order): `"pilot"` (d = 2 LSA `AttentionDynamics`: step counts of an Ott–Antonsen
      pilot of the same members, ≈ 1000× cheaper), `"stiffness"` (`β‖A‖‖V‖`, physical
      time), `"none"`; `"auto"` = `"pilot"` where it applies, else `"stiffness"`, except
      for a compacting sweep on one device, which keeps the input order (its pool's
      queue order only shapes the short drain at the end; with several devices the
      predicted costs balance their queues).
    - `efficiency`: the predicted lockstep efficiency a chunk must reach (auto chunks).
    - `memory_budget`: bytes one chunk may use; `None` = a quarter of the memory
      available on the device (host RAM on CPU). The cap it sets is rounded down to a
      power of two members per device, so the free memory moving between calls does not
      change the plan (nor recompile it).
    - `out_dir`: if given, each finished chunk is written there (`chunk_XXXXX.npz` +
      `.json`, plus `manifest.json` and `members.npz`; the `.json` records the chunk's
      step counts and the SHA-256 of its `.npz`); with `resume=True` chunks already
      there (same sweep, checked by fingerprint; the settings are compared before the
      members are ordered, so a folder of another sweep is refused before the pilot) are
      loaded instead of recomputed (a damaged or altered chunk, whose hash differs, is
      recomputed with a warning; the folder's chunk sizes are kept, whatever memory is
      free now), and `SweepResult.load(out_dir)` reloads the sweep
      without repeating the call.
    - `progress`: a tqdm bar (members, failures, lockstep efficiency).
    - `on_chunk(i, info)`: called after each chunk is finished and written.

    **Raises:** `ValueError` naming a bad strategy, slot count, segment length, chunk
    size, group, efficiency or budget.
    """

    chunk_size: int | str | None = eqx.field(static=True)
    group: str = eqx.field(static=True)
    efficiency: float = eqx.field(static=True)
    memory_budget: float | None = eqx.field(static=True)
    out_dir: str | None = eqx.field(static=True)
    resume: bool = eqx.field(static=True)
    progress: bool = eqx.field(static=True)
    on_chunk: Callable | None = eqx.field(static=True)
    strategy: str = eqx.field(static=True)
    slots: int | None = eqx.field(static=True)
    segment_steps: int | None = eqx.field(static=True)

    def __init__(
        self,
        *,
        strategy: Literal["auto", "compact", "lockstep"] = "auto",
        slots: int | None = None,
        segment_steps: int | None = None,
        chunk_size: int | Literal["auto"] | None = "auto",
        group: Literal["auto", "pilot", "stiffness", "none"] = "auto",
        efficiency: float = 0.85,
        memory_budget: float | None = None,
        out_dir: str | os.PathLike | None = None,
        resume: bool = True,
        progress: bool = True,
        on_chunk: Callable[[int, dict], Any] | None = None,
    ):
        where = "Runner"
        if strategy not in ("auto", "compact", "lockstep"):
            raise ValueError(
                f"{where}: strategy must be 'auto', 'compact' or 'lockstep', got {strategy!r}."
            )
        self.strategy = strategy
        self.slots = None if slots is None else _count(where, "slots", slots)
        self.segment_steps = (
            None if segment_steps is None else _count(where, "segment_steps", segment_steps)
        )
        if chunk_size is not None and chunk_size != "auto":
            if (
                isinstance(chunk_size, bool)
                or not isinstance(chunk_size, (int, np.integer))
                or int(chunk_size) < 1
            ):
                raise ValueError(
                    f"{where}: chunk_size must be an integer >= 1, 'auto' or None, got "
                    f"{chunk_size!r}."
                )
            chunk_size = int(chunk_size)
        if group not in ("auto", "pilot", "stiffness", "none"):
            raise ValueError(
                f"{where}: group must be 'auto', 'pilot', 'stiffness' or 'none', got {group!r}."
            )
        if not 0 < float(efficiency) <= 1:
            raise ValueError(f"{where}: efficiency must lie in (0, 1], got {efficiency!r}.")
        self.chunk_size = chunk_size
        self.group = group
        self.efficiency = float(efficiency)
        self.memory_budget = _positive(where, "memory_budget", memory_budget, allow_none=True)
        self.out_dir = None if out_dir is None else os.fspath(out_dir)
        self.resume = bool(resume)
        self.progress = bool(progress)
        self.on_chunk = on_chunk


# ---------------------------------------------------------------------------------------
# One member
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Config:
    """Everything static about a member's run (hashable: part of the compiled key)."""

    method: str
    n: int
    d: int
    t1: float
    num_save: int
    natural: bool
    r0: float
    init: Any
    rtol: float
    atol: float
    max_steps: int
    window: float
    cluster_tol: float
    gap_floor: float | None
    rest_tol: float | None
    lyapunov: int = 0
    lyapunov_renorm: int = 200
    token_major: bool = False  # particle state laid out (d, n): `token_major_pays`

    def as_json(self) -> dict:
        out = dataclasses.asdict(self)
        if callable(self.init):
            out["init"] = f"callable {getattr(self.init, '__qualname__', repr(self.init))}"
        return out


def _initial_state(key, cfg: _Config | Members, dtype):
    """Initial tokens (or None for OA), their angles (d = 2 laws) and R₂(0). `cfg` gives the
    law: `method`, `init`, `r0`, `n`, `d` (a `_Config`, or the `Members` it was made from)."""
    k_phase, k_tokens = jax.random.split(key)
    if cfg.init == "disc":
        k_phase, k_rad = jax.random.split(k_phase)
        radius = cfg.r0 * jnp.sqrt(jax.random.uniform(k_rad, (), dtype=dtype))
    else:
        radius = jnp.asarray(cfg.r0, dtype)
    R0 = radius * jnp.exp(2j * jnp.pi * jax.random.uniform(k_phase, (), dtype=dtype))
    x0 = theta0 = None
    if cfg.method == "ott_antonsen":
        return x0, theta0, R0
    if callable(cfg.init):
        x0 = jnp.asarray(cfg.init(k_tokens, cfg.n, cfg.d, dtype), dtype)
    elif cfg.d == 2 and cfg.init in ("wrapped_cauchy", "disc"):
        theta0, x0 = _wrapped_cauchy(k_tokens, cfg.n, R0, True, dtype, "sweep")
    else:
        x0 = sample_uniform(k_tokens, cfg.n, cfg.d, dtype=dtype)
    return x0, theta0, R0


def _member_rate(flow, x0, cfg: _Config, dtype):
    """The member's natural rate: the flow's own `natural_rate(x0)` (for `AttentionDynamics`
    `kernel_rate`: USA/SA read the initial weight mass, nGPT is 1), 1 without one or in
    physical time."""
    if not cfg.natural or not hasattr(flow, "natural_rate"):
        return jnp.asarray(1.0, dtype)
    r = flow.natural_rate(x0)
    return jnp.where(jnp.isfinite(r) & (r > 0), r, 1.0).astype(dtype)


def _member_setup(flow, seed, cfg: _Config):
    """What every member's solve starts from: dtype, save times, initial state, natural
    rate, the flow in natural time and the classifier settings."""
    dtype = jnp.result_type(*[x for x in jax.tree_util.tree_leaves(flow) if eqx.is_array(x)])
    if not jnp.issubdtype(dtype, jnp.floating):
        dtype = jnp.result_type(float)
    ts = jnp.linspace(0.0, cfg.t1, cfg.num_save, dtype=dtype)
    x0, theta0, R0 = _initial_state(jax.random.key(seed), cfg, dtype)
    rate = _member_rate(flow, x0, cfg, dtype)
    if isinstance(flow, AttentionDynamics) and getattr(flow, "normalisation", None) != "ngpt":
        # The field is linear in V: V → V/r is exactly the time rescaling.
        run_flow = eqx.tree_at(lambda f: f.V, flow, flow.V / rate)
    else:
        run_flow = _TimeRescaled(flow, rate)
    gap_floor = cfg.gap_floor
    if gap_floor is None:
        # The saved states (dense output) jitter at the solver tolerance: near the circle
        # 1 − |R₂|² wobbles at ~2 rtol, which must read as "on the circle".
        gap_floor = max(default_gap_floor(dtype), 10 * cfg.rtol)
    classify_kw = dict(window=cfg.window, gap_floor=gap_floor, rest_tol=cfg.rest_tol)
    return dtype, ts, x0, theta0, R0, rate, run_flow, classify_kw


def _member_judge(
    cfg: _Config, ts, sol, run_flow, rate, classify_kw, dtype, series=None, trig=None
):
    """Classify one solved member (`sol` a `Trajectory`, `OttAntonsenSolution` or
    `WatanabeStrogatzSolution`); every output is an array with no batch axis.

    Particles are judged by `_classify_series` from the moment series and the late tokens
    (`classify_tokens` of every token, computed from what it reads): `sol.xs` holds every
    save (the whole solve) or, with `series` (the compact path's saved `_token_series`),
    the saves from `_late_start` on. Watanabe–Strogatz members take
    `trig = ((cos ψ, sin ψ), (cos ψ/2, sin ψ/2))` from their prepared problem when given
    (the same numbers as from `sol.constants.half_angle`)."""
    if cfg.method == "ott_antonsen":
        R2 = sol.R
        regime, ev = classify_order_parameter(ts, R2, **classify_kw)
    elif cfg.method == "watanabe_strogatz":
        # What classify_tokens reads of the tokens, from R₂ (exact, O(n) per save), the
        # tokens' speeds on the tail's intervals (from the Möbius parameters) and the
        # last tokens: reconstructing tokens cost more than the solve (every save), then
        # half of it (the tail's).
        psi = sol.constants.psi
        if trig is None:
            half = sol.constants.half_angle
            w = _ws_double_angle(*half)
        else:
            w, half = trig
        R2 = _ws_order_parameter(sol.zeta, sol.Psi, *w)
        tail = _tail_start(cfg.num_save, cfg.window)
        speeds = _ws_token_speeds(ts[tail:], sol.zeta[tail:], sol.Psi[tail:], psi, w)
        x_last = _ws_points(sol.zeta[-1:], sol.Psi[-1:], psi, half)[0]
        gap = 1 - (jnp.real(R2) ** 2 + jnp.imag(R2) ** 2)
        regime, ev = _classify_circle(
            ts, R2, gap, speeds, x_last, cluster_tol=cfg.cluster_tol, **classify_kw
        )
    else:
        xs = sol.xs
        if getattr(run_flow, "manifold", "sphere") == "euclidean":
            # Pre-LN and other flows off the sphere: the regime is that of the directions.
            xs = normalise(xs)
        xs = normalise(xs)  # as classify_tokens reads them
        if series is None:
            Q, R2 = _token_series(xs)
            xs = xs[_late_start(cfg.num_save, cfg.window, cfg.d) :]
        else:
            Q, R2 = series
        regime, ev = _classify_series(ts, Q, R2, xs, cluster_tol=cfg.cluster_tol, **classify_kw)
        if cfg.d != 2:
            R2 = jnp.full(ts.shape, jnp.nan, dtype) * (1 + 0j)
            gap = _gap_from_moment(Q)
    order = jnp.abs(R2) if cfg.d == 2 else jnp.sqrt(jnp.clip(1 - gap, 0.0, 1.0))
    result = sol.result._value
    if cfg.method != "particles" and isinstance(run_flow, AttentionDynamics):
        # β is an inverse temperature: refused for every method, as the particle solve
        # refuses it (the reductions would integrate it without complaint).
        result = jnp.where(run_flow.beta <= 0, RESULTS.nonpositive_beta._value, result)
    failed = (result != 0) | ~jnp.all(jnp.isfinite(order))
    regime = jnp.where(failed, FAILED, regime._value)
    evidence = {k: getattr(ev, k) for k in RegimeEvidence.__dataclass_fields__}
    for k, v in evidence.items():  # a failed member has no measurement
        evidence[k] = jnp.where(failed, -1 if jnp.issubdtype(v.dtype, jnp.integer) else jnp.nan, v)
    for k in _RATES:
        evidence[k] = evidence[k] * rate
    for k in _TIMES:
        evidence[k] = evidence[k] / rate
    return regime, result, failed, order, R2, evidence


def _member_outputs(regime, result, failed, num_steps, rate, order, R2, evidence, lyap):
    evidence["lyapunov_max"], evidence["lyapunov_uncertainty"] = lyap[0], lyap[1]
    return dict(
        regime=regime.astype(jnp.int32),
        result=jnp.asarray(result, jnp.int32),
        failed=failed,
        num_steps=jnp.asarray(num_steps, jnp.int32),
        rate=rate,
        order=order,
        R2=R2,
        **{f"evidence_{k}": v for k, v in evidence.items()},
    )


def _member(flow, seed, cfg: _Config):
    """Solve and classify one member (the lockstep path: the package's public solvers);
    every output is an array with no batch axis."""
    dtype, ts, x0, theta0, R0, rate, run_flow, classify_kw = _member_setup(flow, seed, cfg)
    solve_kw = dict(
        t1=cfg.t1,
        ts=ts,
        rtol=cfg.rtol,
        atol=cfg.atol,
        max_steps=cfg.max_steps,
        solver=SWEEP_SOLVER,
    )
    if cfg.method == "ott_antonsen":
        sol = solve_ott_antonsen(
            run_flow.A, run_flow.V, R0, beta=run_flow.beta, throw=False, **solve_kw
        )
    elif cfg.method == "watanabe_strogatz":
        sol = solve_watanabe_strogatz(
            run_flow.A,
            run_flow.V,
            theta0,
            beta=run_flow.beta,
            throw=False,
            points=x0,
            **solve_kw,
        )
    else:
        sol = simulate(run_flow, x0, throw=False, **solve_kw)
    regime, result, failed, order, R2, evidence = _member_judge(
        cfg, ts, sol, run_flow, rate, classify_kw, dtype
    )
    lyap = jnp.full((2,), jnp.nan, dtype)
    if cfg.lyapunov:
        lkw = dict(
            t1=cfg.t1,
            k=cfg.lyapunov,
            num_renorm=cfg.lyapunov_renorm,
            rtol=cfg.rtol,
            atol=cfg.atol,
            max_steps=cfg.max_steps,
        )
        if cfg.method == "ott_antonsen":
            spec = lyapunov_spectrum_ott_antonsen(
                run_flow.A, run_flow.V, R0, beta=run_flow.beta, **lkw
            )
        else:
            spec = lyapunov_spectrum(run_flow, x0, **lkw)
        chaotic, chaos_ev = chaos_verdict(spec)
        regime = jnp.where(chaotic & ~failed, CHAOTIC, regime)
        lyap = jnp.stack([chaos_ev["largest_exponent"], chaos_ev["largest_uncertainty"]]) * rate
    return _member_outputs(regime, result, failed, sol.num_steps, rate, order, R2, evidence, lyap)


# ---------------------------------------------------------------------------------------
# Compaction: a pool of slots stepped K steps at a time, refilled from the queue
# ---------------------------------------------------------------------------------------


def _member_problem(flow, seed, cfg: _Config):
    """One member's `Problem` and what `_member_finish` needs: the same problem that
    `simulate` / `solve_ott_antonsen` / `solve_watanabe_strogatz` build for `_member`."""
    dtype, ts, x0, theta0, R0, rate, run_flow, classify_kw = _member_setup(flow, seed, cfg)
    solver = SWEEP_SOLVER
    if cfg.method == "ott_antonsen":
        A, V, beta = (jnp.asarray(x).astype(dtype) for x in (run_flow.A, run_flow.V, run_flow.beta))
        problem, checks = prepare_ott_antonsen(A, V, beta, R0, dtype, solver, cfg.rtol, cfg.atol)
    elif cfg.method == "watanabe_strogatz":
        A, V, beta = (jnp.asarray(x).astype(dtype) for x in (run_flow.A, run_flow.V, run_flow.beta))
        # With the sampled tokens: no trigonometry (`_wrapped_cauchy`), as `_member`.
        consts = watanabe_strogatz_constants(
            theta0.astype(dtype), max_iter=200, points=x0.astype(dtype)
        )
        problem, checks = prepare_watanabe_strogatz(
            A, V, beta, consts, dtype, solver, cfg.rtol, cfg.atol
        )
    else:
        problem, checks = prepare_particles(
            run_flow,
            x0.astype(dtype),
            solver,
            cfg.rtol,
            cfg.atol,
            True,
            token_major=cfg.token_major,
        )
    return problem, (checks, rate, run_flow)


def _member_finish(state, post, cfg: _Config, dtype):
    """Read one finished segmented solve (`SegmentState`) into the member's outputs, as
    `_member` reads its whole solve."""
    checks, rate, run_flow = post
    ts = jnp.linspace(0.0, cfg.t1, cfg.num_save, dtype=dtype)
    seg = segments_solution(state)
    finish = dict(
        ott_antonsen=finish_ott_antonsen,
        watanabe_strogatz=finish_watanabe_strogatz,
        particles=finish_particles,
    )[cfg.method]
    series = None
    if cfg.method == "particles":
        # The moment series at every save and the tokens from `_late_start` on.
        (series, late_ys) = seg.ys
        # NaN for a rejected member and for saves never reached (inf in the buffer), as
        # the tokens of the whole solve give them.
        moments = jnp.where(checks.invalid | ~jnp.isfinite(series), jnp.nan, series)
        series = _series_from_moments(moments, cfg.d)
        seg = eqx.tree_at(lambda sg: sg.ys, seg, late_ys)
        sol = finish(checks, seg, ts[_late_start(cfg.num_save, cfg.window, cfg.d) :])
    else:
        sol = finish(checks, seg, ts)
    gap_floor = cfg.gap_floor
    if gap_floor is None:
        gap_floor = max(default_gap_floor(dtype), 10 * cfg.rtol)
    classify_kw = dict(window=cfg.window, gap_floor=gap_floor, rest_tol=cfg.rest_tol)
    trig = (checks.w, checks.half) if cfg.method == "watanabe_strogatz" else None
    regime, result, failed, order, R2, evidence = _member_judge(
        cfg, ts, sol, run_flow, rate, classify_kw, dtype, series, trig
    )
    lyap = jnp.full((2,), jnp.nan, dtype)
    return _member_outputs(regime, result, failed, sol.num_steps, rate, order, R2, evidence, lyap)


def segment_length(asked: int, max_steps: int) -> int:
    """The longest segment of at most `asked` steps that divides `max_steps` (a member in a
    pool must stop at `max_steps` exactly, at the end of a segment)."""
    return max(k for k in range(1, min(asked, max_steps) + 1) if max_steps % k == 0)


def _rows(mask, new, old):
    """`new` where `mask` (one flag per leading row), else `old`, leaf by leaf."""
    return jax.tree.map(
        lambda a, b: jnp.where(mask.reshape((-1,) + (1,) * (a.ndim - 1)), a, b), new, old
    )


def _whole_particle_saves(cfg: _Config, slots: int, dtype) -> bool:
    """Whether a compact particle sweep saves every member's whole state at every save
    time (`WHOLE_SAVE_BYTES`): with one slot, when the buffer is small enough."""
    size = cfg.num_save * cfg.n * cfg.d * jnp.dtype(dtype).itemsize
    return cfg.method == "particles" and slots == 1 and size <= WHOLE_SAVE_BYTES


def _split_particle_saves(cfg: _Config, token_major: bool):
    """`ys ↦ (moments, late)`: the whole states saved at every save time (`ys`, leading
    axis the saves) turned into what `_save_plan`'s two grids save: `_direction_moments`
    at every save and the states from `_late_start` on (unreached saves, inf, give
    non-finite moments, read as NaN by `_member_finish` as before)."""
    late = _late_start(cfg.num_save, cfg.window, cfg.d)
    moments = jax.vmap(functools.partial(_direction_moments, token_major=token_major))

    def split(ys):
        return moments(ys), ys[late:]

    return split


def _save_plan(cfg: _Config, ts, post, whole: bool = False):
    """Save grids and functions of the compact path: OA and WS save their (2–3 real)
    states at every save time (`fns = None`; interpolated from each segment's dense
    output, `DENSE_SAVES`); particles save the moment series at every save time and the
    tokens only from `_late_start` on, which is all their judge reads (saving every token
    cost more than the steps: a vmapped diffrax loop selects over its whole save buffer at
    every save), or with `whole` (`_whole_particle_saves`) their state at every save time,
    split after the solve (`_split_particle_saves`)."""
    if cfg.method != "particles" or whole:
        return ts, None
    checks = post[0]
    late = _late_start(cfg.num_save, cfg.window, cfg.d)
    # The moment of the tokens as `classify_tokens` sees them (`Trajectory.xs`: the
    # directions of the state), which `_series_from_moments` turns into `_token_series`.
    series = functools.partial(_direction_moments, token_major=checks.token_major)
    return (ts, ts[late:]), (series, None)


def _blocked_vmap(fn, block, *args):
    """`eqx.filter_vmap(fn)(*args)` over the leading axis of every array in `args`,
    computed `block` members at a time (`jax.lax.map`) when `block` is an int smaller than
    the batch; the same numbers either way."""
    m = jax.tree_util.tree_leaves(eqx.filter(args, eqx.is_array))[0].shape[0]
    if block is None or block >= m:
        return eqx.filter_vmap(fn)(*args)
    dyn, static = eqx.partition(args, eqx.is_array)
    out_static = []  # the outputs' non-array parts (solver, terms), set while tracing

    def one(d):
        out, rest = eqx.partition(fn(*eqx.combine(d, static)), eqx.is_array)
        out_static[:] = [rest]
        return out

    return eqx.combine(jax.lax.map(one, dyn, batch_size=block), out_static[0])


def _one_slot(advance_one, p_dyn, starts, live, rows, split=None):
    """The finished states of `_compact_local` with one slot, and the solver-loop
    iterations: each member solved on its own, one after the other (`lax.map`), by the
    same `advance_one` segments as a pool of one slot (bitwise the same results). The pool
    paid for its queue (the slot's states taken from and written back to the chunk's
    arrays around every member) and ran the solve as a vmap of one, whose batched loop
    predicates select over the whole carry, save buffers included, at every step and save:
    about 5 % of a particle member (n = 256, d = 2, one core; 2026-12-05)."""

    def solve(args):
        d, st, lv = args
        st = eqx.tree_at(lambda s: (s.ys, s.done), st, (rows, st.done | ~lv))
        st = jax.lax.while_loop(lambda s: ~s.done, lambda s: advance_one(d, s), st)
        if split is None:
            return st
        # The whole saves become what the judge reads before they leave the member.
        ys = split(st.ys)
        return eqx.tree_at(lambda s: (s.ys, s.num_saved), st, (ys, (st.num_saved,) * len(ys)))

    finished = jax.lax.map(solve, (p_dyn, starts, live))
    return finished, jnp.sum(jnp.where(live, finished.num_steps, 0))


def _pool(advance_one, p_dyn, starts, live, inf_rows, slots, m):
    """The finished states of `_compact_local`'s pool of `slots` slots, and the
    solver-loop iterations it ran (per segment, the most steps any slot took)."""
    advance = jax.vmap(advance_one)
    num_live = jnp.sum(live)
    take = lambda tree, idx: jax.tree.map(lambda x: x[idx], tree)  # noqa: E731
    first = jnp.arange(slots)
    slot = jnp.where(first < num_live, first, -1)
    pool = eqx.tree_at(lambda st: st.ys, take(starts, first), inf_rows(slots))
    pool = eqx.tree_at(lambda st: st.done, pool, pool.done | (slot < 0))  # empty: no steps
    # Finished members' states (the unreached saves stay inf, as in diffeqsolve).
    finished = eqx.tree_at(lambda st: st.ys, starts, inf_rows(m))

    def cond(carry):
        return jnp.any(carry[1] >= 0)

    def body(carry):
        pool, slot, queue, finished, iterations = carry
        before = pool.num_steps
        pool = advance(take(p_dyn, jnp.maximum(slot, 0)), pool)
        iterations = iterations + jnp.max(pool.num_steps - before)
        done = pool.done & (slot >= 0)
        where = jnp.where(done, slot, m)  # out of range: dropped
        finished = jax.tree.map(lambda a, b: a.at[where].set(b, mode="drop"), finished, pool)

        def refill(args):
            pool, slot, queue = args
            free = done | (slot < 0)
            cand = queue + jnp.cumsum(free) - 1
            fill = free & (cand < num_live)
            slot = jnp.where(fill, cand, jnp.where(done, -1, slot))
            new = take(starts, jnp.clip(cand, 0, m - 1))
            ys = jax.tree.map(
                lambda y: jnp.where(fill.reshape((-1,) + (1,) * (y.ndim - 1)), jnp.inf, y),
                pool.ys,
            )
            pool = _rows(fill, eqx.tree_at(lambda st: st.ys, new, ys), pool)
            return pool, slot, queue + jnp.sum(fill)

        pool, slot, queue = jax.lax.cond(jnp.any(done), refill, lambda a: a, (pool, slot, queue))
        return pool, slot, queue, finished, iterations

    carry = (pool, slot, jnp.minimum(num_live, slots), finished, jnp.zeros((), jnp.int32))
    _, _, _, finished, iterations = jax.lax.while_loop(cond, body, carry)
    return finished, iterations


def _compact_local(
    dynamic, static, seed, live, cfg: _Config, slots: int, steps: int, block: int | None
):
    """One device's members: prepared, solved `slots` at a time by segments of `steps`
    steps in one `while_loop` (a finished slot takes the next member of the queue; with one
    slot, `_one_slot`: each member's solve on its own), then finished and classified;
    preparing and classifying take `block` members at a time
    (`None`: all at once). Members with `live = False` (the padding of a chunk) sit at the
    end and are never solved.

    **Returns:** the per-member outputs and the number of solver-loop iterations the pool
    ran, shape `(1,)`: per segment, the most steps any slot took in it (a vmapped loop runs
    until its last member stops; the others' iterations are masked), summed.
    """
    flow = eqx.combine(dynamic, static)
    m = seed.shape[0]
    dtype = jnp.result_type(*[x for x in jax.tree_util.tree_leaves(flow) if eqx.is_array(x)])
    if not jnp.issubdtype(dtype, jnp.floating):
        dtype = jnp.result_type(float)
    ts = jnp.linspace(0.0, cfg.t1, cfg.num_save, dtype=dtype)
    t1 = jnp.asarray(cfg.t1, dtype)
    problems, post = _blocked_vmap(lambda f, s: _member_problem(f, s, cfg), block, flow, seed)
    p_dyn, p_static = eqx.partition(problems, eqx.is_array)

    def problem_of(d):
        return eqx.combine(d, p_static)

    whole = _whole_particle_saves(cfg, slots, dtype)
    grids, fns = _save_plan(cfg, ts, post, whole)
    sizes = cfg.num_save if fns is None else tuple(g.shape[0] for g in grids)
    # The queue's start states hold one save row (the pool and the finished states hold
    # all saves): only the pool carries the saves of members in progress.
    one_row = 1 if fns is None else (1,) * len(fns)
    starts = eqx.filter_vmap(
        lambda d: start_segments(problem_of(d), jnp.asarray(0.0, dtype), t1, None, one_row, fns)
    )(p_dyn)
    starts, s_static = eqx.partition(starts, eqx.is_array)

    def inf_rows(k):
        def rows(size, tree):
            return jax.tree.map(lambda y: jnp.full((k, size) + y.shape[2:], jnp.inf, y.dtype), tree)

        if fns is None:
            return rows(sizes, starts.ys)
        return tuple(rows(size, tree) for size, tree in zip(sizes, starts.ys))

    def advance_one(d, st):
        st = advance_segments(
            problem_of(d),
            eqx.combine(st, s_static),
            t1,
            grids,
            steps=steps,
            max_steps=cfg.max_steps,
            save_fns=fns,
            dense_saves=DENSE_SAVES and fns is None and steps < cfg.max_steps,
        )
        return eqx.filter(st, eqx.is_array)

    if slots == 1:
        split = _split_particle_saves(cfg, post[0].token_major) if whole else None
        finished, iterations = _one_slot(
            advance_one, p_dyn, starts, live, jax.tree.map(lambda y: y[0], inf_rows(1)), split
        )
        if whole:  # the finished saves are the two grids' (`_split_particle_saves`)
            s_static = eqx.tree_at(
                lambda s: (s.ys, s.num_saved),
                s_static,
                ((None, None), (None, None)),
                is_leaf=lambda x: x is None,
            )
    else:
        finished, iterations = _pool(advance_one, p_dyn, starts, live, inf_rows, slots, m)
    out = _blocked_vmap(
        lambda st, po: _member_finish(eqx.combine(st, s_static), po, cfg, dtype),
        block,
        finished,
        post,
    )
    return out, iterations[None]


@eqx.filter_jit
@eqx.debug.assert_max_traces(max_traces=None)  # counts traces; tests read the count
def _sweep_chunk_compact(dynamic, static, seed, live, cfg: _Config, mesh, slots, steps, block):
    if mesh is None:
        return _compact_local(dynamic, static, seed, live, cfg, slots, steps, block)
    # Each device runs its own pool and queue: no collective inside the loop.
    spec = PartitionSpec("batch")
    local = jax.shard_map(
        lambda dyn, s, lv: _compact_local(dyn, static, s, lv, cfg, slots, steps, block),
        mesh=mesh,
        in_specs=(spec, spec, spec),
        out_specs=spec,
        check_vma=False,
    )
    return local(dynamic, seed, live)


def _vmapped(dynamic, static, seed, cfg):
    flow = eqx.combine(dynamic, static)
    return eqx.filter_vmap(lambda f, s: _member(f, s, cfg))(flow, seed)


@eqx.filter_jit
@eqx.debug.assert_max_traces(max_traces=None)  # counts traces; tests read the count
def _sweep_chunk(dynamic, static, seed, cfg: _Config, mesh):
    if mesh is None:
        return _vmapped(dynamic, static, seed, cfg)
    # One solver loop per device: no collective inside the while loops, so no device
    # waits for another device's slowest member.
    spec = PartitionSpec("batch")
    local = jax.shard_map(
        lambda dyn, s: _vmapped(dyn, static, s, cfg),
        mesh=mesh,
        in_specs=(spec, spec),
        out_specs=spec,
        check_vma=False,
    )
    return local(dynamic, seed)


def num_traces() -> int:
    """How many times the compiled chunk functions (lockstep and compacting) have been
    traced, together (for tests)."""
    return eqx.debug.get_num_traces(_sweep_chunk) + eqx.debug.get_num_traces(_sweep_chunk_compact)


# ---------------------------------------------------------------------------------------
# Results container
# ---------------------------------------------------------------------------------------


def _failure_records(members, result, params, seed) -> list[dict]:
    """One dict per failed member: its index, the reason and its parameters."""
    out = []
    for i, code in zip(members, result):
        rec = dict(index=int(i), reason=result_message(int(code)) if code else "non-finite")
        for k, v in params.items():
            x = v[i]
            rec[k] = x.tolist() if isinstance(x, np.ndarray) else x.item()
        rec["seed"] = int(seed[i])
        out.append(rec)
    return out


_FIELDS = (
    "regime",
    "result",
    "failed",
    "num_steps",
    "rate",
    "order",
    "R2",
) + tuple(f"evidence_{k}" for k in EVIDENCE_FIELDS)


@dataclasses.dataclass
class SweepResult:
    """Per-member outcome of a sweep (NumPy arrays on the host, batch axis first).

    **Fields:**

    - `params`: dict of the members' parameters, `(batch, ...)` each: the flow's array
      leaves by path (`"A"`, `"V"`, `"beta"`, ... for `AttentionDynamics`); `A`, `V`
      `(batch, d, d)` and `beta` `(batch,)` are also fields when the flow has them (else
      `None`); `seed` `(batch,)`.
    - `regime` `(batch,)`: the value of the member's `REGIMES` item (`REGIME_NAMES[code]`
      is its short name), `FAILED` (−1) for a failed member, `NOT_RUN` (−2) for a member
      an interrupted sweep never computed (`regime_names` names all of them).
    - `evidence`: dict of `(batch,)` arrays, one per `RegimeEvidence` field, times and
      rates in physical units (`period`, `final_motion`, `drift_rate`, `rotation_rate`);
      NaN (−1 for counts) where there is no measurement.
    - `result` (a `RESULTS` code), `failed` (bool), `completed` (bool), `num_steps`,
      `rate` (the member's natural rate, 1 when `time_scale="physical"`).
    - `order` `(batch, times)`: `|R₂|` in d = 2, `ρ = sqrt(1 − clustering_gap)` otherwise;
      `R2` `(batch, times)` complex (NaN when d > 2); `ts` `(batch, times)` physical save
      times.
    - `shape`: the logical shape (cartesian grid or `(batch,)`); `seconds`: wall time of
      the computed chunks; `chunks_computed`, `chunks_loaded`.
    - `lockstep_efficiency`: `Σ steps_i / Σ (slots × loop iterations)` (compaction: the
      share of slot-steps that were a member's own steps; per segment the pool's loop
      runs as many iterations as its busiest slot takes, so a pool of one slot is 1) or
      `Σ steps_i / Σ_chunks (chunk size × max steps in chunk)` (lockstep); 1 = no member
      waited for another.
      Over the chunks computed now and those loaded from `out_dir` (each chunk's summary
      records its step counts: a loaded sweep reports the efficiency of the run that
      computed it); chunk files written before these were recorded are left out (NaN
      when no chunk has them).
    - `plan`: the chunk plan (sizes, the grouping, the memory estimate per member and
      the budget, and `predicted_efficiency`: the lockstep efficiency the grouping's
      predicted costs give the chunks, None with `group="none"`); `config`: the member
      settings; `environment`: backend, device count, dtype, matmul precision and JAX
      version of the run.
    - `fingerprint`: SHA-256 (hex) of the members' parameters, seeds, order and chunking
      and of every setting that changes a result: two sweeps with the same fingerprint
      computed the same thing (the key by which a folder is resumed, recorded in its
      `manifest.json`); None for a result built by hand.
    """

    params: dict
    seed: np.ndarray
    regime: np.ndarray
    result: np.ndarray
    failed: np.ndarray
    num_steps: np.ndarray
    rate: np.ndarray
    order: np.ndarray
    R2: np.ndarray
    evidence: dict
    ts: np.ndarray
    shape: tuple
    completed: np.ndarray | None = None
    seconds: float = 0.0
    chunks_computed: int = 0
    chunks_loaded: int = 0
    lockstep_efficiency: float = float("nan")
    plan: dict = dataclasses.field(default_factory=dict)
    config: dict = dataclasses.field(default_factory=dict)
    environment: dict = dataclasses.field(default_factory=dict)
    fingerprint: str | None = None

    def __post_init__(self):
        if self.completed is None:
            self.completed = np.ones(self.regime.shape, bool)

    @property
    def A(self):
        return self.params.get("A")

    @property
    def V(self):
        return self.params.get("V")

    @property
    def beta(self):
        return self.params.get("beta")

    @property
    def regime_names(self) -> np.ndarray:
        """The regime name of every member (`"failed"`, `"not run"` too), shape `(batch,)`."""
        return np.asarray([regime_label(c) for c in self.regime], dtype=object)

    def counts(self) -> dict:
        """Number of members per regime name, plus `failed` and `not run`."""
        c = {name: int(np.sum(self.regime == i)) for i, name in enumerate(REGIME_NAMES)}
        c["failed"] = int(np.sum(self.regime == FAILED))
        c["not run"] = int(np.sum(self.regime == NOT_RUN))
        return c

    def failures(self) -> list[dict]:
        """Each failed member with its parameters and the reason: a dict with `index`,
        `reason` (the `RESULTS` code's name, or "non-finite" for a successful solve whose
        order parameter is not finite), the parameters by name, `seed`, and how far the
        solve got: `num_steps` and `last_save` (the last physical save time whose order
        parameter is finite; None if none is, as for a non-finite argument)."""
        bad = np.flatnonzero(self.failed)
        out = _failure_records(bad, self.result[bad], self.params, self.seed)
        for rec, i in zip(out, bad):
            finite = np.flatnonzero(np.isfinite(np.asarray(self.order[i])))
            rec["num_steps"] = int(self.num_steps[i])
            rec["last_save"] = float(self.ts[i][finite[-1]]) if finite.size else None
        return out

    def failure_reasons(self) -> list[tuple[str, int]]:
        """Why members failed: `(name of the RESULTS code, number of members)`, most
        common first (empty when none failed); `RESULTS[getattr(RESULTS, name)]` is the
        full message."""
        return _reason_counts(self.result, self.failed)

    def reshape(self, field: str) -> np.ndarray:
        """A per-member field (a parameter or an evidence name) in the sweep's shape."""
        if field in self.evidence:
            x = self.evidence[field]
        elif field in self.params:
            x = self.params[field]
        else:
            x = getattr(self, field)
        return x.reshape(tuple(self.shape) + x.shape[1:])

    def _rule_inputs(self, dtype=None) -> dict:
        """Floors (`gap_floor`, `rest_tol`) and the window quantities of `decision_margin`
        for every member: the sweep's own, or (`dtype` given) those a sweep in `dtype`
        would have used for the floors it left at their default."""
        from ._regimes import _default_rest_tol, _series_extras

        cfg = self.config
        own = np.real(self.order).dtype
        gap_floor, rest_tol = cfg.get("gap_floor"), cfg.get("rest_tol")
        if gap_floor is None:  # as `_member` resolves it
            gap_floor = max(default_gap_floor(dtype or own), 10 * cfg["rtol"])
        if rest_tol is None:
            rest_tol = _default_rest_tol(dtype or own)
        with np.errstate(all="ignore"):
            ts = np.asarray(self.ts, np.float64)
            if cfg["d"] == 2:
                R2 = np.asarray(self.R2, np.complex128)
                series = dict(
                    motion=np.abs(np.diff(R2, axis=-1)) / np.diff(ts, axis=-1),
                    signal=R2.real,
                )
                gap = 1 - np.abs(R2) ** 2
            else:
                series = dict(final_motion=self.evidence["final_motion"])
                gap = 1 - np.asarray(self.order, np.float64) ** 2
            extras = _series_extras(ts, gap, window=cfg["window"], rest_tol=rest_tol, **series)
        return dict(gap_floor=gap_floor, rest_tol=rest_tol, **extras)

    def _degenerate(self) -> bool:
        """One token: reported undetermined whatever its evidence (not a threshold)."""
        return self.config["n"] == 1 and self.config["method"] != "ott_antonsen"

    def decision_margins(self) -> tuple[np.ndarray, np.ndarray]:
        """Each member's `decision_margin`: how close its classification was to one of the
        classifier's thresholds, from the stored evidence and series (on the host; the
        compiled sweep is not involved).

        The thresholds are the member's own (`gap_floor` resolved as the sweep does,
        `rest_tol` or the classifier's default for the sweep's dtype). In d = 2 the window
        quantities the evidence lacks (motion floor, crossings, late and smallest gap) are
        recomputed from the stored `R2` and `ts`, exactly as the classifier read them; in
        d > 2 the gaps come from `order`, the motion floor is its lower bound
        `rest_tol max(final_motion, 1/Δt)` and the crossings are estimated from `period`
        (a member whose re-evaluated rules then disagree with its regime gets margin 0).

        **Returns:** `(margin, rule)`, `(batch,)` arrays: the margin in e-folds (`inf`
        where no single test can change the regime, e.g. a degenerate `n = 1` member; NaN
        for failed and not-run members) and the name of the nearest deciding test.
        """
        from ._lyapunov import CHAOS_FLOOR
        from ._regimes import decision_margin

        inputs = self._rule_inputs()
        inputs.pop("rest_tol")
        with np.errstate(all="ignore"):
            margin, rule = decision_margin(
                self.evidence,
                regime=self.regime,
                chaos_floor=CHAOS_FLOOR * np.asarray(self.rate, np.float64),
                **inputs,
            )
        if self._degenerate():
            margin = np.where(np.isnan(margin), np.nan, np.inf)
            rule = np.full(margin.shape, "", dtype=object)
        return margin, rule

    @property
    def floor_sensitive(self) -> np.ndarray:
        """Members whose regime changes between the default floors of float32 and of
        float64, `(batch,)` bool: the same trajectory judged by both.

        The defaults differ by dtype (`gap_floor` `max(sqrt(eps), 1e-6, 10 rtol)`: 3.5e-4
        against 1e-6 at rtol 1e-7; `rest_tol` 3.5e-3 against 1e-5): a gap of 1e-5 reads
        as "reached" in float32 and not in float64, however far it is from either floor.
        Only floors the sweep left at their default count; with `gap_floor` and
        `rest_tol` both given, no member is floor-sensitive. In d = 2 the stored `R2` and
        `ts` are judged again by `classify_order_parameter` under each dtype's floors
        (exact: the rules read only `R₂`; one small compilation per floor set and
        shape); in d > 2 the rules are re-evaluated on the stored evidence, whose e-fold
        counts were measured against the sweep's own floors (approximate).
        """
        from ._regimes import _classify_order_parameter_batch, _host_rules

        cfg = self.config
        measured = np.isfinite(np.asarray(self.evidence["final_gap"], np.float64))
        if (cfg.get("gap_floor") is not None and cfg.get("rest_tol") is not None) or (
            self._degenerate()
        ):
            return np.zeros(self.regime.shape, bool)
        decided = []
        for dt in (np.float32, np.float64):
            inputs = self._rule_inputs(dt)
            if cfg["d"] == 2:
                ok = measured & np.all(np.isfinite(self.ts), axis=-1)
                codes = _classify_order_parameter_batch(
                    np.where(ok[:, None], self.ts, np.arange(self.ts.shape[-1])),
                    np.where(ok[:, None], self.R2, 0).astype(self.R2.dtype),
                    window=cfg["window"],
                    gap_floor=float(inputs["gap_floor"]),
                    rest_tol=float(inputs["rest_tol"]),
                )
                decided.append(np.asarray(codes))
            else:
                inputs.pop("rest_tol")
                with np.errstate(all="ignore"):
                    rules = _host_rules("SweepResult.floor_sensitive", self.evidence, **inputs)
                decided.append(rules["regime"])
        return measured & (decided[0] != decided[1])

    def near_boundary_mask(self, tol: float = 0.05) -> np.ndarray:
        """Members whose classification is fragile, `(batch,)` bool: a deciding quantity
        within `tol` e-folds of its threshold (`decision_margins`, about `100 tol` %), or a
        decision that changes with the dtype's default floors (`floor_sensitive`).
        Another dtype, horizon, floor or random draw may well decide such a member
        otherwise. The default 0.05 stays below the 0.105 that separates the rate ratio of
        an exact geometric convergence from its 0.9 threshold. Failed and not-run members
        are never flagged (see `failed`, `completed`).

        **Raises:** `ValueError` for a negative or non-finite `tol`.
        """
        try:
            ok = np.isfinite(float(tol)) and float(tol) >= 0
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ValueError(
                f"SweepResult.near_boundary_mask: tol must be a finite number >= 0, got {tol!r}."
            )
        margin, _ = self.decision_margins()
        with np.errstate(invalid="ignore"):
            return np.asarray(margin < tol) | self.floor_sensitive

    @property
    def near_boundary(self) -> np.ndarray:
        """`near_boundary_mask()` at its default tolerance (0.05 e-folds), `(batch,)` bool."""
        return self.near_boundary_mask()

    @classmethod
    def load(cls, out_dir) -> SweepResult:
        """Reload a finished or interrupted sweep from its folder alone.

        Members whose chunk is missing or unreadable come back with `completed=False`
        and regime `NOT_RUN` (rerunning the same sweep with the same `out_dir` computes
        just those).

        **Raises:** `ValueError` naming the problem for a folder without a sweep
        manifest; a damaged manifest (a field missing or of another type than the sweep
        writes, e.g. a non-integer `num_members`: nothing is coerced) or one edited after
        it was written (the SHA-256 of its contents, recorded since 2026-12-07, differs);
        a members file that is damaged, or altered (its SHA-256, recorded in the manifest,
        differs); a chunk of another sweep, or a chunk whose `.npz` was altered after it
        was written (its SHA-256 differs from the one its `.json` recorded; the file is
        named). A damaged chunk (an unreadable or edited archive or summary, or arrays of
        other kinds or shapes than the sweep writes) is skipped with a warning.
        """
        return _load_sweep(os.fspath(out_dir))


# ---------------------------------------------------------------------------------------
# Planning: cost prediction, memory estimate, chunks
# ---------------------------------------------------------------------------------------


def environment_record(dtype=None) -> dict:
    """`_solve.environment_record()` (backend, devices, matmul precision, x64, versions)
    plus the process count and the dtype of the sweep."""
    return dict(
        _solve_environment(),
        process_count=jax.process_count(),
        dtype=None if dtype is None else np.dtype(dtype).name,
    )


def _quadratic_scores(flow) -> bool:
    """Whether the flow builds an `(n, n)` score matrix (all but LSA `AttentionDynamics`)."""
    return not (isinstance(flow, AttentionDynamics) and flow.kernel == "lsa")


def member_memory(members: Members, integration: Integration) -> int:
    """Estimated peak bytes of one member in a compiled chunk (saved states, solver
    stages, classifier temporaries, and the `(n, n)` scores of softmax-type kernels)."""
    item = integration.resolved_dtype().itemsize
    S, n, d = integration.num_save, members.n, members.d
    if members.method == "ott_antonsen":
        return 64 * S * item + 4096
    if members.method == "watanabe_strogatz":
        # 3 real numbers per save; the n constants, their Newton solve and the judge's
        # per-token temporaries (one save interval at a time) are O(n), not O(n · saves).
        return 64 * S * item + 48 * n * item + 4096
    state = n * d * item
    total = 4 * S * state + 16 * state  # saved + normalised states, classifier, stages
    if d > 2:
        total += 3 * S * d * d * item  # moments Q(t) of the classifier
    if members.method == "particles" and _quadratic_scores(members.flow):
        total += 4 * n * n * item
    return int(total)


def available_memory() -> int:
    """Bytes free on the first device (`memory_available`; 8 GiB when it cannot be read)."""
    free = memory_available()
    return 8 * 2**30 if free is None else int(free)


def _host_memory_available() -> int:
    """Bytes of host RAM available (`MemAvailable` of `/proc/meminfo`; else the free
    physical pages; 8 GiB when neither can be read). On a CPU backend this is what
    `available_memory()` reads; on an accelerator that one is the device's memory."""
    free = meminfo_available()
    if free is not None:
        return free
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return 8 * 2**30


# Host bytes per member besides its saved series: the codes, rate and evidence of the
# result, the seeds, order and predicted cost of the plan, and the pilot's results.
_MEMBER_BOOKKEEPING = 8 * (len(EVIDENCE_FIELDS) + 8) + 17 * 32


def _results_memory(num_save: int, dtype) -> int:
    """Host bytes of one member's results: `order` and the complex `R2` at every save in
    `dtype`, the physical save times `ts` (float64) and `_MEMBER_BOOKKEEPING`."""
    item = np.dtype(dtype).itemsize
    return int(num_save) * (3 * item + 8) + _MEMBER_BOOKKEEPING


def _host_memory_need(members: Members, integration: Integration, dtype) -> int:
    """Host bytes a sweep of `members` will hold: every member's results and the flow's
    floating leaves that the cast to `dtype` copies."""
    need = members.size * _results_memory(integration.num_save, dtype)
    for leaf in jax.tree_util.tree_leaves(members.flow):
        if hasattr(leaf, "dtype") and hasattr(leaf, "size"):
            src = np.dtype(leaf.dtype)
            if jnp.issubdtype(src, jnp.floating) and src != np.dtype(dtype):
                need += int(leaf.size) * np.dtype(dtype).itemsize
    return int(need)


def _check_host_memory(num_members: int, need: int, what: str = "their results") -> None:
    """Refuse a sweep whose host arrays would not fit in the host memory available, before
    they are built (10⁷ members hold gigabytes of results and parameters)."""
    free = _host_memory_available()
    if need > free:
        raise ValueError(
            f"sweep: {num_members} members need about {need / 2**30:.3g} GiB of host memory "
            f"({what}), more than the {free / 2**30:.3g} GiB available; sweep fewer members "
            "at a time (e.g. slices of the grid, each with its own out_dir) or fewer saves "
            "(num_save)."
        )


def _refuse_doomed(members: Members, flow) -> None:
    """Refuse a batch of `AttentionDynamics` whose every member is sure to fail for a reason
    seen before solving (instead of solving the batch to fail each member): β ≤ 0 (an
    inverse temperature) or not finite for all, or, for particles, a non-finite
    `score_shift` for all. Batches where only some members fail run, with per-member
    status."""
    if not isinstance(flow, AttentionDynamics):
        return
    B = members.size
    beta = np.asarray(flow.beta, np.float64).ravel()
    if beta.size and np.all(~np.isfinite(beta) | (beta <= 0)):
        nonpositive = np.all(beta <= 0)  # every member fails as nonpositive_beta
        if np.all((beta == beta[0]) | (np.isnan(beta) & np.isnan(beta[0]))):
            got = f"beta = {beta[0]:g} for all {B} members"
        elif nonpositive:
            got = f"beta <= 0 for all {B} members (from {beta.min():g} to {beta.max():g})"
        else:
            got = (
                f"beta is not finite or <= 0 for all {B} members "
                f"({int(np.sum(~np.isfinite(beta)))} not finite)"
            )
        if nonpositive:
            why = (
                f"must be > 0; {got}, so every member would fail (nonpositive_beta): nothing "
                "was run (for LSA, beta < 0 is the flow of -A: pass -A instead)"
            )
        else:
            why = f"must be a finite number > 0; {got}, so every member would fail: nothing was run"
        raise ValueError(f"sweep: beta is an inverse temperature and {why}.")
    shift = np.asarray(flow.score_shift, np.float64).ravel()
    if members.method == "particles" and shift.size and not np.isfinite(shift).any():
        raise ValueError(
            f"sweep: score_shift must be finite; it is {shift[0]:g} for all {B} members, so "
            "every member would fail (non-finite argument): nothing was run."
        )


def _first_member(flow, batched: bool):
    """Member 0 of a batch of flows (every array leaf's first row), as JAX arrays."""

    def first(x):
        if eqx.is_array(x):
            return jnp.asarray(x[0] if batched else x)
        return x

    return jax.tree_util.tree_map(first, flow)


def _check_first_member(members: Members, flow, cfg: _Config, dtype) -> None:
    """`simulate`'s checks of a flow (`check_flow`: traceable, dx/dt of the tokens' shape,
    tangent to the sphere for a sphere flow) on member 0 of a particle sweep of a user's
    flow, at its initial tokens, outside `jit` and before anything is compiled; also the
    tokens of a callable `init` and the flow's `natural_rate`. A non-finite velocity is
    left to the member's own status (the sweep's policy for bad input).

    **Raises:** `ValueError` naming member 0, its tokens' shape and the problem."""
    if members.method != "particles":
        return
    where = f"sweep: member 0 (of {members.size}; n = {cfg.n} tokens, d = {cfg.d})"
    flow0 = _first_member(flow, members.batched)
    hint = (
        " With batched=True, member 0 is the first row of every array leaf of the flow; a "
        "single flow shared by all members needs Members(..., batched=False)."
        if members.batched
        else ""
    )
    manifold = flow_manifold(flow0)
    try:
        x0, _, _ = _initial_state(jax.random.key(members.seeds[0]), cfg, dtype)
    except Exception as err:
        if not callable(cfg.init):
            raise
        raise ValueError(
            f"{where}: the initial law init(key, n, d, dtype) failed "
            f"({type(err).__name__}: {str(err).strip().splitlines()[0] if str(err) else ''})."
        ) from err
    if x0.shape != (cfg.n, cfg.d):
        raise ValueError(
            f"{where}: the initial law init(key, n, d, dtype) returned shape {x0.shape}, not "
            f"the tokens' shape {(cfg.n, cfg.d)}."
        )
    if isinstance(flow0, AttentionDynamics):
        return  # checked at construction, as simulate does
    t0 = jnp.zeros((), dtype)
    try:
        check_flow(where, flow0, x0, t0, manifold, require_finite=False)
    except ValueError as err:
        if "cannot be traced" in str(err) or "must return dx/dt" in str(err):
            raise ValueError(
                f"{err} Is d = {cfg.d} the flow's token dimension (Members(d=...))?{hint}"
            ) from err.__cause__
        raise
    if cfg.natural and hasattr(flow0, "natural_rate"):
        try:
            r = eqx.filter_eval_shape(flow0.natural_rate, x0)
        except Exception as err:
            raise ValueError(
                f"{where}: the flow's natural_rate(x0) cannot be traced by JAX "
                f"({type(err).__name__})."
            ) from err
        if getattr(r, "shape", None) != () or not jnp.issubdtype(r.dtype, jnp.floating):
            raise ValueError(
                f"{where}: the flow's natural_rate(x0) must return a real scalar, got "
                f"{getattr(r, 'shape', type(r).__name__)} {getattr(r, 'dtype', '')}."
            )


def _resolve_group(members, flow, runner) -> str:
    """The ordering of the members (`Runner.group` with `"auto"` resolved)."""
    d2_lsa = isinstance(flow, AttentionDynamics) and flow.kernel == "lsa" and members.d == 2
    group = runner.group
    if group == "auto":
        group = "pilot" if (d2_lsa and members.method != "ott_antonsen") else "stiffness"
    if group == "pilot" and not d2_lsa:
        raise ValueError("sweep: group='pilot' needs d = 2 and kernel='lsa'.")
    return group


def _predicted_cost(members, flow, integration, group):
    """Per-member predicted cost (solver steps or a proxy) for the ordering `group`."""
    B = members.size
    if group == "pilot":
        # The Ott–Antonsen ODE of the same members (≈ 1000× cheaper) predicts each
        # member's step count.
        init = members.init if members.init in ("wrapped_cauchy", "disc") else "wrapped_cauchy"
        pilot = _run(
            Members(
                flow,
                seeds=members.seeds,
                n=members.n,
                method="ott_antonsen",
                init=init,
                r0=members.r0,
                batched=members.batched,
            ),
            # Step counts do not depend on the save times (diffrax interpolates them): a
            # few saves keep the pilot's classification cheap (it was ~1/5 of a WS sweep).
            dataclasses.replace(integration, num_save=17),
            Judge(),
            Runner(chunk_size=None, group="none", progress=False),
            warn_all_failed=False,  # the pilot's failures are the sweep's own to report
        )
        return pilot.num_steps.astype(float)
    if (
        group == "stiffness"
        and integration.time_scale == "physical"
        and isinstance(flow, AttentionDynamics)
    ):
        A, V = np.asarray(flow.A, float), np.asarray(flow.V, float)
        beta = np.broadcast_to(np.asarray(flow.beta, float), (B,))
        if not members.batched:
            A, V = A[None], V[None]
        finite = np.isfinite(A).all((1, 2)) & np.isfinite(V).all((1, 2))
        nA = np.linalg.norm(np.where(finite[:, None, None], A, 0.0), ord=2, axis=(1, 2))
        nV = np.linalg.norm(np.where(finite[:, None, None], V, 0.0), ord=2, axis=(1, 2))
        cost = np.broadcast_to(np.abs(beta) * nA * nV, (B,))
        return np.where(np.isfinite(cost), cost, np.inf)
    return np.ones(B)


def _chunk_plan(cost, perm, ndev, runner, max_chunk, on_cpu=True, compact=False):
    """Chunk sizes (each a multiple of `ndev`) covering the ordered batch.

    Auto, lockstep on CPU: a few power-of-two sizes (one compilation each); from the cheap
    end of the ordered costs, take the largest size whose predicted efficiency
    `Σ c / (size · max c)` reaches the target. Auto otherwise (a compacting pool, or any
    sweep on an accelerator): the largest chunks the memory allows (`_compact_plan`, up to
    `CPU_CHUNK` or `ACCELERATOR_CHUNK` members per device). A pool keeps its slots full
    whatever the chunk holds, and an accelerator's step costs about the same for many
    members as for few: the order by predicted cost still groups alike members.
    """
    B = perm.shape[0]
    if runner.chunk_size is None:
        return [ndev * math.ceil(B / ndev)]
    if runner.chunk_size != "auto":
        cs = ndev * math.ceil(min(runner.chunk_size, B) / ndev)
        return [cs] * math.ceil(B / cs)
    if compact or not on_cpu:
        return _compact_plan(B, ndev, max_chunk, CPU_CHUNK if on_cpu else ACCELERATOR_CHUNK)
    # A multiple of ndev (CPU_CHUNK is not one for 3, 5, 6, 7 devices).
    top = ndev * max(1, min(max_chunk, CPU_CHUNK, ndev * math.ceil(B / ndev)) // ndev)
    # At most four sizes (one compilation each), a factor 4 apart, down to 8 per device
    # (smaller chunks waste vector width more than lockstep costs).
    sizes = [top]
    while len(sizes) < 4 and sizes[-1] // 4 >= 8 * ndev:
        sizes.append(ndev * max(1, sizes[-1] // (4 * ndev)))
    c = np.asarray(cost, float)[perm]
    c = np.where(np.isfinite(c), c, np.nanmax(np.where(np.isfinite(c), c, 0)) + 1)
    plan, i = [], 0
    while i < B:
        for s in sizes:
            seg = c[i : i + s]
            if seg.size == B - i and s > seg.size and s != sizes[-1]:
                # The tail: a smaller size wastes less padding.
                smaller = [t for t in sizes if t >= seg.size]
                if smaller and smaller[-1] < s:
                    continue
            eff = seg.sum() / (s * max(seg.max(), 1e-300))
            if eff >= runner.efficiency or s == sizes[-1]:
                plan.append(s)
                i += s
                break
    return plan


# ---------------------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------------------


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


def _hash_array(h, x, block_bytes: int = 2**26) -> None:
    """`h.update(x.tobytes())` without the copy: a broadcast parameter of 10⁷ members is
    hashed a block of rows at a time (the same bytes, so the same digest). Read as bytes
    (`uint8`): a buffer of bfloat16 cannot be exported as it is."""

    def raw(a):
        return np.ascontiguousarray(a).reshape(-1).view(np.uint8)

    x = np.asarray(x)
    if x.ndim == 0 or x.flags.c_contiguous:
        h.update(raw(x))
        return
    rows = max(1, block_bytes // max(x[0].nbytes, 1))
    for i in range(0, x.shape[0], rows):
        h.update(raw(x[i : i + rows]))


def _flow_params(dynamic, batched, B) -> dict:
    """The flow's array leaves by path, each `(batch, ...)` on the host."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(dynamic)[0]:
        name = jax.tree_util.keystr(path).lstrip(".")
        x = np.asarray(leaf)
        out[name] = x if batched else np.broadcast_to(x, (B,) + x.shape)
    return out


def _warn_narrowed(narrowed: list[str], dtype, *, advice: str):
    """The sweeps' warning for parameters changed by the cast to JAX's default float
    (`narrowed`: `"name (k of N)"` per parameter, from `_vector_field.narrowing`)."""
    warn_at_caller(
        f"sweep: the members' {', '.join(narrowed)} entries changed when cast to "
        f"{np.dtype(dtype).name}, JAX's default float (64-bit floats are disabled). "
        f"Enable float64 (jax.config.update('jax_enable_x64', True)) or pass {advice} to "
        "choose the precision and silence this."
    )


def _cast_flow(flow, dtype, *, warn_narrowing=False):
    """The flow with its floating array leaves cast to `dtype`, as host arrays.

    With `warn_narrowing` (the dtype was not asked for: JAX's default float, float32 when
    64-bit floats are off), a leaf whose values change in the cast is named in a warning
    (a float64 sweep silently run in float32 loses perturbations below ~1e-7); the check is
    `_vector_field.narrowing`, the one `AttentionDynamics` uses."""
    narrowed = []

    def cast(path, x):
        if eqx.is_array(x) or isinstance(x, np.ndarray):
            x = np.asarray(x)
            if jnp.issubdtype(x.dtype, jnp.floating):  # bfloat16 included
                lost = narrowing(x, dtype) if warn_narrowing else None
                if lost is not None:
                    name = jax.tree_util.keystr(path)
                    narrowed.append(f"{name} ({lost.changed} of {lost.size})")
                return x.astype(dtype, copy=False)
        return x

    out = jax.tree_util.tree_map_with_path(cast, flow)
    if narrowed:
        _warn_narrowed(narrowed, dtype, advice="Integration(dtype=...)")
    return out


def _manifest_differences(old: dict, new: dict) -> list[str]:
    """The settings in which a folder's manifest differs from this sweep's (by name); only
    the settings `new` holds are compared (before the pilot, the chunk sizes are not
    known yet)."""
    diff = []
    for key in ("num_members", "shape", "flow", "dtype", "chunk_sizes"):
        if key in new and old.get(key) != new.get(key):
            diff.append(f"{key} {_short(old.get(key))} -> {_short(new.get(key))}")
    old_plan, new_plan = old.get("plan") or {}, new.get("plan") or {}
    for key in ("strategy", "group"):
        if key in new_plan and old_plan.get(key) != new_plan.get(key):
            diff.append(f"{key} {_short(old_plan.get(key))} -> {_short(new_plan.get(key))}")
    old_cfg, new_cfg = old.get("config") or {}, new.get("config") or {}
    for key in sorted(set(old_cfg) | set(new_cfg)):
        if old_cfg.get(key) != new_cfg.get(key):
            diff.append(f"{key} {_short(old_cfg.get(key))} -> {_short(new_cfg.get(key))}")
    return diff


def _short(value, limit: int = 80) -> str:
    """`repr(value)`, cut to `limit` characters (a manifest's lists can be long)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 4] + " ..."


def _check_manifest_fields(man: dict) -> None:
    """Refuse a manifest whose `config` or `plan` is not an object or whose `chunk_sizes`
    is not a list of positive integers (what resuming and loading read of it).

    **Raises:** `ValueError` naming the field."""
    for key in ("config", "plan"):
        if key in man and not isinstance(man[key], dict):
            raise ValueError(f"its {key!r} is not an object")
    sizes = man.get("chunk_sizes")
    if "chunk_sizes" in man and not (
        isinstance(sizes, list) and sizes and all(type(c) is int and c > 0 for c in sizes)
    ):
        raise ValueError("its 'chunk_sizes' is not a list of positive integers")


def _read_manifest(out_dir) -> dict | None:
    """The folder's `manifest.json` (None when there is none).

    **Raises:** `ValueError` naming a damaged manifest."""
    manifest_path = os.path.join(out_dir, "manifest.json")
    if not os.path.exists(manifest_path):
        return None
    try:
        old = read_json_object(manifest_path)
        _check_manifest_fields(old)
        check_summary_sha256(old, manifest_path)
    except ValueError as err:
        raise ValueError(
            f"sweep: {manifest_path} is damaged ({err}); remove it, or pass "
            "resume=False to overwrite the folder."
        ) from None
    return old


class DifferentSweepError(ValueError):
    """An `out_dir` that holds another sweep; `what` names the settings that differ (for
    callers that word the refusal their own way, e.g. `jaxattn map`)."""

    def __init__(self, message: str, what: str):
        super().__init__(message)
        self.what = what


def _different_sweep(out_dir, what) -> DifferentSweepError:
    return DifferentSweepError(
        f"sweep: out_dir {out_dir!r} holds a different sweep ({what}); pass a new "
        "out_dir or resume=False to overwrite.",
        what,
    )


def _check_manifest_settings(out_dir, old: dict | None, known: dict) -> None:
    """Before the pilot and the plan: refuse to resume from a folder (`old`: its manifest,
    `_read_manifest`) whose sweep has other settings (`known`: those fixed before the
    members are ordered, as JSON reads them)."""
    if old is None:
        return
    diff = _manifest_differences(old, known)
    if diff:
        raise _different_sweep(out_dir, "; ".join(diff))


def _check_manifest(out_dir, fingerprint, resume, old: dict | None, manifest: dict) -> None:
    """Resuming (`old`: the folder's manifest as `_read_manifest` read it before the plan,
    None for a new folder): refuse a folder whose sweep has another fingerprint, naming the
    settings that differ from this call's `manifest`. Not resuming: the folder's sweep, if
    it has a manifest (read or not: a damaged one is overwritten too), loses its chunks."""
    if resume:
        if old is not None and old.get("fingerprint") != fingerprint:
            diff = _manifest_differences(old, manifest)
            what = (
                "; ".join(diff)
                if diff
                else "same settings, other members: their parameters, seeds or order differ"
            )
            raise _different_sweep(out_dir, what)
    elif os.path.exists(os.path.join(out_dir, "manifest.json")):
        for fname in os.listdir(out_dir):
            if fname.startswith("chunk_"):
                os.remove(os.path.join(out_dir, fname))


def _run(
    members: Members,
    integration: Integration,
    judge: Judge,
    runner: Runner,
    *,
    warn_all_failed: bool = True,
):
    dtype = integration.resolved_dtype()
    widest = np.dtype(jnp.result_type(float))
    if dtype.itemsize > widest.itemsize:
        # JAX computes in `widest`: say so, and record what was computed (the result used to
        # record `dtype`).
        warn_at_caller(
            f"sweep: dtype {dtype.name} needs 64-bit floats, which are disabled in JAX; the "
            f"sweep runs in {widest.name} (jax.config.update('jax_enable_x64', True) first "
            "for float64)."
        )
        dtype = widest
    try:
        _window_start(integration.num_save, judge.window)
    except ValueError as err:
        raise ValueError(f"sweep: {err}") from None
    B = members.size
    _check_host_memory(B, _host_memory_need(members, integration, dtype))
    flow = _cast_flow(members.flow, dtype, warn_narrowing=integration.dtype is None)
    _refuse_doomed(members, flow)
    dynamic, static = eqx.partition(flow, eqx.is_array_like)
    cfg = _Config(
        method=members.method,
        n=members.n,
        d=members.d,
        t1=integration.t1,
        num_save=integration.num_save,
        natural=integration.time_scale == "natural",
        r0=members.r0,
        init=members.init,
        rtol=integration.rtol,
        atol=integration.atol,
        max_steps=integration.max_steps,
        window=judge.window,
        cluster_tol=judge.cluster_tol,
        gap_floor=judge.gap_floor,
        rest_tol=judge.rest_tol,
        lyapunov=judge.lyapunov,
        lyapunov_renorm=judge.lyapunov_renorm,
        token_major=token_major_pays(members.n, members.d),
    )
    if judge.lyapunov and members.method == "watanabe_strogatz":
        raise ValueError(
            "sweep: Judge(lyapunov=k) needs method='particles' or 'ott_antonsen' (the "
            "Watanabe–Strogatz members are the particle flow: sweep them as particles)."
        )
    mesh, ndev = _devices_mesh()
    strategy = runner.strategy
    if strategy == "compact" and cfg.lyapunov:
        warn_at_caller(
            "sweep: Lyapunov members (Judge(lyapunov>0)) run in lockstep; "
            "strategy='compact' does not apply to them."
        )
    on_cpu = jax.devices()[0].platform == "cpu"
    if strategy == "auto":
        # Measured (experiments/bench_compaction.py, 512 pairs, one pinned core):
        # compaction is 4.0-5.1× faster for particles and 1.1-1.6× for WS members. OA
        # members run lockstep: their pool steps 1.7-2.7× faster on CPU but compiles about
        # 6 s longer (`CPU_SEGMENT_STEPS`), and on an accelerator one lockstep chunk is
        # fastest (`ACCELERATOR_SLOTS`).
        strategy = "lockstep" if members.method == "ott_antonsen" else "compact"
    compact = strategy == "compact" and not cfg.lyapunov
    if compact and ndev == 1 and runner.group == "auto":
        # One pool on one device: the order of its queue only shapes the short drain at
        # the end (WS, 512 random pairs: efficiency 0.79 unordered, 0.80 ordered by the
        # pilot), and the pilot cost ~1/7 of a WS sweep. Several devices keep it: their
        # queues are balanced by the predicted costs.
        group = "none"
    else:
        group = _resolve_group(members, flow, runner)
    per_member = member_memory(members, integration)
    budget = runner.memory_budget or 0.25 * available_memory()
    if per_member > 2 * available_memory():
        raise ValueError(
            f"sweep: one member needs about {per_member / 2**30:.2f} GiB (n = {members.n}, "
            f"d = {members.d}, {integration.num_save} saves, {dtype.name}), more than the "
            f"{available_memory() / 2**30:.2f} GiB available; lower n or num_save."
        )
    # What can be checked before anything is solved or compiled (the Ott–Antonsen pilot
    # included): member 0 of a user's flow (simulate's check_flow), and a folder holding a
    # sweep of other settings (those of the fingerprint that are known before the members
    # are ordered: a difference in any of them is a different fingerprint).
    _check_first_member(members, flow, cfg, dtype)
    if members.method == "particles" and cfg.n == 1:
        warn_at_caller(
            "sweep: n = 1 token is a degenerate configuration (one token is not a cluster; "
            "its clustering gap is zero by definition); every member's regime is reported "
            "as undetermined."
        )
    resumed = None  # the manifest of the folder this call resumes
    if runner.out_dir is not None and runner.resume:
        resumed = _read_manifest(runner.out_dir)
        known = dict(
            num_members=B,
            flow=type(flow).__qualname__,
            dtype=dtype.name,
            plan=dict(strategy="compact" if compact else "lockstep"),
            config=cfg.as_json(),
        )
        _check_manifest_settings(
            runner.out_dir, resumed, json.loads(json.dumps(known, default=_json_default))
        )
    if group == "none":
        cost = np.ones(B)
    else:
        cost = _predicted_cost(members, flow, integration, group)
    perm = np.argsort(cost, kind="stable") if group != "none" else np.arange(B)

    max_chunk = _memory_cap(budget, per_member, ndev)
    sizes = _chunk_plan(cost, perm, ndev, runner, max_chunk, on_cpu, compact)
    planned = sizes
    if resumed is not None:
        sizes = _resumed_sizes(resumed, sizes, B, ndev)
    if runner.memory_budget is not None and per_member > runner.memory_budget:
        used = f"chunks of {max_chunk} member(s) are used"
        if sizes != planned:
            used = f"the chunks of the folder being resumed ({_short(sizes)}) are used"
        warn_at_caller(
            f"sweep: memory_budget={runner.memory_budget:.0f} B is below one member's "
            f"{per_member} B; {used}."
        )
    # Segments of K steps, K dividing max_steps (a member stops at max_steps exactly).
    asked = runner.segment_steps
    if asked is None:
        asked = CPU_SEGMENT_STEPS[members.method] if on_cpu else SEGMENT_STEPS
    steps = segment_length(asked, cfg.max_steps)
    if compact and runner.segment_steps is not None and steps < runner.segment_steps:
        warn_at_caller(
            f"sweep: segment_steps={runner.segment_steps} does not divide max_steps="
            f"{cfg.max_steps}; segments of {steps} steps are used instead (a member must stop "
            "at max_steps exactly). Choose segment_steps dividing max_steps to keep longer "
            "segments."
        )
    starts = np.concatenate([[0], np.cumsum(sizes)])[:-1]
    plan = dict(
        group=group,
        chunk_sizes=[int(s) for s in sizes],
        memory_per_member=per_member,
        memory_budget=float(budget),
        devices=ndev,
        # The lockstep efficiency the predicted costs give these chunks; none predicted
        # with group "none" (every cost reads 1, which would claim 1.0).
        predicted_efficiency=None if group == "none" else _efficiency(cost[perm], sizes),
        strategy="compact" if compact else "lockstep",
    )
    slots_per_device = runner.slots
    if slots_per_device is None:
        defaults = CPU_SLOTS if on_cpu else ACCELERATOR_SLOTS
        slots_per_device = defaults[members.method]

    def segment_steps(slots):
        # A pool of one slot never masks a step: its member's solve runs whole.
        return cfg.max_steps if (runner.segment_steps is None and slots == 1) else steps

    if compact:
        plan["slots_per_device"] = [min(slots_per_device, s // ndev) for s in sizes]
        plan["segment_steps"] = [segment_steps(s) for s in plan["slots_per_device"]]
        pool = max(plan["slots_per_device"]) > 1
        if runner.segment_steps is None and pool and 2 * steps < asked and steps < cfg.max_steps:
            # A pool of several slots in short segments: each one re-enters the solver.
            warn_at_caller(
                f"sweep: max_steps={cfg.max_steps} has no divisor near the pool's segment "
                f"length {asked}; segments of {steps} step{'' if steps == 1 else 's'} are used "
                "(a member must stop at max_steps exactly), which makes the pool slow. "
                f"Choose max_steps a multiple of {asked} (e.g. "
                f"{max(asked, cfg.max_steps // asked * asked)}) or pass segment_steps."
            )

    # Fingerprint: the inputs and every option that changes a member's result.
    h = hashlib.sha256()
    params = _flow_params(dynamic, members.batched, B)
    for name in sorted(params):
        h.update(name.encode())
        _hash_array(h, params[name])
    # The static part (kernel, flags, callables) by its text, without memory addresses, so
    # that the same sweep in a new process resumes from its folder.
    h.update(re.sub(r" at 0x[0-9a-f]+", "", str(jax.tree_util.tree_structure(static))).encode())
    h.update(type(flow).__qualname__.encode())
    for arr in (members.seeds, perm, np.asarray(sizes)):
        h.update(np.ascontiguousarray(arr).tobytes())
    h.update(json.dumps(cfg.as_json(), sort_keys=True).encode())
    h.update(dtype.name.encode())
    h.update(plan["strategy"].encode())
    fingerprint = h.hexdigest()
    environment = environment_record(dtype)
    writer = jax.process_index() == 0
    out_dir = runner.out_dir
    manifest = dict(
        fingerprint=fingerprint,
        num_members=B,
        shape=list(members.shape),
        flow=type(flow).__qualname__,
        batched=members.batched,
        chunk_sizes=plan["chunk_sizes"],
        num_chunks=len(sizes),
        plan=plan,
        config=cfg.as_json(),
        dtype=dtype.name,
        environment=environment,
        regime_names=list(REGIME_NAMES),
    )
    if out_dir is not None:
        if os.path.exists(out_dir) and not os.path.isdir(out_dir):
            raise ValueError(f"sweep: out_dir={out_dir!r} is a file, not a folder.")
        os.makedirs(out_dir, exist_ok=True)
        # Compared as JSON reads it back (tuples become lists).
        as_read = json.loads(json.dumps(manifest, default=_json_default))
        _check_manifest(out_dir, fingerprint, runner.resume, resumed, as_read)
        if writer:
            data = _npz_bytes(
                perm=perm, seeds=members.seeds, **{f"param:{k}": v for k, v in params.items()}
            )
            _atomic_write(os.path.join(out_dir, "members.npz"), lambda p: _write_bytes(p, data))
            # Recorded in the manifest (not part of the sweep's settings): loading refuses a
            # members file altered after it was written.
            recorded = dict(manifest, members_sha256=hashlib.sha256(data).hexdigest())
            _atomic_write(
                os.path.join(out_dir, "manifest.json"), lambda p: _write_json(p, recorded)
            )

    sharding = NamedSharding(mesh, PartitionSpec("batch"))
    outs: dict[str, np.ndarray] = {}
    seconds = 0.0
    computed = loaded = 0
    useful = spent = 0.0
    bar = None
    if runner.progress and writer:
        bar = progress_bar(total=B, unit="member", desc=f"sweep {members.method}", smoothing=0.3)
    try:
        for c, (start, cs) in enumerate(zip(starts, sizes)):
            idx = perm[start : start + cs]
            m = idx.shape[0]
            path = None if out_dir is None else os.path.join(out_dir, f"chunk_{c:05d}.npz")
            chunk = None
            fresh = False
            if path is not None and runner.resume and os.path.exists(path):
                found = _load_chunk(
                    path, idx, fingerprint, cfg.num_save, hashed=_hashes_itself(resumed)
                )
                if found is not None:
                    chunk, info = found
                    # The efficiency of the run that computed it (older files: unknown).
                    steps_known = _chunk_steps(info)
                    if steps_known is not None:
                        useful += steps_known[0]
                        spent += steps_known[1]
            if chunk is None:
                t_start = time.perf_counter()
                pad = np.concatenate([idx, np.full(cs - m, idx[0])])
                if compact:
                    # Each device's queue: its members from the most to the least costly
                    # (the pool then drains on short members), dealt round robin over the
                    # devices, then its padding (never solved).
                    order = np.argsort(-np.asarray(cost, float)[idx], kind="stable")
                    layout = np.full((cs // ndev, ndev), -1)
                    layout.ravel()[:m] = order
                    layout = layout.T.ravel()
                    pad = np.where(layout >= 0, idx[np.maximum(layout, 0)], idx[0])
                if members.batched:
                    dyn = jax.tree_util.tree_map(
                        lambda x: _put(np.asarray(x)[pad], sharding), dynamic
                    )
                else:
                    dyn = jax.tree_util.tree_map(
                        lambda x: _put(np.broadcast_to(x, (cs,) + np.shape(x)), sharding),
                        dynamic,
                    )
                seed = _put(members.seeds[pad], sharding)
                if compact:
                    slots = min(slots_per_device, cs // ndev)
                    res, iterations = _sweep_chunk_compact(
                        dyn,
                        static,
                        seed,
                        _put(layout >= 0, sharding),
                        cfg,
                        mesh if ndev > 1 else None,
                        slots,
                        segment_steps(slots),
                        CPU_BLOCK if on_cpu else ACCELERATOR_BLOCK,
                    )
                    res, iterations = _fetch((res, iterations))
                    back = np.empty(m, int)
                    back[layout[layout >= 0]] = np.flatnonzero(layout >= 0)
                    chunk = {k: v[back] for k, v in res.items()}
                    chunk_spent = slots * float(np.sum(iterations))
                else:
                    res = _sweep_chunk(dyn, static, seed, cfg, mesh if ndev > 1 else None)
                    chunk = {k: v[:m] for k, v in _fetch(res).items()}
                dt = time.perf_counter() - t_start
                seconds += dt
                computed += 1
                fresh = True
                num_steps = chunk["num_steps"].astype(float)
                chunk_useful = float(num_steps.sum())
                if not compact:
                    chunk_spent = float(cs * max(num_steps.max(), 1))
                useful += chunk_useful
                spent += chunk_spent
                if path is not None and writer:
                    data = _npz_bytes(members=idx, fingerprint=np.array(fingerprint), **chunk)
                    summary = _chunk_summary(
                        c,
                        idx,
                        chunk,
                        params,
                        members.seeds,
                        dt,
                        useful_steps=chunk_useful,
                        spent_steps=chunk_spent,
                        npz_sha256=hashlib.sha256(data).hexdigest(),
                    )
                    # The summary (with the archive's hash) first: an archive on disk is
                    # then never newer than the hash it is checked against.
                    _atomic_write(path[:-4] + ".json", lambda p: _write_json(p, summary))
                    _atomic_write(path, lambda p: _write_bytes(p, data))
            else:
                loaded += 1
            for k, v in chunk.items():
                if k not in outs:
                    outs[k] = np.empty((B,) + v.shape[1:], v.dtype)
                outs[k][idx] = v
            if bar is not None:
                done = perm[: start + cs]
                post = dict(failed=int(np.sum(outs["failed"][done])))
                if spent:
                    post["lockstep"] = f"{useful / spent:.2f}"
                # shown by the update's redraw, at the bar's pace (a log's too)
                bar.set_postfix(post, refresh=False)
                bar.update(m)
            if runner.on_chunk is not None:
                runner.on_chunk(c, dict(members=idx, computed=fresh))
    finally:
        if bar is not None:
            bar.close()
    if warn_all_failed:
        _warn_if_all_failed(outs)
        _warn_if_all_undetermined(outs, cfg)
    return _assemble(
        outs,
        params,
        members.seeds,
        members.shape,
        cfg.t1,
        cfg.num_save,
        completed=np.ones(B, bool),
        seconds=seconds,
        computed=computed,
        loaded=loaded,
        efficiency=useful / spent if spent else float("nan"),
        plan=plan,
        config=cfg.as_json(),
        environment=environment,
        fingerprint=fingerprint,
    )


def _reason_counts(result, failed) -> list[tuple[str, int]]:
    """`(RESULTS code name, count)` over the failed members, most common first."""
    codes = np.asarray(result)[np.asarray(failed, bool)]
    values, counts = np.unique(codes, return_counts=True)
    return [(result_message(values[i]), int(counts[i])) for i in np.argsort(-counts, kind="stable")]


def _warn_if_all_failed(outs) -> None:
    """Every member of a batch of several failed: say why (the most common result codes),
    since a result of nothing but `FAILED` usually means one bad input shared by all (a NaN
    in a shared parameter, a flow returning NaN), not a property of the members. (One
    member's failure is its result; the Ott–Antonsen pilot of a sweep does not call it.)"""
    failed = np.asarray(outs["failed"], bool)
    if failed.size < 2 or not failed.all():
        return
    why = ", ".join(f"{m} ({k})" for m, k in _reason_counts(outs["result"], failed)[:3])
    warn_at_caller(
        f"sweep: every one of the {failed.size} members failed ({why}); see "
        "SweepResult.failures() for each member's parameters."
    )


def _warn_if_all_undetermined(outs, cfg) -> None:
    """Every member of a batch of several that ran to its horizon is undetermined: say that
    the horizon, not the members, is the likely cause. The classifier asks the late window
    for e-folds of convergence at a steady rate or sustained oscillation, which a short
    `t1` cannot show (16 random pairs, OA, natural time: all undetermined at t1 = 5,
    three quarters clustering at t1 = 50); near a bifurcation convergence is algebraic
    and stays undetermined at any horizon."""
    if cfg.method == "particles" and cfg.n == 1:
        return  # one token is never a regime, whatever the horizon (warned as such)
    regime = np.asarray(outs["regime"])
    ran = regime[~np.asarray(outs["failed"], bool)]
    if ran.size < 2 or not (ran == UNDETERMINED).all():
        return
    unit = "natural time units" if cfg.natural else "time units"
    warn_at_caller(
        f"sweep: every one of the {ran.size} members that ran is undetermined at t1 = "
        f"{cfg.t1:g} {unit} (no regime is established over the late {cfg.window:.0%} of the "
        "run). A longer horizon t1 settles the regimes of most flows; members near a "
        "bifurcation converge algebraically and stay undetermined."
    )


def _memory_cap(budget, per_member, ndev) -> int:
    """The most members of one chunk that `budget` bytes hold, rounded down to a power of
    two per device: the free memory moves between calls, and a chunk size that moved with
    it made every call of the same sweep compile anew (WS members, n = 1024: 17 s per call
    of 512 members instead of 0.7 s) and changed a resumable sweep's fingerprint."""
    per_device = int(budget // max(per_member, 1)) // ndev
    return ndev * (1 << (per_device.bit_length() - 1)) if per_device >= 1 else ndev


def _resumed_sizes(old: dict, sizes, B, ndev):
    """The chunk sizes of the sweep already in a folder (`old`: its manifest, checked by
    `_read_manifest`) when only the sizes differ from this call's plan (they follow the
    memory free at the time): resuming then continues its chunks instead of refusing the
    folder. Other sizes (another sweep, a plan that does not cover `B` members, a chunk
    larger than the batch or one that does not split over `ndev` devices: an edited
    manifest must not size the arrays) are left to the manifest check."""
    found = old.get("chunk_sizes")
    if (
        not found
        or any(s > ndev * math.ceil(B / ndev) or s % ndev for s in found)
        or not sum(found) - found[-1] < B <= sum(found)
    ):
        return sizes
    return found


def _compact_plan(B, ndev, max_chunk, per_device):
    """Chunks as large as the memory allows (up to `per_device` members per device; a
    compacting pool keeps its slots full whatever the chunk holds), the last one the
    smallest of a few power-of-four fractions that holds the rest (one compilation per
    size)."""
    top = max(ndev, min(max_chunk, per_device * ndev, ndev * math.ceil(B / ndev)))
    sizes = [top]
    while len(sizes) < 4 and sizes[-1] // 4 >= 8 * ndev:
        sizes.append(ndev * max(1, sizes[-1] // (4 * ndev)))
    plan, left = [], B
    while left > 0:
        fits = [s for s in sizes if s >= left]
        s = fits[-1] if fits else top
        plan.append(s)
        left -= s
    return plan


def _efficiency(cost, sizes) -> float:
    useful = spent = 0.0
    i = 0
    for s in sizes:
        seg = cost[i : i + s]
        useful += seg.sum()
        spent += s * seg.max()
        i += s
    return float(useful / spent) if spent else float("nan")


def _assemble(
    outs,
    params,
    seeds,
    shape,
    t1,
    num_save,
    *,
    completed,
    seconds,
    computed,
    loaded,
    efficiency,
    plan,
    config,
    environment,
    fingerprint,
):
    ts = np.linspace(0.0, t1, num_save)[None, :] / outs["rate"][:, None]
    evidence = {k: outs.pop(f"evidence_{k}") for k in EVIDENCE_FIELDS}
    return SweepResult(
        params=params,
        seed=np.asarray(seeds).astype(np.int64),
        ts=ts,
        shape=tuple(shape),
        completed=completed,
        seconds=seconds,
        chunks_computed=computed,
        chunks_loaded=loaded,
        lockstep_efficiency=efficiency,
        plan=plan,
        config=config,
        environment=environment,
        fingerprint=fingerprint,
        evidence=evidence,
        **outs,
    )


def _chunk_steps(info) -> tuple[float, float] | None:
    """`(Σ steps_i, slot-steps spent)` of a chunk as its summary recorded them (None for
    summaries written before they were recorded)."""
    useful, spent = info.get("useful_steps"), info.get("spent_steps")
    if not (is_finite_number(useful) and is_finite_number(spent) and 0 <= useful <= spent):
        return None
    return float(useful), float(spent)


def _hashes_itself(summary: dict | None) -> bool:
    """Whether a summary records the SHA-256 of its own contents: written since 2026-12-07,
    with every hash this version writes (an old folder's files carry none)."""
    return summary is not None and SUMMARY_SHA256 in summary


def _load_chunk(path, members, fingerprint, num_save, *, hashed=False, strict=False):
    """A finished chunk of this sweep from `path` and its summary (the `.json` beside it),
    or None (with a warning) when the file or its summary is damaged or missing, belongs to
    another sweep, does not hold the expected members and fields, or was altered: a valid
    archive whose SHA-256 differs from the one its summary recorded (summaries written
    before hashes were recorded are not checked).

    With `strict` (`SweepResult.load`), a chunk of another sweep or an altered chunk raises
    instead. The files are read whole and closed, damaged or not."""
    who = "SweepResult.load" if strict else "sweep"
    summary_path = path[:-4] + ".json"
    try:
        data = read_regular_file(path)
        z = load_npz_bytes(data)  # reads every array: zip CRCs checked
        if str(z["fingerprint"]) != fingerprint:
            if strict:
                raise ValueError(f"{who}: {path} belongs to a different sweep.")
            raise _Refused("it belongs to a different sweep")
        if not np.array_equal(z["members"], members):
            raise _Refused("it holds other members")
        chunk = {k: z[k] for k in _FIELDS}
        if not all(v.shape[:1] == members.shape for v in chunk.values()):
            raise _Refused("its fields have the wrong length")
        problem = _chunk_field_problem(chunk, num_save)
        if problem is not None:
            raise _Refused(problem)
        if not os.path.exists(summary_path):
            # Every chunk is written with its summary (before its archive): without it the
            # archive cannot be checked against its recorded SHA-256.
            raise _Refused(f"its summary {summary_path} is missing (it cannot be checked)")
        try:
            info = read_json_object(summary_path)
        except (ValueError, OSError) as err:
            raise _Refused(f"its summary {summary_path} cannot be read ({err})") from None
        if hashed and not (SUMMARY_SHA256 in info and "npz_sha256" in info):
            # The sweep's manifest was written by a version that hashes every file.
            raise _Refused(
                f"its summary {summary_path} records no SHA-256, which every chunk of this "
                "sweep records (it was edited)"
            )
        try:
            check_recorded_sha256(info, data, summary_path)
        except ValueError as err:
            problem = str(err)
            if strict:
                raise ValueError(f"{who}: {path} is refused: {problem}.")
            raise _Refused(problem)
        try:
            check_summary_sha256(info, summary_path)  # after its fields: a wrong one is named
        except ValueError as err:
            raise _Refused(f"its summary cannot be trusted ({err})") from None
        return chunk, info
    except _Refused as err:
        problem = str(err)
    except Exception as err:  # truncated, not an npz, missing fields: recompute
        if strict and isinstance(err, ValueError) and str(err).startswith(f"{who}: {path}"):
            raise  # refused above, in its own words
        problem = f"it cannot be read ({read_error_reason(err)})"
    verb = "skipping" if strict else "recomputing"
    warn_at_caller(f"{who}: {verb} {path}: {problem}.")
    return None


def _bad_codes(codes: np.ndarray, lowest: int) -> np.ndarray:
    """The distinct values of `codes` (integers, or floats holding them) that are not
    regime codes in `lowest .. len(REGIME_NAMES) - 1` (regime codes: `NOT_RUN`; a map's
    predictions: -1): out of range, fractions, NaN; empty when all are codes."""
    codes = np.asarray(codes)
    with np.errstate(invalid="ignore"):
        ok = (codes >= lowest) & (codes < len(REGIME_NAMES)) & (codes == np.round(codes))
    return np.unique(codes[~ok])


def _codes_in_range(codes: np.ndarray, lowest: int) -> bool:
    """Whether the integer `codes` of a saved file lie in `lowest .. len(REGIME_NAMES) - 1`
    (`_bad_codes`); an empty array does."""
    return _bad_codes(codes, lowest).size == 0


def _chunk_field_problem(chunk: dict, num_save: int) -> str | None:
    """What is wrong with a chunk's arrays (`_FIELDS`, leading axis already checked), or
    None: each a real array of numbers (`R2` complex), `order` and `R2` of `num_save`
    saves, the others one value per member, `regime` integer codes in range, `failed`
    bool. A chunk written before archives were hashed is checked this way only."""
    for k, v in chunk.items():
        if v.dtype.kind not in ("fc" if k == "R2" else "biuf"):
            return f"its {k!r} is an array of {v.dtype}"
        want = (num_save,) if k in ("order", "R2") else ()
        if v.shape[1:] != want:
            return (
                f"its {k!r} holds {v.shape[1:]} values per member, not {want} (the "
                f"manifest's num_save = {num_save})"
            )
    regime = chunk["regime"]
    if regime.dtype.kind not in "iu" or not _codes_in_range(regime, NOT_RUN):
        return "its 'regime' is not integer regime codes"
    if chunk["failed"].dtype.kind != "b":
        return "its 'failed' is not bool"
    if not np.array_equal(chunk["failed"], regime == FAILED):
        return "its 'failed' does not match its regimes' FAILED codes"
    rate = chunk["rate"]
    if np.any(~np.isnan(rate) & ~((rate > 0) & np.isfinite(rate))):
        return "its 'rate' holds values that are not positive and finite"
    return None


class _Refused(Exception):
    """Why a chunk on disk is not used (raised and caught inside `_load_chunk`)."""


def _check_config_read_later(cfg: dict) -> None:
    """Refuse a manifest's `config` whose settings that `SweepResult`'s methods read
    (`near_boundary`, `decision_margins`: method, n, d, rtol, window and the two floors)
    are missing or of another type than a sweep writes: an old folder (its summaries not
    hashed) is refused when it is loaded, not later by a `KeyError` from inside a method.

    **Raises:** `ValueError` naming a missing or wrong setting."""
    where = "config "
    try:
        json_str(cfg, "method", choices=METHODS, where=where)
        json_int(cfg, "n", minimum=1, where=where)
        json_int(cfg, "d", minimum=1, where=where)
        for key in ("rtol", "window"):
            json_number(cfg, key, positive=True, where=where)
        for key in ("gap_floor", "rest_tol"):
            if cfg[key] is not None:
                json_number(cfg, key, positive=True, where=where)
    except KeyError as err:
        raise ValueError(f"its config has no {err.args[0]!r}") from None


def _manifest_for_load(man: dict) -> tuple[str, list, int, list, dict, float, int]:
    """`(fingerprint, chunk_sizes, num_members, shape, config, t1, num_save)` of a sweep's
    manifest as `SweepResult.load` needs them, each checked for the type the sweep wrote.

    **Raises:** `KeyError` for a missing field, `ValueError` naming a wrong one."""
    _check_manifest_fields(man)
    fingerprint = json_str(man, "fingerprint")
    sizes = man["chunk_sizes"]
    B = json_int(man, "num_members", minimum=1)
    if sum(sizes) != B:
        raise ValueError(f"its chunk_sizes add up to {sum(sizes)}, not num_members = {B}")
    shape = man.get("shape", [B])
    if not (isinstance(shape, list) and all(type(k) is int and k >= 0 for k in shape)):
        raise ValueError(f"its 'shape' is not a list of sizes: {_short(shape)}")
    if math.prod(shape) != B:
        raise ValueError(f"its 'shape' {shape} does not hold num_members = {B}")
    cfg = json_object(man, "config")
    t1 = json_number(cfg, "t1", positive=True, where="config ")
    num_save = json_int(cfg, "num_save", minimum=2, where="config ")
    _check_config_read_later(cfg)
    if not isinstance(man.get("environment", {}), dict):
        raise ValueError("its 'environment' is not an object")
    if "regime_names" in man and man["regime_names"] != list(REGIME_NAMES):
        raise ValueError(
            f"it was written with regimes {_short(man['regime_names'])}, this version has "
            f"{list(REGIME_NAMES)}"
        )
    return fingerprint, sizes, B, shape, cfg, t1, num_save


def _members_sha256(man: dict, where: str) -> str | None:
    """The SHA-256 of members.npz that a manifest (read from `where`) records; None for a
    manifest from before it was recorded.

    **Raises:** `ValueError` for a malformed one, or none in a manifest that hashes itself
    (written by a version that records it)."""
    recorded = recorded_sha256(man, where, key="members_sha256")
    if recorded is None and _hashes_itself(man):
        raise ValueError(
            "it records no members_sha256, which every manifest that hashes itself records"
        )
    return recorded


def _load_sweep(out_dir: str) -> SweepResult:
    manifest_path = os.path.join(out_dir, "manifest.json")
    if not os.path.isfile(manifest_path):
        raise ValueError(f"SweepResult.load: {out_dir!r} holds no sweep (no manifest.json).")
    man, (fingerprint, sizes, B, shape, cfg, t1, num_save), members_sha256 = read_summary(
        manifest_path,
        lambda man: (man, _manifest_for_load(man), _members_sha256(man, manifest_path)),
        f"SweepResult.load: {manifest_path} is damaged",
    )
    hashed = _hashes_itself(man)
    members_path = os.path.join(out_dir, "members.npz")
    try:
        data = read_regular_file(members_path)  # read whole and closed, damaged or not
        z = load_npz_bytes(data)
        check_sha256(data, members_sha256, manifest_path)
        perm = z["perm"]
        seeds = z["seeds"]
        params = {k[6:]: z[k] for k in z if k.startswith("param:")}
        if perm.shape != (B,) or seeds.shape != (B,):
            raise ValueError(f"{B} members expected")
        if perm.dtype.kind not in "iu" or not np.array_equal(np.sort(perm), np.arange(B)):
            raise ValueError(f"its 'perm' is not an order of the {B} members")
        if seeds.dtype.kind not in "iu":
            raise ValueError(f"its 'seeds' are {seeds.dtype}, not integers")
        d = cfg["d"]  # an integer (`_check_config_read_later`)
        for k, v in params.items():
            if v.shape[:1] != (B,) or v.dtype.kind not in "biufc":
                raise ValueError(
                    f"its parameter {k!r} is {v.dtype} of shape {v.shape}, not numbers of "
                    f"shape ({B}, ...)"
                )
            if k in ("A", "V") and (v.ndim < 3 or v.shape[-2:] != (d, d)):
                # every flow's weights act on the d-dimensional tokens (heads in between)
                raise ValueError(
                    f"its parameter {k!r} has shape {v.shape}, not ({B}, ..., {d}, {d}) for "
                    f"tokens of d = {d}"
                )
    except Exception as err:
        raise ValueError(
            f"SweepResult.load: {members_path} is missing or damaged ({read_error_reason(err)})."
        ) from None
    outs: dict[str, np.ndarray] = {}
    completed = np.zeros(B, bool)
    starts = np.concatenate([[0], np.cumsum(sizes)])[:-1]
    loaded = skipped = 0
    useful = spent = 0.0
    for c, (start, cs) in enumerate(zip(starts, sizes)):
        idx = perm[start : start + cs]
        path = os.path.join(out_dir, f"chunk_{c:05d}.npz")
        if not os.path.exists(path):
            if os.path.exists(path[:-4] + ".json"):
                # Its summary is written first: the archive was removed, or its writing
                # was interrupted. Either way its members were not kept.
                warn_at_caller(
                    f"SweepResult.load: {path} is missing beside its summary "
                    f"{path[:-4]}.json (removed, or its writing was interrupted); its {cs} "
                    "members are reported not run."
                )
            continue
        found = _load_chunk(path, idx, fingerprint, num_save, hashed=hashed, strict=True)
        if found is None:
            skipped += 1
            continue
        chunk, info = found
        steps_known = _chunk_steps(info)
        if steps_known is not None:
            useful += steps_known[0]
            spent += steps_known[1]
        loaded += 1
        completed[idx] = True
        for k, v in chunk.items():
            if k not in outs:
                outs[k] = np.empty((B,) + v.shape[1:], v.dtype)
            outs[k][idx] = v
    if not outs:
        if skipped:
            raise ValueError(
                f"SweepResult.load: {out_dir!r} holds no readable finished chunk ({skipped} "
                f"damaged chunk{'s' if skipped > 1 else ''} skipped: see the warning above)."
            )
        raise ValueError(f"SweepResult.load: {out_dir!r} holds no finished chunk yet.")
    todo = ~completed
    for k, v in outs.items():
        if k == "regime":
            v[todo] = NOT_RUN
        elif k == "failed":
            v[todo] = False
        elif np.issubdtype(v.dtype, np.integer):
            v[todo] = -1
        elif np.issubdtype(v.dtype, np.inexact):
            v[todo] = np.nan
    if todo.any():
        outs["rate"][todo] = np.nan
    return _assemble(
        outs,
        params,
        seeds,
        shape,
        t1,
        num_save,
        completed=completed,
        seconds=0.0,
        computed=0,
        loaded=loaded,
        efficiency=useful / spent if spent else float("nan"),
        plan=man.get("plan", {}),
        config=cfg,
        environment=man.get("environment", {}),
        fingerprint=fingerprint,
    )


def _npz_bytes(**arrays) -> bytes:
    """The `.npz` archive of `arrays`, as bytes (hashed, then written)."""
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _write_bytes(path, data: bytes):
    with open(path, "wb") as f:
        f.write(data)


def _write_json(path, obj):
    """Write the summary `obj` with the SHA-256 of its contents (`check_summary_sha256`
    refuses it when read after an edit)."""
    with open(path, "w") as f:
        json.dump(with_summary_sha256(obj, _json_default), f, indent=1)


def _json_default(x):
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(type(x))


def _chunk_summary(c, idx, chunk, params, seeds, seconds, *, useful_steps, spent_steps, npz_sha256):
    """The `.json` beside a chunk: its members, time, regime counts and failures, the step
    counts of its lockstep efficiency (`useful_steps` = Σ steps_i, `spent_steps` = slot-steps
    spent; a loaded sweep reports the efficiency of the run that computed it) and the
    SHA-256 of its `.npz` bytes (checked when the chunk is loaded)."""
    counts = {name: int(np.sum(chunk["regime"] == i)) for i, name in enumerate(REGIME_NAMES)}
    counts["failed"] = int(np.sum(chunk["regime"] == FAILED))
    bad = np.flatnonzero(chunk["failed"])
    return dict(
        chunk=c,
        members=idx.tolist(),
        seconds=seconds,
        members_per_second=len(idx) / max(seconds, 1e-12),
        regime_counts=counts,
        failures=_failure_records(idx[bad], chunk["result"][bad], params, seeds),
        useful_steps=float(useful_steps),
        spent_steps=float(spent_steps),
        npz_sha256=npz_sha256,
    )


# ---------------------------------------------------------------------------------------
# The entry point
# ---------------------------------------------------------------------------------------


def _as_stack(x, name, d=None):
    x = np.asarray(x)
    if not (jnp.issubdtype(x.dtype, jnp.floating) or np.issubdtype(x.dtype, np.integer)):
        raise ValueError(f"sweep: {name} must be a real matrix, got dtype {x.dtype}.")
    if x.ndim == 2:
        x = x[None]
    if x.ndim != 3 or x.shape[1] != x.shape[2]:
        raise ValueError(f"sweep: {name} must have shape (d, d) or (batch, d, d), got {x.shape}.")
    if d is not None and x.shape[1] != d:
        raise ValueError(f"sweep: {name} is {x.shape[1]}×{x.shape[2]} but A is {d}×{d}.")
    return x


def attention_members(
    A,
    V,
    beta=1.0,
    seeds=0,
    *,
    kernel: Literal["lsa", "usa", "sa"] = "lsa",
    batching: Literal["cartesian", "flat"] = "flat",
    score_shift: float | Literal["auto"] = 0.0,
    dtype=None,
    **members_kw,
) -> Members:
    r"""`Members` for a batch of `AttentionDynamics(A_i, V_i, beta=β_i, kernel=kernel)`.

    With `batching="flat"` the four inputs are broadcast against each other along the
    batch axis; with `batching="cartesian"` every combination is run
    (`shape = (nA, nV, nβ, nseeds)`). `score_shift="auto"` (USA) uses, per member, the
    smallest shift with `β σ_max(A) − shift ≤ ½ log(largest float)` (zero unless the
    scores on the sphere could overflow `exp`). Other keywords go to `Members`.

    A float64 `A`, `V` or `beta` whose entries change in the cast to JAX's default float
    (float32 when 64-bit floats are off; `dtype=None`) is named in a `UserWarning`.

    **Raises:** `ValueError` for non-real or non-square matrices, sizes that disagree, an
    empty batch, an unknown kernel or batching, a `score_shift` that is neither a finite
    number nor `"auto"`, and a batch whose broadcast parameters would not fit in the host
    memory available (the member count, the estimate and the memory are named).
    """
    return _attention_members(
        A,
        V,
        beta,
        seeds,
        kernel=kernel,
        batching=batching,
        score_shift=score_shift,
        dtype=dtype,
        **members_kw,
    )


def _attention_members(
    A,
    V,
    beta,
    seeds,
    *,
    num_save=None,
    kernel="lsa",
    batching="flat",
    score_shift=0.0,
    dtype=None,
    **members_kw,
) -> Members:
    """`attention_members` (called by it and by `sweep`, so that a warning points at the
    user's call either way); `num_save` (the keyword form of `sweep`) adds the results to
    the memory estimate."""
    if kernel not in ("lsa", "usa", "sa"):
        raise ValueError(f"sweep: kernel must be 'lsa', 'usa' or 'sa', got {kernel!r}.")
    if batching not in ("cartesian", "flat"):
        raise ValueError(f"sweep: batching must be 'cartesian' or 'flat', got {batching!r}.")
    asked = dtype is not None
    dtype = np.dtype(jnp.result_type(float)) if dtype is None else _member_dtype("sweep", dtype)
    if score_shift != "auto" and (
        isinstance(score_shift, bool) or not isinstance(score_shift, (int, float, np.number))
    ):
        raise ValueError(f"sweep: score_shift must be a number or 'auto', got {score_shift!r}.")
    if score_shift != "auto" and not np.isfinite(float(score_shift)):
        raise ValueError(
            f"sweep: score_shift must be a finite number or 'auto', got {score_shift!r} (every "
            "particle member would fail with a non-finite argument)."
        )
    A = _as_stack(A, "A")
    d = A.shape[1]
    V = _as_stack(V, "V", d)
    beta = np.atleast_1d(np.asarray(beta))
    seeds = np.atleast_1d(np.asarray(seeds))
    if beta.ndim != 1 or seeds.ndim != 1:
        raise ValueError(
            f"sweep: beta and seeds must be scalars or 1-d, got shapes {beta.shape}, {seeds.shape}."
        )
    if not (jnp.issubdtype(beta.dtype, jnp.floating) or np.issubdtype(beta.dtype, np.integer)):
        raise ValueError(f"sweep: beta must be real numbers, got dtype {beta.dtype}.")
    if not np.issubdtype(seeds.dtype, np.integer) or np.any(seeds < 0) or np.any(seeds >= 2**32):
        raise ValueError(
            f"sweep: seeds must be integers in [0, 2**32), got {seeds.tolist()[:8]} "
            f"(dtype {seeds.dtype})."
        )
    if min(A.shape[0], V.shape[0], beta.shape[0], seeds.shape[0]) == 0:
        raise ValueError("sweep: empty batch (A, V, beta or seeds has no members).")
    if batching == "cartesian":
        shape = (A.shape[0], V.shape[0], beta.shape[0], seeds.shape[0])
        B = math.prod(shape)
    else:
        sizes = {A.shape[0], V.shape[0], beta.shape[0], seeds.shape[0]} - {1}
        if len(sizes) > 1:
            raise ValueError(
                "sweep: with batching='flat' the batch sizes of A, V, beta, seeds must agree "
                f"(or be 1); got {A.shape[0]}, {V.shape[0]}, {beta.shape[0]}, {seeds.shape[0]}."
            )
        B = max(sizes) if sizes else 1
        shape = (B,)
    # Before anything of the batch's size is built: the broadcast parameters (indices, A,
    # V, β and the shift in the inputs' dtype, cast, and as JAX arrays) and, in the keyword
    # form of `sweep`, the results.
    need = B * (4 * (2 * d * d + 2) * 8 + 32)
    what = "their broadcast parameters"
    if num_save is not None:
        need += B * _results_memory(num_save, dtype)
        what += " and results"
    _check_host_memory(B, need, what)
    if batching == "cartesian":
        ia, iv, ib, isd = (g.ravel() for g in np.indices(shape))
    else:
        ar = np.arange(B)
        ia, iv, ib, isd = (
            ar if m > 1 else np.zeros(B, int)
            for m in (A.shape[0], V.shape[0], beta.shape[0], seeds.shape[0])
        )
    if not asked:
        # The members are cast here, before `sweep` sees them: the narrowing check of
        # `_cast_flow` runs on the (few) inputs, not on the broadcast members.
        narrowed = []
        for name, x in (("A", A), ("V", V), ("beta", beta)):
            lost = narrowing(x, dtype)
            if lost is not None:
                narrowed.append(f"{name} ({lost.changed} of {lost.size})")
        if narrowed:
            _warn_narrowed(narrowed, dtype, advice="dtype=...")
    Am, Vm, bm = A[ia].astype(dtype), V[iv].astype(dtype), beta[ib].astype(dtype)
    if score_shift == "auto":
        finite = np.where(np.isfinite(Am), Am, 0).astype(np.float64)
        bound = np.abs(bm.astype(np.float64)) * np.linalg.norm(finite, ord=2, axis=(1, 2))
        shift = np.maximum(bound - 0.5 * math.log(float(np.finfo(dtype).max)), 0.0)
        # A member with a non-finite β fails for its β, not for a shift made from it.
        shift = np.where(np.isfinite(shift), shift, 0.0)
    else:
        shift = np.full(Am.shape[0], float(score_shift))
    flow = eqx.filter_vmap(
        lambda a, v, b, s: AttentionDynamics(a, v, beta=b, kernel=kernel, score_shift=s)
    )(Am, Vm, bm, shift.astype(dtype))
    return Members(flow, seeds=seeds[isd], shape=shape, **members_kw)


def sweep(
    members,
    V=None,
    beta=1.0,
    seeds=0,
    *,
    integration: Integration | None = None,
    judge: Judge | None = None,
    runner: Runner | None = None,
    **options,
) -> SweepResult:
    r"""Run a batch of attention flows and classify each member's regime.

    Composable form: `sweep(Members(flows, seeds=..., n=..., method=...),
    integration=Integration(...), judge=Judge(...), runner=Runner(...))`; see each part
    for its settings. Any flow module goes through it (the flow protocol of `simulate`).

    Keyword form (a thin layer over the same parts): `sweep(A, V, beta, seeds, **options)`
    runs `AttentionDynamics` members built by `attention_members(A, V, beta, seeds,
    kernel=..., batching=..., score_shift=..., dtype=...)`; the other options are the
    fields of `Members` (`n`, `method`, `init`, `r0`), `Integration` (`t1`, `num_save`,
    `time_scale`, `rtol`, `atol`, `max_steps`, `dtype`), `Judge` (`window`,
    `cluster_tol`, `gap_floor`, `rest_tol`) and `Runner` (`chunk_size`, `group`,
    `efficiency`, `memory_budget`, `out_dir`, `resume`, `progress`, `on_chunk`,
    `strategy`, `slots`, `segment_steps`).

    Each chunk is one compiled function (one compilation per chunk size and
    configuration); by default for particle and Watanabe–Strogatz members
    (`Runner(strategy="compact")`) each device steps a pool of members in segments and
    refills finished members' slots from its queue, so no member waits for the slowest
    (`lockstep_efficiency` reports it; Ott–Antonsen members run lockstep unless asked,
    see `Runner`); each device solves
    its share of a chunk with its own loops (`shard_map`). Failing members (`max_steps`,
    non-finite input, NaN) get the regime code `FAILED` with `failed=True`, a `result`
    code and NaN evidence, and do not affect the others: every member equals its solo
    run (float64: to rounding).

    **Returns:** a `SweepResult`.

    **Raises:** `ValueError` naming the argument for inconsistent shapes, an unknown
    option, method, kernel or law, a reduced method with `d ≠ 2` or a kernel other than
    LSA, a member too large for the memory, a batch whose results and broadcast
    parameters would not fit in the host memory (the member count, the estimate and the
    memory available are named), and an `out_dir` holding a different sweep. Before
    anything is compiled: a user's flow that fails `simulate`'s checks on member 0
    (`check_flow`: not traceable, dx/dt of another shape than the tokens `(n, d)`, not
    tangent to the sphere; the member is named), a non-finite `score_shift`, and a batch
    of `AttentionDynamics` whose every member would fail for a reason seen before solving
    (β ≤ 0 for all; for particles a non-finite `score_shift` for all). Batches where only
    some members have bad input run, those members failing alone with their `result`.
    There is no `dt0` option (the PID controller picks the first step).
    """
    if isinstance(members, Members):
        if V is not None or options:
            extra = sorted(options) + (["V"] if V is not None else [])
            raise ValueError(
                f"sweep: with Members, pass settings through integration=, judge=, runner= "
                f"(got {extra})."
            )
    else:
        groups = {
            "members": ("n", "method", "init", "r0", "kernel", "batching", "score_shift"),
            "integration": ("t1", "num_save", "time_scale", "rtol", "atol", "max_steps"),
            "judge": ("window", "cluster_tol", "gap_floor", "rest_tol", "lyapunov"),
            "runner": (
                "strategy",
                "slots",
                "segment_steps",
                "chunk_size",
                "group",
                "efficiency",
                "memory_budget",
                "out_dir",
                "resume",
                "progress",
                "on_chunk",
            ),
        }
        known = {k for g in groups.values() for k in g} | {"dtype"}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(f"sweep: unknown option(s) {unknown}.")
        pick = {g: {k: options[k] for k in ks if k in options} for g, ks in groups.items()}
        dtype = options.get("dtype")
        if V is None:
            raise ValueError("sweep: give V (or a Members object as the first argument).")
        given = dict(integration=integration, judge=judge, runner=runner)
        for part, value in given.items():
            clash = sorted(pick[part]) + ["dtype"] * (part == "integration" and dtype is not None)
            if value is not None and clash:
                raise ValueError(
                    f"sweep: {part}= is given, so the option(s) {clash} would be ignored; "
                    f"set them in the {type(value).__name__} instead."
                )
        if integration is None:
            integration = Integration(dtype=dtype, **pick["integration"])
        members = _attention_members(
            members, V, beta, seeds, num_save=integration.num_save, dtype=dtype, **pick["members"]
        )
        if judge is None:
            judge = Judge(**pick["judge"])
        if runner is None:
            runner = Runner(**pick["runner"])
    return _run(
        members,
        Integration() if integration is None else integration,
        Judge() if judge is None else judge,
        Runner() if runner is None else runner,
    )
