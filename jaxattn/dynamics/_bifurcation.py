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

import math
from collections.abc import Callable
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx

from ._circle import _check_2x2, _check_count, _check_scalar, kuramoto_daido_coupling
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
def _newton_batch(seeds, A, V, beta, tol, residual_tol):
    def one(y0):
        sol = optx.root_find(
            lambda y, _: oa_field_real(y, A, V, beta),
            optx.Newton(rtol=tol, atol=tol),
            y0,
            throw=False,
            max_steps=80,
        )
        # A seed that is already a root stays one: where the Jacobian is singular there
        # (a continuum of equilibria, e.g. the zero field of β·A = 0 or V = 0) Newton's
        # step is 0/0 and would lose it.
        at_root = jnp.linalg.norm(oa_field_real(y0, A, V, beta)) <= residual_tol
        y = jnp.where(at_root & ~jnp.all(jnp.isfinite(sol.value)), y0, sol.value)
        res = jnp.linalg.norm(oa_field_real(y, A, V, beta))
        jac = jax.jacfwd(lambda z: oa_field_real(z, A, V, beta))(y)
        return y, res, jnp.linalg.eigvals(jac)

    return jax.vmap(one)(seeds)


FIXED_POINT_TOLERANCES = {
    # (tol, residual_tol, merge_tol, stability_tol) of `fixed_points` by dtype
    "float64": (1e-12, 1e-9, 1e-6, 1e-7),
    "float32": (1e-6, 1e-5, 1e-4, 1e-5),
}


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
    tol: float | None = None,
    residual_tol: float | None = None,
    merge_tol: float | None = None,
    stability_tol: float | None = None,
) -> FixedPoints:
    r"""All fixed points of the OA flow in the closed unit disc that Newton's method finds
    from a polar grid of seeds (`num_radii × num_angles`, circle included).

    **Arguments:** `A`, `V` real 2×2 (float32 or float64: the computation runs in their
    dtype, at least JAX's default float); `beta > 0` scalar; `extra_seeds` complex array of
    further starting points, shape `(k,)` (continuation passes the previous points);
    tolerances for Newton (`tol`), the residual `|F(R)|` that accepts a root
    (`residual_tol`), merging duplicates (`merge_tol`) and the stability test
    (`stability_tol`). Their defaults depend on the dtype (`FIXED_POINT_TOLERANCES`):
    1e-12, 1e-9, 1e-6, 1e-7 in float64 and 1e-6, 1e-5, 1e-4, 1e-5 in float32, whose
    rounding could not reach the float64 ones (every root was rejected).

    **Returns:** a `FixedPoints`. A continuum of equilibria (e.g. `A = V = I`, where the
    whole circle is fixed, or a zero field, `V = 0`, where every point is) is returned as
    the sample of it that Newton lands on (for a zero field: the seeds themselves).

    **Raises:** `ValueError` naming the argument when `A` or `V` is not a real 2×2 matrix
    of finite numbers or not float32/float64, `beta` is not a finite scalar > 0 (an
    inverse temperature, as the other Ott–Antonsen functions require), `num_radii` or
    `num_angles` is not an integer >= 1, a tolerance is not a finite number > 0, or
    `extra_seeds` is not a 1-d array of finite numbers.
    """
    where = "fixed_points"
    # real, 2×2, finite (a NaN entry would leave Newton no root: "no fixed points")
    A, V = _check_2x2(where, A=A, V=V)
    beta = _check_scalar(where, "beta", beta, positive=True)
    dtype = jnp.result_type(A.dtype, V.dtype, float)
    if dtype not in (jnp.float32, jnp.float64):
        raise ValueError(f"{where}: A and V must be float32 or float64, got {dtype}.")
    defaults = FIXED_POINT_TOLERANCES[jnp.dtype(dtype).name]
    tol, residual_tol, merge_tol, stability_tol = (
        default if given is None else given
        for given, default in zip((tol, residual_tol, merge_tol, stability_tol), defaults)
    )
    num_radii = _check_count(where, "num_radii", num_radii)
    num_angles = _check_count(where, "num_angles", num_angles)
    for name, value in (
        ("tol", tol),
        ("residual_tol", residual_tol),
        ("merge_tol", merge_tol),
        ("stability_tol", stability_tol),
    ):
        if not (
            isinstance(value, (int, float, np.floating)) and math.isfinite(value) and value > 0
        ):
            raise ValueError(f"{where}: {name} must be a finite number > 0, got {value!r}.")
    A = A.astype(dtype)
    V = jnp.asarray(V, dtype)
    seeds = _seeds(num_radii, num_angles, dtype)
    if extra_seeds is not None:
        ex = np.asarray(extra_seeds)
        if ex.ndim != 1 or ex.dtype.kind not in "iufc":
            raise ValueError(
                f"{where}: extra_seeds must be a 1-d array of finite (complex) numbers, got "
                f"shape {ex.shape}, dtype {ex.dtype}."
            )
        if not np.all(np.isfinite(ex)):
            raise ValueError(
                f"{where}: extra_seeds must be finite, got {np.sum(~np.isfinite(ex))} "
                "NaN or infinite value(s)."
            )
        if len(ex):
            pts = np.stack([ex.real, ex.imag], -1)
            seeds = jnp.concatenate([seeds, jnp.asarray(pts, dtype)])
    y, res, ev = _newton_batch(seeds, A, V, jnp.asarray(beta, dtype), tol, residual_tol)
    y, res, ev = np.asarray(y), np.asarray(res), np.asarray(ev)
    r = np.hypot(y[:, 0], y[:, 1])
    # roots beyond the circle by rounding still count; `on_circle` below is read alike
    slack = 1e-9 if dtype == jnp.float64 else 1e-5
    ok = np.isfinite(res) & (res <= residual_tol) & (r <= 1 + slack)
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
        on_circle=np.abs(np.abs(Rs) - 1) < (1e-7 if dtype == jnp.float64 else 1e-5),
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
    """`(min g, max g)` of the angular speed `g(ψ)` on the circle `|R₂| = 1`, from a grid
    of `num` angles polished by Newton on `g' = 0`.

    **Raises:** `ValueError` when `A` or `V` is not a real 2×2 matrix of finite numbers,
    `beta` is not a finite scalar > 0, or `num < 3`.
    """
    A, V = _check_2x2("circle_extrema", A=A, V=V)
    beta = _check_scalar("circle_extrema", "beta", beta, positive=True)
    num = _check_count("circle_extrema", "num", num, 3)
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

    **Arguments:** `predicate(p) -> bool`, a bracket of two finite, distinct ends `lo`,
    `hi` (in either order) with `predicate(lo) != predicate(hi)`, the target width
    `tol > 0`.

    **Returns:** `(p, (lo, hi), iterations)` with `lo < hi`, `hi − lo ≤ tol` (unless
    `max_iter` ran out first) and `p` the midpoint.

    **Raises:** `ValueError` if an end is not a finite number, the ends are equal, `tol`
    is not a positive number, or the bracket does not contain a change.
    """
    where = "refine_transition"
    for name, value in (("lo", lo), ("hi", hi), ("tol", tol)):
        try:
            ok = math.isfinite(float(value))
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ValueError(f"{where}: {name} must be a finite number, got {value!r}.")
    lo, hi, tol = float(lo), float(hi), float(tol)
    if lo == hi:
        raise ValueError(f"{where}: lo and hi are the same point ({lo}); no bracket.")
    if not tol > 0:
        raise ValueError(f"{where}: tol must be > 0, got {tol}.")
    lo, hi = min(lo, hi), max(lo, hi)

    def truth(p):
        v = np.asarray(predicate(p))
        if v.shape != () or v.dtype.kind not in "biuf" or (v.dtype.kind == "f" and np.isnan(v)):
            raise ValueError(
                f"{where}: predicate({p}) must return one bool, got {v!r} (shape {v.shape})."
            )
        return bool(v)

    plo, phi = truth(lo), truth(hi)
    if plo == phi:
        raise ValueError(f"{where}: predicate is {plo} at both ends of [{lo}, {hi}]; no bracket.")
    it = 0
    while hi - lo > tol and it < max_iter:
        mid = 0.5 * (lo + hi)
        if truth(mid) == plo:
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
