"""The unit sphere S^{d-1}: tangent projection, normalisation, uniform sampling, distances.

All functions act on the last axis and broadcast over leading axes. They are safe at the
points where the naive formulas have singular derivatives (zero vectors, coincident points),
so `jax.grad` through them never returns NaN there.
"""

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

__all__ = ["project_tangent", "normalise", "safe_norm", "sample_uniform", "geodesic_distance"]


def _sum_last(a, keepdims=False):
    """`jnp.sum(a, axis=-1, keepdims=keepdims)`, written out for the small d of this field
    (d ≤ 3): XLA's CPU reduction over a minor axis of 2 or 3 runs ~5× slower than the same
    adds on whole slices (the same sum to one rounding: XLA may fuse a multiply-add)."""
    d = jnp.shape(a)[-1]
    if not 0 < d <= 3:
        return jnp.sum(a, axis=-1, keepdims=keepdims)
    out = a[..., 0]
    for i in range(1, d):
        out = out + a[..., i]
    return out[..., None] if keepdims else out


def safe_norm(x: Float[Array, "... d"], *, keepdims: bool = False) -> Float[Array, "..."]:
    """Euclidean norm over the last axis with a finite (zero) gradient at `x = 0`.

    **Arguments:**

    - `x`: array of shape `(..., d)`.
    - `keepdims`: keep the reduced axis as size 1.

    **Returns:** `|x|` of shape `(...)` (or `(..., 1)`).
    """
    return _norm_from_squares(_sum_last(x * x, keepdims))


def _norm_from_squares(sq):
    """`sqrt(sq)` with a finite (zero) gradient at `sq = 0` (`safe_norm` of a vector whose
    squared norm is `sq`; also the token-major norms of `jaxattn.dynamics`)."""
    positive = sq > 0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, sq, 1)), 0)


def normalise(x: Float[Array, "... d"]) -> Float[Array, "... d"]:
    """Radial projection `x / |x|` onto S^{d-1}.

    A zero vector is returned unchanged (zero), with a finite gradient; callers that must
    reject zero tokens check for them explicitly (see `jaxattn.dynamics.simulate`).

    **Arguments:** `x` of shape `(..., d)`.

    **Returns:** an array of the same shape with unit rows (zero rows stay zero).
    """
    norm = safe_norm(x, keepdims=True)
    return x / jnp.where(norm > 0, norm, 1)


def project_tangent(x: Float[Array, "... d"], v: Float[Array, "... d"]) -> Float[Array, "... d"]:
    """Tangent projection `P⊥_x v = v − <x, v> x` at a point `x` of the sphere.

    `x` is assumed to be a unit vector; for a point off the sphere project at
    `normalise(x)` instead (applying `I − x xᵀ` at `|x| ≠ 1` makes the sphere repelling).

    **Arguments:**

    - `x`: points on the sphere, shape `(..., d)`.
    - `v`: vectors, shape `(..., d)` (broadcast against `x`).

    **Returns:** the tangent components, shape of the broadcast.

    **Raises:** `ValueError` (at trace time, so free under `jit`) if `x` or `v` has no axis,
    their last axes (the dimension d) differ, or their leading axes do not broadcast.

    Source: Geshkovski et al., *A mathematical perspective on Transformers*, eq. (1.1).
    """
    xs, vs = jnp.shape(x), jnp.shape(v)
    if not xs or not vs or xs[-1] != vs[-1]:
        raise ValueError(
            "project_tangent: x and v need the same last axis (the dimension d, points and "
            f"vectors along it), got shapes {xs} and {vs}."
        )
    try:
        jnp.broadcast_shapes(xs, vs)
    except ValueError:
        raise ValueError(
            f"project_tangent: the leading axes of x {xs} and v {vs} do not broadcast."
        ) from None
    return v - _sum_last(x * v, keepdims=True) * x


def sample_uniform(key: PRNGKeyArray, n: int, d: int, *, dtype=None) -> Float[Array, "n d"]:
    """`n` independent points drawn from the uniform (Haar) measure on S^{d-1}.

    **Arguments:**

    - `key`: a JAX PRNG key.
    - `n`: number of tokens (≥ 1).
    - `d`: ambient dimension (≥ 2).
    - `dtype`: floating dtype; the default float dtype of JAX if omitted.

    **Returns:** tokens of shape `(n, d)` with unit rows.

    **Raises:** `ValueError` if `n < 1` or `d < 2`.
    """
    if int(n) < 1:
        raise ValueError(f"sample_uniform: need n >= 1 tokens, got n={n}.")
    if int(d) < 2:
        raise ValueError(f"sample_uniform: need dimension d >= 2, got d={d}.")
    if dtype is None:
        dtype = jnp.result_type(float)
    g = jax.random.normal(key, (int(n), int(d)), dtype=dtype)
    return normalise(g)


def geodesic_distance(x: Float[Array, "... d"], y: Float[Array, "... d"]) -> Float[Array, "..."]:
    """Great-circle distance `arccos <x, y>` between unit vectors, in radians.

    Evaluated as `2 atan2(|x − y|, |x + y|)`, which is accurate near 0 and π and has a
    finite gradient at coincident and antipodal points (where `arccos` does not).

    **Arguments:** `x`, `y` unit vectors of shape `(..., d)`.

    **Returns:** distances in `[0, π]`, shape `(...)`.
    """
    return 2 * jnp.arctan2(safe_norm(x - y), safe_norm(x + y))


# Rational approximation of atan on [0, tan(π/8)] after reduction from [0, ∞) (the
# classical Cephes form `r + r³ P(r²)/Q(r²)`, P of degree 4, Q monic of degree 5): 1 ulp in
# float64 against the C library, about 1.3 ulp in float32.
_ATAN_P = (
    -8.750608600031904122785e-1,
    -1.615753718733365076637e1,
    -7.500855792314704667340e1,
    -1.228866684490136173410e2,
    -6.485021904942025371773e1,
)
_ATAN_Q = (
    2.485846490142306297962e1,
    1.650270098316988542046e2,
    4.328810604912902668951e2,
    4.853903996359136964868e2,
    1.945506571482613964425e2,
)
_TAN_3PI_8 = 2.414213562373095  # above it: atan(a) = π/2 − atan(1/a)
_PI_2_LOW = 6.123233995736766e-17  # π/2 − fl(π/2)


def _atan(x: Float[Array, "..."]) -> Float[Array, "..."]:
    """`atan(x)` as a rational function in multiply-adds and one division: equal to
    `jnp.arctan` to rounding (at most 1 ulp in float64 against the C library, about 1.3
    ulp in float32), ±π/2 at ±inf, NaN for NaN, odd in `x` (signed zeros kept), with the
    derivative `1/(1 + x²)` (at ±0 too). Integer input is read as floats of JAX's default
    float type. Subnormal arguments read as zero where the backend flushes them (XLA's CPU
    does, in the division), as angles in the classifiers never are.

    The argument is reduced to `|r| ≤ tan(π/8)` (`r = a`, `(a − 1)/(a + 1)` above 0.66, or
    `−1/a` above tan(3π/8), `a = |x|`), then `atan(r) = r + r z P(z)/Q(z)`, `z = r²`, and
    π/4 or π/2 (with its low-order part) is added back. On the CPU, XLA's `atan` is scalar
    code: inside the classifiers' fused token-motion loops this vectorises, ~3× less time
    for the Watanabe–Strogatz tail's token speeds (`experiments/bench_compaction.py`).

    **Raises:** `TypeError` for complex input.
    """
    x = jnp.asarray(x)
    if jnp.iscomplexobj(x):
        raise TypeError(f"_atan: real input only, got dtype {x.dtype}.")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(jnp.result_type(float))
    a = jnp.abs(x)
    big = a > _TAN_3PI_8
    mid = a > 0.66
    r = jnp.where(big, -1.0, jnp.where(mid, a - 1, a)) / jnp.where(
        big, a, jnp.where(mid, a + 1, 1.0)
    )
    z = r * r
    p = _ATAN_P[0]
    for c in _ATAN_P[1:]:
        p = p * z + c
    q = z + _ATAN_Q[0]
    for c in _ATAN_Q[1:]:
        q = q * z + c
    quarter = jnp.where(mid, 0.25 * jnp.pi + 0.5 * _PI_2_LOW, 0)
    t = (jnp.where(big, 0.5 * jnp.pi + _PI_2_LOW, quarter) + (r + r * (z * p / q))).astype(x.dtype)
    # atan(±0) = ±0 is x itself (and its derivative 1: a sign flip on |x| would give −1
    # at −0).
    return jnp.where(x == 0, x, jnp.where(x < 0, -t, t))


def _atan2(y: Float[Array, "..."], x: Float[Array, "..."]) -> Float[Array, "..."]:
    """`atan2(y, x)` in `[−π, π]` through the one-argument `_atan` of `y/x` (a quadrant
    correction of ±π for `x < 0`; 0 at the origin): equal to `jnp.arctan2` to rounding (the
    quotient and the correction add about one rounding each), for the classifiers' token
    motion, where no derivative is taken. On the CPU, XLA's float64 `atan2` and `atan`
    are scalar code (`atan2` ~29 ns an element here): the token motion was the largest part
    of a sweep member's classification (`experiments/bench_compaction.py`)."""
    q = _atan(y / jnp.where(x == 0, 1, x))
    q = jnp.where(x < 0, q + jnp.where(y < 0, -jnp.pi, jnp.pi), q)
    axis = jnp.where(y > 0, 0.5 * jnp.pi, jnp.where(y < 0, -0.5 * jnp.pi, 0.0))
    return jnp.where(x == 0, axis.astype(q.dtype), q)


# Cephes' minimax polynomials for sin and cos on |r| <= π/4, and π/2 in three parts
# (Cody–Waite: the first two have trailing zero bits, so `j · part` is exact for the
# quadrant counts used here).
_SIN_P = (
    1.58962301576546568060e-10,
    -2.50507477628578072866e-8,
    2.75573136213857245213e-6,
    -1.98412698295895385996e-4,
    8.33333333332211858878e-3,
    -1.66666666666666307295e-1,
)
_COS_P = (
    -1.13585365213876817300e-11,
    2.08757008419747316778e-9,
    -2.75573141792967388112e-7,
    2.48015872888517045348e-5,
    -1.38888888888730564116e-3,
    4.16666666666665929218e-2,
)
_PI_2_PARTS = (1.57079625129699707031e0, 7.54978941586159635335e-8, 5.39030285815811905290e-15)


def _sincos(x: Float[Array, "..."]) -> tuple[Float[Array, "..."], Float[Array, "..."]]:
    """`(sin x, cos x)` for `|x| ≤ π` in multiply-adds: within one rounding of `jnp.sin` /
    `jnp.cos` in absolute terms (2.2e-16 in float64 on a grid of 2·10⁶ points of
    `[−π, π]`), for sampling, where the argument is bounded by construction. The argument
    is reduced by the nearest multiple `j` of π/2 (`|r| ≤ π/4`, π/2 in three parts), the
    polynomials of the Cephes library give `sin r`, `cos r`, and `j mod 4` picks the pair.
    On the CPU, XLA's float64 `sin`, `cos` and complex `exp` are scalar code: ~8× the time
    of this at n = 256 tokens.

    Outside `|x| ≤ π` the reduction loses accuracy slowly (exact products up to `|x|` of
    order 10⁷); callers keep to the interval. Not for derivatives at `x = ±π/4 + kπ/2`
    beyond first order (the quadrant switches there).
    """
    x = jnp.asarray(x)
    j = jnp.round(x * (2 / jnp.pi))
    p1, p2, p3 = _PI_2_PARTS
    r = ((x - j * p1) - j * p2) - j * p3
    z = r * r
    ps = _SIN_P[0]
    for c in _SIN_P[1:]:
        ps = ps * z + c
    pc = _COS_P[0]
    for c in _COS_P[1:]:
        pc = pc * z + c
    s = r + r * z * ps
    c = 1 - 0.5 * z + z * z * pc
    q = j.astype(jnp.int32) & 3
    sin = jnp.where(q == 0, s, jnp.where(q == 1, c, jnp.where(q == 2, -s, -c)))
    cos = jnp.where(q == 0, c, jnp.where(q == 1, -s, jnp.where(q == 2, -c, s)))
    return sin.astype(x.dtype), cos.astype(x.dtype)


def _sort(x: Float[Array, "... m"]) -> Float[Array, "... m"]:
    """`jnp.sort(x, axis=-1)` of a real float array, the same values in the same order
    (NaN last, as `jnp.sort`; −0 before +0; subnormals in their order, where XLA's CPU
    `jnp.sort` reads them as zero), by sorting integer keys. Other dtypes (integers,
    complex, 8-bit floats) are passed to `jnp.sort`. For values only: the result carries
    no gradient (the keys are bit patterns).

    The keys are the IEEE bit patterns with the negative ones flipped (a monotone map of
    the floats to integers; NaN made the one positive quiet NaN, which sorts last). XLA's
    CPU sort compares integers directly but calls a compiled comparator for every
    comparison of floats: at 256 elements a row, ~24 → 6 µs (the degeneracy check of the
    Watanabe–Strogatz constants and the circle's cluster structure, once per sweep member).
    """
    x = jnp.asarray(x)
    itype = {2: jnp.int16, 4: jnp.int32, 8: jnp.int64}.get(x.dtype.itemsize)
    if not jnp.issubdtype(x.dtype, jnp.floating) or itype is None:
        return jnp.sort(x, axis=-1)
    x = jax.lax.stop_gradient(jnp.where(jnp.isnan(x), jnp.nan, x).astype(x.dtype))
    i = jax.lax.bitcast_convert_type(x, itype)
    flip = jnp.iinfo(itype).max
    key = jnp.where(i < 0, i ^ flip, i)
    key = jnp.sort(key, axis=-1)
    return jax.lax.bitcast_convert_type(jnp.where(key < 0, key ^ flip, key), x.dtype)


def _step_angle(x: Float[Array, "... d"], y: Float[Array, "... d"]) -> Float[Array, "..."]:
    """`geodesic_distance` of unit vectors evaluated as `2 atan(|x − y| / |x + y|)` (π at
    antipodes, where the quotient is inf): the same angle to rounding, without `atan2`
    (see `_atan2`), for the classifiers' token motion, where no derivative is taken (its
    derivative is not finite at antipodes)."""
    return 2 * _atan(safe_norm(x - y) / safe_norm(x + y))
