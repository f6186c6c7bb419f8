r"""Fixed points, stability, continuation and bifurcations of the Ott–Antonsen flow (d = 2, LSA).

The OA ODE `dR/dt = iβΩ(R)R + (β/2)(H(R) − conj(H(R))R²)` (docs/theory) is a planar vector
field on the closed unit disc; the circle `|R| = 1` (two antipodal clusters) is invariant.

- `fixed_points`: Newton's method (optimistix) from a polar grid of seeds covering the
  closed disc, de-duplicated; stability from the eigenvalues of the 2×2 Jacobian.
- `continuation`: fixed points along a parameter path (natural-parameter continuation,
  seeded from the grid and from the previous parameter's points).
- `saddle_node_on_circle`: the oscillation ↔ clustering transition of the paper's Case 4
  family is a saddle-node on the circle. On `|R| = 1`, `R = e^{iψ}`, the flow is
  `dψ/dt = g(ψ)`; equilibria exist iff `min g · max g ≤ 0`. The extrema of `g` are found
  on a grid and polished by Newton on `g' = 0`, and the parameter at which
  `min g · max g` changes sign is refined by bisection (to `1e-8` by default).
- `refine_transition`: bisection on any boolean predicate of the parameter (e.g. the
  number of fixed points in the disc, or a regime label), `find_transitions` brackets
  label changes along a path.
"""

from collections.abc import Callable
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx

from ._circle import _check_2x2, _check_scalar, kuramoto_daido_coupling
from ._hamiltonian import boundary_flow

__all__ = [
    "FixedPoints",
    "oa_field_real",
    "fixed_points",
    "continuation",
    "circle_extrema",
    "has_circle_equilibrium",
    "refine_transition",
    "saddle_node_on_circle",
    "find_transitions",
]


def oa_field_real(y, A, V, beta=1.0):
    """The OA field in real coordinates `y = (Re R, Im R)` → `(Re Ṙ, Im Ṙ)`."""
    R = y[0] + 1j * y[1]
    H, Omega = kuramoto_daido_coupling(R, A, V)
    dR = 1j * beta * Omega * R + 0.5 * beta * (H - jnp.conj(H) * R**2)
    return jnp.stack([jnp.real(dR), jnp.imag(dR)]).astype(y.dtype)


class FixedPoints(NamedTuple):
    """Fixed points of the OA flow at one parameter.

    **Fields:** `R` complex `(k,)`; `eigenvalues` complex `(k, 2)` of the Jacobian;
    `kind` list of `"sink" | "source" | "saddle" | "centre" | "degenerate"`;
    `on_circle` bool `(k,)` (`|R| = 1`, a two-cluster state).
    """

    R: np.ndarray
    eigenvalues: np.ndarray
    kind: list
    on_circle: np.ndarray


@eqx.filter_jit
def _newton_batch(seeds, A, V, beta, tol):
    def one(y0):
        sol = optx.root_find(
            lambda y, _: oa_field_real(y, A, V, beta),
            optx.Newton(rtol=tol, atol=tol),
            y0,
            throw=False,
            max_steps=80,
        )
        y = sol.value
        res = jnp.linalg.norm(oa_field_real(y, A, V, beta))
        jac = jax.jacfwd(lambda z: oa_field_real(z, A, V, beta))(y)
        return y, res, jnp.linalg.eigvals(jac)

    return jax.vmap(one)(seeds)


def _seeds(num_radii, num_angles, dtype):
    r = np.linspace(0.0, 1.0, num_radii)
    a = np.linspace(0, 2 * np.pi, num_angles, endpoint=False)
    rr, aa = np.meshgrid(r, a)
    pts = np.stack([rr * np.cos(aa), rr * np.sin(aa)], -1).reshape(-1, 2)
    pts = pts[np.unique(np.round(pts, 12), axis=0, return_index=True)[1]]
    return jnp.asarray(pts, dtype)


def _kind(ev, tol):
    re = np.real(ev)
    if np.all(re < -tol):
        return "sink"
    if np.all(re > tol):
        return "source"
    if re.min() < -tol and re.max() > tol:
        return "saddle"
    if np.all(np.abs(re) <= tol) and np.all(np.abs(np.imag(ev)) > tol):
        return "centre"
    return "degenerate"


def fixed_points(
    A,
    V,
    beta=1.0,
    *,
    num_radii: int = 7,
    num_angles: int = 32,
    extra_seeds=None,
    tol: float = 1e-12,
    residual_tol: float = 1e-9,
    merge_tol: float = 1e-6,
    stability_tol: float = 1e-7,
) -> FixedPoints:
    r"""All fixed points of the OA flow in the closed unit disc that Newton's method finds
    from a polar grid of seeds (`num_radii × num_angles`, circle included).

    **Arguments:** `A`, `V` real 2×2; `beta` scalar; `extra_seeds` complex array of further
    starting points (continuation passes the previous points); tolerances for Newton,
    the residual `|F(R)|` that accepts a root, merging duplicates and the stability test.

    **Returns:** a `FixedPoints`. A continuum of equilibria (e.g. `A = V = I`, where the
    whole circle is fixed) is returned as the sample of it that Newton lands on.

    **Raises:** `ValueError` naming the argument when `A` or `V` is not a real 2×2 matrix
    of finite numbers or `beta` is not a finite scalar.
    """
    # real, 2×2, finite (a NaN entry would leave Newton no root: "no fixed points")
    A, V = _check_2x2("fixed_points", A=A, V=V)
    beta = _check_scalar("fixed_points", "beta", beta)
    A = jnp.asarray(A)
    dtype = jnp.result_type(A.dtype, float)
    A = A.astype(dtype)
    V = jnp.asarray(V, dtype)
    seeds = _seeds(num_radii, num_angles, dtype)
    if extra_seeds is not None and len(extra_seeds):
        ex = np.asarray(extra_seeds)
        seeds = jnp.concatenate([seeds, jnp.asarray(np.stack([ex.real, ex.imag], -1), dtype)])
    y, res, ev = _newton_batch(seeds, A, V, jnp.asarray(beta, dtype), tol)
    y, res, ev = np.asarray(y), np.asarray(res), np.asarray(ev)
    r = np.hypot(y[:, 0], y[:, 1])
    ok = np.isfinite(res) & (res < residual_tol) & (r <= 1 + 1e-9)
    pts, eigs = [], []
    for yi, ei in zip(y[ok], ev[ok]):
        if all(np.hypot(*(yi - p)) > merge_tol for p in pts):
            pts.append(yi)
            eigs.append(ei)
    Rs = np.array([p[0] + 1j * p[1] for p in pts], dtype=complex)
    order = np.lexsort((np.angle(Rs), -np.abs(Rs))) if len(Rs) else np.arange(0)
    Rs = Rs[order]
    eigs = np.array(eigs, dtype=complex).reshape(-1, 2)[order]
    return FixedPoints(
        R=Rs,
        eigenvalues=eigs,
        kind=[_kind(e, stability_tol) for e in eigs],
        on_circle=np.abs(np.abs(Rs) - 1) < 1e-7,
    )


def continuation(family: Callable, params, **kwargs) -> list[FixedPoints]:
    """Fixed points along a path: `family(p) -> (A, V, beta)` for each `p` in `params`;
    each parameter is seeded by the grid and by the previous parameter's fixed points."""
    out: list[FixedPoints] = []
    prev = None
    for p in params:
        A, V, beta = family(p)
        fp = fixed_points(A, V, beta, extra_seeds=None if prev is None else prev.R, **kwargs)
        out.append(fp)
        prev = fp
    return out


@eqx.filter_jit
def _circle_extrema(A, V, beta, num):
    psi = jnp.linspace(0.0, 2 * jnp.pi, num, endpoint=False, dtype=A.dtype)
    g = boundary_flow(psi, A, V, beta)
    dg = jax.grad(lambda p: boundary_flow(p, A, V, beta))
    d2g = jax.grad(dg)

    def polish(p0):
        def body(_, p):
            h = d2g(p)
            return p - jnp.where(h != 0, dg(p) / jnp.where(h != 0, h, 1), 0)

        p = jax.lax.fori_loop(0, 30, body, p0)
        return boundary_flow(p, A, V, beta), p

    gmin, pmin = polish(psi[jnp.argmin(g)])
    gmax, pmax = polish(psi[jnp.argmax(g)])
    # Newton can only improve the extremum; keep the grid value if it did not.
    gmin = jnp.minimum(gmin, jnp.min(g))
    gmax = jnp.maximum(gmax, jnp.max(g))
    return gmin, gmax, pmin, pmax


def circle_extrema(A, V, beta=1.0, *, num: int = 4096):
    """`(min g, max g)` of the angular speed `g(ψ)` on the circle `|R₂| = 1`."""
    A = jnp.asarray(A)
    dtype = jnp.result_type(A.dtype, float)
    gmin, gmax, _, _ = _circle_extrema(
        A.astype(dtype), jnp.asarray(V, dtype), jnp.asarray(beta, dtype), num
    )
    return float(gmin), float(gmax)


def has_circle_equilibrium(A, V, beta=1.0, **kw) -> bool:
    """Whether the circle `|R₂| = 1` carries a two-cluster equilibrium (`g` has a zero)."""
    gmin, gmax = circle_extrema(A, V, beta, **kw)
    return gmin * gmax <= 0


def refine_transition(
    predicate: Callable[[float], bool],
    lo: float,
    hi: float,
    *,
    tol: float = 1e-8,
    max_iter: int = 200,
):
    """Bisection on a parameter where a boolean `predicate` changes value.

    **Arguments:** `predicate(p) -> bool`, a bracket `[lo, hi]` with
    `predicate(lo) != predicate(hi)`, the target width `tol`.

    **Returns:** `(p, (lo, hi), iterations)` with `hi − lo ≤ tol` and `p` the midpoint.

    **Raises:** `ValueError` if the bracket does not contain a change.
    """
    plo, phi = bool(predicate(lo)), bool(predicate(hi))
    if plo == phi:
        raise ValueError(
            f"refine_transition: predicate is {plo} at both ends of [{lo}, {hi}]; no bracket."
        )
    it = 0
    while hi - lo > tol and it < max_iter:
        mid = 0.5 * (lo + hi)
        if bool(predicate(mid)) == plo:
            lo = mid
        else:
            hi = mid
        it += 1
    return 0.5 * (lo + hi), (lo, hi), it


def saddle_node_on_circle(family: Callable, lo: float, hi: float, *, tol: float = 1e-8):
    """Locate the saddle-node on the circle between `lo` and `hi` (where two-cluster
    equilibria are born or die) to `tol` by bisection on `has_circle_equilibrium`.

    `family(p) -> (A, V, beta)`. Returns `(p*, (lo, hi), iterations)`.
    """
    return refine_transition(lambda p: has_circle_equilibrium(*family(p)), lo, hi, tol=tol)


def find_transitions(params, labels, *, failed=None) -> list[tuple[float, float, object, object]]:
    """Brackets `(p_i, p_j, label_i, label_j)` where the label changes between consecutive
    members `i < j` of a path that did not fail.

    **Arguments:** `params` the path's parameter values, shape `(m,)`; `labels` one label per
    parameter (e.g. `REGIME_NAMES[code]`); `failed` an optional bool mask, shape `(m,)`, of
    members whose solve failed (a sweep's `failed`). A failed member has no regime: it is
    skipped, never a label of its own, so a failure between two equal labels is no
    transition, and a change across failed members is bracketed by the nearest good ones.

    **Returns:** a list of brackets, in path order.

    **Raises:** `ValueError` if `labels` or `failed` does not match `params` in length.
    """
    m = len(params)
    if len(labels) != m:
        raise ValueError(
            f"find_transitions: {len(labels)} labels for {m} parameters; need one each."
        )
    if failed is None:
        failed = np.zeros(m, bool)
    failed = np.asarray(failed, bool).reshape(-1)
    if failed.shape[0] != m:
        raise ValueError(
            f"find_transitions: failed has {failed.shape[0]} entries for {m} parameters."
        )
    good = [i for i in range(m) if not failed[i]]
    out = []
    for i, j in zip(good[:-1], good[1:]):
        if labels[i] != labels[j]:
            out.append((float(params[i]), float(params[j]), labels[i], labels[j]))
    return out
