"""Cached inference for PLDR-LLM: KV and KV+G caches, prefill/decode, generation.

Semantics of the reference v510 implementation (Gokden, arXiv 2502.13502; tests/fixtures/README.md,
"Cached greedy decoding"):

- `"none"`: every step is a full uncached forward pass over prompt + generated tokens (the
  density operator, hence `A … G_LM`, is rebuilt from the whole sequence).
- `"kv"`: post-RoPE keys and values are cached, and `A` is frozen at the prompt's value (the
  metric learner is skipped for new tokens); `A_LM, A_P, G_LM` are recomputed from it each step.
- `"kvg"`: keys, values and the prompt's `G_LM` are cached; `A_LM … G_LM` are not recomputed.

`"kv"` and `"kvg"` give the same logits (they differ only in work); for a model whose deductive
outputs have not collapsed they differ from `"none"`.

All buffers have a fixed size (`max_len`), so a whole generation compiles once per
(prompt length, `max_new_tokens`, cache, sampling) and runs in a `lax.scan`.
"""

import math
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Int, PRNGKeyArray

from ._attention import heads_first
from ._model import PLDRLLM, check_key

CacheKind = Literal["none", "kv", "kvg"]
_KINDS = ("none", "kv", "kvg")


class DecodeCache(eqx.Module):
    r"""State of cached decoding for one sequence (fixed-size buffers).

    - `ids`: `(max_len,)` token buffer (positions `≥ length` hold `pad_id`).
    - `length`: number of filled positions (scalar int array).
    - `keys`, `values`: `(layers, heads, max_len, dk)` post-RoPE keys and values, head-major
      (the layout attention reads, so a step reads them in place; `None` for `kind="none"`).
    - `A`: `(layers, heads, dk, dk)` frozen metric-learner output (`kind="kv"` only).
    - `G`: `(layers, heads, dk, dk)` frozen `G_LM` (`kind="kvg"`, or any kind when a fixed `G`
      was injected at prefill).
    - `kind`: `"none"`, `"kv"` or `"kvg"` (static).

    `decode_step` consumes the cache it is given (its buffers are donated to, and updated in
    place for, the returned cache); use `copy()` to keep a cache for another branch.
    """

    ids: Int[Array, " max_len"]
    length: Int[Array, ""]
    keys: Float[Array, "layers heads max_len dk"] | None
    values: Float[Array, "layers heads max_len dk"] | None
    A: Float[Array, "layers heads dk dk"] | None
    G: Float[Array, "layers heads dk dk"] | None
    kind: str = eqx.field(static=True)

    @property
    def max_len(self) -> int:
        return self.ids.shape[0]

    def copy(self) -> "DecodeCache":
        """An independent copy (new buffers): `decode_step` consumes the cache it is given, so
        branch with `decode_step(model, cache.copy(), token)`.

        **Raises:** `ValueError` if the cache was already consumed (copy it before the step)."""
        if self.is_consumed():
            raise ValueError(
                "DecodeCache.copy: this cache was already consumed by a decode_step (its "
                "buffers were reused for the new cache); copy it before the step, or use the "
                "cache that step returned."
            )
        return jax.tree.map(jnp.copy, self)

    def is_consumed(self) -> bool:
        """True when a `decode_step` has taken this cache's buffers (it cannot be used again)."""
        return any(
            isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer) and x.is_deleted()
            for x in jax.tree.leaves(self)
        )


def _check_kind(cache) -> str:
    if cache not in _KINDS:
        raise ValueError(f"`cache` must be one of {_KINDS}, got {cache!r}.")
    return cache


def _prefill_impl(model: PLDRLLM, ids, G, *, kind: str, max_len: int):
    c = model.config
    seq = ids.shape[0]
    Gs = model.layer_G(G)
    allowed = jnp.tril(jnp.ones((seq, seq), bool)) & (ids != c.pad_id)[None, :]
    x, _, states = model.run_layers(
        model.embed(ids), allowed=allowed, positions=jnp.arange(seq), G=Gs
    )
    logits = model.final_layer(x)
    buf = jnp.full((max_len,), c.pad_id, ids.dtype).at[:seq].set(ids)
    keys = values = A = Gst = None
    if kind != "none":
        pad = lambda a: (
            jnp.zeros(a.shape[:1] + (max_len,) + a.shape[2:], a.dtype).at[:, :seq].set(a)
        )
        keys = jnp.stack([pad(k) for k, _, _, _ in states])
        values = jnp.stack([pad(v) for _, v, _, _ in states])
    injected = G is not None
    plga = model.attention == "plga"
    if injected:
        Gst = jnp.stack(Gs)
    elif plga and kind == "kvg":
        Gst = jnp.stack([g for _, _, _, g in states])
    elif plga and kind == "kv":
        A = jnp.stack([a for _, _, a, _ in states])
        if c.causal_density:  # the prompt's A is the one of its last position
            A = A[:, -1]
    if Gst is not None and c.causal_density and not injected:
        Gst = Gst[:, -1]
    cache = DecodeCache(buf, jnp.asarray(seq, jnp.int32), keys, values, A, Gst, kind)
    return logits, cache


def prefill(
    model: PLDRLLM,
    ids: Int[ArrayLike, " seq"],
    *,
    cache: CacheKind = "kvg",
    max_len: int | None = None,
    G=None,
) -> tuple[Float[Array, "seq vocab"], DecodeCache]:
    r"""Run the prompt once (uncached, look-ahead mask, pad keys masked) and build a cache.

    **Arguments:**

    - `model`: a `PLDRLLM`.
    - `ids`: prompt token ids `(seq,)`.
    - `cache`: `"none"`, `"kv"` or `"kvg"` (see the module docstring).
    - `max_len`: capacity of the buffers (prompt + tokens still to be fed); default
      `context_length`.
    - `G`: optional fixed `G_LM` for every layer (as `PLDRLLM.__call__`), kept frozen in the cache
      for all steps — collapse-based / generalised-SDPA inference.

    **Returns:** `(logits, cache)`: the prompt's logits `(seq, vocab)` (the last row predicts the
    next token) and a `DecodeCache`.

    **Raises:** `ValueError` for an unknown cache kind, bad ids, `max_len` smaller than the prompt
    or larger than `context_length`, a bad `G` (as `PLDRLLM.__call__`).
    """
    kind = _check_kind(cache)
    ids = model.check_ids(ids)
    ctx = model.config.context_length
    max_len = ctx if max_len is None else int(max_len)
    if not ids.shape[0] <= max_len <= ctx:
        raise ValueError(
            f"`max_len`={max_len} must be between the prompt length {ids.shape[0]} and "
            f"context_length={ctx}."
        )
    if G is not None:
        Gs = model.layer_G(G)
        if any(g is None for g in Gs):
            raise ValueError("`G` given to prefill must cover every layer (no `None` entries).")
        G = jnp.stack(Gs)
    return _prefill_jit(model, ids, G, kind=kind, max_len=max_len)


_prefill_jit = eqx.filter_jit(_prefill_impl)


def _decode_impl(model: PLDRLLM, cache: DecodeCache, token):
    c = model.config
    p = cache.length
    token = eqx.error_if(
        token, (token < 0) | (token >= c.vocab_size), f"`token` outside [0, {c.vocab_size})."
    )
    p = eqx.error_if(p, p >= cache.max_len, "the decode cache is full (length == max_len).")
    ids = jax.lax.dynamic_update_index_in_dim(cache.ids, token.astype(cache.ids.dtype), p, 0)
    pos = jnp.arange(cache.max_len)
    valid = pos <= p
    if cache.kind == "none":
        allowed = jnp.tril(jnp.ones((cache.max_len,) * 2, bool)) & valid[None, :]
        allowed = allowed & (ids != c.pad_id)[None, :]
        Gs = [None] * c.num_layers if cache.G is None else list(cache.G)
        x, _, _ = model.run_layers(
            model.embed(ids),
            allowed=allowed,
            positions=pos,
            G=Gs,
            density_weights=valid.astype(model.dtype),
        )
        logits = model.final_layer(jax.lax.dynamic_index_in_dim(x, p, 0, keepdims=False))
        new = DecodeCache(ids, p + 1, None, None, None, cache.G, cache.kind)
        return logits, new
    allowed = (valid & (ids != c.pad_id))[None, :]
    x = model.embed(token[None])
    keys, values = cache.keys, cache.values
    zero = jnp.zeros((), p.dtype)
    for li, layer in enumerate(model.layers):
        attn = layer.attn
        q, k, v = attn.project(x, p[None])
        # Written in place (the cache is donated by `decode_step`, a scan carry in `generate`).
        at = (jnp.asarray(li, p.dtype), zero, p, zero)
        keys = jax.lax.dynamic_update_slice(keys, heads_first(k)[None].astype(keys.dtype), at)
        values = jax.lax.dynamic_update_slice(values, heads_first(v)[None].astype(values.dtype), at)
        if cache.G is not None:
            G = cache.G[li]
        elif cache.A is not None:
            G = attn.curvature(cache.A[li])[2]
        else:
            G = None  # SDPA model
        out, _ = attn.attend(q, keys[li], values[li], G, allowed)
        x = layer.finish(x, out)
    logits = model.final_layer(x[0])
    return logits, DecodeCache(ids, p + 1, keys, values, cache.A, cache.G, cache.kind)


def _decode_donating(model_and_token, cache: DecodeCache):
    model, token = model_and_token
    return _decode_impl(model, cache, token)


# The cache (the only argument after the first) is donated: its buffers become the returned
# cache's, updated in place instead of copied whole every step. The model and the token are
# not donated (the caller keeps using them).
_decode_jit = eqx.filter_jit(_decode_donating, donate="all-except-first")


def decode_step(
    model: PLDRLLM, cache: DecodeCache, token: Int[ArrayLike, ""]
) -> tuple[Float[Array, " vocab"], DecodeCache]:
    r"""Feed one token at position `cache.length` and return its next-token logits.

    With `"kv"`/`"kvg"`, the token's query and key get RoPE at that position, its key and value
    are appended, and attention runs over all filled cache positions (no look-ahead mask is
    needed; keys equal to `pad_id` stay masked) with the frozen `A` / `G_LM` of the prompt.
    With `"none"` the whole sequence is recomputed.

    **Arguments:** `model`; `cache` from `prefill` or a previous step; `token`, a scalar id.

    **Returns:** `(logits (vocab,), new cache)`. The given cache is consumed: its buffers are
    donated to the new cache, which is written in place (no copy of the keys and values per
    token); keep `cache.copy()` to decode another branch from the same state.

    **Raises:** `ValueError` for a non-scalar or (concrete) out-of-range token, a cache
    already consumed by an earlier step, or (outside `jit`) a full cache; at run time
    (`eqx.error_if`) for a traced out-of-range token or a traced full cache.
    """
    if not isinstance(cache, DecodeCache):
        raise ValueError(f"`cache` must be a DecodeCache from prefill, got {type(cache).__name__}.")
    if not isinstance(token, jax.core.Tracer):
        t = np.asarray(token)
        if t.shape != () or t.dtype.kind not in "iu":
            raise ValueError(
                f"`token` must be a scalar integer id, got shape {t.shape}, dtype {t.dtype}."
            )
        if not 0 <= int(t) < model.config.vocab_size:
            raise ValueError(f"`token`={int(t)} is outside [0, {model.config.vocab_size}).")
    token = jnp.asarray(token)
    if token.shape != ():
        raise ValueError(f"`token` must be a scalar id, got shape {token.shape}.")
    if cache.is_consumed():
        raise ValueError(
            "`cache` was already consumed by a previous decode_step (its buffers are reused for "
            "the returned cache): pass the cache that step returned, or branch from a copy "
            "(`cache.copy()`) taken before the step."
        )
    if not isinstance(cache.length, jax.core.Tracer) and int(cache.length) >= cache.max_len:
        raise ValueError(
            f"decode_step: the cache is full ({int(cache.length)} of max_len={cache.max_len} "
            "positions filled); prefill with a larger `max_len` (at most context_length) to "
            "decode further."
        )
    return _decode_jit((model, token), cache)


TEMPERATURE_MAX = float(np.finfo(np.float32).max)
"""The largest sampling temperature: the sampler divides in float32 or wider."""


def _is_integer(x) -> bool:
    """An integer that is not a bool: a Python or NumPy integer, or a 0-d integer array
    (NumPy or JAX, concrete or traced)."""
    if isinstance(x, (bool, np.bool_)):
        return False
    if isinstance(x, (int, np.integer)):
        return True
    dtype = getattr(x, "dtype", None)
    return dtype is not None and np.ndim(x) == 0 and jnp.issubdtype(dtype, jnp.integer)


def top_p_problem(top_p) -> str | None:
    """Why `top_p` is not a nucleus mass in (0, 1] (None when it is); `generate` and the
    `--top-p` of `jaxattn plga generate` both ask."""
    return None if 0 < float(top_p) <= 1 else f"must be in (0, 1], got {top_p}"


def temperature_problem(temperature) -> str | None:
    """Why `temperature` is not a sampling temperature: finite, > 0 and at most
    `TEMPERATURE_MAX` (None when it is); `generate` and `--temperature` both ask."""
    t = float(temperature)
    if math.isfinite(t) and 0 < t <= TEMPERATURE_MAX:
        return None
    return f"must be finite and > 0 (at most float32's {TEMPERATURE_MAX:.4g}), got {temperature}"


def _sample(logits, key, *, sampling, top_p, temperature):
    if sampling == "greedy":
        return jnp.argmax(logits).astype(jnp.int32)
    z = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
    # Scaled from the largest logit: `z − max ≤ 0`, so a tiny temperature sends every other
    # logit to −inf (argmax, exactly) instead of overflowing all of them, and the top logit
    # stays 0 even when the temperature underflowed to 0 in the compute dtype.
    z = z - jnp.max(z)
    z = jnp.where(z == 0, jnp.zeros_like(z), z / jnp.asarray(temperature, z.dtype))
    order = jnp.argsort(-z)
    zs = z[order]
    probs = jax.nn.softmax(zs)
    before = jnp.cumsum(probs) - probs  # mass strictly above each candidate
    keep = before < top_p  # the top token is always kept
    zs = jnp.where(keep, zs, -jnp.inf)
    choice = jax.random.categorical(key, zs)
    return order[choice].astype(jnp.int32)


_TRACES = {"generate": 0}  # diagnostics: how many times generation was traced


def _generate_impl(
    model, prompt, key, top_p, temperature, eos_id, *, max_new_tokens, kind, sampling
):
    _TRACES["generate"] += 1
    L = prompt.shape[0]
    logits, cache = _prefill_impl(model, prompt, None, kind=kind, max_len=L + max_new_tokens - 1)
    keys = jax.random.split(key, max_new_tokens)
    samp = lambda lg, k: _sample(lg, k, sampling=sampling, top_p=top_p, temperature=temperature)
    tok0 = samp(logits[-1], keys[0])
    pad = jnp.asarray(model.config.pad_id, jnp.int32)
    done0 = tok0 == eos_id  # eos_id = −1: never

    def step(carry, k):
        cache, tok, done = carry
        lg, cache = _decode_impl(model, cache, tok)
        nxt = samp(lg, k)
        out = jnp.where(done, pad, nxt)
        done = done | (nxt == eos_id)
        return (cache, nxt, done), out

    _, rest = jax.lax.scan(step, (cache, tok0, done0), keys[1:])
    return jnp.concatenate([tok0[None], rest])


_generate_jit = eqx.filter_jit(_generate_impl)


def generate(
    model: PLDRLLM,
    prompt_ids: Int[ArrayLike, " seq"],
    *,
    max_new_tokens: int,
    cache: CacheKind = "none",
    sampling: Literal["greedy", "top_p"] = "greedy",
    top_p: float = 0.9,
    temperature: float = 1.0,
    key: PRNGKeyArray | None = None,
    eos_id: int | None = None,
) -> Int[Array, " max_new_tokens"]:
    r"""Generate `max_new_tokens` tokens after `prompt_ids`.

    Prefill the prompt, then `lax.scan` over `decode_step`; compiled once per (model structure,
    prompt length, `max_new_tokens`, `cache`, `sampling`) — `top_p`, `temperature`, `eos_id` and
    `key` are traced (a traced `top_p` or `temperature` is checked with the program: an
    `EquinoxRuntimeError` where it is out of range).

    **Arguments:**

    - `model`, `prompt_ids` `(seq,)`.
    - `max_new_tokens`: ≥ 1; `seq + max_new_tokens − 1 ≤ context_length`.
    - `cache`: `"none"` (default, exact: every new token runs the model on the whole
      sequence so far), `"kv"` (keys and values cached, `A` frozen at the prompt's value) or
      `"kvg"` (the prompt's `G_LM` cached as well; the same logits as `"kv"`, less work).
      The cached kinds follow the reference's cached decoding: they differ from `"none"` for
      a model whose deductive outputs have not collapsed (`collapse_error` measures it, and
      the command line's `--cache auto` uses them only where they agree on the prompt).
    - `sampling`: `"greedy"` (argmax) or `"top_p"` (nucleus sampling: the smallest set of most
      likely tokens with mass ≥ `top_p`, at `temperature`). `key` is required for `"top_p"`:
      a typed key (`jax.random.key(0)`) or a legacy `uint32` key; `top_p` and `temperature`
      apply only to `"top_p"`.
    - `temperature`: finite, `> 0` and at most float32's largest value; a tiny one gives the
      argmax exactly (the logits are scaled from their maximum).
    - `eos_id`: if given, every token after the first `eos_id` is `pad_id`.

    **Returns:** the new token ids, int32 `(max_new_tokens,)` (the prompt is not repeated).

    **Raises:** `ValueError` for a bad cache/sampling name, `max_new_tokens` not an integer
    `≥ 1`, an `eos_id` outside the vocabulary, a too long
    total, `top_p` outside (0, 1], a non-finite, non-positive or float32-overflowing
    `temperature`, a missing `key` or one that is not a PRNG key (e.g. a Python int), bad
    prompt ids.
    """
    kind = _check_kind(cache)
    if sampling not in ("greedy", "top_p"):
        raise ValueError(f"`sampling` must be 'greedy' or 'top_p', got {sampling!r}.")
    if not _is_integer(max_new_tokens) or isinstance(max_new_tokens, jax.core.Tracer):
        raise ValueError(f"`max_new_tokens` must be an integer ≥ 1, got {max_new_tokens!r}.")
    max_new_tokens = int(max_new_tokens)
    if max_new_tokens < 1:
        raise ValueError(f"`max_new_tokens` must be ≥ 1, got {max_new_tokens}.")
    vocab = model.config.vocab_size
    if eos_id is not None and not (
        _is_integer(eos_id) and (isinstance(eos_id, jax.core.Tracer) or 0 <= int(eos_id) < vocab)
    ):
        raise ValueError(f"`eos_id` must be a token id in [0, {vocab}) or None, got {eos_id!r}.")
    prompt = model.check_ids(prompt_ids, name="prompt_ids")
    total = prompt.shape[0] + max_new_tokens - 1
    if total > model.config.context_length:
        raise ValueError(
            f"prompt length {prompt.shape[0]} + max_new_tokens {max_new_tokens} − 1 = {total} "
            f"exceeds context_length={model.config.context_length}."
        )
    if sampling == "top_p":
        if key is None:
            raise ValueError("`key` is required for sampling='top_p'.")
        for name, value, problem in (
            ("top_p", top_p, top_p_problem),
            ("temperature", temperature, temperature_problem),
        ):
            why = None if isinstance(value, jax.core.Tracer) else problem(value)
            if why is not None:
                raise ValueError(f"`{name}` {why}.")
        key = check_key(key, "generate")
    if key is None:
        key = jax.random.key(0)
    top_p_arr = jnp.asarray(top_p, jnp.float32)
    temperature_arr = jnp.asarray(temperature, jnp.float32)
    if sampling == "top_p" and isinstance(top_p, jax.core.Tracer):
        top_p_arr = eqx.error_if(
            top_p_arr, ~((top_p_arr > 0) & (top_p_arr <= 1)), "generate: `top_p` must be in (0, 1]."
        )
    if sampling == "top_p" and isinstance(temperature, jax.core.Tracer):
        temperature_arr = eqx.error_if(
            temperature_arr,
            ~(jnp.isfinite(temperature_arr) & (temperature_arr > 0)),
            "generate: `temperature` must be finite and > 0 (at most float32's largest value).",
        )
    return _generate_jit(
        model,
        prompt,
        key,
        top_p_arr,
        temperature_arr,
        jnp.asarray(-1 if eos_id is None else eos_id, jnp.int32),
        max_new_tokens=max_new_tokens,
        kind=kind,
        sampling=sampling,
    )
