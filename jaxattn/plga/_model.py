"""The PLDR-LLM decoder (v51) with Power Law Graph Attention, and its named configurations.

Source: Gokden, PLDR-LLM (arXiv 2410.16703; 2502.13502, v51 with KV/G caches) and *Power law
graph attention* (2026). Conventions as in tests/fixtures/README.md.
"""

import dataclasses
import math
from collections.abc import Sequence
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float, Int, PRNGKeyArray

from ._attention import AttentionKind, DeductiveOutputs, PowerLawGraphAttention, heads_first
from ._metric_learner import LayerNorm, Linear, SwiGLU, init_params


@dataclasses.dataclass(frozen=True)
class PLDRLLMConfig:
    r"""Shape and constants of a PLDR-LLM decoder (frozen, hashable: usable as a static argument).

    - `vocab_size`, `d_model` (D), `num_layers`, `num_heads` (H), `head_dim` (dk), `dff` (FFN
      width), `A_dff` (metric-learner width), `num_reslayerA` (residual units of the learner),
      `num_denseA` (GLU blocks per unit), `context_length` (longest accepted sequence).
    - `rope_base` (10000), `layer_norm_eps` (1e-6, every LayerNorm), `epsilon` (1e-9, the
      metric-tensor floor), `pad_id` (0; keys equal to it are masked).
    - `rope`: `"interleaved"` (reference) or `"half"` (NeoX pairing, an option).
    - `causal_density`: our causal extension of the density operator (see
      `PowerLawGraphAttention`); `False` is the reference.

    **Raises:** `ValueError` for non-positive sizes, odd `head_dim`, an unknown `rope`, or
    `pad_id` outside the vocabulary.
    """

    vocab_size: int
    d_model: int
    num_layers: int
    num_heads: int
    head_dim: int
    dff: int
    A_dff: int
    num_reslayerA: int
    num_denseA: int
    context_length: int
    rope_base: float = 10000.0
    layer_norm_eps: float = 1e-6
    epsilon: float = 1e-9
    pad_id: int = 0
    rope: Literal["interleaved", "half"] = "interleaved"
    causal_density: bool = False

    def __post_init__(self):
        sizes = (
            "vocab_size",
            "d_model",
            "num_layers",
            "num_heads",
            "head_dim",
            "dff",
            "A_dff",
            "num_reslayerA",
            "num_denseA",
            "context_length",
        )
        for name in sizes:
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise ValueError(f"PLDRLLMConfig.{name} must be a positive int, got {value!r}.")
            object.__setattr__(self, name, int(value))
        if self.head_dim % 2:
            raise ValueError(f"PLDRLLMConfig.head_dim must be even (RoPE), got {self.head_dim}.")
        if self.rope not in ("interleaved", "half"):
            raise ValueError(
                f"PLDRLLMConfig.rope must be 'interleaved' or 'half', got {self.rope!r}."
            )
        if not 0 <= int(self.pad_id) < self.vocab_size:
            raise ValueError(
                f"PLDRLLMConfig.pad_id={self.pad_id} is outside the vocabulary "
                f"[0, {self.vocab_size})."
            )
        for name in ("rope_base", "layer_norm_eps", "epsilon"):
            value = float(getattr(self, name))
            if not value > 0:
                raise ValueError(f"PLDRLLMConfig.{name} must be > 0, got {value}.")
            object.__setattr__(self, name, value)
        object.__setattr__(self, "pad_id", int(self.pad_id))
        object.__setattr__(self, "causal_density", bool(self.causal_density))

    def replace(self, **changes) -> "PLDRLLMConfig":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


CONFIGS: dict[str, PLDRLLMConfig] = {
    # Released PLDR-LLM v51-110M (docs/theory/plga.md).
    "v51-110m": PLDRLLMConfig(
        vocab_size=32000,
        d_model=896,
        num_layers=5,
        num_heads=14,
        head_dim=64,
        dff=2389,
        A_dff=170,
        num_reslayerA=8,
        num_denseA=2,
        context_length=1024,
    ),
    # CPU-sized: trains in minutes on 2 cores with the 32k tokenizer.
    "tiny": PLDRLLMConfig(
        vocab_size=32000,
        d_model=128,
        num_layers=2,
        num_heads=4,
        head_dim=32,
        dff=341,
        A_dff=64,
        num_reslayerA=2,
        num_denseA=1,
        context_length=128,
    ),
    "small": PLDRLLMConfig(
        vocab_size=32000,
        d_model=256,
        num_layers=4,
        num_heads=4,
        head_dim=64,
        dff=682,
        A_dff=128,
        num_reslayerA=4,
        num_denseA=2,
        context_length=256,
    ),
}


class DecoderLayer(eqx.Module):
    r"""One post-LN PLDR-LLM layer: `x₁ = LN₁(x + PLGA(x))`, `x₂ = LN₂(x₁ + SwiGLU-FFN(x₁))`."""

    attn: PowerLawGraphAttention
    ffn: SwiGLU
    ln1: LayerNorm
    ln2: LayerNorm

    def __init__(self, config: PLDRLLMConfig, *, attention: AttentionKind, key, dtype):
        ka, kf = jax.random.split(key)
        c = config
        self.attn = PowerLawGraphAttention(
            c.d_model,
            c.num_heads,
            c.head_dim,
            c.A_dff,
            c.num_reslayerA,
            c.num_denseA,
            rope_base=c.rope_base,
            rope=c.rope,
            layer_norm_eps=c.layer_norm_eps,
            epsilon=c.epsilon,
            causal_density=c.causal_density,
            attention=attention,
            key=ka,
            dtype=dtype,
        )
        self.ffn = SwiGLU(c.d_model, c.dff, key=kf, dtype=dtype)
        self.ln1 = LayerNorm(c.d_model, eps=c.layer_norm_eps, dtype=dtype)
        self.ln2 = LayerNorm(c.d_model, eps=c.layer_norm_eps, dtype=dtype)

    def finish(self, x: Array, attn_out: Array) -> Array:
        """The residual/LayerNorm/FFN part, after attention."""
        x1 = self.ln1(x + attn_out)
        return self.ln2(x1 + self.ffn(x1))


def _build_parts(config: PLDRLLMConfig, key, *, dtype, attention):
    ke, kh, *kl = jax.random.split(key, 2 + config.num_layers)
    embedding = jax.random.normal(ke, (config.vocab_size, config.d_model), dtype)
    emb_norm = LayerNorm(config.d_model, eps=config.layer_norm_eps, dtype=dtype)
    layers = [DecoderLayer(config, attention=attention, key=k, dtype=dtype) for k in kl]
    final_layer = Linear(config.d_model, config.vocab_size, key=kh, dtype=dtype)
    return dict(embedding=embedding, emb_norm=emb_norm, layers=layers, final_layer=final_layer)


@eqx.filter_jit
def _init_parts(config: PLDRLLMConfig, key, *, dtype, attention):
    # Shapes only (nothing compiled), then every array from two random draws (`init_params`).
    skeleton = eqx.filter_eval_shape(_build_parts, config, key, dtype=dtype, attention=attention)
    p = init_params(skeleton, key)
    return p["embedding"], p["emb_norm"], p["layers"], p["final_layer"]


def _is_tracer(x) -> bool:
    return isinstance(x, jax.core.Tracer)


def check_key(key, fn: str):
    """`key` if it is one PRNG key: a typed key (`jax.random.key(0)`, shape `()`) or a legacy
    `uint32` key of shape `(2,)` (`jax.random.PRNGKey(0)`).

    **Raises:** `ValueError` naming `fn` otherwise (a Python int, say, which JAX would refuse
    only deep inside `jax.random` as "invalid PRNG key data")."""
    dtype = getattr(key, "dtype", None)
    shape = getattr(key, "shape", None)
    if dtype is not None:
        if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key) and shape == ():
            return key
        if dtype == jnp.uint32 and shape == (2,):
            return key
        got = f"an array of shape {shape} and dtype {dtype}"
    else:
        got = f"{type(key).__name__} {key!r}"
    raise ValueError(f"{fn}: `key` must be one PRNG key, e.g. `jax.random.key(0)`, got {got}.")


def check_float_dtype(dtype, fn: str):
    """`dtype` as a NumPy dtype if it is a real floating type (float16/32/64, bfloat16).

    **Raises:** `ValueError` naming `fn` and the dtype otherwise (integers, complex, bool)."""
    try:
        dt = jnp.dtype(dtype)
    except TypeError:
        raise ValueError(f"{fn}: `dtype` must be a floating dtype, got {dtype!r}.") from None
    if not jnp.issubdtype(dt, jnp.floating):
        raise ValueError(
            f"{fn}: `dtype` must be a real floating dtype (float32, float64, bfloat16, "
            f"float16), got {dt.name}."
        )
    return dt


class PLDRLLM(eqx.Module):
    r"""The PLDR-LLM v51 decoder on one sequence of token ids.

    `h₀ = LN(E[ids]·√D)` (no positional embedding: RoPE inside attention), then `num_layers`
    post-LN layers `x₁ = LN₁(x + O(PLGA(x)))`, `x₂ = LN₂(x₁ + SwiGLU-FFN(x₁))`, then an untied,
    biased LM head. Attention masks keys equal to `pad_id` and future positions (look-ahead); the
    density operator still sums over all positions, padding included (so, as in the reference,
    the model is not causal unless `config.causal_density`).

    **Arguments (init):**

    - `config`: a `PLDRLLMConfig` (e.g. `CONFIGS["tiny"]`).
    - `key`: PRNG key (keyword-only), e.g. `jax.random.key(0)`; a Python int is refused.
    - `dtype`: parameter and compute dtype, a real float type (default float32).
    - `attention`: `"plga"` (default) or `"sdpa"` — the same shape without the metric learner and
      PLGA tensors, i.e. `G = I` (the baseline for benchmarks).

    **Raises:** `ValueError` for a `config` that is not a `PLDRLLMConfig`, an unknown
    `attention`, a `key` that is not one PRNG key (e.g. a Python int) or a `dtype` that is not
    a real float type.

    Initialisation: Xavier-uniform Linear weights, zero biases, N(0, 1) embedding, unit
    LayerNorms; PLGA tensors as in `PowerLawGraphAttention`.

    Batches come from `jax.vmap(model)`. Source: Gokden, arXiv 2410.16703, 2502.13502; PLGA (2026).
    """

    embedding: Float[Array, "vocab D"]
    emb_norm: LayerNorm
    layers: list[DecoderLayer]
    final_layer: Linear
    config: PLDRLLMConfig = eqx.field(static=True)
    attention: AttentionKind = eqx.field(static=True)

    def __init__(
        self,
        config: PLDRLLMConfig,
        *,
        key: PRNGKeyArray,
        dtype=jnp.float32,
        attention: AttentionKind = "plga",
    ):
        if not isinstance(config, PLDRLLMConfig):
            raise ValueError(f"`config` must be a PLDRLLMConfig, got {type(config).__name__}.")
        if attention not in ("plga", "sdpa"):
            raise ValueError(f"`attention` must be 'plga' or 'sdpa', got {attention!r}.")
        key = check_key(key, "PLDRLLM")
        dtype = check_float_dtype(dtype, "PLDRLLM")
        self.config = config
        self.attention = attention
        # One compiled initialiser instead of hundreds of eagerly dispatched random ops.
        parts = _init_parts(config, key, dtype=dtype, attention=attention)
        self.embedding, self.emb_norm, self.layers, self.final_layer = parts

    @property
    def dtype(self):
        return self.embedding.dtype

    # -- argument checks --------------------------------------------------------------------------

    def check_ids(self, ids: Int[ArrayLike, " seq"], *, name: str = "ids") -> Int[Array, " seq"]:
        """Validate token ids: integer, shape `(seq,)` with `1 ≤ seq ≤ context_length`, values in
        `[0, vocab_size)`. Shape problems and (for concrete ids) value problems raise
        `ValueError`; under `jit`/`vmap` out-of-range values raise through `eqx.error_if`."""
        c = self.config
        if not _is_tracer(ids):
            arr = np.asarray(ids)
            if arr.dtype.kind not in "iu":
                raise ValueError(f"`{name}` must be integer token ids, got dtype {arr.dtype}.")
            if arr.ndim == 1 and arr.size and (arr.min() < 0 or arr.max() >= c.vocab_size):
                bad = arr[(arr < 0) | (arr >= c.vocab_size)]
                raise ValueError(
                    f"`{name}` has token ids outside [0, {c.vocab_size}): {bad[:8].tolist()}."
                )
        ids = jnp.asarray(ids)
        if not jnp.issubdtype(ids.dtype, jnp.integer):
            raise ValueError(f"`{name}` must be integer token ids, got dtype {ids.dtype}.")
        if ids.ndim != 1:
            raise ValueError(
                f"`{name}` must have shape (seq,), got {ids.shape}; batch with jax.vmap(model)."
            )
        if not 1 <= ids.shape[0] <= c.context_length:
            raise ValueError(
                f"`{name}` has length {ids.shape[0]}; it must be between 1 and "
                f"context_length={c.context_length}."
            )
        if _is_tracer(ids):
            ids = eqx.error_if(
                ids,
                (ids < 0) | (ids >= c.vocab_size),
                f"`{name}` has token ids outside [0, {c.vocab_size}).",
            )
        return ids

    def layer_G(self, G) -> list[Array | None]:
        """Normalise an injected `G` into one entry per layer. Accepted: `None`; one array
        `(heads, dk, dk)` or `(dk, dk)` for every layer; `(layers, heads, dk, dk)`; or a sequence
        of `num_layers` such arrays / `None`. Raises `ValueError` otherwise."""
        L = self.config.num_layers
        if G is None:
            return [None] * L
        if isinstance(G, Sequence) and not isinstance(G, (str, bytes)):
            if len(G) != L:
                raise ValueError(f"`G` as a sequence needs num_layers={L} entries, got {len(G)}.")
            return [
                None if g is None else layer.attn.check_G(g) for g, layer in zip(G, self.layers)
            ]
        G = jnp.asarray(G)
        if G.ndim == 4:
            if G.shape[0] != L:
                raise ValueError(f"`G` of shape {G.shape} must have num_layers={L} as first axis.")
            return [layer.attn.check_G(g) for g, layer in zip(G, self.layers)]
        return [layer.attn.check_G(G) for layer in self.layers]

    # -- forward ----------------------------------------------------------------------------------

    def embed(self, ids: Int[Array, " seq"]) -> Float[Array, "seq D"]:
        """`LN(E[ids] · √D)` (√D formed in float64, then cast)."""
        x = self.embedding[ids] * jnp.asarray(math.sqrt(self.config.d_model), self.dtype)
        return self.emb_norm(x)

    def run_layers(
        self,
        x: Float[Array, "seq D"],
        *,
        allowed: Bool[Array, "seq seq"],
        positions: Int[Array, " seq"],
        G: list,
        density_weights: Array | None = None,
    ) -> tuple[Float[Array, "seq D"], list[DeductiveOutputs], list[tuple]]:
        """All layers; also returns per layer `(k̃, v, A, G_used)` for the caches (`k̃, v`
        head-major, `(heads, seq, dk)`)."""
        deductive, states = [], []
        for layer, g in zip(self.layers, G):
            attn = layer.attn
            q, k, v = attn.project(x, positions)
            k, v = heads_first(k), heads_first(v)
            if g is not None:
                A = A_LM = A_P = None
                G_used = g.astype(x.dtype)
            elif attn.attention == "sdpa":
                A = A_LM = A_P = G_used = None
            else:
                A, A_LM, A_P, G_used = attn.deductive(q, density_weights)
            out, scores = attn.attend(q, k, v, G_used, allowed)
            overflow = attn.overflow(A_P, G_used, scores)
            deductive.append(DeductiveOutputs(A, A_LM, A_P, G_used, scores, overflow))
            states.append((k, v, A, G_used))
            x = layer.finish(x, out)
        return x, deductive, states

    def features(
        self, ids: Int[ArrayLike, " seq"], *, G=None
    ) -> tuple[Float[Array, "seq D"], list[DeductiveOutputs]]:
        """The last layer's output `(seq, D)` (input of the LM head) and the deductive outputs;
        arguments as `__call__`."""
        ids = self.check_ids(ids)
        Gs = self.layer_G(G)
        seq = ids.shape[0]
        allowed = jnp.tril(jnp.ones((seq, seq), bool)) & (ids != self.config.pad_id)[None, :]
        x, deductive, _ = self.run_layers(
            self.embed(ids), allowed=allowed, positions=jnp.arange(seq), G=Gs
        )
        return x, deductive

    def __call__(
        self, ids: Int[ArrayLike, " seq"], *, G=None
    ) -> tuple[Float[Array, "seq vocab"], list[DeductiveOutputs]]:
        r"""Uncached forward pass over one sequence.

        **Arguments:**

        - `ids`: token ids, shape `(seq,)`, `seq ≤ context_length`, values in `[0, vocab)`.
          Keys equal to `pad_id` are masked (padding at the end of a row, as the reference).
        - `G`: optional fixed `G_LM` replacing every layer's energy-curvature tensor (the
          metric learner is skipped): `(heads, dk, dk)` or `(dk, dk)` for all layers,
          `(layers, heads, dk, dk)`, or a list with one array or `None` per layer. `G = I` gives
          RoPE scaled-dot-product attention.

        **Returns:** `(logits, deductive)`: logits `(seq, vocab)` at every position, and a list
        with one `DeductiveOutputs` per layer (`A, A_LM, A_P, G_LM`: `(heads, dk, dk)`; scores
        `(heads, seq, seq)` before the mask).

        **Raises:** `ValueError` for ids that are not 1-D integers, longer than the context, or
        (when concrete) out of range; a wrongly shaped `G`. Out-of-range traced ids raise at run
        time via `eqx.error_if`.
        """
        x, deductive = self.features(ids, G=G)
        return self.final_layer(x), deductive

    def score_overflow(self, ids: Int[ArrayLike, "... seq"]) -> list:
        r"""Which heads' score path overflowed the dtype on these ids (e.g. float32,
        `A_LM` at its floor ε with `P ≈ −4.5`): a list of `ScoreOverflow(layer, head,
        max_abs_G_LM, max_abs_score, dtype)`, largest `|G_LM|` first, empty when none did.

        Use it to say why a loss or a logit became non-finite;
        `jaxattn.plga.format_score_overflow` makes the message.

        **Arguments:** `ids`: token ids `(seq,)` or a batch `(batch, seq)`.

        **Raises:** `ValueError` for bad ids (as `__call__`).
        """
        from ._attention import score_overflow

        ids = jnp.asarray(ids)
        if ids.ndim == 2:
            for row in ids:
                self.check_ids(row)
            deductive = _batched_deductive(self, ids)
        else:
            deductive = _deductive(self, self.check_ids(ids))
        return score_overflow(deductive)

    # -- reference layout -------------------------------------------------------------------------

    @classmethod
    def from_reference(
        cls,
        source,
        config: PLDRLLMConfig | None = None,
        *,
        dtype=None,
        attention: AttentionKind = "plga",
    ) -> "PLDRLLM":
        """Build a model from weights in the reference PyTorch state-dict layout; see
        `jaxattn.plga.from_reference` (this is the same function)."""
        from ._weights import from_reference

        return from_reference(source, config, dtype=dtype, attention=attention)

    def to_reference(self) -> dict[str, np.ndarray]:
        """The weights as a reference-layout state dict; see `jaxattn.plga.to_reference`."""
        from ._weights import to_reference

        return to_reference(self)


@eqx.filter_jit
def _deductive(model: PLDRLLM, ids):
    return model(ids)[1]


@eqx.filter_jit
def _batched_deductive(model: PLDRLLM, ids):
    return jax.vmap(lambda i: model(i)[1])(ids)
