"""The paper's cases as named `(A, V)` presets with a suggested β and horizon."""

import dataclasses

import jax.numpy as jnp
import numpy as np

from ._theory import block_embed

__all__ = ["Preset", "PRESETS", "preset"]


@dataclasses.dataclass(frozen=True)
class Preset:
    """A named d = 2 parameter set of the LSA flow.

    **Fields:** `name`; `A`, `V` (numpy arrays of shape `(2, 2)`); `beta`; `t1` a horizon
    long enough for the classifier to settle the regime from uniform starts; `expected`
    the regime name the paper (and our runs) give for particles from uniform starts;
    `description`.
    """

    name: str
    A: np.ndarray
    V: np.ndarray
    beta: float
    t1: float
    expected: str
    description: str

    def matrices(self, d: int = 2, dtype=None):
        """`(A, V)` as JAX arrays, block-embedded as `I_{d/2} ⊗ M` when `d > 2` (d even).

        **Raises:** `ValueError` if `d` is odd or below 2.
        """
        dtype = jnp.result_type(float) if dtype is None else dtype
        A = jnp.asarray(self.A, dtype)
        V = jnp.asarray(self.V, dtype)
        if int(d) == 2:
            return A, V
        return block_embed(A, d), block_embed(V, d)


def _case4(v11, v12):
    # numpy twin of `case4_matrices` (no JAX work at import time)
    return np.eye(2), np.array([[v11, v12], [-v12, -v11]], dtype=np.float64)


def _make():
    eye = np.eye(2)
    # Case 3 example, the numpy twin of `case3_matrices`: A = diag(2, 1), V = I + J.
    A3, V3 = np.diag([2.0, 1.0]), np.array([[1.0, -1.0], [1.0, 1.0]])
    A4o, V4o = _case4(0.2, 1.0)
    A4c, V4c = _case4(1.0, 0.2)
    A4s, V4s = _case4(1.0, 1.0)
    items = [
        Preset(
            "case1",
            np.array([[1.0, 2.0], [-3.0, 0.5]]),
            eye,
            1.0,
            40.0,
            "clustering",
            "Case 1 (V = I) with tr A > 0: two antipodal clusters at rest (Type 1).",
        ),
        Preset(
            "case1-interior",
            np.array([[-1.0, 0.5], [-1.5, -2.0]]),
            eye,
            1.0,
            100.0,
            "oscillation",
            "Case 1 (V = I) with sym(A) negative definite: the Ott–Antonsen flow converges "
            "to an interior point; finite-n particles keep moving (Watanabe–Strogatz tori).",
        ),
        Preset(
            "case2",
            eye,
            np.array([[1.0, 0.5], [0.5, -2.0]]),
            1.0,
            40.0,
            "clustering",
            "Case 2 (A = I, V symmetric) with λ_max(V) ≥ 0: clusters on the top eigenvector.",
        ),
        Preset(
            "case2-interior",
            eye,
            np.array([[-1.0, 0.5], [0.5, -2.0]]),
            1.0,
            40.0,
            "interior",
            "Case 2 with V negative definite: convergence without clustering.",
        ),
        Preset(
            "case3-rotating",
            A3,
            V3,
            1.0,
            60.0,
            "rotating",
            "Case 3: A = diag(2, 1), V = I + J (non-commuting): two antipodal clusters that "
            "rotate forever (Type 2).",
        ),
        Preset(
            "case4-oscillating",
            A4o,
            V4o,
            1.0,
            100.0,
            "oscillation",
            "Case 4 family, v11 = 0.2 < v12 = 1: periodic orbits of R₂ (Type 3).",
        ),
        Preset(
            "case4-clustering",
            A4c,
            V4c,
            1.0,
            40.0,
            "clustering",
            "Case 4 family, v11 = 1 > v12 = 0.2: clustering (Type 1).",
        ),
        Preset(
            "case4-saddle-node",
            A4s,
            V4s,
            1.0,
            200.0,
            "undetermined",
            "Case 4 family at the saddle-node v11 = v12 = 1 (V nilpotent): only algebraic "
            "convergence, 1 − |R₂| ∝ t⁻²; a finite horizon cannot settle it.",
        ),
        Preset(
            "rotating-family",
            eye,
            np.array([[0.5, -1.0], [1.0, 0.5]]),
            1.0,
            60.0,
            "rotating",
            "The rotating family A = I, V = a I + b J with a = 0.5, b = 1: the Ott–Antonsen "
            "equations give d|R|/dt = (aβ/2)(1 − |R|²)|R| and arg R turning at (bβ/2)(|R|² + 3) "
            "(counter-clockwise for bβ > 0): clusters that rotate at 2bβ once formed.",
        ),
        Preset(
            "identity",
            eye,
            eye,
            1.0,
            40.0,
            "clustering",
            "A = V = I: LSA forms two antipodal clusters; USA and SA (d ≥ 3) one cluster.",
        ),
    ]
    return {p.name: p for p in items}


PRESETS: dict[str, Preset] = _make()
"""The named presets, by name."""


def preset(name: str) -> Preset:
    """The preset called `name` (see `PRESETS` for the list).

    **Raises:** `ValueError` for an unknown name, listing the known ones.
    """
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; known presets: {', '.join(PRESETS)}.") from None
