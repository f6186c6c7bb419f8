"""Collapse audits of Power Law Graph Attention: invariance order parameter, rank-one audit,
Perron–Frobenius check, RoPE commutant residual, cache fidelity and non-causality.

Array-only audits act on one tensor (batches by `vmap`, or by the leading axes where said) and
compute in the widest float dtype JAX allows (float64 when x64 is on; call them inside
`with jax.enable_x64(True):` for float64 without touching the global setting). They are safe at
zero, repeated and extreme values: an all-zero or constant matrix counts as fully collapsed, and
their gradients are finite there.

Source: the docs, theory/plga ("Collapse audits"); Gokden, "PLDR-LLMs learn a generalizable tensor
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
    "TENSORS",
    "InvarianceAudit",
    "deductive_tensors",
    "invariance_audit",
    "perturb_suffix",
    "noncausality_audit",
    "cache_fidelity",
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

    Source: Gokden, arXiv:2603.23539 (the order parameter of the deductive outputs'
    invariance); the normalisations are described in the docs, theory/plga ("Collapse
    audits").
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


def _normalised_singular_values(m: Array) -> tuple[Array, Array]:
    """`(σ(M/c), c)`: the singular values (descending) of `M / c`, `c = max|M|` per matrix (1 for
    the zero matrix; no gradient through `c`). Ratios of singular values are taken from these, not
    from `σ(M) = c·σ(M/c)`: for `σ₁ ≲ 1e-19` in float32, `σ₁²` underflows and the gradient of
    `σ_i/σ₁` through the unscaled values is `inf·0 = NaN`."""
    c = jax.lax.stop_gradient(jnp.max(jnp.abs(m), axis=(-2, -1), keepdims=True))
    c = jnp.where(c > 0, c, 1)
    return jnp.linalg.svd(m / c, compute_uv=False), c[..., 0]


def _singular_values(m: Array) -> Array:
    """Singular values of the last two axes, descending, computed on a rescaled copy."""
    s, c = _normalised_singular_values(m)
    return s * c


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

    Source: the docs, theory/plga ("Rank-one audit").
    """
    m = _wide(m)
    _check_matrix("m", m, "rank_one_audit")
    sn, scale = _normalised_singular_values(m)  # ratios from σ(M/max|M|): finite gradients
    s = sn * scale
    s1 = sn[..., 0]
    r = _safe_div(sn, s1[..., None])  # s / s₁ ∈ [0, 1]; all zero for the zero matrix
    rank = jnp.sum(sn > rtol * s1[..., None], axis=-1)
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

    **Arguments:** `g` of shape `(..., dk, dk)`, `dk` even (the leading axes are a batch);
    `rope` the pairing of the coordinates into RoPE planes (`"interleaved"` or `"half"`).

    **Returns:** the residual in `[0, 1]`, shape `(...)`.

    **Raises:** `ValueError` if `g` has fewer than 2 axes or is not square.

    Source: the RoPE rotations of Su et al., arXiv:2104.09864; folding a collapsed `G_LM`
    (arXiv:2502.13502) into the query projection is exact iff this residual is 0 (the docs,
    theory/plga, "Collapse").
    """
    g = _wide(g)
    _check_matrix("g", g, "rope_commutant_residual")
    if g.shape[-2] != g.shape[-1]:
        raise ValueError(f"rope_commutant_residual: `g` must be square, got shape {g.shape}.")
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

    **Raises:** `ValueError` if `g` is complex, not 4-dimensional and square, or has NaN or
    infinite entries (its singular value decomposition is then undefined).
    """
    if np.iscomplexobj(g):  # float64 would drop the imaginary part with only a warning
        raise ValueError(
            f"energy_curvature_audit: `g` must be real, got {np.asarray(g).dtype} entries."
        )
    g = np.asarray(g, dtype=np.float64)
    if g.ndim != 4 or g.shape[-1] != g.shape[-2]:
        raise ValueError(
            f"energy_curvature_audit: `g` must have shape (layers, heads, dk, dk), got {g.shape}."
        )
    finite = np.isfinite(g)
    if not finite.all():
        where = [int(i) for i in np.argwhere(~finite)[0]]
        raise ValueError(
            f"energy_curvature_audit: `g` has {int((~finite).sum())} non-finite entries (NaN "
            f"or inf), the first at index {where}."
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


# ============================================================================= model audits
#
# These act on a `PLDRLLM` (jaxattn.plga._model). They run in the model's dtype; the order
# parameters are then formed in the widest float available.

TENSORS = ("A", "A_LM", "A_P", "G_LM")
"""The deductive tensors audited, in order."""


def _stack_deductive(deductive) -> dict[str, Array]:
    """Per tensor name, `(layers, heads, dk, dk)` from a list of per-layer `DeductiveOutputs`.

    With a causal density operator the tensors carry a leading `seq` axis; the last position
    (the whole sequence) is kept. Tensors that the model does not compute (SDPA, injected `G`)
    are left out.
    """
    out = {}
    for name in TENSORS:
        per_layer = [getattr(d, name) for d in deductive]
        if any(t is None for t in per_layer):
            continue
        per_layer = [t[-1] if t.ndim == 4 else t for t in per_layer]
        out[name] = jnp.stack(per_layer)
    return out


def _check_batch_ids(model, ids, fn: str) -> Array:
    ids = jnp.asarray(ids)
    if ids.ndim != 2 or not jnp.issubdtype(ids.dtype, jnp.integer):
        raise ValueError(
            f"{fn}: `ids` must be integer token ids of shape (prompts, seq), "
            f"got {ids.shape} {ids.dtype}."
        )
    for row in np.asarray(ids):
        model.check_ids(row)
    return ids


@eqx.filter_jit
def _deductive_batch(model, ids):
    return jax.vmap(lambda i: _stack_deductive(model(i)[1]))(ids)


def deductive_tensors(model, ids: Int[ArrayLike, "*prompts seq"]) -> dict[str, Array]:
    """The deductive tensors of a model on one prompt `(seq,)` or a batch `(prompts, seq)`.

    **Returns:** a dict `{"A", "A_LM", "A_P", "G_LM"}` of arrays
    `([prompts,] layers, heads, dk, dk)` (with a causal density operator, the tensors of the last
    position).
    """
    ids = jnp.asarray(ids)
    single = ids.ndim == 1
    ids = _check_batch_ids(model, ids[None] if single else ids, "deductive_tensors")
    out = _deductive_batch(model, ids)
    return {k: v[0] for k, v in out.items()} if single else out


class InvarianceAudit(eqx.Module):
    """Invariance order parameters of a model over pairs of prompts.

    - `by_mean_abs`, `by_rms`: `(pairs, layers, tensors)`, see `invariance_order_parameter`;
    - `pairs`: `(pairs, 2)` prompt indices;
    - `tensors`: the tensor names along the last axis (static).
    """

    by_mean_abs: Float[Array, "pairs layers tensors"]
    by_rms: Float[Array, "pairs layers tensors"]
    pairs: Int[Array, "pairs 2"]
    tensors: tuple[str, ...] = eqx.field(static=True)

    def summary(self) -> dict:
        """`{variant: {tensor: [per-layer summarise(...) over pairs]}}` (host floats)."""
        out = {}
        for variant in ("by_mean_abs", "by_rms"):
            v = np.asarray(getattr(self, variant))
            out[variant] = {
                name: [summarise(v[:, layer, t]) for layer in range(v.shape[1])]
                for t, name in enumerate(self.tensors)
            }
        return out


PAIR_CHUNK = 256
"""`invariance_audit` computes the pairs this many at a time (`lax.map` with `batch_size`), so its
working memory is that of `PAIR_CHUNK` pairs, not of all `prompts·(prompts − 1)/2` of them."""


@eqx.filter_jit
def _pair_order_parameters(tensors: dict, pairs):
    def one(ij):
        i, j = ij[0], ij[1]
        cols = [jax.vmap(invariance_order_parameter)(tensors[n][i], tensors[n][j]) for n in tensors]
        return (
            jnp.stack([c.by_mean_abs for c in cols], axis=-1),
            jnp.stack([c.by_rms for c in cols], axis=-1),
        )

    # One chunk of pairs at a time: a single vmap over every pair would hold each pair's
    # gathered tensors and intermediates at once (memory quadratic in the prompt count).
    return jax.lax.map(one, pairs, batch_size=min(PAIR_CHUNK, pairs.shape[0]))


def invariance_audit(model, ids: Int[ArrayLike, "prompts seq"], *, pairs=None) -> InvarianceAudit:
    """Invariance order parameter of every layer and deductive tensor over pairs of prompts.

    Runs the model once per prompt (vmapped, one compilation per shape), then for each pair
    `(i, j)` and layer `l` computes `invariance_order_parameter(T_l(ids_i), T_l(ids_j))` for
    `T ∈ {A, A_LM, A_P, G_LM}`. Prompts that share a prefix and differ in their continuation
    audit invariance to the continuation; unrelated prompts audit invariance to the input.
    A fully collapsed model gives exactly 0.

    **Arguments:** `model` (a `PLDRLLM`); `ids` of shape `(prompts, seq)`, `prompts ≥ 2`;
    `pairs`: `(pairs, 2)` indices (default: every `i < j`).

    **Returns:** an `InvarianceAudit` (`.summary()` gives the distribution over pairs).

    **Raises:** `ValueError` for fewer than two prompts, bad ids, or a model without deductive
    tensors (SDPA).
    """
    ids = _check_batch_ids(model, ids, "invariance_audit")
    n = ids.shape[0]
    if n < 2:
        raise ValueError(f"invariance_audit: need at least 2 prompts, got {n}.")
    if pairs is None:
        pairs = np.stack(np.triu_indices(n, k=1), axis=-1)
    pairs = jnp.asarray(pairs, dtype=jnp.int32)
    if pairs.ndim != 2 or pairs.shape[1] != 2:
        raise ValueError(
            f"invariance_audit: `pairs` must have shape (pairs, 2), got {pairs.shape}."
        )
    tensors = _deductive_batch(model, ids)
    if not tensors:
        raise ValueError("invariance_audit: the model computes no deductive tensors (SDPA).")
    by_mean, by_rms = _pair_order_parameters(tensors, pairs)
    return InvarianceAudit(by_mean, by_rms, pairs, tuple(tensors))


def perturb_suffix(
    ids: Int[ArrayLike, " seq"], split: int, *, key, low: int = 4, vocab_size: int
) -> Array:
    """`ids` with every position `≥ split` replaced by a random id in `[low, vocab_size)` that
    differs from the original one (ids below `low` are the special tokens)."""
    ids = jnp.asarray(ids)
    seq = ids.shape[0]
    if not 0 < split < seq:
        raise ValueError(f"perturb_suffix: `split` must be in (0, {seq}), got {split}.")
    shift = jax.random.randint(key, (seq,), 1, vocab_size - low)
    new = low + (ids - low + shift) % (vocab_size - low)
    return jnp.where(jnp.arange(seq) >= split, new.astype(ids.dtype), ids)


@eqx.filter_jit
def _noncausality(model, ids, alt_ids, split):
    la, da = model(ids)
    lb, db = model(alt_ids)
    early = jnp.arange(ids.shape[0]) < split
    dlogit = jnp.max(jnp.abs(la - lb), axis=-1)
    scale = jnp.max(jnp.abs(la))
    out = {
        "max_abs_dlogit": jnp.max(jnp.where(early, dlogit, 0)),
        "rel_dlogit": _safe_div(jnp.max(jnp.where(early, dlogit, 0)), scale),
        "per_position_dlogit": jnp.where(early, dlogit, jnp.nan),
        "argmax_agreement": jnp.sum(early & (jnp.argmax(la, -1) == jnp.argmax(lb, -1)))
        / jnp.sum(early),
    }
    ta, tb = _stack_deductive(da), _stack_deductive(db)
    for name in ta:
        x, y = _wide(ta[name]), _wide(tb[name])
        num = jnp.sqrt(jnp.sum(jnp.square(x - y), axis=(-3, -2, -1)))
        out[f"rel_d{name}"] = _safe_div(num, jnp.sqrt(jnp.sum(jnp.square(x), axis=(-3, -2, -1))))
    return out


def noncausality_audit(
    model, ids: Int[ArrayLike, " seq"], alt_ids: Int[ArrayLike, " seq"], *, split: int
) -> dict:
    """How much changing the tokens at positions `≥ split` moves earlier logits and `G_LM`.

    In the reference model the density operator sums over all positions, so later tokens
    change `A … G_LM` and, through them, the logits at earlier positions: the model is not
    causal. A causal model (SDPA, or `causal_density=True`) gives 0.

    **Arguments:** `model`; `ids` and `alt_ids` `(seq,)`, equal before `split`
    (`perturb_suffix` makes one); `split`.

    **Returns:** a dict of host values: `max_abs_dlogit` and `rel_dlogit` (over positions
    `< split`, relative to `max |logit|`), `per_position_dlogit` `(seq,)` (NaN from `split` on),
    `argmax_agreement` over positions `< split`, and per layer `rel_dA … rel_dG_LM`
    (`‖ΔT‖_F / ‖T‖_F`).

    **Raises:** `ValueError` if the prompts differ before `split` or have different shapes.
    """
    ids, alt_ids = model.check_ids(ids), model.check_ids(alt_ids, name="alt_ids")
    if ids.shape != alt_ids.shape:
        raise ValueError(
            f"noncausality_audit: `ids` {ids.shape} and `alt_ids` {alt_ids.shape} differ in shape."
        )
    if not 0 < split < ids.shape[0]:
        raise ValueError(
            f"noncausality_audit: `split` must be in (0, {ids.shape[0]}), got {split}."
        )
    if bool(jnp.any(ids[:split] != alt_ids[:split])):
        raise ValueError("noncausality_audit: `ids` and `alt_ids` must agree before `split`.")
    out = _noncausality(model, ids, alt_ids, jnp.asarray(split))
    return {k: np.asarray(v).tolist() for k, v in out.items()}


@eqx.filter_jit
def _prefix_state(model, buf, length):
    """Uncached logits of position `length − 1` and `G_LM` per layer, with the density operator
    over the first `length` positions of `buf` only (a full recomputation of that prefix, with
    fixed-size buffers so that every length shares one compilation)."""
    max_len = buf.shape[0]
    pos = jnp.arange(max_len)
    valid = pos < length
    allowed = (
        jnp.tril(jnp.ones((max_len, max_len), bool))
        & (valid & (buf != model.config.pad_id))[None, :]
    )
    x, deductive, _ = model.run_layers(
        model.embed(buf),
        allowed=allowed,
        positions=pos,
        G=[None] * model.config.num_layers,
        density_weights=valid.astype(model.dtype),
    )
    logits = model.final_layer(jax.lax.dynamic_index_in_dim(x, length - 1, 0, keepdims=False))
    Gs = [d.G_LM for d in deductive]
    if any(g is None for g in Gs):
        return logits, None
    return logits, jnp.stack([g[length - 1] if g.ndim == 4 else g for g in Gs])


def cache_fidelity(
    model, prompt: Int[ArrayLike, " seq"], *, max_new_tokens: int = 8, caches=("kv", "kvg")
) -> dict:
    """Cached (KV, KV+G) against uncached greedy decoding.

    The uncached greedy path (`cache="none"`: every step a full recomputation) gives the tokens
    `t₀ … t_{N−1}` and, at every step, the reference logits and `G_LM` of the whole sequence.
    Each cache is then fed the same tokens (teacher forcing, so steps stay aligned) and its
    logits compared; its own free-running greedy tokens are compared too.

    **Arguments:** `model` (a `PLDRLLM`), `prompt` `(seq,)`, `max_new_tokens` `N ≥ 1`, `caches`.

    **Returns:** a dict with `tokens` (the uncached greedy path) and per cache:
    `max_abs_dlogit` `(N,)` and `rel_dlogit` `(N,)` (relative to `max |logit|` of the reference
    step), `argmax_agreement` (fraction of steps, teacher-forced), `token_agreement` and
    `first_divergence` (free running; `N` if none), and `rel_dG` `(N, layers)`: the relative
    Frobenius distance between the frozen prompt `G_LM` the cache uses and the `G_LM` of the
    whole sequence at that step (the same for KV and KV+G: KV freezes `A`, hence `G_LM`).
    Step 0 is the prompt itself (cached and uncached agree there).
    """
    from ._cache import decode_step, prefill

    prompt = model.check_ids(prompt, name="prompt")
    n = int(max_new_tokens)
    if n < 1:
        raise ValueError(f"cache_fidelity: `max_new_tokens` must be ≥ 1, got {n}.")
    L0 = prompt.shape[0]
    max_len = L0 + n - 1
    buf = jnp.full((max_len,), model.config.pad_id, prompt.dtype).at[:L0].set(prompt)
    tokens, ref_logits, ref_G = [], [], []
    for t in range(n):  # the uncached greedy path, one compilation for every step
        lg, g = _prefix_state(model, buf, jnp.asarray(L0 + t))
        tok = jnp.argmax(lg).astype(prompt.dtype)
        tokens.append(tok)
        ref_logits.append(lg)
        ref_G.append(g)
        if t < n - 1:
            buf = buf.at[L0 + t].set(tok)
    ref_logits = jnp.stack(ref_logits)
    scale = jnp.max(jnp.abs(ref_logits), axis=-1)
    out = {"tokens": [int(t) for t in tokens], "prompt_length": L0}
    for kind in caches:
        logits, cache0 = prefill(model, prompt, cache=kind, max_len=max_len)
        forced, free = [logits[-1]], [jnp.argmax(logits[-1]).astype(prompt.dtype)]
        cache_forced, cache_free = cache0, cache0.copy()  # decode_step consumes its cache
        for t in range(n - 1):
            lg, cache_forced = decode_step(model, cache_forced, tokens[t])
            forced.append(lg)
            lg, cache_free = decode_step(model, cache_free, free[-1])
            free.append(jnp.argmax(lg).astype(prompt.dtype))
        forced = jnp.stack(forced)
        d = jnp.max(jnp.abs(forced - ref_logits), axis=-1)
        same = np.asarray(jnp.stack(free) == jnp.stack(tokens))
        res = {
            "max_abs_dlogit": np.asarray(d).tolist(),
            "rel_dlogit": np.asarray(_safe_div(d, scale)).tolist(),
            "argmax_agreement": float(
                np.mean(np.asarray(jnp.argmax(forced, -1) == jnp.argmax(ref_logits, -1)))
            ),
            "token_agreement": float(same.mean()),
            "first_divergence": int(np.argmin(same)) if not same.all() else n,
        }
        if ref_G[0] is not None:
            G = _wide(jnp.stack(ref_G))
            num = jnp.sqrt(jnp.sum(jnp.square(G - G[:1]), axis=(-3, -2, -1)))
            den = jnp.sqrt(jnp.sum(jnp.square(G), axis=(-3, -2, -1)))
            res["rel_dG"] = np.asarray(_safe_div(num, den)).tolist()
        out[kind] = res
    return out
