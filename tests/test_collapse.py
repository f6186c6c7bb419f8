"""Model audits (invariance, cache fidelity, non-causality) and collapse-based inference."""

import pathlib

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxattn.plga import PLDRLLM, PLDRLLMConfig, generate
from jaxattn.plga._audits import (
    cache_fidelity,
    invariance_audit,
    noncausality_audit,
    perturb_suffix,
    rope_commutant_projection,
)
from jaxattn.plga._collapse import collapse, collapse_error, frozen_G

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "plga_reference_small.npz"
CFG = PLDRLLMConfig(
    vocab_size=40,
    d_model=32,
    num_layers=2,
    num_heads=2,
    head_dim=8,
    dff=48,
    A_dff=16,
    num_reslayerA=2,
    num_denseA=1,
    context_length=24,
)


def _set_attn(model, name, values):
    """Replace `layer.attn.<name>` in every layer (values: one per layer)."""
    where = lambda m: [getattr(layer.attn, name) for layer in m.layers]
    return eqx.tree_at(where, model, list(values))


def make_collapsed(model, key):
    """Make the metric learner's output input-invariant: the last residual unit's LayerNorm gets
    zero scale, so every row of A is its offset b (A = 1 bᵀ, identical rows and heads)."""
    for layer in range(len(model.layers)):
        ml = model.layers[layer].attn.metric_learner
        offset = jax.random.normal(
            jax.random.fold_in(key, layer), ml.ln_bias.shape[1:], ml.ln_bias.dtype
        )
        model = eqx.tree_at(
            lambda m: (
                m.layers[layer].attn.metric_learner.ln_weight,
                m.layers[layer].attn.metric_learner.ln_bias,
            ),
            model,
            (ml.ln_weight.at[-1].set(0.0), ml.ln_bias.at[-1].set(offset)),
        )
    return model


@pytest.fixture(scope="module")
def models():
    @eqx.filter_jit  # one compilation instead of many small eager ones
    def build(key):
        model = PLDRLLM(CFG, key=key, dtype=jnp.float64)
        # non-zero biases b_W so that the power-law stage is not trivial
        shape = model.layers[0].attn.b_W.shape
        b_W = [
            0.05 * jax.random.normal(jax.random.fold_in(key, i), shape)
            for i in range(CFG.num_layers)
        ]
        model = _set_attn(model, "b_W", b_W)
        return model, make_collapsed(model, jax.random.fold_in(key, 99))

    plga, collapsed = build(jax.random.key(0))
    return {"plga": plga, "collapsed": collapsed}


@pytest.fixture(scope="module")
def prompts():
    return jax.random.randint(jax.random.key(3), (4, 10), 4, CFG.vocab_size)


# ------------------------------------------------------------------ invariance


def test_invariance_order_parameter(models, prompts):
    live = invariance_audit(models["plga"], prompts)
    dead = invariance_audit(models["collapsed"], prompts)
    assert live.by_rms.shape == (6, 2, 4) and live.tensors == ("A", "A_LM", "A_P", "G_LM")
    assert float(jnp.min(live.by_rms[..., 0])) > 1e-2  # A moves with the input
    assert float(jnp.max(live.by_rms)) <= 2.0
    assert float(jnp.max(dead.by_rms)) < 1e-14 and float(jnp.max(dead.by_mean_abs)) < 1e-14
    s = live.summary()
    assert set(s) == {"by_mean_abs", "by_rms"} and len(s["by_rms"]["G_LM"]) == 2
    assert s["by_rms"]["A"][0]["n"] == 6
    with pytest.raises(ValueError, match="at least 2"):
        invariance_audit(models["plga"], prompts[:1])


# ------------------------------------------------------------------ cache fidelity, non-causality


def test_cache_fidelity_matches_reference_fixture():
    """Teacher-forced on the uncached greedy path, the KV / KV+G caches differ from full
    recomputation exactly as the reference's decode_logits differ from its recompute_logits."""
    ref = np.load(FIXTURE)
    model = PLDRLLM.from_reference(FIXTURE)
    fid = cache_fidelity(model, ref["decode_prompt_ids"], max_new_tokens=4, caches=("kvg",))
    assert fid["tokens"][:3] == ref["decode_tokens"].tolist()
    expected = np.abs(ref["decode_logits"] - ref["recompute_logits"]).max(
        -1
    )  # ≈ [1.31, 0.90, 1.13]
    np.testing.assert_allclose(fid["kvg"]["max_abs_dlogit"][1:], expected, rtol=1e-9)
    assert fid["kvg"]["max_abs_dlogit"][0] < 1e-10  # the prompt itself
    # the reference's cached path picks 75 at the last step, the uncached one 94
    assert fid["kvg"]["argmax_agreement"] == 0.75
    assert fid["kvg"]["token_agreement"] == 0.75 and fid["kvg"]["first_divergence"] == 3
    dG = np.asarray(fid["kvg"]["rel_dG"])
    assert dG.shape == (4, 2) and np.all(dG[0] == 0) and np.all(dG[1:] > 1e-3)


@pytest.mark.slow
def test_cache_fidelity_collapsed_is_exact(models, prompts):
    fid = cache_fidelity(models["collapsed"], prompts[0], max_new_tokens=4)
    for kind in ("kv", "kvg"):
        assert max(fid[kind]["rel_dlogit"]) < 1e-12
        assert fid[kind]["argmax_agreement"] == 1.0 and fid[kind]["first_divergence"] == 4
        assert np.max(fid[kind]["rel_dG"]) == 0.0


def test_noncausality(models, prompts):
    ids = prompts[0]
    alt = perturb_suffix(ids, 6, key=jax.random.key(5), vocab_size=CFG.vocab_size)
    assert bool(jnp.all(alt[:6] == ids[:6])) and bool(jnp.all(alt[6:] != ids[6:]))
    live = noncausality_audit(models["plga"], ids, alt, split=6)
    assert live["rel_dlogit"] > 1e-3 and min(live["rel_dG_LM"]) > 1e-3
    assert np.isnan(live["per_position_dlogit"][6])
    dead = noncausality_audit(models["collapsed"], ids, alt, split=6)
    assert dead["max_abs_dlogit"] < 1e-13 and max(dead["rel_dG_LM"]) == 0.0
    with pytest.raises(ValueError, match="agree before"):
        noncausality_audit(models["plga"], ids, alt, split=8)


# ------------------------------------------------------------------ collapse-based inference


def test_collapse_equals_collapsed_model(models, prompts):
    model = models["collapsed"]
    frozen = collapse(model, ids=prompts[0], fold="auto")
    assert frozen.folded == (False, False)  # this G is not in the RoPE commutant
    assert frozen.model.layers[0].attn.metric_learner is None and frozen.model.attention == "sdpa"
    err = collapse_error(model, frozen, prompts)
    assert err["rel_dlogit"] < 1e-13 and err["argmax_agreement"] == 1.0
    # cached decoding of the frozen model = uncached decoding of the original
    ref = generate(model, prompts[1], max_new_tokens=4, cache="none")
    assert frozen.generate(prompts[1], max_new_tokens=4).tolist() == ref.tolist()
    # folding a G that is not in the commutant is an approximation, and it shows
    folded = collapse(model, ids=prompts[0], fold="always")
    assert folded.folded == (True, True) and all(g is None for g in folded.G)
    assert collapse_error(model, folded, prompts)["rel_dlogit"] > 1e-2


def test_collapse_error_of_a_live_model(models, prompts):
    model = models["plga"]
    frozen = collapse(model, frozen_G(model, prompts[0]))
    assert collapse_error(model, frozen, prompts[0])["rel_dlogit"] < 1e-13  # its own prompt
    assert collapse_error(model, frozen, prompts[1:])["rel_dlogit"] > 1e-3  # other prompts


def test_fold_is_exact_in_the_commutant(models, prompts, getkey):
    """P = 0 makes A_P = 1 and a = 0 makes G_LM = b_a for every input; with b_a in the RoPE
    commutant, G folds into W_q and the frozen model is plain SDPA with the same logits."""
    model = models["plga"]
    shape = model.layers[0].attn.b_a.shape
    comm = [rope_commutant_projection(jax.random.normal(getkey(), shape)) for _ in model.layers]
    model = _set_attn(model, "P", [jnp.zeros(shape)] * 2)
    model = _set_attn(model, "a", [jnp.zeros(shape)] * 2)
    model = _set_attn(model, "b_a", comm)
    folded = collapse(model, ids=prompts[0])
    assert folded.folded == (True, True) and all(g is None for g in folded.G)
    assert collapse_error(model, folded, prompts)["rel_dlogit"] < 1e-12
    kept = collapse(model, ids=prompts[0], fold="never")
    assert kept.folded == (False, False)
    assert collapse_error(model, kept, prompts)["rel_dlogit"] < 1e-12
    # the folded model decodes with a plain KV cache exactly as the original decodes uncached
    ref = generate(model, prompts[2], max_new_tokens=4, cache="none")
    assert folded.generate(prompts[2], max_new_tokens=4).tolist() == ref.tolist()


def test_collapse_argument_errors(models, prompts):
    with pytest.raises(ValueError, match="exactly one"):
        collapse(models["plga"])
    with pytest.raises(ValueError, match="shape"):
        collapse(models["plga"], jnp.zeros((2, 2, 4, 4)))
    with pytest.raises(ValueError, match="fold"):
        collapse(models["plga"], ids=prompts[0], fold="sometimes")
