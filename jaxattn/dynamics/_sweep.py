r"""Batched runs of the attention flow over many parameters: one compiled function per
sweep shape, the batch axis sharded over every visible device, chunked with a progress
bar, written to disk chunk by chunk and resumable.

Three ways to run a member (`method=`):

- `"particles"`: the full particle flow (`simulate`), any `d`, any kernel.
- `"ott_antonsen"` (d = 2, LSA): the closed ODE for `R₂` on the wrapped-Cauchy manifold.
- `"watanabe_strogatz"` (d = 2, LSA): the exact finite-`n` reduction
  (`solve_watanabe_strogatz`: three real ODEs for the Möbius parameters plus `n`
  constants); every token is reconstructed, so its regime is read by the same token
  classifier as a particle run.

Every member runs the package's own solver for its method (`simulate`,
`solve_ott_antonsen`, `solve_watanabe_strogatz` with `throw=False`) and is classified by
`classify_tokens` (particles, WS) or `classify_order_parameter` (OA), so a sweep member
and a hand-made run of the same parameters agree.

Lockstep. A `vmap` of an adaptive solve advances the batch in one `while_loop`: every
member pays for as many loop iterations as the slowest member takes. Two defences are
built in. (1) `time_scale="natural"` (default) integrates each member in its own time
unit `s = r t` with `r = β ‖A‖₂ ‖V‖₂` (LSA/OA/WS; the bound of the drive), which is
exactly the substitution `V → V / r` because the field is linear in `V`; every member then
covers the same number of its own time units, so step counts are alike and the regime
rules (read per unit of time) are scale-free. (2) `group="pilot"` (d = 2, LSA) runs the cheap
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
import warnings
from collections.abc import Callable
from typing import Any, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ..sphere import sample_uniform
from ._ott_antonsen import sample_wrapped_cauchy, solve_ott_antonsen
from ._regimes import (
    REGIMES,
    RegimeEvidence,
    _window_start,
    classify_order_parameter,
    classify_tokens,
    clustering_gap,
    default_gap_floor,
)
from ._solve import RESULTS, simulate
from ._vector_field import AttentionDynamics
from ._watanabe_strogatz import solve_watanabe_strogatz

__all__ = [
    "REGIME_NAMES",
    "SweepResult",
    "sweep",
    "natural_rate",
    "result_message",
]

# Regime codes of a sweep are the values of `REGIMES`; these are their short names in code
# order, so `REGIME_NAMES[code]` names a member's regime.
REGIME_NAMES = tuple(REGIMES._name_to_item)
UNDETERMINED = int(REGIMES.undetermined._value)

METHODS = ("particles", "ott_antonsen", "watanabe_strogatz")

# Evidence fields (`RegimeEvidence`) that carry a unit of time, converted from the member's
# natural time back to physical time.
_RATES = ("final_motion", "drift_rate", "rotation_rate")
_TIMES = ("period",)
EVIDENCE_FIELDS = tuple(RegimeEvidence.__dataclass_fields__)


def result_message(code: int) -> str:
    """The name of a `RESULTS` code (`"successful"`, `"max_steps_reached"`, ...)."""
    for name, item in RESULTS._name_to_item.items():
        if int(item._value) == int(code):
            return name
    return f"code {int(code)}"


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
    window: float
    cluster_tol: float
    gap_floor: float | None
    rest_tol: float | None


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
            theta0 = sample_wrapped_cauchy(k_tokens, cfg.n, R0, dtype=dtype)
            x0 = jnp.stack([jnp.cos(theta0), jnp.sin(theta0)], axis=-1)
        else:
            x0 = sample_uniform(k_tokens, cfg.n, cfg.d, dtype=dtype)
    if not cfg.natural:
        rate = jnp.asarray(1.0, dtype)
    elif cfg.kernel == "lsa":
        rate = natural_rate(A, V, beta, "lsa").astype(dtype)
    else:
        # USA / SA: the bound ‖V‖ e^{β σ_max(A)} overstates typical speeds by orders of
        # magnitude; use ‖V‖₂ times the largest initial weight mass (1/n) Σ_j w_kj.
        f0 = AttentionDynamics(A, V, beta=beta, kernel=cfg.kernel, score_shift=shift)
        s0 = f0.scores(jnp.where(jnp.isfinite(x0), x0, 0))
        mass = jnp.max(jnp.mean(jnp.exp(s0 - shift), axis=1)) if cfg.kernel == "usa" else 1.0
        r = jnp.linalg.norm(jnp.where(jnp.isfinite(V), V, 0), ord=2) * mass
        rate = jnp.where(jnp.isfinite(r) & (r > 0), r, 1.0).astype(dtype)
    Vs = V / rate
    solve_kw = dict(t1=cfg.t1, ts=ts, rtol=cfg.rtol, atol=cfg.atol, max_steps=cfg.max_steps)
    gap_floor = cfg.gap_floor
    if gap_floor is None:
        # The saved states (dense output) jitter at the solver tolerance: near the circle
        # 1 − |R₂|² wobbles at ~2 rtol, which must read as "on the circle".
        gap_floor = max(default_gap_floor(dtype), 10 * cfg.rtol)
    classify_kw = dict(window=cfg.window, gap_floor=gap_floor, rest_tol=cfg.rest_tol)
    xs = None
    if cfg.method == "ott_antonsen":
        sol = solve_ott_antonsen(A, Vs, R0, beta=beta, throw=False, **solve_kw)
        R2 = sol.R
        regime, ev = classify_order_parameter(ts, R2, **classify_kw)
    elif cfg.method == "watanabe_strogatz":
        if theta0 is None:  # uniform initial tokens
            theta0 = jnp.arctan2(x0[:, 1], x0[:, 0])
        sol = solve_watanabe_strogatz(A, Vs, theta0, beta=beta, throw=False, **solve_kw)
        xs = sol.points()
    else:
        field = AttentionDynamics(A, Vs, beta=beta, kernel=cfg.kernel, score_shift=shift)
        sol = simulate(field, x0, throw=False, **solve_kw)
        xs = sol.xs
    if xs is not None:
        regime, ev = classify_tokens(ts, xs, cluster_tol=cfg.cluster_tol, **classify_kw)
        if cfg.d == 2:
            R2 = jnp.mean((xs[..., 0] + 1j * xs[..., 1]) ** 2, axis=-1)
        else:
            R2 = jnp.full(ts.shape, jnp.nan, dtype) * (1 + 0j)
    order = (
        jnp.abs(R2) if cfg.d == 2 else jnp.sqrt(jnp.clip(1 - clustering_gap(xs), 0.0, 1.0))
    )
    result = sol.result._value
    failed = (result != 0) | ~jnp.all(jnp.isfinite(order))
    regime = jnp.where(failed, UNDETERMINED, regime._value)
    evidence = {k: getattr(ev, k) for k in EVIDENCE_FIELDS}
    for k, v in evidence.items():  # a failed member has no measurement
        evidence[k] = jnp.where(failed, -1 if jnp.issubdtype(v.dtype, jnp.integer) else jnp.nan, v)
    for k in _RATES:
        evidence[k] = evidence[k] * rate
    for k in _TIMES:
        evidence[k] = evidence[k] / rate
    return dict(
        regime=regime.astype(jnp.int32),
        result=jnp.asarray(result, jnp.int32),
        failed=failed,
        num_steps=jnp.asarray(sol.num_steps, jnp.int32),
        rate=rate,
        order=order,
        R2=R2,
        **{f"evidence_{k}": v for k, v in evidence.items()},
    )


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


def _failure_records(members, result, A, V, beta, seed) -> list[dict]:
    """One dict per failed member: its index, the reason and its parameters."""
    return [
        dict(
            index=int(i),
            reason=result_message(int(code)) if code else "non-finite",
            A=A[i].tolist(),
            V=V[i].tolist(),
            beta=float(beta[i]),
            seed=int(seed[i]),
        )
        for i, code in zip(members, result)
    ]


@dataclasses.dataclass
class SweepResult:
    """Per-member outcome of a sweep (NumPy arrays on the host, batch axis first).

    **Fields:**

    - `A`, `V` `(batch, d, d)`, `beta` `(batch,)`, `seed` `(batch,)`: the members.
    - `regime` `(batch,)`: the value of the member's `REGIMES` item (`REGIME_NAMES[code]`
      is its short name); `undetermined` for a failed member.
    - `evidence`: dict of `(batch,)` arrays, one per `RegimeEvidence` field, times and
      rates in physical units (`period`, `final_motion`, `drift_rate`, `rotation_rate`).
    - `result` (a `RESULTS` code), `failed` (bool), `num_steps`, `rate` (the member's
      natural rate, 1 when `time_scale="physical"`).
    - `order` `(batch, times)`: `|R₂|` in d = 2, `ρ = sqrt(1 − clustering_gap)` otherwise;
      `R2` `(batch, times)` complex (NaN when d > 2); `ts` `(batch, times)` physical save
      times.
    - `shape`: the cartesian shape (or `(batch,)`); `seconds`: wall time of the computed
      chunks; `chunks_computed`, `chunks_loaded`.
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
    evidence: dict
    ts: np.ndarray
    shape: tuple
    seconds: float = 0.0
    chunks_computed: int = 0
    chunks_loaded: int = 0

    @property
    def regime_names(self) -> np.ndarray:
        """The short regime name of every member, shape `(batch,)`."""
        return np.asarray(REGIME_NAMES, dtype=object)[self.regime]

    def counts(self) -> dict:
        """Number of members per regime name (plus `failed`)."""
        c = {name: int(np.sum(self.regime == i)) for i, name in enumerate(REGIME_NAMES)}
        c["failed"] = int(np.sum(self.failed))
        return c

    def failures(self) -> list[dict]:
        """Each failed member with its parameters and the reason."""
        bad = np.flatnonzero(self.failed)
        return _failure_records(bad, self.result[bad], self.A, self.V, self.beta, self.seed)

    def reshape(self, field: str) -> np.ndarray:
        """A per-member field (or an evidence name) in the cartesian shape of the sweep."""
        x = self.evidence[field] if field in self.evidence else getattr(self, field)
        return x.reshape(tuple(self.shape) + x.shape[1:])


_FIELDS = (
    "regime",
    "result",
    "failed",
    "num_steps",
    "rate",
    "order",
    "R2",
) + tuple(f"evidence_{k}" for k in EVIDENCE_FIELDS)


# ---------------------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------------------


def _as_stack(x, name, d=None):
    x = np.asarray(x)
    if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
        raise ValueError(f"sweep: {name} must be a real matrix, got dtype {x.dtype}.")
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
    window: float = 0.5,
    cluster_tol: float = 1e-3,
    gap_floor: float | None = None,
    rest_tol: float | None = None,
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
    - `window`, `cluster_tol`, `gap_floor`, `rest_tol`: the regime classifier's settings;
      `gap_floor=None` means `max(default_gap_floor(dtype), 10 rtol)` (the saved states
      jitter at the solver tolerance, so a clustering gap below that is "on the circle");
      at the default rtol this is the classifiers' own default.
      Particle and Watanabe–Strogatz members are classified from their tokens by
      `classify_tokens` (the rules of `classify_regime`, with the cluster structure of the
      final tokens), Ott–Antonsen members from `R₂(t)` by `classify_order_parameter`; the
      rules are rate-based and read per unit of the member's own time, so with the natural
      time scale they are scale-free.

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
    if init not in ("wrapped_cauchy", "uniform"):
        raise ValueError(f"sweep: init must be 'wrapped_cauchy' or 'uniform', got {init!r}.")
    A = _as_stack(A, "A")
    d = A.shape[1]
    V = _as_stack(V, "V", d)
    beta = np.atleast_1d(np.asarray(beta))
    seeds = np.atleast_1d(np.asarray(seeds))
    if beta.ndim != 1 or seeds.ndim != 1:
        raise ValueError(
            f"sweep: beta and seeds must be scalars or 1-d, got shapes {beta.shape}, {seeds.shape}."
        )
    for name, x in (("beta", beta),):
        if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
            raise ValueError(f"sweep: {name} must be real numbers, got dtype {x.dtype}.")
    if not np.issubdtype(seeds.dtype, np.integer) or np.any(seeds < 0) or np.any(seeds >= 2**32):
        raise ValueError(
            f"sweep: seeds must be integers in [0, 2**32), got {seeds.tolist()[:8]} "
            f"(dtype {seeds.dtype})."
        )
    seeds = seeds.astype(np.int64)
    if min(A.shape[0], V.shape[0], beta.shape[0], seeds.shape[0]) == 0:
        raise ValueError("sweep: empty batch (A, V, beta or seeds has no members).")
    if isinstance(n, bool) or not float(n).is_integer():
        raise ValueError(f"sweep: n must be an integer number of tokens, got n={n!r}.")
    if chunk_size is not None and int(chunk_size) < 1:
        raise ValueError(f"sweep: chunk_size must be >= 1 or None, got {chunk_size!r}.")
    if score_shift != "auto" and not isinstance(score_shift, (int, float, np.number)):
        raise ValueError(f"sweep: score_shift must be a number or 'auto', got {score_shift!r}.")
    for name, value, lo in (
        ("t1", t1, 0.0),
        ("rtol", rtol, 0.0),
        ("atol", atol, 0.0),
        ("cluster_tol", cluster_tol, 0.0),
        ("gap_floor", gap_floor, 0.0),
        ("rest_tol", rest_tol, 0.0),
    ):
        if value is not None and not (np.isfinite(float(value)) and float(value) > lo):
            raise ValueError(f"sweep: {name} must be a finite positive number, got {value!r}.")
    if int(max_steps) < 1:
        raise ValueError(f"sweep: max_steps must be >= 1, got {max_steps!r}.")
    if method != "particles" and (d != 2 or kernel != "lsa"):
        raise ValueError(
            f"sweep: method={method!r} is the d = 2 LSA reduction; got d = {d}, kernel={kernel!r}."
        )
    if dtype is None:
        dtype = jnp.result_type(float)
    dtype = np.dtype(dtype)
    if not np.issubdtype(dtype, np.floating):
        raise ValueError(f"sweep: dtype must be a real floating dtype, got {dtype}.")
    if int(n) < 1:
        raise ValueError(f"sweep: need n >= 1 tokens, got n={n}.")
    if method == "watanabe_strogatz" and int(n) < 3:
        raise ValueError(f"sweep: the Watanabe–Strogatz reduction needs n >= 3, got n={n}.")
    if not 0 <= float(r0) < 1:
        raise ValueError(f"sweep: r0 = |R₂(0)| must lie in [0, 1), got r0={r0}.")
    try:
        _window_start(int(num_save), float(window))
    except ValueError as err:
        raise ValueError(f"sweep: {err}") from None

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
        window=float(window),
        cluster_tol=float(cluster_tol),
        gap_floor=None if gap_floor is None else float(gap_floor),
        rest_tol=None if rest_tol is None else float(rest_tol),
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
            try:
                with open(manifest_path) as f:
                    old = json.load(f)
                if not isinstance(old, dict):
                    raise ValueError("not a JSON object")
            except ValueError as err:
                raise ValueError(
                    f"sweep: {manifest_path} is damaged ({err}); remove it, or pass "
                    "resume=False to overwrite the folder."
                ) from None
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
                chunk = _load_chunk(path, idx, fingerprint)
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
                    _atomic_write(
                        path,
                        lambda p: _write_npz(
                            p, members=idx, fingerprint=np.array(fingerprint), **chunk
                        ),
                    )
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
    evidence = {k: outs.pop(f"evidence_{k}") for k in EVIDENCE_FIELDS}
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
        evidence=evidence,
        **outs,
    )


def _load_chunk(path, members, fingerprint):
    """A finished chunk of this sweep from `path`, or None (with a warning) when the file is
    damaged, belongs to another sweep or does not hold the expected members and fields."""
    try:
        with np.load(path, allow_pickle=False) as z:
            if str(z["fingerprint"]) != fingerprint:
                problem = "it belongs to a different sweep"
            elif not np.array_equal(z["members"], members):
                problem = "it holds other members"
            else:
                chunk = {k: z[k] for k in _FIELDS}
                if all(v.shape[:1] == members.shape for v in chunk.values()):
                    return chunk
                problem = "its fields have the wrong length"
    except Exception as err:  # truncated, not an npz, missing fields: recompute
        problem = f"it cannot be read ({type(err).__name__}: {err})"
    warnings.warn(f"sweep: recomputing {path}: {problem}.", stacklevel=3)
    return None


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
    bad = np.flatnonzero(chunk["failed"])
    return dict(
        chunk=c,
        members=idx.tolist(),
        seconds=seconds,
        members_per_second=len(idx) / max(seconds, 1e-12),
        regime_counts=counts,
        failures=_failure_records(idx[bad], chunk["result"][bad], Am, Vm, bm, sm),
    )
