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

    Source: Geshkovski et al., *A mathematical perspective on Transformers*, eq. (1.1).
    """
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


def _atan2(y: Float[Array, "..."], x: Float[Array, "..."]) -> Float[Array, "..."]:
    """`atan2(y, x)` in `[−π, π]` through the one-argument `atan` of `y/x` (a quadrant
    correction of ±π for `x < 0`; 0 at the origin): equal to `jnp.arctan2` to rounding (the
    quotient and the correction add about one rounding each), for the classifiers' token
    motion, where no derivative is taken. On the CPU, XLA's float64 `atan2` is scalar code,
    ~29 ns an element here against ~12 ns for `atan` and a division: the largest part of
    a sweep member's classification (`experiments/bench_compaction.py`)."""
    q = jnp.arctan(y / jnp.where(x == 0, 1, x))
    q = jnp.where(x < 0, q + jnp.where(y < 0, -jnp.pi, jnp.pi), q)
    axis = jnp.where(y > 0, 0.5 * jnp.pi, jnp.where(y < 0, -0.5 * jnp.pi, 0.0))
    return jnp.where(x == 0, axis.astype(q.dtype), q)


def _step_angle(x: Float[Array, "... d"], y: Float[Array, "... d"]) -> Float[Array, "..."]:
    """`geodesic_distance` of unit vectors evaluated as `2 atan(|x − y| / |x + y|)` (π at
    antipodes, where the quotient is inf): the same angle to rounding, without `atan2`
    (see `_atan2`), for the classifiers' token motion, where no derivative is taken (its
    derivative is not finite at antipodes)."""
    return 2 * jnp.arctan(safe_norm(x - y) / safe_norm(x + y))
