"""d = 2: tokens as angles, order parameters and the Kuramoto–Daido form of the flow."""

import jax.numpy as jnp
from jaxtyping import Array, Complex, Float

from .._custom_types import Angles, Matrix

__all__ = [
    "angles_from_tokens",
    "tokens_from_angles",
    "order_parameter",
    "complex_coefficients",
    "kuramoto_daido_coupling",
    "kuramoto_daido",
]


def angles_from_tokens(x: Float[Array, "... 2"]) -> Float[Array, "..."]:
    """Angles `θ = atan2(x₂, x₁)` of planar tokens, in `(−π, π]`.

    **Arguments:** `x` of shape `(..., 2)` (need not be normalised).

    **Returns:** angles of shape `(...)`, radians.

    **Raises:** `ValueError` if the last axis is not of size 2.
    """
    x = jnp.asarray(x)
    if x.shape[-1] != 2:
        raise ValueError(f"angles_from_tokens: tokens must have d = 2, got shape {x.shape}.")
    return jnp.arctan2(x[..., 1], x[..., 0])


def tokens_from_angles(theta: Float[Array, "..."]) -> Float[Array, "... 2"]:
    """Unit tokens `(cos θ, sin θ)`, shape `(..., 2)`."""
    theta = jnp.asarray(theta)
    return jnp.stack([jnp.cos(theta), jnp.sin(theta)], axis=-1)


def order_parameter(theta: Float[Array, "... n"], m: int = 2) -> Complex[Array, "..."]:
    """Kuramoto–Daido order parameter `R_m = (1/n) Σ_j exp(i m θ_j)` over the last axis.

    `|R_2| = 1` means all tokens sit on one antipodal pair; `R_2 = 0` is the balanced
    (e.g. uniform) state.

    **Arguments:** `theta` of shape `(..., n)`, radians; `m` the harmonic (integer ≥ 1).

    **Returns:** complex array of shape `(...)`.

    Source: Li et al. (2026), definition of `R₂`; Daido, Prog. Theor. Phys. 88 (1992).
    """
    theta = jnp.asarray(theta)
    return jnp.mean(jnp.exp(1j * m * theta), axis=-1)


def complex_coefficients(M: Matrix) -> tuple[Complex[Array, ""], Complex[Array, ""]]:
    """`(μ, ν)` with `M z = μ z + ν z̄` for a real 2×2 matrix acting on `z ∈ C`.

    `μ = ((m11 + m22) + i(m21 − m12))/2`, `ν = ((m11 − m22) + i(m21 + m12))/2`.

    **Raises:** `ValueError` if `M` is not of shape `(2, 2)`.
    """
    M = jnp.asarray(M)
    if M.shape[-2:] != (2, 2):
        raise ValueError(f"complex_coefficients: need a 2×2 matrix, got shape {M.shape}.")
    m11, m12, m21, m22 = M[..., 0, 0], M[..., 0, 1], M[..., 1, 0], M[..., 1, 1]
    mu = 0.5 * ((m11 + m22) + 1j * (m21 - m12))
    nu = 0.5 * ((m11 - m22) + 1j * (m21 + m12))
    return mu, nu


def kuramoto_daido_coupling(R, A: Matrix, V: Matrix):
    """The global field `(H, Ω)` of the d = 2 LSA flow at order parameter `R = R₂`.

    `H = a c R + (a e + b c) + b e R̄`, `Ω = Im(ā c + b̄ e + ā e R̄ + b̄ c R)` with
    `(a, b) = (μ, ν)` of `A` and `(c, e)` those of `V` (see `complex_coefficients`).

    **Returns:** `(H, Ω)`: complex `H` and real `Ω`, broadcast over the shape of `R`.

    Source: MATH.md, Part 1, "d = 2: Kuramoto–Daido form".
    """
    a, b = complex_coefficients(A)
    c, e = complex_coefficients(V)
    Rc = jnp.conj(R)
    H = a * c * R + (a * e + b * c) + b * e * Rc
    Omega = jnp.imag(jnp.conj(a) * c + jnp.conj(b) * e + jnp.conj(a) * e * Rc + jnp.conj(b) * c * R)
    return H, Omega


def kuramoto_daido(theta: Angles, A: Matrix, V: Matrix, beta=1.0) -> Angles:
    """Angular velocities of the d = 2 LSA flow in Kuramoto–Daido form.

    `dθ_k/dt = (β/2) [ Im(H e^{−2iθ_k}) + Ω ]`, with `(H, Ω)` from
    `kuramoto_daido_coupling` at `R₂ = (1/n) Σ_j e^{2iθ_j}`. Equal to the full field
    `AttentionDynamics(A, V, beta=beta, kernel="lsa")` expressed in angles.

    **Arguments:** `theta` shape `(n,)`; `A`, `V` shape `(2, 2)`; `beta` scalar.

    **Returns:** `dθ/dt`, shape `(n,)`.
    """
    R = order_parameter(theta, 2)
    H, Omega = kuramoto_daido_coupling(R, A, V)
    return 0.5 * beta * (jnp.imag(H * jnp.exp(-2j * theta)) + Omega)
