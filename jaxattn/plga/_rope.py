"""Rotary position embedding (RoPE) for PLGA queries and keys.

Source: Su et al., *RoFormer* (arXiv 2104.09864); the convention matched here is the one of the
PLDR-LLM reference (Gokden, arXiv 2410.16703, 2502.13502): interleaved feature pairs.
"""

from typing import Literal

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Int

RopeStyle = Literal["interleaved", "half"]


def _angle_dtype(dtype) -> jnp.dtype:
    """Angles are built in float32 or better, whatever the compute dtype (bf16 angles at
    position ~1000 are off by whole radians)."""
    return jnp.promote_types(dtype, jnp.float32)


def rope_angles(
    positions: Int[ArrayLike, " seq"], head_dim: int, *, base: float = 10000.0, dtype=jnp.float32
) -> Float[Array, "seq half"]:
    r"""Rotation angles `θ[p, i] = positions[p] · base^{−2i/dk}` for `i = 0 … dk/2 − 1`.

    **Arguments:**

    - `positions`: integer positions, shape `(seq,)`.
    - `head_dim`: `dk`, even.
    - `base`: the RoPE base (10000 in PLDR-LLM).
    - `dtype`: the compute dtype; the angles are returned in `promote(dtype, float32)`.

    **Returns:** angles of shape `(seq, dk/2)`.

    **Raises:** `ValueError` if `head_dim` is odd or `positions` is not one-dimensional.
    """
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head_dim, got head_dim={head_dim}.")
    positions = jnp.asarray(positions)
    if positions.ndim != 1:
        raise ValueError(f"`positions` must have shape (seq,), got {positions.shape}.")
    adt = _angle_dtype(dtype)
    i = jnp.arange(head_dim // 2, dtype=adt)
    inv_freq = jnp.asarray(base, adt) ** (-2.0 * i / head_dim)
    return positions.astype(adt)[:, None] * inv_freq[None, :]


def apply_rope(
    x: Float[Array, "seq heads dk"],
    positions: Int[ArrayLike, " seq"],
    *,
    base: float = 10000.0,
    style: RopeStyle = "interleaved",
) -> Float[Array, "seq heads dk"]:
    r"""Rotate the features of `x` by position.

    `style="interleaved"` (the PLDR-LLM reference): pair `(2i, 2i+1)` at position `p` becomes
    `(x₂ᵢ cos θ − x₂ᵢ₊₁ sin θ, x₂ᵢ sin θ + x₂ᵢ₊₁ cos θ)` with `θ = p·base^{−2i/dk}`.
    `style="half"` (GPT-NeoX): the pair is `(i, i + dk/2)` instead. The two do not agree.

    The angles and their cos/sin are computed in float32 or better and cast to `x.dtype` only
    at the end.

    **Arguments:**

    - `x`: shape `(seq, heads, dk)` (or `(seq, dk)`).
    - `positions`: integer positions, shape `(seq,)`.
    - `base`, `style`: as above.

    **Returns:** an array like `x`.

    **Raises:** `ValueError` for an unknown style, odd `dk` or mismatched `positions`.
    """
    if style not in ("interleaved", "half"):
        raise ValueError(f"`style` must be 'interleaved' or 'half', got {style!r}.")
    squeeze = x.ndim == 2
    if squeeze:
        x = x[:, None, :]
    if x.ndim != 3:
        raise ValueError(f"`x` must have shape (seq, heads, dk), got {x.shape}.")
    seq, _, dk = x.shape
    positions = jnp.asarray(positions)
    if positions.shape != (seq,):
        raise ValueError(f"`positions` must have shape ({seq},), got {positions.shape}.")
    theta = rope_angles(positions, dk, base=base, dtype=x.dtype)[:, None, :]
    cos, sin = jnp.cos(theta), jnp.sin(theta)
    xf = x.astype(theta.dtype)
    if style == "interleaved":
        x0, x1 = xf[..., 0::2], xf[..., 1::2]
        out = jnp.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1).reshape(xf.shape)
    else:
        x0, x1 = xf[..., : dk // 2], xf[..., dk // 2 :]
        out = jnp.concatenate([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1)
    out = out.astype(x.dtype)
    return out[:, 0, :] if squeeze else out
