r"""Gradient-based regime search: differentiate a regime score through the diffrax solve and
move `A` and/or `V` with optax towards a target regime or onto a regime boundary.

Scores (each a time average over the late part `[t1·(1−window), t1]` of the run, on a
grid of save times):

- `"order"`: `⟨|R₂|⟩` (d = 2) or `⟨2 λ_max(C) − 1⟩` (any d, `C = XᵀX/n`) — cluster
  tightness: 1 for two antipodal clusters, 0 for a balanced state.
- `"phase_velocity"`: `⟨|dR₂/dt|⟩` (finite differences of the saved series) — how fast
  the state keeps moving (rotation, oscillation).

Gradients flow through `diffrax.diffeqsolve` with `RecursiveCheckpointAdjoint(checkpoints=64)`:
a fixed number of stored states, so the memory of a gradient does not grow with `max_steps`
(measured in `experiments/bench_sweep.py`: 15.2 MiB for n = 256, d = 64, t1 = 100 at both
`max_steps` = 1024 and 4096 with 32 checkpoints, against 18.4 → 35.6 MiB with diffrax's
default `log(max_steps)` rule).

**Tolerance limit.** The gradient is that of the computed solution, so it is only as good as
the solve: relative error of `jax.grad` of the `"order"` score against the gradient of a
tight solve (rtol 1e-12, itself equal to central differences to 3e-9), `t1 = 20`,
`atol = rtol/100`, measured in `experiments`-style runs (OA: d = 2 LSA; particles: n = 16):

| rtol  | OA (LSA) | particles LSA | particles SA |
|-------|----------|---------------|--------------|
| 1e-2  | 3.3e-2   | 4.3e-1        | 3.6e-1       |
| 1e-3  | 2.8e-3   | 2.5e-2        | 1.3e-2       |
| 1e-4  | 1.0e-3   | 4.4e-4        | 3.3e-4       |
| 1e-5  | 5.0e-5   | 3.8e-5        | 2.7e-5       |
| 1e-6  | 2.3e-6   | 2.2e-6        | 2.5e-6       |

`regime_score` and `regime_search` therefore refuse `rtol` or `atol` above
`MAX_GRADIENT_TOL = 1e-4` (gradient error ≤ 0.1 % above; up to 43 % at 1e-2).
"""

import dataclasses
from collections.abc import Callable
from typing import Literal

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from ..sphere import sample_uniform
from ._circle import _check_count
from ._ott_antonsen import solve_ott_antonsen
from ._solve import simulate
from ._vector_field import AttentionDynamics

__all__ = ["regime_score", "regime_search", "SearchResult", "MAX_GRADIENT_TOL"]

MAX_GRADIENT_TOL = 1e-4


def _check_gradient_tol(where, rtol, atol):
    for name, value in (("rtol", rtol), ("atol", atol)):
        try:
            v = float(value)
        except TypeError:  # traced: cannot be checked
            continue
        if not (np.isfinite(v) and v > 0):
            raise ValueError(f"{where}: {name} must be a finite positive number, got {value}.")
        if v > MAX_GRADIENT_TOL:
            raise ValueError(
                f"{where}: {name} = {value} is above MAX_GRADIENT_TOL = {MAX_GRADIENT_TOL:g}: "
                f"the gradient through the solve is then off by up to 43 % (rtol 1e-2) against "
                f"finite differences (table in jaxattn.dynamics._search). Use {name} <= 1e-5 "
                f"for gradients good to ~5e-5."
            )


def _check_score_settings(where, beta, t1, window, num_save):
    """The settings of a score that can be checked before anything is traced: a concrete
    `beta` must be a positive scalar (an inverse temperature; a traced one gives NaN and
    `RESULTS.nonpositive_beta` in the solve), `t1` finite and positive, `window` in
    (0, 1] and `num_save` an integer >= 2 (two saves make the shortest time average)."""
    if not isinstance(beta, jax.core.Tracer):
        b = np.asarray(beta)
        if b.ndim != 0 or b.dtype.kind not in "iuf":
            raise ValueError(f"{where}: beta must be a real scalar, got {beta!r}.")
        if not (np.isfinite(b) and b > 0):
            raise ValueError(
                f"{where}: beta must be finite and > 0 (an inverse temperature), got {beta}."
            )
    try:
        t1f = float(t1)
    except TypeError:  # traced
        t1f = None
    if t1f is not None and not (np.isfinite(t1f) and t1f > 0):
        raise ValueError(f"{where}: t1 must be finite and > 0, got {t1}.")
    try:
        w = float(window)
    except TypeError:
        w = None
    if w is not None and not 0 < w <= 1:
        raise ValueError(
            f"{where}: window must be in (0, 1] (the late fraction of the horizon the score "
            f"averages over), got {window}."
        )
    _check_count(where, "num_save", num_save, 2)


def _late_ts(t1, num_save, window, dtype):
    return jnp.linspace((1 - window) * t1, t1, num_save, dtype=dtype)


def regime_score(
    A,
    V,
    beta=1.0,
    *,
    score: Literal["order", "phase_velocity"] = "order",
    method: Literal["ott_antonsen", "particles"] = "ott_antonsen",
    R0=0.1 + 0.05j,
    x0=None,
    kernel: str = "lsa",
    t1: float = 40.0,
    window: float = 0.5,
    num_save: int = 41,
    rtol: float = 1e-7,
    atol: float = 1e-9,
    max_steps: int = 16384,
    adjoint: diffrax.AbstractAdjoint = diffrax.RecursiveCheckpointAdjoint(checkpoints=64),
):
    r"""A differentiable regime score of the flow with parameters `(A, V, β)`.

    `method="ott_antonsen"` (d = 2, LSA) solves the OA ODE from `R0`;
    `method="particles"` solves the particle flow from `x0` (shape `(n, d)`, any d and
    kernel). The score is the time average over the late `window` of the horizon `t1`.

    **Returns:** a scalar, differentiable in `A`, `V`, `beta` (and `R0`/`x0`); NaN when the
    solve failed (`throw=False` inside). Where the score is NaN its gradient is not: a
    member the solver refuses (non-finite or traced `beta ≤ 0` input) runs a zero field,
    so the gradient there is 0. Check the score before stepping on the gradient, as
    `regime_search` does.

    **Raises:** `ValueError` for an unknown `method`/`score`, a missing `x0`, `rtol`/`atol`
    above `MAX_GRADIENT_TOL` (the gradient would be off by more than ~0.1 %, see the module
    docstring), a concrete `beta` that is not a positive real scalar, `t1 ≤ 0`, `window`
    outside (0, 1] or `num_save < 2`; the solver's errors for bad `A`, `V`, `R0`, `x0`. A
    traced `beta ≤ 0` gives NaN (the solve's `RESULTS.nonpositive_beta`).
    """
    _check_gradient_tol("regime_score", rtol, atol)
    _check_score_settings("regime_score", beta, t1, window, num_save)
    A = jnp.asarray(A)
    V = jnp.asarray(V)
    dtype = jnp.result_type(A.dtype, V.dtype, float)
    ts = _late_ts(t1, num_save, window, dtype)
    if method == "ott_antonsen":
        sol = solve_ott_antonsen(
            A,
            V,
            R0,
            beta=beta,
            t1=t1,
            ts=ts,
            rtol=rtol,
            atol=atol,
            max_steps=max_steps,
            adjoint=adjoint,
            throw=False,
        )
        Y = jnp.stack([jnp.real(sol.R), jnp.imag(sol.R)], -1)
        order = jnp.sqrt(jnp.sum(Y**2, -1) + 1e-30)
    elif method == "particles":
        if x0 is None:
            raise ValueError("regime_score: method='particles' needs x0 of shape (n, d).")
        field = AttentionDynamics(A, V, beta=beta, kernel=kernel)
        traj = simulate(
            field,
            x0,
            t1=t1,
            ts=ts,
            rtol=rtol,
            atol=atol,
            max_steps=max_steps,
            adjoint=adjoint,
            throw=False,
        )
        n = traj.xs.shape[1]
        C = jnp.einsum("tnd,tne->tde", traj.xs, traj.xs) / n
        order = 2 * jnp.linalg.eigvalsh(C)[:, -1] - 1
        Y = np.sqrt(2) * C.reshape(C.shape[0], -1)
    else:
        raise ValueError(
            f"regime_score: method must be 'ott_antonsen' or 'particles', got {method!r}."
        )
    if score == "order":
        return jnp.mean(order)
    if score == "phase_velocity":
        dY = jnp.diff(Y, axis=0)
        return jnp.mean(jnp.sqrt(jnp.sum(dY**2, -1) + 1e-30) / jnp.diff(ts))
    raise ValueError(f"regime_score: score must be 'order' or 'phase_velocity', got {score!r}.")


def _real_params(where, params):
    """`params` with every leaf a real floating array (integers promoted to JAX's default
    float); refuses a pytree without leaves and complex, boolean or non-numeric leaves."""
    leaves = jax.tree_util.tree_leaves(params)
    if not leaves:
        raise ValueError(f"{where}: params has no numbers to optimise, got {params!r}.")

    def leaf(x):
        a = np.asarray(x) if not isinstance(x, jax.Array) else x
        kind = np.dtype(a.dtype).kind
        if kind not in "iuf":
            raise ValueError(
                f"{where}: params must hold real numbers, got a leaf of dtype {a.dtype}."
            )
        return jnp.asarray(a, a.dtype if kind == "f" else jnp.result_type(float))

    return jax.tree.map(leaf, params)


@dataclasses.dataclass
class SearchResult:
    """History of a regime search.

    **Fields:** `params` (the final parameter pytree: the last parameters with a finite
    score and gradient), `A`, `V` (final matrices), `history` (dict of NumPy arrays over the
    optimisation steps: `score`, `loss`, and `params` flattened per step), `steps` (steps
    taken), `reached` (bool: target met), `status`: why the search stopped — `"reached"`,
    `"max_iters"`, `"nonfinite_start"` (the score at the start is NaN/inf, e.g. a failed
    solve: `params` are the start), `"nonfinite_score"` (a step led to a NaN/inf score:
    `params` are the last ones with a finite score) or `"nonfinite_gradient"` (the gradient
    at `params` is not finite).
    """

    params: object
    A: jnp.ndarray
    V: jnp.ndarray
    history: dict
    steps: int
    reached: bool
    status: str = "max_iters"


def regime_search(
    params,
    build: Callable,
    *,
    target: Literal["clustering", "no_clustering", "boundary"] = "clustering",
    boundary_level: float = 0.5,
    beta=1.0,
    score: Literal["order", "phase_velocity"] = "order",
    method: Literal["ott_antonsen", "particles"] = "ott_antonsen",
    R0=0.1 + 0.05j,
    x0=None,
    t1: float = 40.0,
    window: float = 0.5,
    num_save: int = 41,
    optimiser: optax.GradientTransformation | None = None,
    learning_rate: float = 0.05,
    max_iters: int = 100,
    tol: float = 1e-3,
    threshold: float = 0.9,
    rtol: float = 1e-7,
    atol: float = 1e-9,
    callback: Callable | None = None,
) -> SearchResult:
    r"""Move parameters with gradient steps on a regime score until a target regime is
    reached or the score sits on a boundary level.

    `build(params) -> (A, V)` maps the optimised pytree to the matrices (e.g.
    `lambda p: (jnp.eye(2), jnp.diag(p))` for Case 2, or `lambda p: (p["A"], p["V"])`).

    Losses: `"clustering"` → `−score` until `score ≥ threshold`; `"no_clustering"` →
    `score` until `score ≤ 1 − threshold`; `"boundary"` → `(score − boundary_level)²`
    until `|score − boundary_level| < tol`. One compiled `value_and_grad` step is reused
    for every iteration.

    A non-finite score (e.g. a failed solve) or gradient stops the search at once; the
    result holds the last parameters with a finite score and says why in `status`.

    **Returns:** a `SearchResult`.

    `params` is a pytree of real numbers (arrays, Python numbers or lists of them); integer
    leaves are promoted to JAX's default float. A list is a pytree, not an array: `build`
    then receives a list of scalars (pass `jnp.array([...])` for an array).

    **Raises:** `ValueError` for an unknown `target`, `rtol`/`atol` above
    `MAX_GRADIENT_TOL`, `params` without numbers or with complex or boolean leaves, and the
    settings `regime_score` refuses (`beta`, `t1`, `window`, `num_save`), before any step.
    """
    if target not in ("clustering", "no_clustering", "boundary"):
        raise ValueError(f"regime_search: unknown target {target!r}.")
    _check_gradient_tol("regime_search", rtol, atol)
    _check_score_settings("regime_search", beta, t1, window, num_save)
    params = _real_params("regime_search", params)
    optimiser = optax.adam(learning_rate) if optimiser is None else optimiser

    def loss_fn(p):
        A, V = build(p)
        s = regime_score(
            A,
            V,
            beta,
            score=score,
            method=method,
            R0=R0,
            x0=x0,
            t1=t1,
            window=window,
            num_save=num_save,
            rtol=rtol,
            atol=atol,
        )
        if target == "clustering":
            loss = -s
        elif target == "no_clustering":
            loss = s
        else:
            loss = (s - boundary_level) ** 2
        return loss, s

    @eqx.filter_jit
    def step(p, opt_state):
        (loss, s), g = eqx.filter_value_and_grad(loss_fn, has_aux=True)(p)
        finite_g = jnp.all(
            jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(g)])
        )
        updates, opt_state = optimiser.update(g, opt_state, p)
        return eqx.apply_updates(p, updates), opt_state, loss, s, finite_g

    opt_state = optimiser.init(eqx.filter(params, eqx.is_array))

    def done(s):
        if target == "clustering":
            return s >= threshold
        if target == "no_clustering":
            return s <= 1 - threshold
        return abs(s - boundary_level) < tol

    hist = dict(score=[], loss=[], params=[])
    reached = False
    status = "max_iters"
    last_good = params
    it = 0
    for it in range(1, max_iters + 1):
        flat = np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree_util.tree_leaves(params)])
        new_params, new_state, loss, s, finite_g = step(params, opt_state)
        s = float(s)
        if not (np.isfinite(s) and np.isfinite(float(loss))):
            # `params` has no finite score: return the previous parameters, the last with a
            # finite score (at the start there are none: the start is returned).
            status = "nonfinite_start" if it == 1 else "nonfinite_score"
            params = last_good
            break
        hist["score"].append(s)
        hist["loss"].append(float(loss))
        hist["params"].append(flat)
        if callback is not None:
            callback(it, params, s)
        if done(s):
            reached = True
            status = "reached"
            break
        if not bool(finite_g):
            status = "nonfinite_gradient"
            break
        last_good = params
        params, opt_state = new_params, new_state
    A, V = build(params)
    return SearchResult(
        params=params,
        A=jnp.asarray(A),
        V=jnp.asarray(V),
        history={k: np.asarray(v) for k, v in hist.items()},
        steps=it,
        reached=reached,
        status=status,
    )


def uniform_tokens(key, n, d, dtype=None):
    """Uniform tokens for `method="particles"` searches (re-export of `sample_uniform`)."""
    return sample_uniform(key, n, d, dtype=dtype)
