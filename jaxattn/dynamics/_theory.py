"""The papers' stated criteria for the d = 2 LSA flow, as traceable predicates.

Each predicate takes `(A, V)` and returns a `Prediction`: whether the criterion applies to
this pair *and* makes a claim, and which `REGIMES` item it predicts. They contain no Python
control flow on values, so they run under `jax.jit` and `jax.vmap` over batches of
matrices (the regime atlas evaluates them on grids).

Source: Li et al., *On the Diverse Dynamical Behaviors Arising in Deep Linear Transformers*
(2026), Cases 1–4 (as reconstructed in the docs, theory pages ("Stated results")).
"""

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float

from ._regimes import REGIMES

__all__ = [
    "Prediction",
    "case1_criterion",
    "case2_criterion",
    "case4_criterion",
    "stated_prediction",
    "case1_matrices",
    "case2_matrices",
    "case3_matrices",
    "case4_matrices",
    "block_embed",
]

_J = ((0.0, -1.0), (1.0, 0.0))


class Prediction(eqx.Module):
    """What a stated criterion says about a pair `(A, V)`.

    **Fields:**

    - `claims`: boolean scalar, `True` when the criterion applies to `(A, V)` and makes a
      claim about the long-run regime.
    - `regime`: the predicted `REGIMES` item (`REGIMES.undetermined` when `claims` is
      `False`).
    """

    claims: Bool[Array, ""]
    regime: REGIMES


def _check_2x2(name, M):
    M = jnp.asarray(M)
    if M.shape != (2, 2):
        raise ValueError(
            f"{name} must be a 2×2 matrix (the stated results are for d = 2), got shape {M.shape}."
        )
    if not (jnp.issubdtype(M.dtype, jnp.floating) or jnp.issubdtype(M.dtype, jnp.integer)):
        raise ValueError(f"{name} must be a real 2×2 matrix, got dtype {M.dtype}.")
    return M.astype(jnp.result_type(M, float))


def _close(X, Y, atol):
    return jnp.all(jnp.abs(X - Y) <= atol * (1 + jnp.max(jnp.abs(Y))))


def _predict(cluster, other, other_regime):
    claims = cluster | other
    regime = REGIMES.where(other, other_regime, REGIMES.undetermined)
    regime = REGIMES.where(cluster, REGIMES.clustering, regime)
    return Prediction(claims=claims, regime=regime)


def case1_criterion(
    A: Float[ArrayLike, "2 2"], V: Float[ArrayLike, "2 2"], *, atol: float = 1e-12
) -> Prediction:
    r"""Case 1 (`V = I`, d = 2, LSA): clustering if `tr A > 0` or `det A ≤ 0`; convergence
    without clustering if the symmetric part `(A + Aᵀ)/2` is negative definite.

    The clustering condition is sufficient, not necessary: for `tr A ≤ 0 < det A` with a
    symmetric part that is not negative definite there is no claim. The predicted
    clusters are at rest (Type 1): with `V = I` every antipodal pair `±u` is an
    equilibrium. The interior claim is about the mean-field (Ott–Antonsen) flow; finite-n
    particle runs there keep moving on Watanabe–Strogatz tori.

    **Arguments:** `A`, `V` of shape `(2, 2)`; `atol` the tolerance of the test `V = I`.

    **Returns:** a `Prediction`; `claims` is `False` when `V ≠ I`.

    **Raises:** `ValueError` if `A` or `V` is not 2×2.

    Source: Li et al. (2026), Case 1.
    """
    A = _check_2x2("A", A)
    V = _check_2x2("V", V)
    applies = _close(V, jnp.eye(2, dtype=V.dtype), atol)
    tr = A[0, 0] + A[1, 1]
    det = A[0, 0] * A[1, 1] - A[0, 1] * A[1, 0]
    s12 = 0.5 * (A[0, 1] + A[1, 0])
    negdef = (A[0, 0] < 0) & (A[0, 0] * A[1, 1] - s12 * s12 > 0)
    cluster = applies & ((tr > 0) | (det <= 0))
    interior = applies & negdef & ~cluster
    return _predict(cluster, interior, REGIMES.interior)


def case2_criterion(
    A: Float[ArrayLike, "2 2"], V: Float[ArrayLike, "2 2"], *, atol: float = 1e-12
) -> Prediction:
    r"""Case 2 (`A = I`, `V` symmetric, d = 2, LSA): clustering iff `λ_max(V) ≥ 0`,
    otherwise convergence without clustering.

    `λ_max(V) = (v11 + v22)/2 + sqrt(((v11 − v22)/2)² + v12²)`. Clusters form on the top
    eigenvector of `V` and are at rest (Type 1).

    **Arguments:** `A`, `V` of shape `(2, 2)`; `atol` the tolerance of the tests `A = I`,
    `V = Vᵀ`.

    **Returns:** a `Prediction`; `claims` is `False` unless `A = I` and `V` is symmetric.

    **Raises:** `ValueError` if `A` or `V` is not 2×2.

    Source: Li et al. (2026), Case 2.
    """
    A = _check_2x2("A", A)
    V = _check_2x2("V", V)
    applies = _close(A, jnp.eye(2, dtype=A.dtype), atol) & _close(V, V.T, atol)
    half_tr = 0.5 * (V[0, 0] + V[1, 1])
    disc = (0.5 * (V[0, 0] - V[1, 1])) ** 2 + (0.5 * (V[0, 1] + V[1, 0])) ** 2
    lam_max = half_tr + jnp.where(disc > 0, jnp.sqrt(jnp.where(disc > 0, disc, 1)), 0)
    cluster = applies & (lam_max >= 0)
    interior = applies & (lam_max < 0)
    return _predict(cluster, interior, REGIMES.interior)


def case4_criterion(
    A: Float[ArrayLike, "2 2"], V: Float[ArrayLike, "2 2"], *, atol: float = 1e-12
) -> Prediction:
    r"""Case 4 (`A = I`, `V = [[v11, v12], [−v12, −v11]]`, d = 2, LSA): periodic orbits
    (Type 3) when `|v11| < |v12|`, clustering when `|v11| > |v12|`; no claim on the
    saddle-node `|v11| = |v12|` (V nilpotent: only algebraic convergence).

    `V` has eigenvalues `±sqrt(v11² − v12²)`; the Ott–Antonsen flow is Hamiltonian after
    an integrating factor, with closed orbits around a centre for imaginary eigenvalues.
    For `v11, v12 ≥ 0` this is the paper's `v11 < v12` (oscillation) / `v11 > v12`
    (clustering); the absolute values extend it to all signs (checked numerically).

    **Arguments:** `A`, `V` of shape `(2, 2)`; `atol` the tolerance of the family test.

    **Returns:** a `Prediction`; `claims` is `False` outside the family or on its
    saddle-node.

    **Raises:** `ValueError` if `A` or `V` is not 2×2.

    Source: Li et al. (2026), Case 4 (hidden Hamiltonian, saddle-node bifurcation).
    """
    A = _check_2x2("A", A)
    V = _check_2x2("V", V)
    v11, v12 = V[0, 0], V[0, 1]
    applies = _close(A, jnp.eye(2, dtype=A.dtype), atol) & _close(
        V, jnp.array([[v11, v12], [-v12, -v11]]), atol
    )
    s = v11 * v11 - v12 * v12
    cluster = applies & (s > 0)
    oscillation = applies & (s < 0)
    return _predict(cluster, oscillation, REGIMES.oscillation)


def stated_prediction(
    A: Float[ArrayLike, "2 2"], V: Float[ArrayLike, "2 2"], *, atol: float = 1e-12
) -> Prediction:
    """The first of Case 1, Case 2, Case 4 that makes a claim about `(A, V)`.

    **Returns:** a `Prediction` (no claim if none of the criteria applies).
    """
    out = Prediction(claims=jnp.asarray(False), regime=REGIMES.undetermined)
    for criterion in (case4_criterion, case2_criterion, case1_criterion):
        p = criterion(A, V, atol=atol)
        out = Prediction(
            claims=p.claims | out.claims,
            regime=REGIMES.where(p.claims, p.regime, out.regime),
        )
    return out


def case1_matrices(A: Float[ArrayLike, "2 2"]) -> tuple[Float[Array, "2 2"], Float[Array, "2 2"]]:
    """Case 1 pair `(A, I)`."""
    A = _check_2x2("A", A)
    return A, jnp.eye(2, dtype=A.dtype)


def case2_matrices(V: Float[ArrayLike, "2 2"]) -> tuple[Float[Array, "2 2"], Float[Array, "2 2"]]:
    """Case 2 pair `(I, (V + Vᵀ)/2)` (the symmetric part of `V` is used)."""
    V = _check_2x2("V", V)
    return jnp.eye(2, dtype=V.dtype), 0.5 * (V + V.T)


def case3_matrices(dtype=None) -> tuple[Float[Array, "2 2"], Float[Array, "2 2"]]:
    """Case 3 example `A = diag(2, 1)`, `V = I + J` (`J` the rotation by π/2): non-commuting
    `A`, `V` with two antipodal clusters that rotate forever (Type 2).

    Source: Li et al. (2026), Case 3; docs/theory.
    """
    dtype = jnp.result_type(float) if dtype is None else dtype
    return jnp.diag(jnp.array([2.0, 1.0], dtype)), jnp.eye(2, dtype=dtype) + jnp.array(_J, dtype)


def case4_matrices(
    v11: Float[ArrayLike, ""], v12: Float[ArrayLike, ""]
) -> tuple[Float[Array, "2 2"], Float[Array, "2 2"]]:
    """Case 4 pair `A = I`, `V = [[v11, v12], [−v12, −v11]]` (traceless). Traceable."""
    v11 = jnp.asarray(v11)
    v12 = jnp.asarray(v12)
    dtype = jnp.result_type(v11, v12, float)
    V = jnp.stack([jnp.stack([v11, v12]), jnp.stack([-v12, -v11])]).astype(dtype)
    return jnp.eye(2, dtype=dtype), V


def block_embed(M: Float[ArrayLike, "2 2"], d: int) -> Float[Array, "d d"]:
    """`I_{d/2} ⊗ M`: a 2×2 block repeated on the diagonal of a d×d matrix (d even).

    Embedding both `A` and `V` this way reproduces the d = 2 regimes in high dimension.

    **Raises:** `ValueError` if `M` is not 2×2 or `d` is not an even number ≥ 2.
    """
    M = _check_2x2("M", M)
    if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or int(d) < 2 or int(d) % 2:
        raise ValueError(f"block_embed: d must be an even number >= 2, got d={d}.")
    return jnp.kron(jnp.eye(int(d) // 2, dtype=M.dtype), M)
