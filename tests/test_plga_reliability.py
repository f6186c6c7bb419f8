"""Reliability of the PLGA training and weight paths: refused settings and weights, float32 master
weights for a float16 model, checkpoint leaf records, fallback past a corrupt checkpoint, the
learning-rate schedule pinned against its formula."""

import json
import math
import re
import shutil

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxattn.plga import PLDRLLM, PLDRLLMConfig, from_reference, to_reference
from jaxattn.plga._checkpoint import (
    CheckpointError,
    checkpoint_dirs,
    load_checkpoint,
    read_manifest,
    save_checkpoint,
    usable_checkpoint,
)
from jaxattn.plga._train import TrainConfig, learning_rate_schedule, make_optimizer, train

CFG = PLDRLLMConfig(
    vocab_size=40, d_model=16, num_layers=1, num_heads=2, head_dim=8, dff=24, A_dff=12,
    num_reslayerA=1, num_denseA=1, context_length=16,
)  # fmt: skip


# -- TrainConfig -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value",
    [
        ("clip_value", -1.0),
        ("clip_value", 0.0),
        ("clip_value", math.nan),
        ("clip_value", math.inf),
        ("learning_rate", math.nan),
        ("learning_rate", math.inf),
        ("learning_rate", 0.0),
        ("final_lr_fraction", 1.5),
        ("final_lr_fraction", math.nan),
        ("b1", 1.0),
        ("b2", -0.1),
        ("b2", math.nan),
        ("eps", 0.0),
        ("eps", math.inf),
        ("weight_decay", -0.1),
        ("weight_decay", math.nan),
        ("steps", 0),
        ("steps", 2.5),
        ("batch_size", True),
        ("seq_len", math.nan),
        ("warmup_steps", -1),
        ("seed", -3),
        ("checkpoint_every", 1.5),
        ("keep_checkpoints", -1),
        ("dag_coefficients", (0.0, math.nan, 0.0)),
        ("dag_coefficients", (0.0, 0.0)),
    ],
)
def test_train_config_refuses_bad_numbers(field, value):
    with pytest.raises(ValueError, match=rf"TrainConfig\.{field}"):
        TrainConfig(**{field: value})


def test_train_config_accepts_edges_and_normalises_types():
    c = TrainConfig(steps=5.0, learning_rate=1, final_lr_fraction=0, b1=0, weight_decay=0)
    assert c.steps == 5 and isinstance(c.steps, int) and isinstance(c.learning_rate, float)
    assert TrainConfig(final_lr_fraction=1.0, clip_value=1e30).clip_value == 1e30


# -- weights through from_reference ----------------------------------------------------------------


@pytest.fixture(scope="module")
def state_dict():
    return to_reference(PLDRLLM(CFG, key=jax.random.key(0), dtype=jnp.float32))


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_from_reference_refuses_non_finite_weights(state_dict, bad):
    key = "decoder.dec_layers.0.mha1.plgatt_layer.pwlst"
    sd = dict(state_dict)
    sd[key] = sd[key].copy()
    sd[key][1, 2, 3] = bad
    with pytest.raises(ValueError, match=rf"not finite.*{re.escape(key)} \(1 entries"):
        from_reference(sd, CFG)


def test_from_reference_refuses_weights_that_overflow_the_dtype(state_dict):
    """A value that fits float32 but not the requested dtype is refused too, by key."""
    sd = dict(state_dict)
    big = "decoder.dec_layers.0.ffn.gluw2.weight"
    sd[big] = sd[big].copy()
    sd[big][0, 0] = 1e6
    with pytest.raises(ValueError, match=rf"overflow float16: '{re.escape(big)}'"):
        from_reference(sd, CFG, dtype=jnp.float16)
    ok = from_reference(state_dict, CFG, dtype=jnp.float16)  # the same weights without 1e6 load
    assert all(bool(jnp.isfinite(x).all()) for x in jax.tree.leaves(ok))


# -- learning-rate schedule ------------------------------------------------------------------------


def _reference_lr(t, *, peak, W, T, f):
    """The documented formula (module docstring, README): linear warm-up from 0 to the peak over
    W steps, then cosine decay to f·peak at step T, f·peak after."""
    if t <= W:
        return peak * t / W
    if t >= T:
        return f * peak
    return peak * (f + (1 - f) * 0.5 * (1 + math.cos(math.pi * (t - W) / (T - W))))


def test_schedule_pinned_against_formula():
    peak, W, T, f = 3e-3, 40, 1000, 0.1
    s = learning_rate_schedule(peak, warmup_steps=W, total_steps=T, final_fraction=f)
    mid = (W + T) // 2
    for t in (0, 1, W - 1, W, W + 1, mid, T - 1, T, T + 7):
        want = _reference_lr(t, peak=peak, W=W, T=T, f=f)
        assert float(s(t)) == pytest.approx(want, rel=1e-6, abs=1e-15), t
    assert float(s(0)) == 0.0 and float(s(W)) == pytest.approx(peak, rel=1e-7)
    assert float(s(mid)) == pytest.approx(peak * (f + (1 - f) / 2), rel=1e-6)
    # no warm-up: the peak at step 0
    s0 = learning_rate_schedule(peak, warmup_steps=0, total_steps=T, final_fraction=f)
    assert float(s0(0)) == pytest.approx(peak, rel=1e-7)
    assert float(s0(T)) == pytest.approx(f * peak, rel=1e-6)


def test_optimizer_step_k_uses_the_schedule_at_k_minus_1():
    """Optax evaluates the schedule at the update count before it increments (as torch's
    LambdaLR): update k (1-based) uses η(k − 1), so the first update of a warm-up has rate 0."""
    cfg = TrainConfig(steps=10, warmup_steps=4, learning_rate=1.0, weight_decay=0.0, b1=0.0)
    opt = make_optimizer(cfg)
    params = {"w": jnp.zeros(1)}
    state = opt.init(params)
    g = {"w": jnp.ones(1)}
    sizes = []
    for _ in range(6):
        upd, state = opt.update(g, state, params)
        sizes.append(-float(upd["w"][0]))
    sched = learning_rate_schedule(1.0, warmup_steps=4, total_steps=10, final_fraction=0.1)
    # b1 = 0 and a constant gradient: m̂/(√v̂ + eps) = 1/(1 + 1e-5), so the update is η(k−1)
    want = [float(sched(k)) / (1 + 1e-5) for k in range(6)]
    np.testing.assert_allclose(sizes, want, rtol=1e-6, atol=1e-12)
    assert sizes[0] == 0.0 and sizes[4] == pytest.approx(1 / (1 + 1e-5), rel=1e-6)


# -- training --------------------------------------------------------------------------------------


class Bigram(eqx.Module):
    """Embedding → linear head: a model with the trainer's interface that compiles in a second."""

    embedding: jax.Array
    head: jax.Array

    def __init__(self, vocab, d=8, *, key, dtype=jnp.float32):
        k1, k2 = jax.random.split(key)
        self.embedding = jax.random.normal(k1, (vocab, d), dtype)
        self.head = (0.1 * jax.random.normal(k2, (d, vocab))).astype(dtype)

    def __call__(self, ids):
        return self.embedding[ids] @ self.head, []


@pytest.fixture(scope="module")
def data():
    from jaxattn.plga._data import Tokenizer, load_text_data

    return load_text_data(Tokenizer(), seq_len=16)


def _tc(**kw):
    base = dict(steps=6, batch_size=4, seq_len=16, learning_rate=1e-3, warmup_steps=0)
    base.update(checkpoint_every=0, eval_every=0, weight_decay=0.0)
    base.update(kw)
    return TrainConfig(**base)


def test_float16_model_trains_float32_master_weights_and_moments(data, tmp_path):
    """Before: float16 Adam moments; a fifth of the second moments underflowed to 0 while the
    first moments did not, and updates reached m/eps ≫ lr."""
    lr = 1e-3
    model = Bigram(32000, key=jax.random.key(0), dtype=jnp.float16)
    msgs = []
    res = train(model, data, _tc(steps=3, learning_rate=lr), out_dir=tmp_path / "r",
                progress=False, log=msgs.append)  # fmt: skip
    assert any("float16" in m and "float32 master weights" in m for m in msgs)
    assert {x.dtype for x in jax.tree.leaves(res.model)} == {jnp.dtype(jnp.float32)}
    adam = res.opt_state[1][0]
    for mu, nu in zip(jax.tree.leaves(adam.mu), jax.tree.leaves(adam.nu)):
        assert mu.dtype == nu.dtype == jnp.float32
        moved = np.asarray(mu) != 0
        assert moved.any() and (np.asarray(nu)[moved] > 0).all()  # no second moment underflows
    # three Adam steps move each weight by at most ~3·lr (here: by at most 3·lr + rounding)
    delta = max(
        float(jnp.max(jnp.abs(a.astype(jnp.float32) - b)))
        for a, b in zip(jax.tree.leaves(model), jax.tree.leaves(res.model))
    )
    assert lr / 2 < delta <= 3 * lr * 1.01


def test_short_run_with_long_warmup_warns(data, tmp_path):
    msgs = []
    train(Bigram(32000, key=jax.random.key(0)), data, _tc(steps=2, warmup_steps=3),
          out_dir=tmp_path / "r", progress=False, log=msgs.append)  # fmt: skip
    assert any(m.startswith("warning: the warm-up (3 steps) is not shorter") for m in msgs)
    msgs.clear()
    train(Bigram(32000, key=jax.random.key(0)), data, _tc(steps=2), out_dir=tmp_path / "s",
          progress=False, log=msgs.append)  # fmt: skip
    assert not any("warm-up" in m for m in msgs)
    msgs.clear()  # one step: no warm-up at all (the schedule's rate at count 0 is the peak)
    train(Bigram(32000, key=jax.random.key(0)), data, _tc(steps=1, warmup_steps=3),
          out_dir=tmp_path / "t", progress=False, log=msgs.append)  # fmt: skip
    assert any("dropped in a run of one step: its one update uses the peak" in m for m in msgs)


def test_resume_falls_back_past_a_corrupt_checkpoint_bit_for_bit(data, tmp_path):
    cfg = _tc(steps=6, checkpoint_every=2)
    straight = train(Bigram(32000, key=jax.random.key(1)), data, cfg, out_dir=tmp_path / "a",
                     progress=False, log=None)  # fmt: skip
    run = tmp_path / "b"
    train(Bigram(32000, key=jax.random.key(1)), data, cfg, out_dir=run, stop_after=4,
          progress=False, log=None)  # fmt: skip
    assert [d.name for d in checkpoint_dirs(run)] == ["step_00000002", "step_00000004"]
    blob = bytearray((run / "step_00000004" / "opt_state.eqx").read_bytes())
    blob[len(blob) // 3] ^= 0x01
    (run / "step_00000004" / "opt_state.eqx").write_bytes(bytes(blob))
    step_dir, note = usable_checkpoint(run, files=("model.eqx", "opt_state.eqx"))
    assert step_dir.name == "step_00000002"
    assert note.startswith("using checkpoint step_00000002 (step 2); skipped unusable")
    assert "step_00000004: opt_state.eqx is corrupt" in note and "\n" not in note
    msgs = []
    resumed = train(Bigram(32000, key=jax.random.key(1)), data, cfg, out_dir=run, resume=True,
                    progress=False, log=msgs.append)  # fmt: skip
    assert note in msgs and any("resumed from" in m and "(step 2)" in m for m in msgs)
    assert resumed.step == 6 and straight.history[2:] == resumed.history
    for a, b in zip(jax.tree.leaves(straight.model), jax.tree.leaves(resumed.model)):
        np.testing.assert_array_equal(a, b)
    # the corrupt step was rewritten by the resumed run
    assert usable_checkpoint(run / "step_00000004", files=("model.eqx", "opt_state.eqx"))[1] is None


def test_changed_settings_refusal_names_the_flag(data, tmp_path):
    run = tmp_path / "r"
    train(Bigram(32000, key=jax.random.key(0)), data, _tc(steps=2), out_dir=run, progress=False,
          log=None)  # fmt: skip
    with pytest.raises(CheckpointError, match=r"(?s)steps: checkpoint 2, this run 4.*"
                       r"--allow-changed-settings"):  # fmt: skip
        train(Bigram(32000, key=jax.random.key(0)), data, _tc(steps=4), out_dir=run, resume=True,
              progress=False, log=None)  # fmt: skip
    res = train(Bigram(32000, key=jax.random.key(0)), data, _tc(steps=4), out_dir=run,
                resume=True, progress=False, log=None, allow_changed_settings=True)  # fmt: skip
    assert res.step == 4


def test_interrupt_saves_then_reraises(data, tmp_path, monkeypatch):
    import jaxattn.plga._train as T

    calls = {"n": 0}
    real = T.batch_indices

    def interrupting(*args):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(T, "batch_indices", interrupting)
    msgs = []
    with pytest.raises(KeyboardInterrupt):
        train(Bigram(32000, key=jax.random.key(0)), data, _tc(steps=5), out_dir=tmp_path / "r",
              progress=False, log=msgs.append)  # fmt: skip
    assert [d.name for d in checkpoint_dirs(tmp_path / "r")] == ["step_00000002"]
    assert msgs == [f"interrupted at step 2: saved {tmp_path / 'r' / 'step_00000002'}; "
                    "continue with --resume"]  # fmt: skip


# -- checkpoint leaf records -----------------------------------------------------------------------


class Pair(eqx.Module):
    a: jax.Array
    b: jax.Array


class PairSwapped(eqx.Module):  # the same fields declared in the other order
    b: jax.Array
    a: jax.Array


def test_checkpoint_refuses_leaves_saved_in_another_order(tmp_path):
    saved = Pair(a=jnp.zeros(3, jnp.float32), b=jnp.ones(3, jnp.float32))
    step = save_checkpoint(tmp_path, step=1, data_position=0, model=saved, opt_state={})
    manifest = json.loads((step / "manifest.json").read_text())
    assert manifest["leaves"]["model.eqx"] == [
        {"path": ".a", "shape": [3], "dtype": "float32"},
        {"path": ".b", "shape": [3], "dtype": "float32"},
    ]
    # Equinox alone (shape and dtype checks) loads the swapped structure silently swapped:
    like = PairSwapped(b=jnp.zeros(3, jnp.float32), a=jnp.zeros(3, jnp.float32))
    swapped = eqx.tree_deserialise_leaves(step / "model.eqx", like)
    assert float(swapped.a[0]) == 1.0  # wrong: `a` holds the saved `b`
    with pytest.raises(CheckpointError, match=r"leaf 0: on disk \.a float32\(3,\), expected \.b"):
        load_checkpoint(step, like_model=like)
    back, _, _ = load_checkpoint(step, like_model=saved)
    assert float(back.a[0]) == 0.0 and float(back.b[0]) == 1.0


def test_checkpoint_bf16_round_trip_and_dtype_check(tmp_path):
    x = (jnp.arange(7, dtype=jnp.float32) / 3 - 1e-3).astype(jnp.bfloat16)
    saved = Pair(a=x, b=jnp.full(2, 1e-40, jnp.bfloat16))  # a bf16 subnormal too
    step = save_checkpoint(tmp_path, step=3, data_position=0, model=saved, opt_state={})
    like = jax.tree.map(lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype), saved)
    back, _, manifest = load_checkpoint(step, like_model=like)
    assert (
        back.a.dtype == jnp.bfloat16 and manifest["leaves"]["model.eqx"][0]["dtype"] == "bfloat16"
    )
    np.testing.assert_array_equal(np.asarray(back.a).view(np.uint16), np.asarray(x).view(np.uint16))
    assert float(back.b[0]) == float(jnp.bfloat16(1e-40)) != 0.0
    f32 = Pair(a=jnp.zeros(7, jnp.float32), b=jnp.zeros(2, jnp.bfloat16))
    with pytest.raises(CheckpointError, match=r"on disk \.a bfloat16\(7,\), expected \.a float32"):
        load_checkpoint(step, like_model=f32)


def test_load_model_falls_back_and_says_which_step(tmp_path):
    from jaxattn.plga._checkpoint import config_dict, load_model

    model = PLDRLLM(CFG, key=jax.random.key(0), dtype=jnp.float32)
    extra = {"model_config": config_dict(CFG), "attention": "plga"}
    for step in (1, 2):
        save_checkpoint(tmp_path, step=step, data_position=0, model=model, opt_state={},
                        manifest=extra)  # fmt: skip
    (tmp_path / "step_00000002" / "model.eqx").write_bytes(b"")
    loaded, manifest = load_model(tmp_path)
    assert manifest["step"] == 1 and bool(eqx.tree_equal(loaded, model))
    assert manifest["fallback"] == (
        "using checkpoint step_00000001 (step 1); skipped unusable step_00000002: model.eqx is "
        f"truncated or altered (0 bytes, manifest says "
        f"{(tmp_path / 'step_00000001' / 'model.eqx').stat().st_size})"
    )
    with pytest.raises(CheckpointError, match="model.eqx is truncated"):
        load_model(tmp_path / "step_00000002")  # an explicit step is never replaced
    shutil.rmtree(tmp_path / "step_00000001")
    with pytest.raises(CheckpointError, match="step_00000002: model.eqx is truncated"):
        load_model(tmp_path)


class _Flagged(eqx.Module):
    G_LM: jax.Array
    scores: jax.Array
    overflow: jax.Array


class OverflowingBigram(Bigram):
    """Reports head 1 of 2 as overflowing (the flag `PowerLawGraphAttention` sets when A_P = A_LM^P
    or the scores leave the dtype's range), with |G_LM| = 3e38 there."""

    def __call__(self, ids):
        n = ids.shape[0]
        G = jnp.stack([jnp.ones((4, 4)), jnp.full((4, 4), 3e38)]).astype(jnp.float32)
        d = _Flagged(G, jnp.zeros((2, n, n)), jnp.array([False, True]))
        return self.embedding[ids] @ self.head, [d]


def test_training_reports_score_overflow(data, tmp_path):
    import jaxattn.plga._attention as attention

    msgs = []
    model = OverflowingBigram(32000, key=jax.random.key(0))
    train(model, data, _tc(steps=2), out_dir=tmp_path / "r", progress=False, log=msgs.append)
    warned = [m for m in msgs if m.startswith("warning: the PLGA score path overflowed")]
    assert len(warned) == 2  # once with the details, once as the run's summary
    assert "in 4 (row, layer, head) of the batch of step 1." in warned[0]  # 4 rows × 1 head
    assert "overflowed in 2 of the steps of this call" in warned[1]
    if hasattr(attention, "score_overflow"):  # the per-head report of the forward pass
        assert "layer 0, head 1: largest |G_LM| = 3e+38" in warned[0]
    lines = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [x["score_overflow"] for x in lines if "loss" in x] == [4, 4]
    msgs.clear()
    train(Bigram(32000, key=jax.random.key(0)), data, _tc(steps=2), out_dir=tmp_path / "s",
          progress=False, log=msgs.append)  # fmt: skip
    assert not any("overflow" in m for m in msgs)


def test_version_1_checkpoint_loads_with_a_warning(tmp_path):
    saved = Pair(a=jnp.arange(3.0, dtype=jnp.float32), b=jnp.ones(3, jnp.float32))
    step = save_checkpoint(tmp_path, step=1, data_position=0, model=saved, opt_state={})
    manifest = json.loads((step / "manifest.json").read_text())
    del manifest["leaves"], manifest["manifest_sha256"]  # version 1 had neither
    manifest["format_version"] = 1
    (step / "manifest.json").write_text(json.dumps(manifest))
    with pytest.warns(
        UserWarning, match="records no leaf paths; model.eqx is loaded by leaf order"
    ) as w:
        back, _, _ = load_checkpoint(step, like_model=saved)
    assert {x.filename for x in w} == {__file__}
    assert bool(eqx.tree_equal(back, saved))
    manifest["format_version"] = 3
    (step / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="format version 3; this jaxattn reads versions 1, 2"):
        load_checkpoint(step, like_model=saved)


def test_an_edited_manifest_is_refused(tmp_path):
    """The manifest records its own SHA-256: an edited configuration (which changed the
    model built at load without a word) or step is refused; an older manifest without the
    hash still has its step and data position checked by type, by name."""
    saved = Pair(a=jnp.arange(3.0, dtype=jnp.float32), b=jnp.ones(3, jnp.float32))
    extra = {"model_config": {"rope": "interleaved", "d_model": 4}}
    step = save_checkpoint(
        tmp_path, step=6, data_position=2, model=saved, opt_state={}, manifest=extra
    )
    good = json.loads((step / "manifest.json").read_text())
    assert read_manifest(step)["model_config"]["rope"] == "interleaved"
    for edit in (
        lambda m: m["model_config"].update(rope="half"),
        lambda m: m.update(step=7),
        lambda m: m.update(data_position=0),
    ):
        m = json.loads(json.dumps(good))
        edit(m)
        (step / "manifest.json").write_text(json.dumps(m))
        with pytest.raises(CheckpointError, match="manifest.json was edited"):
            read_manifest(step)
    m = json.loads(json.dumps(good))
    del m["manifest_sha256"]
    m["step"] = "six"
    (step / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(CheckpointError, match="field 'step' must be an integer >= 0, got 'six'"):
        load_checkpoint(step, like_model=saved)


def test_bfloat16_weights_round_trip_through_safetensors(tmp_path):
    # bf16 tensors in safetensors: saved in the reference layout and reloaded bit for bit,
    # with their dtype kept.
    import jaxattn.plga as plga

    cfg = plga.CONFIGS["tiny"].replace(
        d_model=32,
        num_layers=1,
        num_heads=2,
        head_dim=16,
        dff=64,
        A_dff=16,
        num_reslayerA=1,
        context_length=32,
        vocab_size=64,
    )
    model = plga.PLDRLLM(cfg, key=jax.random.key(0), dtype=jnp.bfloat16)
    path = tmp_path / "m.safetensors"
    plga.save_reference(model, path)
    back = plga.PLDRLLM.from_reference(path)
    a = [x for x in jax.tree_util.tree_leaves(model) if hasattr(x, "dtype")]
    b = [x for x in jax.tree_util.tree_leaves(back) if hasattr(x, "dtype")]
    assert len(a) == len(b) and {str(x.dtype) for x in b} == {"bfloat16"}
    for x, y in zip(a, b):
        np.testing.assert_array_equal(np.asarray(x).view(np.uint16), np.asarray(y).view(np.uint16))


# -- refused keys, dtypes and weights --------------------------------------------------------------


def test_model_refuses_int_key_and_non_float_dtype():
    with pytest.raises(ValueError, match=r"PLDRLLM: `key` must be one PRNG key, e\.g\. "
                       r"`jax\.random\.key\(0\)`, got int 0"):  # fmt: skip
        PLDRLLM(CFG, key=0)
    for dtype, name in ((jnp.int32, "int32"), (jnp.complex64, "complex64"), (bool, "bool")):
        with pytest.raises(ValueError, match=rf"PLDRLLM: `dtype` must be a real floating.*{name}"):
            PLDRLLM(CFG, key=jax.random.key(0), dtype=dtype)


def test_from_reference_refuses_complex_weights_and_int_dtype(state_dict):
    key = "decoder.dec_layers.0.mha1.wq.weight"
    sd = dict(state_dict)
    sd[key] = sd[key].astype(np.complex64)
    with pytest.raises(ValueError, match=rf"must be real: '{re.escape(key)}' holds complex64"):
        from_reference(sd, CFG)
    with pytest.raises(ValueError, match="from_reference: `dtype` must be a real floating.*int32"):
        from_reference(state_dict, CFG, dtype=jnp.int32)


def test_from_reference_refuses_string_weights_and_a_config_that_contradicts_the_shapes(
    state_dict, tmp_path
):
    key = "decoder.dec_layers.0.mha1.wq.bias"
    sd = dict(state_dict)
    sd[key] = sd[key].astype(str)  # parsed back into floats before
    with pytest.raises(ValueError, match=rf"must be numbers: '{re.escape(key)}' holds str"):
        from_reference(sd, CFG)
    # A stored config entry beside the weights that their shapes contradict was ignored.
    path = tmp_path / "w.npz"
    np.savez(path, **state_dict, d_model=np.array(64))
    with pytest.raises(ValueError, match=r"contradicts the weights' shapes: d_model=.*give 16\)"):
        from_reference(path)
    np.savez(path, **state_dict, d_model=np.array(16), context_length=np.array(24))
    assert from_reference(path).config.d_model == 16  # agreeing entries are fine


def test_save_reference_refuses_non_finite_weights_before_writing(tmp_path):
    from jaxattn.plga import save_reference

    model = PLDRLLM(CFG, key=jax.random.key(0), dtype=jnp.float32)
    bad = eqx.tree_at(
        lambda m: m.final_layer.bias, model, model.final_layer.bias.at[3].set(jnp.nan)
    )
    path = tmp_path / "w.npz"
    why = (
        r"save_reference: Weights are not finite .* in 1 key\(s\): final_layer\.bias "
        r"\(1 entries, first nan at \(3,\)\); nothing written"
    )
    with pytest.raises(ValueError, match=why):
        save_reference(bad, path)
    assert not path.exists()


def test_collapse_refuses_non_finite_G():
    from jaxattn.plga import collapse

    model = PLDRLLM(CFG, key=jax.random.key(0), dtype=jnp.float32)
    G = jnp.zeros((1, 2, 8, 8)).at[0, 1, 2, 3].set(jnp.nan)
    with pytest.raises(ValueError, match=r"collapse: `G` has 1 non-finite entries .* the first at "
                       r"index \[0, 1, 2, 3\]"):  # fmt: skip
        collapse(model, G)
    with pytest.raises(
        ValueError, match=r"collapse: `G` has 128 non-finite entries \(NaN or inf in float32\)"
    ):
        collapse(model, jnp.full((1, 2, 8, 8), 1e300, jnp.float64))  # overflows float32
    # An injected G in the forward pass and in prefill is checked alike, after broadcasting
    # over the heads (it gave all-NaN logits); traced, it is the caller's to check.
    from jaxattn.plga import prefill

    ids = jnp.array([1, 5, 7, 2])
    bad = jnp.eye(8).at[2, 3].set(jnp.inf)
    for call in (lambda g: model(ids, G=g), lambda g: prefill(model, ids, G=g)):
        with pytest.raises(ValueError, match=r"`G` has 2 non-finite entries .* index \[0, 2, 3\]"):
            call(bad)
        assert np.isfinite(np.asarray(call(jnp.eye(8))[0])).all()
    with pytest.raises(ValueError, match=r"`G` has 128 non-finite entries \(NaN or inf in float32"):
        model(ids, G=[jnp.full((8, 8), jnp.nan)])  # one per layer, broadcast over the heads


# -- audits in chunks: memory linear in prompts, same numbers --------------------------------------


def test_invariance_pairs_and_bootstrap_in_chunks_match_direct(monkeypatch):
    """The pairs (and the bootstrap resamples) are computed a few at a time; with chunks smaller
    than the count, and a remainder, the numbers are those of the pairwise definition."""
    from jaxattn.plga import _audits, _mechanism
    from jaxattn.plga._audits import invariance_order_parameter

    monkeypatch.setattr(_audits, "PAIR_CHUNK", 4)
    monkeypatch.setattr(_mechanism, "BOOTSTRAP_CHUNK", 3)
    rng = np.random.default_rng(0)
    tensors = {n: jnp.asarray(rng.normal(size=(5, 1, 2, 3, 3))) for n in ("A", "G_LM")}
    pairs = jnp.asarray(np.stack(np.triu_indices(5, k=1), axis=-1), jnp.int32)  # 10 pairs
    by_mean, by_rms = _audits._pair_order_parameters(tensors, pairs)
    for p, (i, j) in enumerate(np.asarray(pairs)):
        for t, n in enumerate(tensors):
            op = invariance_order_parameter(tensors[n][i, 0], tensors[n][j, 0])
            np.testing.assert_allclose(by_rms[p, 0, t], op.by_rms, rtol=1e-12)
            np.testing.assert_allclose(by_mean[p, 0, t], op.by_mean_abs, rtol=1e-12)
    d = jnp.asarray(rng.normal(size=(4, 3, 2, 2)))
    lengths = jnp.asarray([2, 4, 8])
    chunked = _mechanism._concentration(d, lengths, jax.random.key(0), 7)
    monkeypatch.setattr(_mechanism, "BOOTSTRAP_CHUNK", 7)  # all at once
    whole = _mechanism._concentration(d, lengths, jax.random.key(0), 7)
    for a, b in zip(chunked, whole):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)
