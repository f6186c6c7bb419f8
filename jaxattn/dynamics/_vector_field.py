"""The attention particle flow on the sphere: LSA, USA and SA kernels."""

from typing import Literal

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._custom_types import Matrix, Tokens
from ..sphere import normalise, project_tangent

__all__ = ["AttentionDynamics", "KERNELS"]

KERNELS = ("lsa", "usa", "sa")


def _is_concrete(x) -> bool:
    try:
        np.asarray(x)
    except Exception:
        return False
    return True


class AttentionDynamics(eqx.Module):
    r"""Vector field of self-attention dynamics on the unit sphere S^{d-1}.

    $$\dot x_k = P^\perp_{x_k}\Big(\frac1n\sum_{j=1}^n w_{kj}\, V x_j\Big),\qquad
    P^\perp_x v = v - \langle x, v\rangle x,$$

    with the attention weights

    - `kernel="lsa"` (linear self-attention): `w_kj = β <x_k, A x_j>`;
    - `kernel="usa"` (unnormalised softmax): `w_kj = exp(β <x_k, A x_j> − score_shift)`;
    - `kernel="sa"` (softmax): `w_kj = n exp(β<x_k, A x_j>) / Σ_l exp(β<x_k, A x_l>)`.

    LSA is evaluated through the moment `M = XᵀX` as `F = (β/n) X A M Vᵀ` in O(n d²).
    USA and SA are evaluated with the row maximum of the scores factored out. For USA the
    factor `exp(max_j s_kj − score_shift)` is bounded on the sphere by
    `exp(β σ_max(A) − score_shift)`; `simulate` checks that bound against the floating
    range before solving. A nonzero `score_shift` rescales time by `exp(score_shift)`
    (same orbits, `t_physical = t · exp(−score_shift)`), which is how scores past the
    range of `exp` (≈ 88 in float32) are integrated.

    The field is evaluated at `x_k/|x_k|`, so it is homogeneous of degree zero and the
    norm of every token is an exact invariant of the continuous flow.

    **Arguments:**

    - `A`: the bilinear form `QᵀK`, shape `(d, d)`.
    - `V`: the value matrix, shape `(d, d)`.
    - `beta`: inverse temperature β > 0 (a scalar; differentiable).
    - `kernel`: one of `"lsa"`, `"usa"`, `"sa"`.
    - `score_shift`: USA only, the constant subtracted from every score (time rescaling).

    `__call__(t, x, args)` takes tokens `x` of shape `(n, d)` and returns `dx/dt`, same shape.

    **Raises:** `ValueError` if `A` or `V` is not square `(d, d)` with `d ≥ 2`, if their
    sizes differ, if the kernel is unknown, or if concrete `A`, `V`, `beta` are not finite.

    Source: Li et al., *On the Diverse Dynamical Behaviors Arising in Deep Linear
    Transformers* (2026), eq. (1); Geshkovski et al., arXiv 2312.10794, eqs. (1.1)–(1.3).
    """

    A: Matrix
    V: Matrix
    beta: Float[Array, ""]
    score_shift: Float[Array, ""]
    kernel: Literal["lsa", "usa", "sa"] = eqx.field(static=True)

    def __init__(self, A, V, *, beta=1.0, kernel: str = "lsa", score_shift=0.0):
        A = jnp.asarray(A)
        V = jnp.asarray(V)
        dtype = jnp.result_type(A, V, float)
        self.A = A.astype(dtype)
        self.V = V.astype(dtype)
        self.beta = jnp.asarray(beta, dtype=dtype)
        self.score_shift = jnp.asarray(score_shift, dtype=dtype)
        self.kernel = kernel

    def __check_init__(self):
        if self.kernel not in KERNELS:
            raise ValueError(
                f"AttentionDynamics: kernel must be one of {KERNELS}, got {self.kernel!r}."
            )
        for name, m in (("A", self.A), ("V", self.V)):
            if m.ndim != 2 or m.shape[0] != m.shape[1] or m.shape[0] < 2:
                raise ValueError(
                    f"AttentionDynamics: {name} must be a square (d, d) matrix with d >= 2, "
                    f"got shape {m.shape}."
                )
        if self.A.shape != self.V.shape:
            raise ValueError(
                f"AttentionDynamics: A and V must have the same shape, got A {self.A.shape} "
                f"and V {self.V.shape}."
            )
        if self.beta.ndim != 0:
            raise ValueError(
                f"AttentionDynamics: beta must be a scalar, got shape {self.beta.shape}."
            )
        for name, m in (("A", self.A), ("V", self.V), ("beta", self.beta)):
            if _is_concrete(m) and not np.all(np.isfinite(np.asarray(m))):
                raise ValueError(f"AttentionDynamics: {name} has non-finite entries (NaN or inf).")

    @property
    def d(self) -> int:
        return self.A.shape[0]

    def scores(self, x: Tokens) -> Float[Array, "n n"]:
        """Scores `s_kj = β <x_k, A x_j>` at the normalised tokens, shape `(n, n)`."""
        xh = normalise(x)
        return self.beta * (xh @ self.A) @ xh.T

    def drive(self, x: Tokens) -> Tokens:
        """The un-projected mean field `(1/n) Σ_j w_kj V x_j` at `x/|x|`, shape `(n, d)`."""
        xh = normalise(x)
        n = xh.shape[0]
        if self.kernel == "lsa":
            moment = xh.T @ xh
            return (self.beta / n) * (xh @ (self.A @ moment @ self.V.T))
        s = self.beta * (xh @ self.A) @ xh.T
        m = jnp.max(s, axis=1, keepdims=True)
        w = jnp.exp(s - m)
        vx = xh @ self.V.T
        if self.kernel == "sa":
            return (w @ vx) / jnp.sum(w, axis=1, keepdims=True)
        return jnp.exp(m - self.score_shift) * (w @ vx) / n

    def __call__(self, t, x: Tokens, args=None) -> Tokens:
        del t, args
        return project_tangent(normalise(x), self.drive(x))

    def direct_sum(self, x: Tokens) -> Tokens:
        """Reference O(n² d) evaluation of the field (pairwise weights), for checks."""
        xh = normalise(x)
        n = xh.shape[0]
        s = self.beta * (xh @ self.A) @ xh.T
        if self.kernel == "lsa":
            w = s
        elif self.kernel == "usa":
            w = jnp.exp(s - self.score_shift)
        else:
            e = jnp.exp(s - jnp.max(s, axis=1, keepdims=True))
            w = n * e / jnp.sum(e, axis=1, keepdims=True)
        drive = jnp.einsum("kj,jd->kd", w, xh @ self.V.T) / n
        return project_tangent(xh, drive)

    def score_bound(self) -> Float[Array, ""]:
        """Upper bound `β σ_max(A)` of every score on the sphere (|<x, A y>| ≤ σ_max(A))."""
        return jnp.abs(self.beta) * jnp.linalg.norm(self.A, ord=2)
