"""Collapse-based inference: a PLDR-LLM with its energy-curvature tensors frozen.

When the deductive outputs of a trained PLDR-LLM have collapsed (are the same for every input),
the metric learner and the power-law stage compute a constant. Freezing `G_LM` removes them:
each layer becomes a *generalised SDPA*, `softmax(q̃ G k̃ᵀ/√dk) v`, computed as `q' = q̃ G`
followed by ordinary attention. When `G` lies in the commutant of the RoPE rotations
(block-diagonal over the RoPE pairs with 2×2 blocks `[[a, −b], [b, a]]`, see
`rope_commutant_projection`), `rope(q) G = rope(q G)`, so `G` folds exactly into the query
projection (`W_q' = Gᵀ W_q` per head, `b_q' = b_q G`) and the layer *is* SDPA.

Source: docs/theory/plga.md ("A constant G can be folded into the query projection ... when G
commutes with every RoPE rotation"); Gokden, *Power law graph attention: ... empirical collapse
at inference* (2026).
"""

from __future__ import annotations

from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Int

from ._attention import nonfinite_G_problem
from ._audits import deductive_tensors, rope_commutant_projection, rope_commutant_residual
from ._cache import DecodeCache, decode_step, prefill
from ._model import PLDRLLM

__all__ = ["CollapsedPLDRLLM", "collapse", "collapse_error", "frozen_G"]

FoldMode = Literal["auto", "always", "never"]


def frozen_G(
    model: PLDRLLM, ids: Int[ArrayLike, "*prompts seq"]
) -> Float[Array, "layers heads dk dk"]:
    """The `G_LM` to freeze: the model's `G_LM` on one prompt `(seq,)`, or its mean over a batch
    of prompts `(prompts, seq)`. For a collapsed model every choice is the same."""
    g = deductive_tensors(model, ids)["G_LM"]
    return g if jnp.asarray(ids).ndim == 1 else jnp.mean(g, axis=0)


class CollapsedPLDRLLM(eqx.Module):
    """A PLDR-LLM with frozen `G_LM`: SDPA-shaped layers (no density operator, metric learner or
    PLGA tensors) plus one fixed `G` per layer.

    - `model`: a `PLDRLLM` built with `attention="sdpa"`; the query projections of folded
      layers already contain their `G`.
    - `G`: per layer, `(heads, dk, dk)` applied as `q' = q̃ G`, or `None` for a folded layer.
    - `folded`: per layer, whether `G` was folded into `W_q` (static).

    Call it like a `PLDRLLM`: `logits, deductive = collapsed(ids)`. Cached decoding:
    `prefill` / `decode_step` / `generate` (greedy) below, with a KV cache (no `G` to cache:
    it is part of the model).
    """

    model: PLDRLLM
    G: tuple[Float[Array, "heads dk dk"] | None, ...]
    folded: tuple[bool, ...] = eqx.field(static=True)

    def _G(self):
        """`G` for `PLDRLLM`: `None` when every layer is folded (plain SDPA), else one array per
        layer (the identity for folded layers, which the cache needs)."""
        if all(self.folded):
            return None
        H, dk = self.model.config.num_heads, self.model.config.head_dim
        eye = jnp.broadcast_to(jnp.eye(dk, dtype=self.model.dtype), (H, dk, dk))
        return jnp.stack([eye if g is None else g for g in self.G])

    def __call__(self, ids: Int[ArrayLike, " seq"]):
        """Uncached forward pass: `(logits (seq, vocab), deductive outputs)`; `G_LM` in the
        deductive outputs is the frozen `G` (`None` for a folded layer)."""
        return self.model(ids, G=list(self.G))

    def prefill(self, ids: Int[ArrayLike, " seq"], *, max_len: int | None = None):
        """`(prompt logits (seq, vocab), DecodeCache)` with a KV cache (see `_cache.prefill`)."""
        return prefill(self.model, ids, cache="kv", max_len=max_len, G=self._G())

    def decode_step(self, cache: DecodeCache, token: Int[ArrayLike, ""]):
        """`(logits (vocab,), new cache)` for one token (see `_cache.decode_step`)."""
        return decode_step(self.model, cache, token)

    def generate(
        self, prompt_ids: Int[ArrayLike, " seq"], *, max_new_tokens: int
    ) -> Int[Array, " n"]:
        """Greedy generation with the KV cache: `max_new_tokens` new ids (int32)."""
        n = int(max_new_tokens)
        if n < 1:
            raise ValueError(f"`max_new_tokens` must be ≥ 1, got {n}.")
        prompt = self.model.check_ids(prompt_ids, name="prompt_ids")
        logits, cache = self.prefill(prompt, max_len=prompt.shape[0] + n - 1)
        tok0 = jnp.argmax(logits[-1]).astype(jnp.int32)
        if n == 1:
            return tok0[None]
        return _greedy_scan(self.model, cache, tok0, n - 1)


@eqx.filter_jit
def _greedy_scan(model, cache, tok0, steps: int):
    def step(carry, _):
        cache, tok = carry
        lg, cache = decode_step(model, cache, tok)
        nxt = jnp.argmax(lg).astype(jnp.int32)
        return (cache, nxt), nxt

    _, rest = jax.lax.scan(step, (cache, tok0), None, length=steps)
    return jnp.concatenate([tok0[None], rest])


def _sdpa_copy(model: PLDRLLM) -> PLDRLLM:
    """The same weights in an SDPA-shaped `PLDRLLM` (metric learner and PLGA tensors dropped)."""
    skeleton = eqx.filter_eval_shape(
        lambda: PLDRLLM(model.config, key=jax.random.key(0), dtype=model.dtype, attention="sdpa")
    )
    L = len(model.layers)
    parts = lambda m: (
        m.embedding,
        m.emb_norm,
        m.final_layer,
        *[getattr(layer.attn, f) for layer in m.layers for f in ("wq", "wk", "wv", "dense")],
        *[getattr(layer, f) for layer in m.layers for f in ("ffn", "ln1", "ln2")],
    )
    out = eqx.tree_at(parts, skeleton, parts(model))
    assert len(parts(out)) == 3 + 7 * L
    left = [x for x in jax.tree.leaves(out) if isinstance(x, jax.ShapeDtypeStruct)]
    if left:  # every leaf of the SDPA shape must come from `model`
        raise RuntimeError(f"_sdpa_copy: {len(left)} parameters were not copied.")
    return out


def _fold_query(linear, G: Float[Array, "heads dk dk"]):
    """`x ↦ (x W_qᵀ + b_q) G` per head as one linear map: `W_q' = Gᵀ W_q`, `b_q' = b_q G`."""
    H, dk, _ = G.shape
    W = linear.weight.reshape(H, dk, -1)  # [out = heads·dk, in]
    b = linear.bias.reshape(H, dk)
    W2 = jnp.einsum("hmn,hmi->hni", G, W).reshape(H * dk, -1)
    b2 = jnp.einsum("hm,hmn->hn", b, G).reshape(H * dk)
    return eqx.tree_at(lambda lin: (lin.weight, lin.bias), linear, (W2, b2))


def collapse(
    model: PLDRLLM,
    G: Float[ArrayLike, "layers heads dk dk"] | None = None,
    *,
    ids: Int[ArrayLike, "*prompts seq"] | None = None,
    fold: FoldMode = "auto",
    fold_rtol: float = 1e-6,
) -> CollapsedPLDRLLM:
    """Freeze `G_LM` into a generalised-SDPA model (the metric learner removed).

    **Arguments:**

    - `model`: a PLGA `PLDRLLM`.
    - `G`: the tensors to freeze, `(layers, heads, dk, dk)` (e.g. the shipped v51 `G_LM`), or
    - `ids`: prompts `(seq,)` or `(prompts, seq)` from which `frozen_G` takes them.
    - `fold`: `"auto"` folds a layer into `W_q` when every head's RoPE commutant residual is
      `≤ fold_rtol` (exact up to that residual); `"always"` folds the commutant projection
      `Π(G)` of every layer (exact only for `G` in the commutant: the error is the point of
      measuring it); `"never"` keeps `q' = q̃ G` everywhere (exact for any `G`).

    **Returns:** a `CollapsedPLDRLLM`. For a collapsed model (input-invariant `G_LM`) its logits
    equal the original's for every input; otherwise `collapse_error` quantifies the difference.

    **Raises:** `ValueError` if neither or both of `G` and `ids` are given, `G` has the wrong
    shape or (when concrete) NaN or infinite entries in the model's dtype, `fold` is unknown,
    or the model is not a PLGA model.
    """
    if fold not in ("auto", "always", "never"):
        raise ValueError(f"`fold` must be 'auto', 'always' or 'never', got {fold!r}.")
    if (G is None) == (ids is None):
        raise ValueError("collapse: give exactly one of `G` and `ids`.")
    if G is None:
        if model.attention != "plga":
            raise ValueError("collapse: `ids` needs a PLGA model (an SDPA model has no G_LM).")
        G = frozen_G(model, ids)
    c = model.config
    G = jnp.asarray(G, dtype=model.dtype)
    shape = (c.num_layers, c.num_heads, c.head_dim, c.head_dim)
    if G.shape != shape:
        raise ValueError(
            f"collapse: `G` must have shape (layers, heads, dk, dk) = {shape}, got {G.shape}."
        )
    why = nonfinite_G_problem(G, model.dtype)
    if why is not None:
        raise ValueError(
            f"collapse: `G` {why}; every logit of the collapsed model would be non-finite."
        )
    sdpa = _sdpa_copy(model)
    residual = np.asarray(jnp.max(rope_commutant_residual(G, rope=c.rope), axis=-1))
    folded = [fold == "always" or (fold == "auto" and float(r) <= fold_rtol) for r in residual]
    Gs = []
    for layer, (g, f) in enumerate(zip(G, folded)):
        if f:
            g_comm = rope_commutant_projection(g, rope=c.rope).astype(model.dtype)
            sdpa = eqx.tree_at(
                lambda m: m.layers[layer].attn.wq,
                sdpa,
                _fold_query(sdpa.layers[layer].attn.wq, g_comm),
            )
            Gs.append(None)
        else:
            Gs.append(g)
    return CollapsedPLDRLLM(sdpa, tuple(Gs), tuple(folded))


@eqx.filter_jit
def _logit_errors(model, collapsed, ids):
    def one(i):
        a = model(i)[0]
        b = collapsed(i)[0]
        return (
            jnp.max(jnp.abs(a - b)),
            jnp.max(jnp.abs(a)),
            jnp.mean(jnp.argmax(a, -1) == jnp.argmax(b, -1), dtype=a.dtype),
        )

    return jax.vmap(one)(ids)


def collapse_error(
    model: PLDRLLM, collapsed: CollapsedPLDRLLM, ids: Int[ArrayLike, "*prompts seq"]
) -> dict:
    """How far the collapsed model is from the original, over one or more prompts.

    **Returns:** host values `max_abs_dlogit` (over prompts and positions), `rel_dlogit`
    (`max |Δlogit| / max |logit|`, worst prompt) and `argmax_agreement` (fraction of positions
    with the same top token, all prompts).
    """
    ids = jnp.asarray(ids)
    ids = ids[None] if ids.ndim == 1 else ids
    for row in np.asarray(ids):
        model.check_ids(row)
    d, s, agree = _logit_errors(model, collapsed, ids)
    return {
        "max_abs_dlogit": float(jnp.max(d)),
        "rel_dlogit": float(jnp.max(d / jnp.where(s > 0, s, 1))),
        "argmax_agreement": float(jnp.mean(agree)),
    }
