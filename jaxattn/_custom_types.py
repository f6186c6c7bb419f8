"""jaxtyping aliases shared by both halves of jaxattn."""

from jaxtyping import Array, ArrayLike, Bool, Complex, Float, Int

Tokens = Float[Array, "n d"]
"""Tokens on the unit sphere S^{d-1}, one per row."""

Matrix = Float[Array, "d d"]
"""A real d×d matrix (the bilinear form `A = QᵀK` or the value map `V`)."""

Angles = Float[Array, " n"]
"""Angles θ_k of tokens on the circle (d = 2), radians."""

Scalar = Float[Array, ""]
ScalarLike = float | Float[ArrayLike, ""]
ComplexScalar = Complex[Array, ""]

__all__ = [
    "Angles",
    "Array",
    "ArrayLike",
    "Bool",
    "Complex",
    "ComplexScalar",
    "Float",
    "Int",
    "Matrix",
    "Scalar",
    "ScalarLike",
    "Tokens",
]
