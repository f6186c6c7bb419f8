"""Structure of the compiled cached-decode step: a decoded token reads the weights and the KV
cache in place. A transposed weight (`x @ W.T` materialised the transpose of every matrix, the
LM head first among them, on every token), a re-laid-out cache (a position-major cache copied
whole by every layer) or a cache copied into the output (not donated) all show up as a
`transpose`/`copy` of a large array in the optimised HLO. Cheap and deterministic: no timing."""

import re

import jax
import jax.numpy as jnp
import pytest

from jaxattn.plga import PLDRLLM, PLDRLLMConfig, _cache, decode_step, prefill

# Every weight matrix and each layer's cache (heads × max_len × dk = 2·128·32) holds at least
# THRESHOLD elements; the per-head dk × dk tensors (2·32·32) and the token's own q/k/v do not.
CFG = PLDRLLMConfig(
    vocab_size=512,
    d_model=64,
    num_layers=2,
    num_heads=2,
    head_dim=32,
    dff=96,
    A_dff=48,
    num_reslayerA=1,
    num_denseA=1,
    context_length=128,
)
THRESHOLD = 64 * 64
MAXLEN = 128


def _large_moves(hlo: str, threshold: int) -> list[str]:
    """The `transpose`/`copy` instructions (fused or not) of at least `threshold` elements."""
    out = []
    pattern = r"=\s*[a-z0-9]+\[([0-9,]*)\](?:\{[^}]*\})?\s+(transpose|copy)\("
    for line in hlo.splitlines():
        m = re.search(pattern, line)
        if m:
            size = 1
            for d in filter(None, m.group(1).split(",")):
                size *= int(d)
            if size >= threshold:
                out.append(line.strip()[:160])
    return out


@pytest.fixture(scope="module")
def compiled_steps():
    out = {}
    for attention, kinds in (("plga", ("kv", "kvg")), ("sdpa", ("kv",))):
        model = PLDRLLM(CFG, key=jax.random.key(0), attention=attention)
        for kind in kinds:
            _, cache = prefill(model, jnp.arange(4, 12), cache=kind, max_len=MAXLEN)
            lowered = _cache._decode_jit.lower((model, jnp.asarray(3)), cache)
            out[f"{attention}-{kind}"] = lowered.lowered.compile().as_text()
    return out


@pytest.mark.parametrize("variant", ["plga-kv", "plga-kvg", "sdpa-kv"])
def test_decode_step_moves_no_large_array(compiled_steps, variant):
    hlo = compiled_steps[variant]
    assert _large_moves(hlo, THRESHOLD) == []
    # the detector itself sees a transposed weight: x @ W.T on the LM head
    W = jnp.ones((CFG.vocab_size, CFG.d_model), jnp.float32)
    naive = jax.jit(lambda x, W: jnp.tanh(x @ W.T) @ W).lower(jnp.ones(CFG.d_model), W)
    assert _large_moves(naive.compile().as_text(), THRESHOLD)


def _aliased_parameters(hlo: str) -> set[int]:
    """Entry parameters that an output aliases (`input_output_alias={ {out}: (param, ...) }`)."""
    header = hlo.splitlines()[0]
    aliases = re.search(r"input_output_alias=\{(.*?)\}\s*,\s*entry", header)
    if aliases is None:
        return set()
    return {int(p) for p in re.findall(r"\}:\s*\((\d+),", aliases.group(1))}


def _entry_parameters(hlo: str, shape: tuple[int, ...]) -> set[int]:
    """Entry parameters of this shape (f32)."""
    entry = hlo[hlo.index("\nENTRY") :]
    dims = ",".join(map(str, shape))
    found = re.findall(rf"= f32\[{dims}\]\{{[^}}]*\}} parameter\((\d+)\)", entry)
    return {int(p) for p in found}


@pytest.mark.parametrize("variant", ["plga-kv", "plga-kvg", "sdpa-kv"])
def test_decode_step_aliases_the_cache(compiled_steps, variant):
    """The keys and values buffers (layers, heads, max_len, dk) are outputs aliased to the
    step's inputs: updated in place, not copied whole into a new buffer every token."""
    hlo = compiled_steps[variant]
    cache_params = _entry_parameters(hlo, (CFG.num_layers, CFG.num_heads, MAXLEN, CFG.head_dim))
    assert len(cache_params) == 2  # keys and values
    assert cache_params <= _aliased_parameters(hlo)


def test_decode_step_donates_the_cache(compiled_steps):
    """A consumed cache is refused with a message instead of JAX's deleted-buffer error; a
    copy taken before the step decodes the same."""
    model = PLDRLLM(CFG, key=jax.random.key(0), attention="sdpa")
    _, cache = prefill(model, jnp.arange(4, 12), cache="kv", max_len=16)
    branch = cache.copy()
    lg1, _ = decode_step(model, cache, 7)
    assert cache.is_consumed() and not branch.is_consumed()
    with pytest.raises(ValueError, match="already consumed"):
        decode_step(model, cache, 7)
    with pytest.raises(ValueError, match="copy it before the step"):
        cache.copy()
    lg2, _ = decode_step(model, branch, 7)
    assert jnp.array_equal(lg1, lg2)
