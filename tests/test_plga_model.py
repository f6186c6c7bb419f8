"""PLDRLLM: configs, argument checks, numerical guards, weight import/export."""

import pathlib
import subprocess
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxattn.plga import (
    CONFIGS,
    PLDRLLM,
    PLDRLLMConfig,
    from_reference,
    save_reference,
    to_reference,
)

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "plga_reference_small.npz"
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


@pytest.fixture(scope="module")
def model():
    return PLDRLLM(CFG, key=jax.random.key(0), dtype=jnp.float64)


@eqx.filter_jit
def logits_of(model, ids, G=None):
    return model(ids, G=G)[0]


def loss_fn(model, ids):
    """Next-token cross-entropy masked where the target is padding, plus a small logit penalty
    (so that an all-padding row still has a gradient); the deductive outputs as aux."""
    logits, ded = model(ids)
    tgt = ids[1:]
    lp = jax.nn.log_softmax(logits[:-1])
    nll = -jnp.take_along_axis(lp, tgt[:, None], axis=-1)[:, 0]
    w = (tgt != model.config.pad_id).astype(lp.dtype)
    loss = jnp.sum(nll * w) / jnp.maximum(jnp.sum(w), 1) + 1e-3 * jnp.mean(logits**2)
    return loss, ded


loss_and_grad = eqx.filter_jit(eqx.filter_value_and_grad(loss_fn, has_aux=True))


IDS = jnp.array([5, 17, 3, 44, 9, 21, 30, 2, 0, 0], jnp.int32)


def test_configs():
    v = CONFIGS["v51-110m"]
    assert (v.num_layers, v.num_heads, v.head_dim, v.d_model, v.dff, v.A_dff) == (
        5,
        14,
        64,
        896,
        2389,
        170,
    )
    assert (v.num_reslayerA, v.num_denseA, v.vocab_size, v.context_length) == (8, 2, 32000, 1024)
    assert {"tiny", "small"} <= set(CONFIGS) and CONFIGS["tiny"].vocab_size == 32000
    assert hash(v) == hash(v.replace())
    skeleton = eqx.filter_eval_shape(lambda: PLDRLLM(v, key=jax.random.key(0)))
    n = sum(x.size for x in jax.tree.leaves(skeleton) if hasattr(x, "shape"))
    assert 109e6 < n < 111e6  # "110M"
    with pytest.raises(ValueError, match="head_dim"):
        CFG.replace(head_dim=15)
    with pytest.raises(ValueError, match="num_layers"):
        CFG.replace(num_layers=0)
    with pytest.raises(ValueError, match="rope"):
        CFG.replace(rope="neox")
    with pytest.raises(ValueError, match="pad_id"):
        CFG.replace(pad_id=50)


def test_import_keeps_jax_config():
    code = "import jax, jaxattn.plga; assert not jax.config.jax_enable_x64; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr


def test_bad_ids(model):
    with pytest.raises(ValueError, match=r"outside \[0, 50\): \[50\]"):
        model(jnp.array([1, 50, 2]))
    with pytest.raises(ValueError, match=r"outside .*\[-1\]"):
        model(np.array([1, -1, 2]))
    with pytest.raises(ValueError, match="context_length=24"):
        model(jnp.ones((25,), jnp.int32))
    with pytest.raises(ValueError, match="shape \\(seq,\\)"):
        model(jnp.ones((2, 3), jnp.int32))
    with pytest.raises(ValueError, match="integer"):
        model(jnp.ones((3,)))
    # traced ids are checked at run time
    with pytest.raises(Exception, match="outside"):
        jax.block_until_ready(logits_of(model, jnp.array([1, 99, 2], jnp.int32)))


def test_G_injection(model):
    dk, H, L = CFG.head_dim, CFG.num_heads, CFG.num_layers
    # every accepted form normalises to one (heads, dk, dk) array per layer
    forms = [jnp.eye(dk), [jnp.eye(dk)] * L, jnp.broadcast_to(jnp.eye(dk), (L, H, dk, dk))]
    for form in forms:
        Gs = model.layer_G(form)
        assert len(Gs) == L and all(g.shape == (H, dk, dk) for g in Gs)
        np.testing.assert_array_equal(jnp.stack(Gs), forms[2])
    a = logits_of(model, IDS, forms[2])
    sdpa = from_reference(to_reference(model), CFG, attention="sdpa")
    np.testing.assert_allclose(logits_of(sdpa, IDS), a, rtol=1e-12, atol=1e-12)
    # injecting the model's own G_LM reproduces the uncached forward
    own = jnp.stack([d.G_LM for d in loss_and_grad(model, IDS)[0][1]])
    np.testing.assert_allclose(
        logits_of(model, IDS, own), logits_of(model, IDS), rtol=1e-10, atol=1e-12
    )
    with pytest.raises(ValueError, match="`G` must have shape"):
        model(IDS, G=jnp.eye(dk + 1))
    with pytest.raises(ValueError, match="num_layers=2"):
        model(IDS, G=[jnp.eye(dk)])


def test_vmap_batch_and_padding(model):
    ids2 = jnp.stack([IDS, jnp.array([7, 8, 9, 10, 11, 12, 13, 14, 15, 16], jnp.int32)])
    batched = eqx.filter_jit(jax.vmap(lambda m, i: m(i)[0], in_axes=(None, 0)))(model, ids2)
    np.testing.assert_allclose(batched[0], logits_of(model, IDS), rtol=1e-12, atol=1e-12)
    # all-padding sequence (every key masked in every row): finite forward, finite gradient
    allpad = jnp.zeros_like(IDS)
    (loss, _), g = loss_and_grad(model, allpad)
    assert bool(jnp.isfinite(loss)) and bool(jnp.all(jnp.isfinite(logits_of(model, allpad))))
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(g))
    assert float(jnp.max(jnp.abs(g.final_layer.bias))) > 0


@pytest.mark.parametrize("dtype", [jnp.float64, pytest.param(jnp.float32, marks=pytest.mark.slow)])
def test_grad_finite_at_tiny_A_LM_and_negative_powers(model, dtype):
    """W = b_W = 0 puts every A_LM entry at ε = 1e-9; P = −4 gives A_P = 1e36 (≈ float32 max)."""
    m = jax.tree.map(lambda x: x.astype(dtype) if eqx.is_inexact_array(x) else x, model)
    for li in range(CFG.num_layers):
        attn = m.layers[li].attn
        m = eqx.tree_at(
            lambda mm: (
                mm.layers[li].attn.W,
                mm.layers[li].attn.b_W,
                mm.layers[li].attn.P,
                mm.layers[li].attn.a,
            ),
            m,
            (
                jnp.zeros_like(attn.W),
                jnp.zeros_like(attn.b_W),
                jnp.full_like(attn.P, -4.0),
                attn.a * 1e-36,
            ),
        )
    (loss, ded), g = loss_and_grad(m, IDS)
    np.testing.assert_allclose(np.asarray(ded[0].A_LM, np.float64), 1e-9, rtol=1e-6)
    assert float(jnp.max(ded[0].A_P)) > 1e35
    assert bool(jnp.isfinite(loss))
    leaves = jax.tree.leaves(g)
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in leaves)
    assert float(jnp.max(jnp.abs(g.layers[0].attn.P))) >= 0  # reached


@pytest.mark.slow  # the layer-level test in test_plga_attention.py runs by default
def test_causal_density_model_is_causal(model):
    m = PLDRLLM(CFG.replace(causal_density=True), key=jax.random.key(1), dtype=jnp.float64)
    ref = model
    a, b = IDS, IDS.at[7].set(33)  # change position 7 (positions 8, 9 are padding)
    la, lb = logits_of(m, a), logits_of(m, b)
    np.testing.assert_allclose(la[:7], lb[:7], rtol=0, atol=1e-12)
    ra, rb = logits_of(ref, a), logits_of(ref, b)
    assert float(jnp.max(jnp.abs(ra[:7] - rb[:7]))) > 1e-6  # the reference model is not causal


@pytest.mark.slow
def test_bfloat16_forward(model):
    """bf16 compute: finite; the deductive chain, scores and LayerNorm statistics run in float32.
    The SDPA path (G = I) stays within bf16 accuracy of float32; the PLGA path can not be held to
    that, because A_LM near ε raised to a power turns bf16's 4e-3 rounding of q̃ into O(1)
    changes of G_LM (the fixture README shows the same amplification from float64 to float32)."""
    m32 = jax.tree.map(lambda x: x.astype(jnp.float32) if eqx.is_inexact_array(x) else x, model)
    m16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16) if eqx.is_inexact_array(x) else x, model)
    l16, ded = eqx.filter_jit(lambda m, i: m(i))(m16, IDS)
    assert l16.dtype == jnp.bfloat16 and bool(jnp.all(jnp.isfinite(l16)))
    assert ded[0].G_LM.dtype == jnp.float32 and ded[0].scores.dtype == jnp.float32
    eye = jnp.eye(CFG.head_dim)
    s32 = logits_of(m32, IDS, eye)
    s16 = logits_of(m16, IDS, eye)
    err = float(jnp.max(jnp.abs(s16.astype(jnp.float32) - s32)) / jnp.max(jnp.abs(s32)))
    assert err < 0.05


def test_forward_compiles_once(model):
    @eqx.debug.assert_max_traces(max_traces=1)
    def f(m, i):
        return m(i)[0]

    f = eqx.filter_jit(f)
    f(model, IDS)
    f(model, (IDS + 1) % CFG.vocab_size)


# -- reference layout ------------------------------------------------------------------------------


def test_to_reference_is_fixture_layout():
    with np.load(FIXTURE, allow_pickle=False) as f:
        keys = [str(k) for k in f["keys"]]
        m = from_reference(FIXTURE)
        sd = to_reference(m)
        assert list(sd) == keys
        for k in keys:
            np.testing.assert_array_equal(sd[k], f[k])


@pytest.mark.parametrize("suffix", [".safetensors", ".npz"])
def test_round_trip(model, tmp_path, suffix):
    path = tmp_path / f"w{suffix}"
    save_reference(model, path)
    back = PLDRLLM.from_reference(path)
    assert back.config == CFG  # context_length etc. travel with the file
    assert bool(eqx.tree_equal(back, model))
    with pytest.raises(ValueError, match="must end in"):
        save_reference(model, tmp_path / "w.pt")


def test_bad_weights(model, tmp_path):
    sd = to_reference(model)
    k_w = "decoder.dec_layers.1.mha1.plgatt_layer.Wlst"
    missing = {k: v for k, v in sd.items() if k != k_w}
    with pytest.raises(ValueError, match=r"missing keys \(1\).*plgatt_layer\.Wlst"):
        from_reference(missing, CFG)
    with pytest.raises(ValueError, match=r"unexpected keys \(1\).*decoder\.bogus"):
        from_reference(sd | {"decoder.bogus": np.zeros(3)}, CFG)
    bad = dict(sd)
    bad["decoder.dec_layers.0.ffn.gluw1.weight"] = np.zeros((47, 32))
    with pytest.raises(
        ValueError, match=r"mis-shaped.*ffn\.gluw1\.weight: got \(47, 32\), expected \(48, 32\)"
    ):
        from_reference(bad, CFG)
    (tmp_path / "x.bin").write_bytes(b"junk")
    with pytest.raises(ValueError, match="must end in"):
        from_reference(tmp_path / "x.bin")
    with pytest.raises(FileNotFoundError):
        from_reference(tmp_path / "nope.npz")
    # an npz holding a pickled object array is refused, never unpickled
    np.savez(tmp_path / "obj.npz", a=np.array([{"x": 1}], dtype=object))
    with pytest.raises(ValueError, match="pickle"):
        from_reference(tmp_path / "obj.npz")
    (tmp_path / "bad.safetensors").write_bytes(b"\x00" * 16)
    with pytest.raises(ValueError, match="safetensors"):
        from_reference(tmp_path / "bad.safetensors")


def _overflowing(model, dtype):
    """Layer 0 with its metric tensor at the floor ε (W = 0, b_W = −100: iSwiGLU(−100) ≈ 4e-40)
    and exponents P = −4.5: A_P = ε^P ≈ 3e40, beyond float32 (3.4e38)."""
    m = jax.tree.map(lambda x: x.astype(dtype) if eqx.is_inexact_array(x) else x, model)
    attn = m.layers[0].attn
    return eqx.tree_at(
        lambda mm: (mm.layers[0].attn.W, mm.layers[0].attn.b_W, mm.layers[0].attn.P),
        m,
        (
            jnp.zeros_like(attn.W),
            jnp.full_like(attn.b_W, -100.0),
            jnp.full_like(attn.P, -4.5),
        ),
    )


def test_float32_power_law_overflow_is_finite_and_reported(model):
    """float32, P = −4.5 at the floor ε: A_P saturates, G_LM ~1e37–1e38. The logits stay finite
    and equal the float64 model's (where ε^P fits: an arg-max attention in both, since A_P is a
    constant matrix either way); `generate` gives real tokens; the overflow is reported with
    layer, head and the largest |G_LM|, and `check_score_overflow` raises under jit."""
    from jaxattn.plga import (
        check_score_overflow,
        format_score_overflow,
        generate,
        score_overflow,
    )

    m32, m64 = _overflowing(model, jnp.float32), _overflowing(model, jnp.float64)
    forward = eqx.filter_jit(lambda m, i: m(i))
    lg32, ded32 = forward(m32, IDS)
    lg64, ded64 = forward(m64, IDS)
    assert float(jnp.max(ded64[0].A_P)) > 1e40  # the true power law: beyond float32
    assert bool(jnp.all(jnp.isfinite(lg32)))
    scale = float(jnp.max(jnp.abs(lg64)))
    assert float(jnp.max(jnp.abs(lg32 - lg64))) / scale < 1e-4
    reports = score_overflow(ded32)
    assert sorted((r.layer, r.head) for r in reports) == [(0, 0), (0, 1)]
    assert all(r.max_abs_G_LM > 1e35 and r.dtype == "float32" for r in reports)
    msg = format_score_overflow(reports)
    assert "layer 0, head" in msg and "float32" in msg
    assert score_overflow(ded64) == [] and format_score_overflow([]) is None
    # the model-level check (what a training loop calls on its batch when the loss is NaN)
    batch = m32.score_overflow(jnp.stack([IDS, IDS]))
    assert [(r.layer, r.head) for r in batch] == [(r.layer, r.head) for r in reports]
    checked = eqx.filter_jit(lambda m, i: check_score_overflow(*m(i)))
    with pytest.raises(Exception, match="score overflow in layer 0"):
        jax.block_until_ready(checked(m32, IDS))
    np.testing.assert_array_equal(checked(m64, IDS), lg64)
    # generation: real tokens (not pad), the float64 model's
    prompt = IDS[:6]
    toks = generate(m32, prompt, max_new_tokens=3, cache="kv")
    np.testing.assert_array_equal(toks, generate(m64, prompt, max_new_tokens=3, cache="kv"))
    assert CFG.pad_id not in toks.tolist()
