"""The Ott–Antonsen reduction of the d = 2 LSA flow: one complex ODE for R₂."""

import jax.numpy as jnp
from jaxtyping import Array, Complex

from .._custom_types import Matrix
from ._circle import kuramoto_daido_coupling

__all__ = ["ott_antonsen_field"]


def ott_antonsen_field(R: Complex[Array, "..."], A: Matrix, V: Matrix, beta=1.0):
    """Right-hand side of the Ott–Antonsen ODE for `R = R₂`.

    `dR/dt = i β Ω(R) R + (β/2) (H(R) − conj(H(R)) R²)`, exact on the manifold of
    wrapped-Cauchy laws of `φ = 2θ` (mean resultant `R`).

    **Arguments:** `R` complex (any shape), `A`, `V` of shape `(2, 2)`, `beta` scalar.

    **Returns:** `dR/dt`, same shape as `R`.

    Source: MATH.md, Part 1, "Ott–Antonsen"; Ott & Antonsen, Chaos 18, 037113 (2008).
    """
    H, Omega = kuramoto_daido_coupling(R, A, V)
    return 1j * beta * Omega * R + 0.5 * beta * (H - jnp.conj(H) * R**2)
