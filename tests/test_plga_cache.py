"""KV / KV+G caches, prefill/decode and generation, against uncached forwards that encode the
same semantics exactly (the fixture comparison is in test_plga_reference.py)."""

import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import max_normalised_error

from jaxattn.plga import PLDRLLM, PLDRLLMConfig, _cache, decode_step, generate, prefill

CFG = PLDRLLMConfig(
    vocab_size=50,
    d_model=32,
    num_layers=2,
    num_heads=2,
    head_dim=16,
    dff=48,
    A_dff=24,
    num_reslayerA=2,
    num_denseA=1,
    context_length=24,
)
PROMPT = jnp.array([5, 17, 3, 44, 9, 21], jnp.int32)
TOKS = jnp.array([30, 2, 11], jnp.int32)
MAXLEN = 10


@pytest.fixture(scope="module")
def model():
    return PLDRLLM(CFG, key=jax.random.key(0), dtype=jnp.float64)


@eqx.filter_jit
def logits_of(model, ids, G=None):
    return model(ids, G=G)[0]


def _decode(model, kind, G=None):
    logits, cache = prefill(model, PROMPT, cache=kind, max_len=MAXLEN, G=G)
    steps = [logits[-1]]
    for t in TOKS:
        lg, cache = decode_step(model, cache, t)
        steps.append(lg)
    return jnp.stack(steps), cache


def test_sdpa_kv_cache_equals_full_forward(model):
    """An SDPA model is causal, so its cached decode must equal the full forward exactly."""
    sdpa = PLDRLLM(CFG, key=jax.random.key(0), dtype=jnp.float64, attention="sdpa")
    steps, cache = _decode(sdpa, "kv")
    full = logits_of(sdpa, jnp.concatenate([PROMPT, TOKS]))
    np.testing.assert_allclose(steps, full[len(PROMPT) - 1 :], rtol=1e-12, atol=1e-12)
    assert int(cache.length) == len(PROMPT) + len(TOKS) and cache.G is None and cache.A is None


def test_kv_and_kvg_freeze_the_prompts_G(model):
    """KV (frozen A) and KV+G (frozen G_LM) both equal a full forward with the prompt's G_LM
    injected into every position."""
    kv, c_kv = _decode(model, "kv")
    kvg, c_kvg = _decode(model, "kvg")
    np.testing.assert_allclose(kv, kvg, rtol=1e-12, atol=1e-12)
    G_prompt = jnp.stack([d.G_LM for d in eqx.filter_jit(lambda m, i: m(i)[1])(model, PROMPT)])
    assert max_normalised_error(c_kvg.G, G_prompt) < 1e-10
    assert c_kv.A.shape == (CFG.num_layers, CFG.num_heads, CFG.head_dim, CFG.head_dim)
    full = logits_of(model, jnp.concatenate([PROMPT, TOKS]), G_prompt)
    np.testing.assert_allclose(kvg[1:], full[len(PROMPT) :], rtol=1e-11, atol=1e-11)


@pytest.mark.slow
def test_uncached_decode_is_full_forward(model):
    """`cache="none"` recomputes the sequence; it differs from KV+G for a non-collapsed model."""
    kvg, _ = _decode(model, "kvg")
    none, _ = _decode(model, "none")
    np.testing.assert_allclose(none[0], kvg[0], rtol=1e-12, atol=1e-12)  # same prompt pass
    assert float(jnp.max(jnp.abs(none[1:] - kvg[1:]))) > 1e-4
    # "none" is the full uncached forward over the prefix
    last = logits_of(model, jnp.concatenate([PROMPT, TOKS]))[-1]
    np.testing.assert_allclose(none[-1], last, rtol=1e-11, atol=1e-11)


def test_injected_G_cache_is_exact(model):
    """With a fixed G the model is causal: cached decoding equals the full forward."""
    G = jnp.eye(CFG.head_dim) + 0.1 * jax.random.normal(
        jax.random.key(5), (CFG.num_layers, CFG.num_heads, CFG.head_dim, CFG.head_dim), jnp.float64
    )
    steps, cache = _decode(model, "kvg", G=G)
    full = logits_of(model, jnp.concatenate([PROMPT, TOKS]), G)
    np.testing.assert_allclose(steps, full[len(PROMPT) - 1 :], rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(cache.G, G, atol=0)


def test_generate_greedy_compiles_once_and_matches_decode(model):
    before = _cache._TRACES["generate"]
    toks = generate(model, PROMPT, max_new_tokens=4, cache="kvg")
    assert toks.shape == (4,) and toks.dtype == jnp.int32
    # greedy by hand with the same cache
    logits, cache = prefill(model, PROMPT, cache="kvg", max_len=len(PROMPT) + 3)
    expect = [int(jnp.argmax(logits[-1]))]
    for _ in range(3):
        lg, cache = decode_step(model, cache, jnp.asarray(expect[-1]))
        expect.append(int(jnp.argmax(lg)))
    np.testing.assert_array_equal(toks, expect)
    # another prompt of the same length, an EOS id: no new trace
    other = generate(model, (PROMPT + 7) % CFG.vocab_size, max_new_tokens=4, cache="kvg")
    assert other.shape == (4,)
    eos = generate(model, PROMPT, max_new_tokens=4, cache="kvg", eos_id=expect[1])
    np.testing.assert_array_equal(eos, [expect[0], expect[1], CFG.pad_id, CFG.pad_id])
    assert _cache._TRACES["generate"] - before == 1


def test_generate_top_p(model, getkey):
    key = getkey()
    greedy = generate(model, PROMPT, max_new_tokens=4, cache="kvg")
    # a tiny nucleus keeps only the most likely token: greedy
    tiny = generate(
        model, PROMPT, max_new_tokens=4, cache="kvg", sampling="top_p", top_p=1e-6, key=key
    )
    np.testing.assert_array_equal(tiny, greedy)
    a = generate(
        model,
        PROMPT,
        max_new_tokens=4,
        cache="kvg",
        sampling="top_p",
        top_p=1.0,
        temperature=5.0,
        key=key,
    )
    b = generate(
        model,
        PROMPT,
        max_new_tokens=4,
        cache="kvg",
        sampling="top_p",
        top_p=1.0,
        temperature=5.0,
        key=key,
    )
    np.testing.assert_array_equal(a, b)  # same key, same tokens
    assert bool(jnp.all((a >= 0) & (a < CFG.vocab_size)))


def test_top_p_sampler_distribution():
    """Empirical frequencies of the nucleus sampler against the renormalised truncated law."""
    logits = jnp.log(jnp.array([0.5, 0.3, 0.15, 0.05]))
    keys = jax.random.split(jax.random.key(0), 4000)
    draws = jax.jit(
        jax.vmap(lambda k: _cache._sample(logits, k, sampling="top_p", top_p=0.75, temperature=1.0))
    )(keys)
    freq = np.bincount(np.asarray(draws), minlength=4) / len(keys)
    # mass above token 2 is 0.8 ≥ 0.75, so the nucleus is {0, 1}: probabilities 5/8, 3/8
    np.testing.assert_allclose(freq, [5 / 8, 3 / 8, 0, 0], atol=0.03)


def test_bad_arguments(model):
    with pytest.raises(ValueError, match="`cache` must be one of"):
        prefill(model, PROMPT, cache="g")
    with pytest.raises(ValueError, match="max_len"):
        prefill(model, PROMPT, max_len=3)
    with pytest.raises(ValueError, match="max_len"):
        prefill(model, PROMPT, max_len=CFG.context_length + 1)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, PROMPT, max_new_tokens=0)
    for bad in (2.5, True, "3"):  # 2.5 gave 2 tokens
        with pytest.raises(ValueError, match="`max_new_tokens` must be an integer"):
            generate(model, PROMPT, max_new_tokens=bad)
    for bad in (50, -1, 1.0, jnp.int32(50)):
        with pytest.raises(ValueError, match=r"`eos_id` must be a token id in \[0, 50\)"):
            generate(model, PROMPT, max_new_tokens=2, eos_id=bad)
    # 0-d integer arrays are integers (helper-27: a JAX eos_id was refused as out of range).
    ref = generate(model, PROMPT, max_new_tokens=3, eos_id=7)
    same = generate(model, PROMPT, max_new_tokens=np.array(3), eos_id=jnp.int32(7))
    np.testing.assert_array_equal(same, ref)
    with pytest.raises(ValueError, match="exceeds context_length=24"):
        generate(model, PROMPT, max_new_tokens=20)
    with pytest.raises(ValueError, match="`key` is required"):
        generate(model, PROMPT, max_new_tokens=2, sampling="top_p")
    with pytest.raises(ValueError, match="top_p"):
        generate(
            model, PROMPT, max_new_tokens=2, sampling="top_p", top_p=1.5, key=jax.random.key(0)
        )
    with pytest.raises(ValueError, match="temperature"):
        generate(
            model,
            PROMPT,
            max_new_tokens=2,
            sampling="top_p",
            temperature=0.0,
            key=jax.random.key(0),
        )
    with pytest.raises(ValueError, match="sampling"):
        generate(model, PROMPT, max_new_tokens=2, sampling="beam")
    with pytest.raises(ValueError, match=r"outside \[0, 50\)"):
        generate(model, jnp.array([1, 60]), max_new_tokens=2)
    logits, cache = prefill(model, PROMPT, cache="kvg", max_len=len(PROMPT) + 1)
    with pytest.raises(ValueError, match="outside"):
        decode_step(model, cache, 50)
    with pytest.raises(ValueError, match="scalar"):
        decode_step(model, cache, jnp.array([1, 2]))
    _, cache = decode_step(model, cache, jnp.asarray(3))
    # a full cache outside jit: a plain ValueError before any work (not Equinox's runtime error)
    with pytest.raises(ValueError, match=r"decode_step: the cache is full \(7 of max_len=7"):
        decode_step(model, cache, jnp.asarray(3))


def test_tiny_temperature_is_greedy_and_bad_temperatures_are_refused(model):
    """`z − max` before dividing: a temperature that overflows `logits/T` (or underflows to 0 in
    float32) gives the argmax exactly, not junk ids."""
    greedy = generate(model, PROMPT, max_new_tokens=4, cache="kvg")
    for t in (1e-300, 1e-45, 1e-30):
        tiny = generate(
            model, PROMPT, max_new_tokens=4, cache="kvg", sampling="top_p", top_p=1.0,
            temperature=t, key=jax.random.key(1),
        )  # fmt: skip
        np.testing.assert_array_equal(tiny, greedy)
    logits = jnp.asarray([1.0, 3.0, 3.0 - 1e-6, -2.0])  # near tie: still the exact argmax
    for t in (1e-300, 0.0):  # 0: what 1e-300 becomes in float32
        draws = jax.vmap(
            lambda k: _cache._sample(
                logits, k, sampling="top_p", top_p=1.0, temperature=jnp.float32(t)
            )
        )(jax.random.split(jax.random.key(0), 64))
        np.testing.assert_array_equal(draws, 1)
    kw = dict(max_new_tokens=2, sampling="top_p", key=jax.random.key(0))
    for bad in (float("inf"), float("nan"), -1.0, 1e39):
        with pytest.raises(
            ValueError, match=rf"`temperature` must be finite and > 0.*got {re.escape(str(bad))}"
        ):
            generate(model, PROMPT, temperature=bad, **kw)


def test_traced_temperature_and_top_p_are_checked_with_the_program(model):
    """The docstring says `temperature` and `top_p` are traced: under `jit` they are (one
    program for every value, the same draws as eager calls), and an out-of-range traced
    value fails with the program, naming it."""
    kw = dict(max_new_tokens=3, cache="kvg", sampling="top_p", key=jax.random.key(2))
    run = eqx.filter_jit(lambda t, p: generate(model, PROMPT, temperature=t, top_p=p, **kw))
    for t, p in ((0.5, 0.9), (2.0, 1.0)):
        eager = generate(model, PROMPT, temperature=t, top_p=p, **kw)
        np.testing.assert_array_equal(run(jnp.float32(t), jnp.float32(p)), eager)
    t, p = jnp.float32(-1.0), jnp.float32(0.9)
    with pytest.raises(eqx.EquinoxRuntimeError, match="`temperature` must be finite and > 0"):
        run(t, p)
    with pytest.raises(eqx.EquinoxRuntimeError, match=r"`top_p` must be in \(0, 1\]"):
        run(jnp.float32(0.5), jnp.float32(1.5))


def test_key_must_be_a_prng_key(model):
    with pytest.raises(ValueError, match=r"generate: `key` must be one PRNG key, e.g. "
                       r"`jax.random.key\(0\)`, got int 0"):  # fmt: skip
        generate(model, PROMPT, max_new_tokens=2, sampling="top_p", key=0)
    legacy = generate(model, PROMPT, max_new_tokens=2, sampling="top_p", key=jax.random.PRNGKey(0))
    assert legacy.shape == (2,)
