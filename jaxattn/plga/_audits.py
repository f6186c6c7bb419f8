"""Collapse audits of Power Law Graph Attention: invariance order parameter, rank-one audit,
Perron–Frobenius check, RoPE commutant residual, cache fidelity and non-causality.

Array-only audits act on one tensor (batches by `vmap`, or by the leading axes where said) and
compute in the widest float dtype JAX allows (float64 when x64 is on; call them inside
`with jax.enable_x64(True):` for float64 without touching the global setting). They are safe at
zero, repeated and extreme values: an all-zero or constant matrix counts as fully collapsed, and
their gradients are finite there.

Source: MATH.md, Part 2, "Collapse audits"; Gokden, "PLDR-LLMs learn a generalizable tensor
operator ..." (2025) for the order parameter and the rank-one audit.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float, Int

__all__ = [
    "EPS_F32",
    "RANK_RTOL",
    "OrderParameter",
    "RankOneAudit",
    "PerronFrobeniusAudit",
    "invariance_order_parameter",
    "rank_one_audit",
    "head_spread",
    "perron_frobenius_audit",
    "rope_rotation",
    "rope_commutant_projection",
    "rope_commutant_residual",
    "summarise",
    "as_host",
    "energy_curvature_audit",
]

EPS_F32 = float(np.finfo(np.float32).eps)
RANK_RTOL = 64.0 * EPS_F32
"""Relative threshold of the numerical rank: `#{s > 64·eps_f32·s₁}` (as published)."""


# ----------------------------------------------------------------------------- helpers


def _wide(x: ArrayLike) -> Array:
    """`x` as the widest real float JAX currently allows (float64 under x64, else float32)."""
    return jnp.asarray(x, dtype=jnp.result_type(float))


def _safe_div(num: Array, den: Array) -> Array:
    """`num/den`, and 0 where `den == 0` (value and gradient: the double-`where` trick)."""
    ok = den > 0
    return jnp.where(ok, num / jnp.where(ok, den, 1), 0)


def _safe_sqrt(x: Array) -> Array:
    """`√x` for `x ≥ 0` with a finite (zero) gradient at `x = 0`."""
    ok = x > 0
    return jnp.where(ok, jnp.sqrt(jnp.where(ok, x, 1)), 0)


def _scale(*xs: Array) -> Array:
    """A positive scale `max |x|` (1 where everything is zero), with no gradient.

    Dividing by it before squaring keeps sums of squares finite for entries near the float
    range limits; every audit is scale-invariant, so the gradient is unaffected.
    """
    m = jnp.max(jnp.stack([jnp.max(jnp.abs(x)) for x in xs]))
    return jax.lax.stop_gradient(jnp.where(m > 0, m, 1))


def _mean_square(x: Array) -> Array:
    return jnp.mean(jnp.square(x))


def _check_matrix(name: str, x: Array, fn: str) -> None:
    if x.ndim < 2:
        raise ValueError(
            f"{fn}: `{name}` must have at least 2 axes (..., m, n), got shape {x.shape}."
        )


# ----------------------------------------------------------------------------- order parameter


class OrderParameter(eqx.Module):
    """Invariance order parameter of a deductive tensor between two runs.

    - `by_mean_abs = rms(X − Y) / ½(mean|X| + mean|Y|)` (the published normalisation);
    - `by_rms = rms(X − Y) / ½(rms X + rms Y)`, bounded by 2 (triangle inequality).

    Both are 0 for identical runs (including two all-zero tensors): a collapsed tensor.
    """

    by_mean_abs: Float[Array, "*batch"]
    by_rms: Float[Array, "*batch"]


@eqx.filter_jit
def invariance_order_parameter(
    x: Float[ArrayLike, ...], y: Float[ArrayLike, ...]
) -> OrderParameter:
    """Invariance order parameter of one tensor between two runs (all axes reduced).

    `δ = rms(X − Y) / m`, with `m = ½(mean|X| + mean|Y|)` (`by_mean_abs`) or
    `m = ½(rms X + rms Y)` (`by_rms`, so `0 ≤ δ ≤ 2`). `0/0 := 0`.

    **Arguments:** `x`, `y`: the same deductive tensor (e.g. one layer's `A_LM`, shape
    `(heads, dk, dk)`) from two runs on different inputs or continuations; same shape.

    **Returns:** an `OrderParameter` of scalars; `vmap` for batches.

    **Raises:** `ValueError` if the shapes differ.

    Source: MATH.md, Part 2, "Collapse audits".
    """
    x, y = _wide(x), _wide(y)
    if x.shape != y.shape:
        raise ValueError(
            "invariance_order_parameter: `x` and `y` must have the same shape, "
            f"got {x.shape} and {y.shape}."
        )
    c = _scale(x, y)
    x, y = x / c, y / c
    diff = _safe_sqrt(_mean_square(x - y))
    mean_abs = 0.5 * (jnp.mean(jnp.abs(x)) + jnp.mean(jnp.abs(y)))
    mean_rms = 0.5 * (_safe_sqrt(_mean_square(x)) + _safe_sqrt(_mean_square(y)))
    return OrderParameter(by_mean_abs=_safe_div(diff, mean_abs), by_rms=_safe_div(diff, mean_rms))


# ----------------------------------------------------------------------------- rank-one audit


class RankOneAudit(eqx.Module):
    """Singular-value audit of matrices (leading axes are a batch).

    - `singular_values` (descending, float64 under x64);
    - `numerical_rank = #{s > rtol·s₁}` (0 for the zero matrix);
    - `s2_over_s1` (0 when `s₁ = 0`);
    - `rank_one_deficit = Σ_{i≥2} s_i² / Σ s_i²` (0 for rank ≤ 1, smooth, differentiable);
    - `row_spread = ‖M − 1 r̄ᵀ‖_F / ‖M‖_F` with `r̄` the mean row: 0 when all rows are identical;
    - `collapsed`: `numerical_rank ≤ 1` (an all-zero or constant matrix is fully collapsed).
    """

    singular_values: Float[Array, "*batch k"]
    numerical_rank: Int[Array, "*batch"]
    s2_over_s1: Float[Array, "*batch"]
    rank_one_deficit: Float[Array, "*batch"]
    row_spread: Float[Array, "*batch"]
    collapsed: Bool[Array, "*batch"]


def _singular_values(m: Array) -> Array:
    """Singular values of the last two axes, descending, computed on a rescaled copy."""
    c = jax.lax.stop_gradient(jnp.max(jnp.abs(m), axis=(-2, -1), keepdims=True))
    c = jnp.where(c > 0, c, 1)
    return jnp.linalg.svd(m / c, compute_uv=False) * c[..., 0]


@eqx.filter_jit
def rank_one_audit(
    m: Float[ArrayLike, "*batch rows cols"], *, rtol: float = RANK_RTOL
) -> RankOneAudit:
    """Rank-one audit of a matrix or a batch of matrices (e.g. `A` of shape `(heads, dk, dk)`).

    Singular values come from an SVD of `M / max|M|` (so entries near the float limits do not
    overflow), in float64 under x64. Only singular values enter (no singular vectors), so
    `jax.grad` is finite at repeated and at zero singular values.

    **Arguments:** `m` of shape `(..., rows, cols)`; `rtol` the relative rank threshold
    (default `64·eps_f32`, as published).

    **Returns:** a `RankOneAudit` with batch shape `m.shape[:-2]`.

    **Raises:** `ValueError` if `m` has fewer than 2 axes.

    Source: MATH.md, Part 2, "Rank-one audit".
    """
    m = _wide(m)
    _check_matrix("m", m, "rank_one_audit")
    s = _singular_values(m)
    s1 = s[..., 0]
    r = _safe_div(s, s1[..., None])  # s / s₁ ∈ [0, 1]; all zero for the zero matrix
    rank = jnp.sum(s > rtol * s1[..., None], axis=-1)
    s2 = r[..., 1] if s.shape[-1] > 1 else jnp.zeros_like(s1)
    tail = jnp.sum(jnp.square(r[..., 1:]), axis=-1)
    deficit = _safe_div(tail, 1 + tail) * (s1 > 0)

    c = jax.lax.stop_gradient(jnp.max(jnp.abs(m), axis=(-2, -1), keepdims=True))
    mc = m / jnp.where(c > 0, c, 1)
    centred = mc - jnp.mean(mc, axis=-2, keepdims=True)
    spread = _safe_div(
        _safe_sqrt(jnp.sum(jnp.square(centred), axis=(-2, -1))),
        _safe_sqrt(jnp.sum(jnp.square(mc), axis=(-2, -1))),
    )
    return RankOneAudit(
        singular_values=s,
        numerical_rank=rank,
        s2_over_s1=s2,
        rank_one_deficit=deficit,
        row_spread=spread,
        collapsed=rank <= 1,
    )


@eqx.filter_jit
def head_spread(m: Float[ArrayLike, "heads rows cols"]) -> Float[Array, ""]:
    """Identity of heads: `sqrt(mean_h ‖M_h − M̄‖²_F / mean_h ‖M_h‖²_F)`, `M̄` the head mean.

    0 when every head holds the same matrix (including all zero); at most 1.

    **Arguments:** `m` of shape `(heads, rows, cols)`, one layer's tensor.

    **Raises:** `ValueError` if `m` is not 3-dimensional.
    """
    m = _wide(m)
    if m.ndim != 3:
        raise ValueError(f"head_spread: `m` must have shape (heads, rows, cols), got {m.shape}.")
    m = m / _scale(m)
    centred = m - jnp.mean(m, axis=0, keepdims=True)
    return _safe_sqrt(_safe_div(jnp.sum(jnp.square(centred)), jnp.sum(jnp.square(m))))


# ----------------------------------------------------------------------------- Perron–Frobenius


class PerronFrobeniusAudit(eqx.Module):
    """Perron–Frobenius structure of square matrices (leading axes are a batch).

    - `min_entry`, `positive_fraction`, `entrywise_positive` (every entry > 0: the theorem
      applies and guarantees what follows);
    - `dominant_eigenvalue` (largest modulus; real part) and `dominant_imag`;
    - `dominant_real_positive`: `|Im λ₁| ≤ tol·|λ₁|` and `Re λ₁ > 0`;
    - `perron_vector`: the eigenvector of `λ₁`, scaled so its largest-modulus entry is 1 (real
      part), and `perron_vector_positive` (every entry > 0);
    - `spectral_gap = 1 − |λ₂|/|λ₁|` (0 for the zero matrix).
    """

    min_entry: Float[Array, "*batch"]
    positive_fraction: Float[Array, "*batch"]
    entrywise_positive: Bool[Array, "*batch"]
    dominant_eigenvalue: Float[Array, "*batch"]
    dominant_imag: Float[Array, "*batch"]
    dominant_real_positive: Bool[Array, "*batch"]
    perron_vector: Float[Array, "*batch n"]
    perron_vector_positive: Bool[Array, "*batch"]
    spectral_gap: Float[Array, "*batch"]


@eqx.filter_jit
def perron_frobenius_audit(m: Float[ArrayLike, "*batch n n"]) -> PerronFrobeniusAudit:
    """Perron–Frobenius check (e.g. of `A_LM`, which is entrywise ≥ ε > 0 by construction).

    For an entrywise positive matrix the theorem guarantees a simple real dominant eigenvalue
    `λ₁ > 0` with an entrywise positive eigenvector and a strictly positive spectral gap; for a
    matrix with negative entries (e.g. `G_LM`) the same quantities are reported but nothing is
    guaranteed. Uses `jnp.linalg.eig` (a CPU-only kernel in JAX).

    **Arguments:** `m` of shape `(..., n, n)`.

    **Returns:** a `PerronFrobeniusAudit` with batch shape `m.shape[:-2]`.

    **Raises:** `ValueError` if the last two axes are not square.
    """
    m = _wide(m)
    _check_matrix("m", m, "perron_frobenius_audit")
    if m.shape[-1] != m.shape[-2]:
        raise ValueError(f"perron_frobenius_audit: `m` must be square, got shape {m.shape}.")
    c = jnp.max(jnp.abs(m), axis=(-2, -1))
    c = jnp.where(c > 0, c, 1)
    mc = m / c[..., None, None]
    n = m.shape[-1]
    lam, vec = jnp.linalg.eig(mc)
    order = jnp.argsort(-jnp.abs(lam), axis=-1)
    lam = jnp.take_along_axis(lam, order, axis=-1)
    vec = jnp.take_along_axis(vec, order[..., None, :], axis=-1)
    lam1 = lam[..., 0]
    abs1 = jnp.abs(lam1)
    tol = jnp.sqrt(jnp.finfo(m.dtype).eps) * n
    real_pos = (jnp.abs(lam1.imag) <= tol * abs1) & (lam1.real > tol * abs1) & (abs1 > 0)
    v = vec[..., :, 0]
    pivot = jnp.take_along_axis(v, jnp.argmax(jnp.abs(v), axis=-1)[..., None], axis=-1)
    v = v / jnp.where(jnp.abs(pivot) > 0, pivot, 1)
    v_real = v.real
    v_pos = (jnp.min(v_real, axis=-1) > 0) & (jnp.max(jnp.abs(v.imag), axis=-1) <= tol) & real_pos
    gap = 1 - _safe_div(jnp.abs(lam[..., 1]), abs1) if n > 1 else jnp.where(abs1 > 0, 1.0, 0.0)
    gap = jnp.where(abs1 > 0, gap, 0.0)
    return PerronFrobeniusAudit(
        min_entry=jnp.min(m, axis=(-2, -1)),
        positive_fraction=jnp.mean(m > 0, axis=(-2, -1), dtype=m.dtype),
        entrywise_positive=jnp.all(m > 0, axis=(-2, -1)),
        dominant_eigenvalue=lam1.real * c,
        dominant_imag=lam1.imag * c,
        dominant_real_positive=real_pos,
        perron_vector=v_real,
        perron_vector_positive=v_pos,
        spectral_gap=gap,
    )


# ----------------------------------------------------------------------------- RoPE commutant


def _rope_pairs(dk: int, rope: str) -> tuple[np.ndarray, np.ndarray]:
    """Feature indices `(first, second)` of the RoPE pairs, pair `i` having frequency index `i`."""
    if dk % 2 or dk < 2:
        raise ValueError(f"RoPE needs an even head width, got dk = {dk}.")
    i = np.arange(dk // 2)
    if rope == "interleaved":
        return 2 * i, 2 * i + 1
    if rope == "half":
        return i, i + dk // 2
    raise ValueError(f"`rope` must be 'interleaved' or 'half', got {rope!r}.")


def rope_rotation(
    position: float | Float[ArrayLike, ""],
    dk: int,
    *,
    base: float = 10000.0,
    rope: str = "interleaved",
) -> Float[Array, "dk dk"]:
    """The RoPE rotation `R(p)` acting on a column vector: `x̃ = R(p) x`.

    Pair `i` (features `(2i, 2i+1)` for `rope="interleaved"`, `(i, i + dk/2)` for `"half"`) is
    rotated by `θ_i = p · base^(−2i/dk)`. Angles are formed in the widest float available.

    **Arguments:** `position` (scalar), `dk` (even head width), `base`, `rope`.

    **Returns:** an orthogonal `(dk, dk)` matrix.
    """
    a, b = _rope_pairs(dk, rope)
    freqs = _wide(base) ** (-2 * _wide(np.arange(dk // 2)) / dk)
    theta = _wide(position) * freqs
    c, s = jnp.cos(theta), jnp.sin(theta)
    r = jnp.zeros((dk, dk), dtype=theta.dtype)
    r = r.at[a, a].set(c).at[a, b].set(-s).at[b, a].set(s).at[b, b].set(c)
    return r


@eqx.filter_jit
def rope_commutant_projection(
    g: Float[ArrayLike, "*batch dk dk"], *, rope: str = "interleaved"
) -> Float[Array, "*batch dk dk"]:
    """Orthogonal (Frobenius) projection of `G` onto the commutant of the RoPE rotations.

    With the `dk/2` frequencies `θ_i = base^(−2i/dk) ∈ (0, 1]` all distinct, `R(p) G = G R(p)`
    for every integer position `p` holds iff `G` is block-diagonal over the RoPE pairs with
    every 2×2 block of the form `[[a, −b], [b, a]]` (a complex scalar acting on the pair):
    the block `(i, j)` must satisfy `R(pθ_i) G_ij R(−pθ_j) = G_ij`; its complex-linear part turns
    by `e^{ip(θ_i−θ_j)}` and its anti-linear part by `e^{−ip(θ_i+θ_j)}`, and neither
    `θ_i − θ_j` (i ≠ j) nor `θ_i + θ_j` is a multiple of 2π. The projection keeps
    `a = (g₀₀ + g₁₁)/2`, `b = (g₁₀ − g₀₁)/2` per diagonal block and zeroes everything else.
    It does not depend on `base`.

    **Arguments:** `g` of shape `(..., dk, dk)`; `rope` the pairing (`"interleaved"` or `"half"`).

    **Returns:** the projection, same shape.
    """
    g = _wide(g)
    _check_matrix("g", g, "rope_commutant_projection")
    dk = g.shape[-1]
    if g.shape[-2] != dk:
        raise ValueError(f"rope_commutant_projection: `g` must be square, got shape {g.shape}.")
    i, j = _rope_pairs(dk, rope)
    a = 0.5 * (g[..., i, i] + g[..., j, j])
    b = 0.5 * (g[..., j, i] - g[..., i, j])
    out = jnp.zeros_like(g)
    out = out.at[..., i, i].set(a).at[..., j, j].set(a).at[..., j, i].set(b).at[..., i, j].set(-b)
    return out


@eqx.filter_jit
def rope_commutant_residual(
    g: Float[ArrayLike, "*batch dk dk"], *, rope: str = "interleaved"
) -> Float[Array, "*batch"]:
    """Relative distance of `G` from the RoPE commutant: `‖G − Π(G)‖_F / ‖G‖_F` (0 for `G = 0`).

    0 means `G` commutes with every rotation, so `q̃ G k̃ᵀ = rope(G ᵀq)·rope(k)` and `G` folds
    exactly into the query projection; 1 means `G` has no component in the commutant.

    A rank-one `G = u vᵀ` is never in the commutant (its nonzero elements have even rank):
    per 2×2 block `‖Π(u_i v_iᵀ)‖² = ½‖u_i‖²‖v_i‖²`, so the residual is at least `1/√2`, and
    about `√(1 − 1/dk)` when `u` and `v` are spread over all pairs.
    """
    g = _wide(g)
    c = jax.lax.stop_gradient(jnp.max(jnp.abs(g), axis=(-2, -1), keepdims=True))
    g = g / jnp.where(c > 0, c, 1)
    res = g - rope_commutant_projection(g, rope=rope)
    return _safe_div(
        _safe_sqrt(jnp.sum(jnp.square(res), axis=(-2, -1))),
        _safe_sqrt(jnp.sum(jnp.square(g), axis=(-2, -1))),
    )


# ----------------------------------------------------------------------------- summaries


def summarise(values: ArrayLike) -> dict[str, float]:
    """Distribution of a set of audit values: count, mean, std, min, quartiles, max (host floats).

    NaN entries are dropped and counted under `"nan"`.
    """
    v = np.asarray(values, dtype=np.float64).ravel()
    nan = int(np.sum(~np.isfinite(v)))
    v = v[np.isfinite(v)]
    if v.size == 0:
        return {"n": 0, "nan": nan}
    q = np.quantile(v, [0.0, 0.25, 0.5, 0.75, 1.0])
    return {
        "n": int(v.size),
        "nan": nan,
        "mean": float(v.mean()),
        "std": float(v.std()),
        "min": float(q[0]),
        "q25": float(q[1]),
        "median": float(q[2]),
        "q75": float(q[3]),
        "max": float(q[4]),
    }


def as_host(tree) -> object:
    """An audit (an Equinox module, dict or list of them) as plain Python: lists, floats, bools.

    Suitable for `json.dump`.
    """
    if isinstance(tree, eqx.Module):
        return {k: as_host(v) for k, v in vars(tree).items()}
    if isinstance(tree, dict):
        return {str(k): as_host(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [as_host(v) for v in tree]
    if isinstance(tree, (jax.Array, np.ndarray, np.generic)):
        return np.asarray(tree).tolist()
    return tree


def _sign_definiteness(v: np.ndarray) -> np.ndarray:
    """Fraction of the entries of each vector (last axis) carrying its majority sign."""
    pos = np.mean(v > 0, axis=-1)
    return np.maximum(pos, 1 - pos)


def energy_curvature_audit(
    g: Float[ArrayLike, "layers heads dk dk"], *, rope: str = "interleaved"
) -> dict:
    """Array-only audit of a stack of (collapsed) energy-curvature tensors `G_LM`.

    Runs in float64 (inside `jax.enable_x64(True)`, leaving the global setting alone) and
    returns host arrays, per layer and head unless said:

    - `singular_values` `(layers, heads, dk)`, `numerical_rank`, `s2_over_s1`,
      `rank_one_deficit`, `row_spread` (from `rank_one_audit`); `head_spread` per layer;
    - `left_sign_definiteness`, `right_sign_definiteness`: fraction of the entries of the
      leading left / right singular vector carrying its majority sign (1 = single-signed: a
      near rank-one `G ≈ s u vᵀ` with `v > 0` has every row a multiple of one positive vector,
      which is what `G = a A_P + b_a` gives when the positive `A_P` is rank one);
    - `perron_frobenius`: `perron_frobenius_audit` of each `G` (the theorem itself needs
      positive entries, which `G_LM` need not have; the flags say what holds);
    - `commutant_residual` (`rope_commutant_residual`).

    **Arguments:** `g` of shape `(layers, heads, dk, dk)`; `rope` the RoPE pairing.

    **Raises:** `ValueError` if `g` is not 4-dimensional and square.
    """
    g = np.asarray(g, dtype=np.float64)
    if g.ndim != 4 or g.shape[-1] != g.shape[-2]:
        raise ValueError(
            f"energy_curvature_audit: `g` must have shape (layers, heads, dk, dk), got {g.shape}."
        )
    with jax.enable_x64(True):
        gj = jnp.asarray(g)
        rank = rank_one_audit(gj)
        heads = jax.vmap(head_spread)(gj)
        pf = perron_frobenius_audit(gj)
        comm = rope_commutant_residual(gj, rope=rope)
        out = {
            "shape": list(g.shape),
            "rope": rope,
            "rank_rtol": RANK_RTOL,
            "singular_values": np.asarray(rank.singular_values),
            "numerical_rank": np.asarray(rank.numerical_rank),
            "s2_over_s1": np.asarray(rank.s2_over_s1),
            "rank_one_deficit": np.asarray(rank.rank_one_deficit),
            "row_spread": np.asarray(rank.row_spread),
            "head_spread": np.asarray(heads),
            "perron_frobenius": {k: np.asarray(v) for k, v in vars(pf).items()},
            "commutant_residual": np.asarray(comm),
        }
    u, _, vt = np.linalg.svd(g)
    out["left_sign_definiteness"] = _sign_definiteness(u[..., :, 0])
    out["right_sign_definiteness"] = _sign_definiteness(vt[..., 0, :])
    return out
