"""Power Law Graph Attention (PLGA), multi-head, on one sequence.

Source: Gokden, *Power law graph attention: exact generalization of scaled dot-product
attention, empirical collapse at inference* (2026); PLDR-LLM (arXiv 2410.16703, 2502.13502).
The conventions are those of the reference implementation (see tests/fixtures/README.md).
"""

import math
from typing import Literal, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float, Int, PRNGKeyArray

from ._metric_learner import LayerNorm, Linear, MetricLearner, xavier_uniform
from ._rope import RopeStyle, apply_rope

AttentionKind = Literal["plga", "sdpa"]


class DeductiveOutputs(NamedTuple):
    r"""The deductive outputs of one PLGA layer for one sequence.

    - `A`: metric-learner output, `(heads, dk, dk)`.
    - `A_LM`: metric tensor `iSwiGLU(W A + b_W) + ε`, `(heads, dk, dk)`.
    - `A_P`: potential tensor `A_LM^{∘P}`, `(heads, dk, dk)`.
    - `G_LM`: energy-curvature tensor `a A_P + b_a`, `(heads, dk, dk)`.
    - `scores`: `q̃ G_LM k̃ᵀ/√dk` before the mask, `(heads, seq, seq)`. Entries beyond the
      dtype's range are reported as `±inf` (the attention itself stays finite, see
      `PowerLawGraphAttention.attend`).
    - `overflow`: bool `(heads,)`, True where the head's score path left the dtype's range:
      `A_P = A_LM^{∘P}` saturated at its cap (see `potential_power`), or a non-finite `G_LM` or
      score. `score_overflow` turns it into a report (layer, head, largest `|G_LM|`).

    With `causal_density=True` the four tensors carry a leading `seq` axis (one per query
    position). Entries not computed (an injected `G`, or an SDPA layer) are `None`; an
    injected `G` is reported as `G_LM`.
    """

    A: Array | None
    A_LM: Array | None
    A_P: Array | None
    G_LM: Array | None
    scores: Array
    overflow: Array | None = None


def potential_power(
    x: Array, p: Array, epsilon: float, *, log_cap: ArrayLike | None = None
) -> Array:
    r"""`x^{∘p}` computed as `exp(p · log max(x, ε))`.

    The base is floored at `max(ε, tiny(dtype))` so that `log` never sees 0 (ε = 1e-9 underflows
    in float16) and the gradient `p x^{p−1}` stays finite; the exponent is capped at
    `log(max(dtype)) − 2`, or at `log_cap` (broadcast against `x`) when smaller, so that a tiny
    base raised to a negative power saturates instead of becoming `inf`. A saturated entry is
    exactly `exp(cap)` (`PowerLawGraphAttention` reports it as an overflow); in float64 the
    cap is never reached by the reference models.
    """
    finfo = jnp.finfo(x.dtype)
    floor = jnp.asarray(max(float(epsilon), float(finfo.tiny)), x.dtype)
    z = p * jnp.log(jnp.where(x >= floor, x, floor))
    cap = jnp.asarray(math.log(float(finfo.max)) - 2.0, x.dtype)
    if log_cap is not None:
        cap = jnp.minimum(cap, jnp.asarray(log_cap, x.dtype))
    return jnp.exp(jnp.minimum(z, cap))


def masked_softmax(scores: Array, allowed: Array, *, scale: ArrayLike | None = None) -> Array:
    r"""Softmax over the last axis of `scale · scores`, restricted to `allowed` keys.

    Equal to the reference's `softmax(scores − 1e9·mask)` whenever a row has at least one allowed
    key; a row with no allowed key returns zeros (the reference returns `softmax(scores)` there).
    No `NaN` forward or backward from the masked scores, whatever their size or the dtype.

    Infinite scores take their limit instead of turning the row into `NaN` (`inf − inf`): a row
    with allowed `+inf` scores spreads its mass evenly over them; `−inf` scores get 0 (a row of
    allowed `−inf` only is uniform over them). `NaN` scores stay `NaN`.

    `scale` (positive, broadcast against `scores`, e.g. a power of two per head) is applied as
    `exp(scale · (s − max s))`, so `scale · scores` is never formed: it may exceed the dtype.
    """
    finfo = jnp.finfo(scores.dtype)
    neg = jnp.asarray(finfo.min, scores.dtype)
    plus_inf = allowed & (scores == jnp.inf)
    any_inf = jnp.any(plus_inf, axis=-1, keepdims=True)
    s = jnp.where(scores == -jnp.inf, neg, scores)
    s = jnp.where(allowed & ~any_inf, s, neg)
    s = jnp.where(plus_inf, 0, s)  # in a row with +inf scores, only those count
    s = s - jax.lax.stop_gradient(jnp.max(s, axis=-1, keepdims=True))
    if scale is not None:
        s = jnp.asarray(scale, s.dtype) * s
    e = jnp.where(allowed & (plus_inf | ~any_inf), jnp.exp(s), 0)
    denom = jnp.sum(e, axis=-1, keepdims=True)
    return e / jnp.where(denom > 0, denom, 1)


_SCALE_FROM = 2.0**64  # |G| up to this: scores are formed directly (exactly the reference)


def _split_scale(G: Array) -> tuple[Array, Array]:
    """`G = 2^E Ĝ` per head (over the last two axes), `E = 0` unless `max |G| > 2⁶⁴`, else
    `max |Ĝ| ∈ [1, 2)`; powers of two make the split exact. Returns `(Ĝ, 2^E)`, `2^E` with
    shape `G.shape[:-2] + (1, 1)` and at most `2^{max exponent − 1}` (finite)."""
    big = jnp.max(jnp.abs(G), axis=(-2, -1), keepdims=True)
    finite_big = jnp.where(jnp.isfinite(big), big, 0)
    _, e = jnp.frexp(finite_big)
    E = jnp.where(finite_big > _SCALE_FROM, e - 1, 0)
    return jnp.ldexp(G, -E), jnp.ldexp(jnp.ones((), G.dtype), E)


def heads_first(x: Float[Array, "seq heads dk"]) -> Float[Array, "heads seq dk"]:
    """`(seq, heads, dk) → (heads, seq, dk)`, the layout `PowerLawGraphAttention.attend` reads
    keys and values in."""
    return jnp.swapaxes(x, 0, 1)


def look_ahead_mask(seq: int) -> Bool[Array, "seq seq"]:
    """`allowed[i, j] = j ≤ i` (True = query i may attend to key j)."""
    return jnp.tril(jnp.ones((seq, seq), bool))


def nonfinite_G_problem(G, dtype) -> str | None:
    """Why a concrete `G` is not finite once cast to `dtype` (how many entries, the first
    index); None when it is finite or traced."""
    if isinstance(G, jax.core.Tracer):
        return None
    finite = np.isfinite(np.asarray(jnp.asarray(G, dtype)))
    if finite.all():
        return None
    where = [int(i) for i in np.argwhere(~finite)[0]]
    return (
        f"has {int((~finite).sum())} non-finite entries (NaN or inf in "
        f"{jnp.dtype(dtype).name}), the first at index {where}"
    )


class PowerLawGraphAttention(eqx.Module):
    r"""Multi-head Power Law Graph Attention on one sequence (docs/theory/plga.md, steps 1–7).

    Per head, with `x` of shape `(seq, D)`:

    1. `q, k, v` from biased linear maps; RoPE on `q, k` → `q̃, k̃`.
    2. density operator `D = Σ_positions q̃ᵀq̃` (`dk × dk`, all positions, padding included);
    3. `A = Φ(LN(D))`: LayerNorm of each row, then the residual SwiGLU metric learner on each row
       (one learner for all heads);
    4. `A_LM = iSwiGLU(W A + b_W) + ε`, `iSwiGLU(u) = u² σ(u)`, `W A` a per-head matrix product;
    5. `A_P = A_LM^{∘P}` (elementwise power);
    6. `G_LM = a A_P + b_a`;
    7. `softmax_masked(q̃ G_LM k̃ᵀ / √dk) v`, heads concatenated, output projection.

    `G_LM = I` is scaled dot-product attention exactly. `attention="sdpa"` builds that layer
    without the metric learner and PLGA tensors (for benchmarks).

    **Extension (ours, not in the reference):** `causal_density=True` replaces step 2 by the
    prefix sums `D_i = Σ_{j ≤ i} q̃_jᵀ q̃_j`, so every query position gets its own `A, …, G_LM`
    and the layer is causal (the reference layer is not: later tokens change earlier outputs).
    The deductive tensors then have a leading `seq` axis.

    **Arguments (init):** `d_model`, `num_heads`, `head_dim`, `A_dff`, `num_reslayerA`,
    `num_denseA`; keyword: `rope_base`, `rope` (`"interleaved"` | `"half"`), `layer_norm_eps`,
    `epsilon`, `causal_density`, `attention` (`"plga"` | `"sdpa"`), `key`, `dtype`.

    Source: Gokden (2026), PLGA; PLDR-LLM v51 (arXiv 2410.16703, 2502.13502).
    """

    wq: Linear
    wk: Linear
    wv: Linear
    dense: Linear
    gram_norm: LayerNorm | None
    metric_learner: MetricLearner | None
    W: Float[Array, "heads dk dk"] | None
    b_W: Float[Array, "heads dk dk"] | None
    P: Float[Array, "heads dk dk"] | None
    a: Float[Array, "heads dk dk"] | None
    b_a: Float[Array, "heads dk dk"] | None
    num_heads: int = eqx.field(static=True)
    head_dim: int = eqx.field(static=True)
    rope_base: float = eqx.field(static=True)
    rope: RopeStyle = eqx.field(static=True)
    epsilon: float = eqx.field(static=True)
    causal_density: bool = eqx.field(static=True)
    attention: AttentionKind = eqx.field(static=True)

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        head_dim: int,
        A_dff: int,
        num_reslayerA: int,
        num_denseA: int,
        *,
        rope_base: float = 10000.0,
        rope: RopeStyle = "interleaved",
        layer_norm_eps: float = 1e-6,
        epsilon: float = 1e-9,
        causal_density: bool = False,
        attention: AttentionKind = "plga",
        key: PRNGKeyArray,
        dtype=jnp.float32,
    ):
        if attention not in ("plga", "sdpa"):
            raise ValueError(f"`attention` must be 'plga' or 'sdpa', got {attention!r}.")
        if rope not in ("interleaved", "half"):
            raise ValueError(f"`rope` must be 'interleaved' or 'half', got {rope!r}.")
        if head_dim % 2:
            raise ValueError(f"`head_dim` must be even for RoPE, got {head_dim}.")
        kq, kk, kv, ko, kl, kW, kP, ka = jax.random.split(key, 8)
        hd = num_heads * head_dim
        self.wq = Linear(d_model, hd, key=kq, dtype=dtype)
        self.wk = Linear(d_model, hd, key=kk, dtype=dtype)
        self.wv = Linear(d_model, hd, key=kv, dtype=dtype)
        self.dense = Linear(hd, d_model, key=ko, dtype=dtype)
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.rope_base = float(rope_base)
        self.rope = rope
        self.epsilon = float(epsilon)
        self.causal_density = bool(causal_density)
        self.attention = attention
        if attention == "sdpa":
            self.gram_norm = self.metric_learner = None
            self.W = self.b_W = self.P = self.a = self.b_a = None
            return
        shape = (num_heads, head_dim, head_dim)
        self.gram_norm = LayerNorm(head_dim, eps=layer_norm_eps, dtype=dtype)
        self.metric_learner = MetricLearner(
            head_dim, A_dff, num_reslayerA, num_denseA, eps=layer_norm_eps, key=kl, dtype=dtype
        )
        # Our initialisation (the reference's is not part of the port): W, a Xavier-uniform per
        # head, small random exponents P ~ N(0, 0.1²), zero biases.
        self.W = xavier_uniform(kW, shape, dtype)
        self.b_W = jnp.zeros(shape, dtype)
        self.P = 0.1 * jax.random.normal(kP, shape, dtype)
        self.a = xavier_uniform(ka, shape, dtype)
        self.b_a = jnp.zeros(shape, dtype)

    # -- pieces (also used by the caches) ------------------------------------------------------

    def project(
        self, x: Float[Array, "seq D"], positions: Int[ArrayLike, " seq"]
    ) -> tuple[Array, Array, Array]:
        """`(q̃, k̃, v)`, each `(seq, heads, dk)`: biased projections, RoPE on `q` and `k`."""
        seq = x.shape[0]
        split = lambda y: y.reshape(seq, self.num_heads, self.head_dim)
        q, k, v = split(self.wq(x)), split(self.wk(x)), split(self.wv(x))
        q = apply_rope(q, positions, base=self.rope_base, style=self.rope)
        k = apply_rope(k, positions, base=self.rope_base, style=self.rope)
        return q, k, v

    def density(
        self, q: Float[Array, "seq heads dk"], weights: Float[Array, " seq"] | None = None
    ) -> Array:
        """Density operator `Σ_s w_s q̃_sᵀ q̃_s`: `(heads, dk, dk)`, or its prefix sums
        `(seq, heads, dk, dk)` when `causal_density`. `weights` (0/1) drop positions (used
        for unfilled cache slots); `None` keeps all, as the reference does."""
        qw = q if weights is None else q * weights[:, None, None].astype(q.dtype)
        if self.causal_density:
            return jnp.cumsum(jnp.einsum("shm,shn->shmn", qw, q), axis=0)
        return jnp.einsum("shm,shn->hmn", qw, q)

    def metric(self, D: Array) -> Array:
        """`A = Φ(LN(D))`, LayerNorm and learner acting on each row; same shape as `D`."""
        return self.metric_learner(self.gram_norm(D))

    def power_log_cap(self, dtype) -> Array:
        """Per-head cap `(heads, 1, 1)` on `log A_P` (`potential_power`'s `log_cap`): with
        `A_P ≤ max(dtype) / (4 max_m Σ_n |a_mn|)`, `G_LM = a A_P + b_a` cannot overflow however
        small `A_LM` and negative `P` get (float32: `A_LM = ε = 1e-9` with `P = −4.5` gives
        1e40). Never reached in float64 by the reference models."""
        a = jax.lax.stop_gradient(self.a).astype(dtype)
        row = jnp.max(jnp.sum(jnp.abs(a), axis=-1), axis=-1)[:, None, None]
        big = jnp.asarray(float(jnp.finfo(dtype).max) / 4, dtype)
        return jnp.log(big) - jnp.log(jnp.maximum(row, 1))

    def curvature(self, A: Array) -> tuple[Array, Array, Array]:
        """`(A_LM, A_P, G_LM)` from `A` of shape `(..., heads, dk, dk)` (steps 4–6); `A_P`
        saturates at `exp(power_log_cap)` (a finite `G_LM` by construction)."""
        u = jnp.einsum("hmn,...hnk->...hmk", self.W, A) + self.b_W
        A_LM = u * jax.nn.silu(u) + jnp.asarray(self.epsilon, u.dtype)
        A_P = potential_power(A_LM, self.P, self.epsilon, log_cap=self.power_log_cap(u.dtype))
        G_LM = jnp.einsum("hmn,...hnk->...hmk", self.a, A_P) + self.b_a
        return A_LM, A_P, G_LM

    def power_saturated(self, A_P: Array) -> Array:
        """Bool `(heads,)`: True where an entry of `A_P` (`(..., heads, dk, dk)`) sits at the cap
        of `potential_power`, i.e. `A_LM^P` exceeded what the dtype holds."""
        finfo = jnp.finfo(A_P.dtype)
        cap = jnp.minimum(math.log(float(finfo.max)) - 2.0, self.power_log_cap(A_P.dtype))
        hit = A_P >= jnp.exp(cap) * (1 - 8 * float(finfo.eps))
        return jnp.any(hit.reshape(-1, *hit.shape[-3:]), axis=(0, 2, 3))

    def deductive(
        self, q: Float[Array, "seq heads dk"], weights: Float[Array, " seq"] | None = None
    ) -> tuple[Array, Array, Array, Array]:
        """`(A, A_LM, A_P, G_LM)` from the rotated queries (steps 2–6), computed in float32 or
        better whatever the compute dtype (bf16 loses the power law: `G_LM` off by ~30 %)."""
        q = q.astype(jnp.promote_types(q.dtype, jnp.float32))  # the chain runs in ≥ float32
        A = self.metric(self.density(q, weights))
        return (A, *self.curvature(A))

    def attend(
        self,
        q: Float[Array, "sq heads dk"],
        k: Float[Array, "heads sk dk"],
        v: Float[Array, "heads sk dk"],
        G: Array | None,
        allowed: Bool[Array, "sq sk"],
    ) -> tuple[Float[Array, "sq D"], Float[Array, "heads sq sk"]]:
        """Scores `q̃ G k̃ᵀ/√dk` (plain `q̃ k̃ᵀ/√dk` when `G is None`), masked softmax, values,
        output projection. `G`: `(heads, dk, dk)` or per query `(sq, heads, dk, dk)`.

        Keys and values are head-major, `(heads, sk, dk)`: the layout of the decode cache, so
        that a decoded token's attention reads the cache in place (a position-major cache was
        re-laid out, i.e. copied whole, in every layer of every step).
        Scores and softmax are computed in float32 or better; the output has `v`'s dtype."""
        hi = jnp.promote_types(q.dtype, jnp.float32)
        scale = None
        if G is None:
            qG = q
        else:
            # G = 2^E Ĝ exactly (E = 0 unless max |G| > 2⁶⁴): the scores q̃ Ĝ k̃ᵀ stay finite,
            # the softmax takes 2^E inside its exponent; a G_LM of ~1e38 (float32, A_P at its
            # cap) gives an arg-max attention, not NaN.
            G, scale = _split_scale(G.astype(hi))
            scale = jnp.swapaxes(scale[..., 0], 0, 1) if G.ndim == 4 else scale
            qG = jnp.einsum("ihm,hmn->ihn" if G.ndim == 3 else "ihm,ihmn->ihn", q.astype(hi), G)
        scores = jnp.einsum("ihn,hjn->hij", qG.astype(hi), k.astype(hi)) / math.sqrt(self.head_dim)
        probs = masked_softmax(scores, allowed[None], scale=scale)
        out = jnp.einsum("hij,hjn->ihn", probs, v.astype(hi)).reshape(q.shape[0], -1)
        if scale is not None:
            scores = scores * scale  # the reported scores (±inf beyond the dtype's range)
        return self.dense(out.astype(v.dtype)), scores

    def overflow(self, A_P: Array | None, G: Array | None, scores: Array) -> Array:
        """Bool `(heads,)`: the head's score path left the dtype's range (`A_P` saturated, a
        non-finite `G` or score); see `DeductiveOutputs.overflow`."""
        bad = ~jnp.all(jnp.isfinite(scores), axis=(-2, -1))
        if G is not None:
            Gf = ~jnp.isfinite(G)
            bad = bad | jnp.any(Gf.reshape(-1, *Gf.shape[-3:]), axis=(0, 2, 3))
        if A_P is not None:
            bad = bad | self.power_saturated(A_P)
        return bad

    def check_G(self, G: ArrayLike) -> Array:
        """Validate an injected `G` (`(heads, dk, dk)` or `(dk, dk)`, broadcast over heads):
        its shape, and (when concrete) that it is finite in the layer's dtype."""
        G = jnp.asarray(G)
        H, dk = self.num_heads, self.head_dim
        if G.shape == (dk, dk):
            G = jnp.broadcast_to(G, (H, dk, dk))
        if G.shape != (H, dk, dk):
            raise ValueError(f"`G` must have shape (heads, dk, dk) = {(H, dk, dk)}, got {G.shape}.")
        why = nonfinite_G_problem(G, self.wq.weight.dtype)
        if why is not None:
            raise ValueError(f"`G` {why}; every logit would be non-finite.")
        return G

    # -- the layer -------------------------------------------------------------------------------

    def __call__(
        self,
        x: Float[Array, "seq D"],
        *,
        mask: Bool[ArrayLike, "seq seq"] | None = None,
        key_padding: Bool[ArrayLike, " seq"] | None = None,
        G: Float[ArrayLike, "heads dk dk"] | None = None,
        positions: Int[ArrayLike, " seq"] | None = None,
    ) -> tuple[Float[Array, "seq D"], DeductiveOutputs]:
        r"""Apply PLGA to one sequence.

        **Arguments:**

        - `x`: input, shape `(seq, D)`.
        - `mask`: boolean `(seq, seq)`, `True` where query `i` may attend to key `j`. Default:
          the look-ahead mask `j ≤ i`.
        - `key_padding`: boolean `(seq,)`, `True` where the key is padding (masked out for every
          query; padded positions still enter the density operator, as in the reference).
        - `G`: optional fixed energy-curvature tensor `(heads, dk, dk)` (or `(dk, dk)`, shared by
          the heads) used instead of `G_LM`; the metric learner is skipped. `G = I` is SDPA.
        - `positions`: integer RoPE positions `(seq,)`; default `0 … seq−1`.

        **Returns:** `(out, DeductiveOutputs(A, A_LM, A_P, G_LM, scores))`: `out` of shape
        `(seq, D)`, per-head tensors `(heads, dk, dk)`, `scores` `(heads, seq, seq)` before the
        mask.

        **Raises:** `ValueError` for a wrongly shaped `x`, `mask`, `key_padding`, `G` or
        `positions`.
        """
        x = jnp.asarray(x)
        if x.ndim != 2 or x.shape[1] != self.wq.weight.shape[1]:
            raise ValueError(
                f"`x` must have shape (seq, {self.wq.weight.shape[1]}), got {x.shape}; "
                "batch with vmap."
            )
        seq = x.shape[0]
        if positions is None:
            positions = jnp.arange(seq)
        positions = jnp.asarray(positions)
        if positions.shape != (seq,):
            raise ValueError(f"`positions` must have shape ({seq},), got {positions.shape}.")
        if mask is None:
            allowed = look_ahead_mask(seq)
        else:
            allowed = jnp.asarray(mask, bool)
            if allowed.shape != (seq, seq):
                raise ValueError(f"`mask` must have shape ({seq}, {seq}), got {allowed.shape}.")
        if key_padding is not None:
            key_padding = jnp.asarray(key_padding, bool)
            if key_padding.shape != (seq,):
                raise ValueError(
                    f"`key_padding` must have shape ({seq},), got {key_padding.shape}."
                )
            allowed = allowed & ~key_padding[None, :]
        q, k, v = self.project(x, positions)
        k, v = heads_first(k), heads_first(v)
        if G is not None:
            G = self.check_G(G).astype(x.dtype)
            out, scores = self.attend(q, k, v, G, allowed)
            return out, DeductiveOutputs(
                None, None, None, G, scores, self.overflow(None, G, scores)
            )
        if self.attention == "sdpa":
            out, scores = self.attend(q, k, v, None, allowed)
            return out, DeductiveOutputs(
                None, None, None, None, scores, self.overflow(None, None, scores)
            )
        A, A_LM, A_P, G_LM = self.deductive(q)
        out, scores = self.attend(q, k, v, G_LM, allowed)
        return out, DeductiveOutputs(A, A_LM, A_P, G_LM, scores, self.overflow(A_P, G_LM, scores))


class ScoreOverflow(NamedTuple):
    """One overflowing head of a PLGA forward pass (see `score_overflow`).

    - `layer`, `head`: where.
    - `max_abs_G_LM`: the largest `|G_LM|` of that head (`nan` when the layer has no `G`).
    - `max_abs_score`: the largest `|score|` (`inf` when a score left the dtype's range).
    - `dtype`: the dtype of the scores.
    """

    layer: int
    head: int
    max_abs_G_LM: float
    max_abs_score: float
    dtype: str

    def __str__(self) -> str:
        return (
            f"layer {self.layer}, head {self.head}: largest |G_LM| = {self.max_abs_G_LM:.3g}, "
            f"largest |score| = {self.max_abs_score:.3g} ({self.dtype})"
        )


def _per_head_max(x: Array, head_axis: int) -> np.ndarray:
    x = np.moveaxis(np.abs(np.asarray(x, np.float64)), head_axis, 0)
    return x.reshape(x.shape[0], -1).max(axis=1)


def score_overflow(deductive) -> list[ScoreOverflow]:
    r"""The heads whose score path overflowed, from the deductive outputs of a forward pass.

    In float32, learned exponents `P ≈ −4.5` with the metric tensor at its floor `ε = 1e-9` ask
    for `A_P = A_LM^{∘P} ≈ 1e40`: `A_P` saturates at its cap (`potential_power`), `G_LM` reaches
    ~1e38 and the scores leave the range. The attention stays finite (`attend` takes the scale
    of `G` inside the softmax: an arg-max attention), but the power law computed is not the
    model's any more; this says where.

    **Arguments:** `deductive`: the list of per-layer `DeductiveOutputs` returned by
    `PLDRLLM.__call__` (or one `DeductiveOutputs`), concrete (not traced); leading batch axes
    (from `vmap`) are reduced over.

    **Returns:** one `ScoreOverflow` per overflowing (layer, head), largest `|G_LM|` first;
    empty when every head is within range. `format_score_overflow` makes a message of it.

    **Raises:** `ValueError` for outputs without the `overflow` flag or traced values.
    """
    if isinstance(deductive, DeductiveOutputs):
        deductive = [deductive]
    out = []
    for layer, d in enumerate(deductive):
        if d.overflow is None:
            raise ValueError(f"score_overflow: layer {layer}'s deductive outputs have no flag.")
        if isinstance(d.overflow, jax.core.Tracer):
            raise ValueError("score_overflow needs concrete outputs; use check_score_overflow.")
        flags = np.asarray(d.overflow)
        flags = flags.reshape(-1, flags.shape[-1]).any(axis=0)
        if not flags.any():
            continue
        g = _per_head_max(d.G_LM, -3) if d.G_LM is not None else None
        s = _per_head_max(d.scores, -3)
        for h in np.flatnonzero(flags):
            out.append(
                ScoreOverflow(
                    layer,
                    int(h),
                    float("nan") if g is None else float(g[h]),
                    float(s[h]),
                    str(jnp.asarray(d.scores).dtype),
                )
            )
    return sorted(out, key=lambda r: -np.nan_to_num(r.max_abs_G_LM, nan=-1.0))


def format_score_overflow(reports: list[ScoreOverflow]) -> str | None:
    """A one-paragraph message for `score_overflow`'s result (`None` when it is empty)."""
    if not reports:
        return None
    heads = "; ".join(str(r) for r in reports[:8])
    more = f" (and {len(reports) - 8} more)" if len(reports) > 8 else ""
    return (
        f"PLGA score overflow in {len(reports)} head(s): {heads}{more}. A_P = A_LM^P exceeded "
        f"{reports[0].dtype} (metric tensor at its floor ε with negative exponents P); the "
        "attention of these heads is an arg-max, not the power law. Use float64 or smaller |P|."
    )


def check_score_overflow(x, deductive):
    """`x` unchanged, with a run-time error (`eqx.error_if`, works under `jit`) naming the first
    layer whose score path overflowed (see `score_overflow` for heads and `|G_LM|`)."""
    for layer, d in enumerate(deductive):
        if d.overflow is not None:
            x = eqx.error_if(
                x,
                jnp.any(d.overflow),
                f"PLGA score overflow in layer {layer}: A_P = A_LM^P or the scores exceeded the "
                "dtype's range; jaxattn.plga.score_overflow(deductive) names the heads and the "
                "largest |G_LM|.",
            )
    return x
