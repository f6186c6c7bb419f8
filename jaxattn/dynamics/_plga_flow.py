"""The PLGA flow: attention dynamics whose bilinear form is generated, at every instant, by a
Power Law Graph Attention metric learner from the tokens' own density operator.

This is where the two halves of jaxattn meet: the continuous-time limit of a deep
shared-weight PLGA encoder without RoPE (tokens as their own queries and keys).
"""

import math
import operator
from collections.abc import Callable
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._custom_types import Tokens
from ..plga._attention import PowerLawGraphAttention
from ..plga._metric_learner import MetricLearner, layer_norm
from ..sphere import normalise
from ._vector_field import (
    NORMALISATIONS,
    _is_concrete,
    attention_drive,
    check_causal,
    normalised_field,
)

__all__ = ["PLGAFlow"]


class _LayerGenerator(eqx.Module):
    """`D ↦ G_LM(D)` of the selected heads of a PLGA layer (steps 3–6 of docs/theory/plga.md)."""

    layer: PowerLawGraphAttention
    heads: tuple[int, ...] = eqx.field(static=True)

    def __call__(self, D):
        A = self.layer.metric(D)  # LN of the rows, then the shared metric learner: (dk, dk)
        H = self.layer.num_heads
        _, _, G = self.layer.curvature(jnp.broadcast_to(A, (H,) + A.shape))
        return G[jnp.asarray(self.heads)]


class _LearnerGenerator(eqx.Module):
    """`D ↦ Φ(LN(D))`: a metric learner's output used as the bilinear form (one head)."""

    learner: Callable
    eps: float = eqx.field(static=True)

    def __call__(self, D):
        one = jnp.ones(D.shape[-1], D.dtype)
        return self.learner(layer_norm(D, one, jnp.zeros_like(one), self.eps))[None]


def _head_index(h, heads):
    """`h` as a Python int (NumPy and 0-d JAX integers included; never a bool).

    **Raises:** `TypeError` naming `heads` for anything else."""
    if not isinstance(h, (bool, np.bool_)):
        try:
            return operator.index(h)
        except TypeError:
            pass
    raise TypeError(
        f"PLGAFlow.from_layer: heads must be a head index, a sequence of them or None; "
        f"{h!r} in heads = {heads!r} is not an integer."
    )


def _head_indices(heads, H: int) -> tuple[int, ...]:
    """The selected heads of a layer of `H` heads: all for `None`, one index, or a sequence
    of distinct indices in `[0, H)`.

    **Raises:** `TypeError` for a non-integer index, `ValueError` for one out of range or
    repeated, or no heads."""
    where = "PLGAFlow.from_layer"
    if heads is None:
        return tuple(range(H))
    if isinstance(heads, (str, bytes)):
        raise TypeError(
            f"{where}: heads must be a head index, a sequence of them or None, got {heads!r}."
        )
    try:
        idx = (_head_index(heads, heads),)
    except TypeError:
        try:
            items = list(heads)
        except TypeError:
            raise TypeError(
                f"{where}: heads must be a head index, a sequence of them or None, got {heads!r}."
            ) from None
        idx = tuple(_head_index(h, heads) for h in items)
    if not idx:
        raise ValueError(f"{where}: heads selects no head; give at least one of [0, {H}).")
    if any(not 0 <= h < H for h in idx):
        raise ValueError(f"{where}: heads must be in [0, {H}), got {heads!r}.")
    twice = sorted({h for h in idx if idx.count(h) > 1})
    if twice:
        raise ValueError(f"{where}: heads must be distinct; {twice} given twice in {heads!r}.")
    return idx


class PLGAFlow(eqx.Module):
    r"""The attention flow of a Power Law Graph Attention layer: softmax attention whose
    bilinear form is the layer's energy-curvature tensor of the current tokens,

    $$D = \sum_j \theta_j \theta_j^\top,\quad G_h = G_{LM,h}(D),\qquad
    \mathrm{drive}_k = \sum_h \sum_j \mathrm{softmax}_j\big(\beta_h\langle\theta_k, G_h
    \theta_j\rangle\big) V_h \theta_j,$$

    at `θ_k = x_k/|x_k|`, with the velocity of the normalisation scheme (`normalised_field`;
    Post-LN by default: the flow on the sphere). `G_{LM}(D) = a (iSwiGLU(W Φ(LN(D)) + b_W) +
    ε)^{∘P} + b_a` per head (docs/theory/plga.md, steps 2–6): the density operator, the metric
    learner `Φ`, the metric, potential and energy-curvature tensors. The tokens are their own
    queries and keys (no projections, no RoPE): one step of size `δ` of a deep PLGA encoder
    whose layers share their weights, `x ← x + δ · attention(x)`, tends to this flow as
    `δ → 0`. Cost per right-hand side: `D` in O(n d²), one metric-learner pass on the d × d
    matrix `D` (shared by all heads), then the softmax attention of each head, O(n² d).

    Build it with `PLGAFlow.from_layer(layer)` (a `PowerLawGraphAttention`, one head or all
    heads) or `PLGAFlow.from_metric_learner(learner)` (the learner's output `Φ(LN(D))` is
    the bilinear form). `frozen(G)` fixes `G` (a collapsed model, whose `G_LM` no longer
    depends on the input): the flow is then the fixed-`A` softmax flow with `A = G`
    (`AttentionDynamics(G, V, kernel="sa")` for one head, `MultiHeadDynamics` for several).

    **Fields:** `generator` (`D (d, d) -> G (heads, d, d)`, an `eqx.Module`), `V`
    `(heads, d, d)`, `beta` `(heads,)`, `G` (`None`, or the frozen `(heads, d, d)`);
    static `causal`, `normalisation`.

    `__call__(t, x, args)`: tokens `(n, d)` → `dx/dt` `(n, d)`. `energy_curvature(x)`: the
    `G` in force at tokens `x`, `(heads, d, d)`.

    Source: Gokden, *Power law graph attention* (2026), PLDR-LLM (arXiv 2410.16703,
    2502.13502); the flow: Geshkovski et al., arXiv 2312.10794, eq. (1.1) with `A = G(X)`.
    """

    generator: eqx.Module
    V: Float[Array, "heads d d"]
    beta: Float[Array, " heads"]
    G: Float[Array, "heads d d"] | None
    causal: bool = eqx.field(static=True)
    normalisation: Literal["post_ln", "pre_ln", "ngpt"] = eqx.field(static=True)

    def __init__(
        self,
        generator,
        V,
        *,
        beta,
        G=None,
        causal: bool = False,
        normalisation: str = "post_ln",
    ):
        where = "PLGAFlow"
        V = jnp.asarray(V)
        if V.ndim == 2:
            V = V[None]
        if V.ndim != 3 or V.shape[1] != V.shape[2] or V.shape[1] < 2:
            raise ValueError(
                f"{where}: V must have shape (d, d) or (heads, d, d) with d >= 2, got {V.shape}."
            )
        heads = V.shape[0]
        beta = jnp.asarray(beta, V.dtype)
        beta = jnp.broadcast_to(beta, (heads,)) if beta.ndim == 0 else beta
        if beta.shape != (heads,):
            raise ValueError(
                f"{where}: beta must be a scalar or have shape (heads,) = ({heads},), got "
                f"{beta.shape}."
            )
        if _is_concrete(beta) and not np.all(np.asarray(beta) > 0):
            raise ValueError(f"{where}: beta must be > 0, got {np.asarray(beta).tolist()}.")
        if normalisation not in NORMALISATIONS:
            raise ValueError(
                f"{where}: normalisation must be one of {NORMALISATIONS}, got {normalisation!r}."
            )
        if not callable(generator):
            raise ValueError(f"{where}: generator must be callable D -> G, got {generator!r}.")
        if G is not None:
            G = jnp.asarray(G, V.dtype)
            if G.ndim == 2:
                G = jnp.broadcast_to(G, (heads,) + G.shape)
            if G.shape != V.shape:
                raise ValueError(
                    f"{where}: a frozen G must have the shape of V {V.shape}, got {G.shape}."
                )
        self.generator = generator
        self.V = V
        self.beta = beta
        self.G = G
        self.causal = check_causal(where, causal)
        self.normalisation = normalisation

    # -- constructors ----------------------------------------------------------------------------

    @classmethod
    def from_layer(
        cls,
        layer: PowerLawGraphAttention,
        *,
        heads: int | tuple[int, ...] | None = None,
        V=None,
        beta=None,
        causal: bool = False,
        normalisation: str = "post_ln",
        dtype=None,
    ) -> "PLGAFlow":
        """The flow of a PLGA layer's heads (`heads`: one index, a sequence of distinct
        indices, or `None` for all; NumPy integers count as indices).

        `V` is `(heads, dk, dk)`, one per selected head, or `(dk, dk)`, the same for every
        selected head; it defaults to the identity for every head. `beta` defaults to the
        layer's `1/√dk`; `dtype` casts the layer's arrays (e.g. `jnp.float64` for checks).

        **Raises:** `ValueError` for an SDPA layer (no metric learner), a head index out of
        range or given twice, no heads, or a `V` of another shape; `TypeError` for a head
        index that is not an integer.
        """
        if not isinstance(layer, PowerLawGraphAttention):
            raise ValueError(
                f"PLGAFlow.from_layer: layer must be a PowerLawGraphAttention, got "
                f"{type(layer).__name__}."
            )
        if layer.attention != "plga" or layer.metric_learner is None:
            raise ValueError(
                "PLGAFlow.from_layer: the layer is an SDPA layer (no metric learner); the "
                "flow of an SDPA layer is AttentionDynamics(I, V, kernel='sa')."
            )
        H, dk = layer.num_heads, layer.head_dim
        idx = _head_indices(heads, H)
        if V is not None:
            V = jnp.asarray(V)
            if V.shape == (dk, dk):
                V = jnp.broadcast_to(V, (len(idx), dk, dk))  # the same V for every head
            if V.shape != (len(idx), dk, dk):
                raise ValueError(
                    f"PLGAFlow.from_layer: V must have shape (dk, dk) = {(dk, dk)} (every head) "
                    f"or (heads, dk, dk) = {(len(idx), dk, dk)} for the {len(idx)} head(s) "
                    f"{list(idx)} of a layer with dk = {dk}, got {V.shape}."
                )
        if dtype is not None:
            layer = jax.tree.map(lambda a: a.astype(dtype) if eqx.is_inexact_array(a) else a, layer)
        dtype = layer.W.dtype
        V = jnp.broadcast_to(jnp.eye(dk, dtype=dtype), (len(idx), dk, dk)) if V is None else V
        beta = 1 / math.sqrt(dk) if beta is None else beta
        return cls(
            _LayerGenerator(layer, idx),
            V,
            beta=beta,
            causal=causal,
            normalisation=normalisation,
        )

    @classmethod
    def from_metric_learner(
        cls,
        learner: MetricLearner | Callable,
        *,
        V=None,
        beta=None,
        eps: float = 1e-6,
        causal: bool = False,
        normalisation: str = "post_ln",
    ) -> "PLGAFlow":
        """One head whose bilinear form is `Φ(LN(D))` (row LayerNorm without parameters,
        `eps`, then the learner on each row). `V` (`(d, d)` or `(1, d, d)`) defaults to the
        identity, `beta` to `1/√d`. `learner` is a `MetricLearner` or any row map
        `(d, d) -> (d, d)` module.

        **Raises:** `ValueError` for a learner that is not a `MetricLearner` without `V`, or
        a `V` of another shape (one head, of the learner's size `d`).
        """
        if isinstance(learner, MetricLearner):
            d = learner.w1.shape[-1]
            dtype = learner.w1.dtype
        elif V is not None:
            d = jnp.shape(V)[-1]
            dtype = jnp.asarray(V).dtype
        else:
            raise ValueError(
                "PLGAFlow.from_metric_learner: pass V (its size fixes d) with a learner that "
                "is not a MetricLearner."
            )
        if V is not None and jnp.shape(V) not in ((d, d), (1, d, d)):
            raise ValueError(
                f"PLGAFlow.from_metric_learner: V must have shape (d, d) = {(d, d)} or "
                f"(1, d, d) (one head), got {jnp.shape(V)}."
            )
        V = jnp.eye(d, dtype=dtype) if V is None else V
        beta = 1 / math.sqrt(d) if beta is None else beta
        return cls(
            _LearnerGenerator(learner, float(eps)),
            V,
            beta=beta,
            causal=causal,
            normalisation=normalisation,
        )

    def frozen(self, G) -> "PLGAFlow":
        """The same flow with `G` fixed (`(heads, d, d)` or `(d, d)` for all heads): the
        collapsed model, a fixed-`A` softmax flow."""
        return PLGAFlow(
            self.generator,
            self.V,
            beta=self.beta,
            G=G,
            causal=self.causal,
            normalisation=self.normalisation,
        )

    # -- the field -------------------------------------------------------------------------------

    @property
    def d(self) -> int:
        return self.V.shape[-1]

    @property
    def heads(self) -> int:
        return self.V.shape[0]

    @property
    def manifold(self) -> str:
        return "euclidean" if self.normalisation == "pre_ln" else "sphere"

    def natural_rate(self, x0: Tokens | None = None) -> Float[Array, ""]:
        """Softmax heads move at most `Σ_h ‖V_h‖₂`; 1 for nGPT."""
        if self.normalisation == "ngpt":
            return jnp.ones((), self.V.dtype)
        r = jnp.sum(jax.vmap(lambda v: jnp.linalg.norm(v, ord=2))(self.V))
        return jnp.where(jnp.isfinite(r) & (r > 0), r, 1.0)

    def energy_curvature(self, x: Tokens) -> Float[Array, "heads d d"]:
        """The bilinear forms `G_h` in force at tokens `x` (the frozen `G` if set)."""
        if self.G is not None:
            return self.G
        xh = normalise(x)
        hi = jnp.promote_types(xh.dtype, jnp.float32)  # the PLGA chain runs in ≥ float32
        D = (xh.T @ xh).astype(hi)
        G = self.generator(D)
        if G.shape != self.V.shape:
            raise ValueError(
                f"PLGAFlow: the generator returned G of shape {G.shape}; V is {self.V.shape}."
            )
        return G.astype(xh.dtype)

    def drive(self, x: Tokens) -> Tokens:
        xh = normalise(x)
        G = self.energy_curvature(xh)
        per_head = jax.vmap(lambda g, v, b: attention_drive(xh, g, v, b, "sa", causal=self.causal))(
            G, self.V, self.beta
        )
        return jnp.sum(per_head, axis=0)

    def __call__(self, t, x: Tokens, args=None) -> Tokens:
        del t, args
        return normalised_field(normalise(x), self.drive(x), self.normalisation)
