"""Training loop of the PLDR-LLM: schedule, masked loss, DAG regulariser, clipping, mixed precision,
compile-once, bit-for-bit resume, checkpoint refusal, NaN stop, and learning on real text."""

import dataclasses
import json
import math
import shutil

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

from jaxattn.plga._checkpoint import (
    CheckpointError,
    checkpoint_dirs,
    load_checkpoint,
    read_manifest,
)
from jaxattn.plga._data import Tokenizer, load_text_data
from jaxattn.plga._train import (
    NonFiniteLossError,
    TrainConfig,
    dag_penalty,
    learning_rate_schedule,
    make_optimizer,
    make_step,
    masked_cross_entropy,
    train,
)

# -- a tiny stand-in with the model's interface (compiles in a second) -----------------------------


class _Deductive(eqx.Module):
    A: jax.Array
    A_LM: jax.Array
    A_P: jax.Array
    G_LM: jax.Array
    scores: jax.Array


@dataclasses.dataclass(frozen=True)
class StandInConfig:
    vocab_size: int
    d: int = 8


class StandIn(eqx.Module):
    """Embedding → linear head, with (heads, dk, dk) tensors reported as deductive outputs."""

    embedding: jax.Array
    head: jax.Array
    bias: jax.Array
    M: jax.Array
    config: StandInConfig = eqx.field(static=True)

    def __init__(self, config, *, key):
        k1, k2, k3 = jax.random.split(key, 3)
        self.config = config
        self.embedding = jax.random.normal(k1, (config.vocab_size, config.d), jnp.float32)
        self.head = 0.1 * jax.random.normal(k2, (config.d, config.vocab_size), jnp.float32)
        self.bias = jnp.zeros(config.vocab_size, jnp.float32)
        self.M = 0.3 * jax.random.normal(k3, (2, 4, 4), jnp.float32)

    def __call__(self, ids):
        logits = self.embedding[ids] @ self.head + self.bias
        d = _Deductive(
            self.M, self.M, self.M**2, self.M, jnp.zeros((2, ids.shape[0], ids.shape[0]))
        )
        return logits, [d]


@pytest.fixture(scope="module")
def data():
    return load_text_data(Tokenizer(), seq_len=16)


def _standin(key=0):
    return StandIn(StandInConfig(vocab_size=32000), key=jax.random.key(key))


def _tc(**kw):
    base = dict(steps=8, batch_size=4, seq_len=16, learning_rate=1e-2, warmup_steps=2)
    base.update(checkpoint_every=0, eval_every=0)
    base.update(kw)
    return TrainConfig(**base)


def _leaves_equal(a, b):
    la, lb = (
        jax.tree.leaves(eqx.filter(a, eqx.is_array)),
        jax.tree.leaves(eqx.filter(b, eqx.is_array)),
    )
    return len(la) == len(lb) and all(
        np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb)
    )


# -- pieces ----------------------------------------------------------------------------------------


def test_schedule_values():
    peak, W, T = 1e-3, 10, 110
    s = learning_rate_schedule(peak, warmup_steps=W, total_steps=T, final_fraction=0.1)
    assert float(s(0)) == 0.0
    assert float(s(5)) == pytest.approx(peak / 2, rel=1e-6)
    assert float(s(W)) == pytest.approx(peak, rel=1e-6)  # warm-up end = peak
    mid = W + (T - W) // 2  # half-way through the cosine: f + (1 - f)/2
    assert float(s(mid)) == pytest.approx(peak * (0.1 + 0.9 * 0.5), rel=1e-6)
    t = W + 17
    cos = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 17 / (T - W)))
    assert float(s(t)) == pytest.approx(peak * cos, rel=1e-5)
    assert float(s(T)) == pytest.approx(0.1 * peak, rel=1e-6)  # cosine end = 10 % of peak
    assert float(s(T + 50)) == pytest.approx(0.1 * peak, rel=1e-6)


def test_masked_cross_entropy_by_hand():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 3, 5))
    targets = np.array([[1, 0, 4], [0, 0, 2]])  # pad 0 masked
    total, count = masked_cross_entropy(jnp.asarray(logits), jnp.asarray(targets), pad_id=0)
    expect = []
    for b in range(2):
        for t in range(3):
            if targets[b, t] == 0:
                continue
            z = logits[b, t]
            expect.append(-(z[targets[b, t]] - np.log(np.exp(z).sum())))
    assert float(count) == 3
    assert float(total) == pytest.approx(sum(expect), rel=1e-12)
    assert float(total / count) == pytest.approx(np.mean(expect), rel=1e-12)


def test_dag_penalty_against_scipy_expm():
    pen = jax.jit(dag_penalty)  # one compile per shape
    rng = np.random.default_rng(1)
    M = rng.normal(size=(3, 6, 6)) * np.array([0.1, 1.0, 3.0])[:, None, None]  # 0 to 5 squarings
    got = np.asarray(pen(jnp.asarray(M)))
    want = [abs(np.log(np.trace(scipy.linalg.expm(m * m)) / 6)) for m in M]
    np.testing.assert_allclose(got, want, rtol=1e-10)
    assert (got > 0).all()
    # zero where the weighted graph has no cycle: 0, strictly triangular
    assert float(pen(jnp.zeros((4, 4)))) == 0.0
    upper = jnp.triu(jnp.asarray(rng.normal(size=(4, 4))), k=1)
    assert float(pen(upper)) == pytest.approx(0.0, abs=1e-14)
    # a 2-cycle a→b→a of weights (u, v): tr exp(M∘M) = dk - 2 + 2 cosh(u v)
    u, v = 0.7, -1.3
    cyc = jnp.zeros((4, 4)).at[0, 1].set(u).at[1, 0].set(v)
    assert float(pen(cyc)) == pytest.approx(np.log((2 + 2 * np.cosh(u * v)) / 4), rel=1e-12)
    # gradient against central finite differences
    m0 = jnp.asarray(rng.normal(size=(4, 4)))
    g = jax.jit(jax.grad(dag_penalty))(m0)
    E = jnp.zeros((4, 4)).at[1, 2].set(1e-6)
    fd = (pen(m0 + E) - pen(m0 - E)) / 2e-6
    assert float(g[1, 2]) == pytest.approx(float(fd), rel=1e-6)


def test_clip_by_value_and_adamw_settings():
    opt = make_optimizer(_tc(learning_rate=1.0, warmup_steps=0, steps=10, weight_decay=0.0))
    params = {"w": jnp.zeros(4, jnp.float32)}
    state = opt.init(params)
    grads = {"w": jnp.array([5.0, -3.0, 0.5, 0.0], jnp.float32)}
    updates, state = opt.update(grads, state, params)
    adam = state[1][0]
    np.testing.assert_allclose(adam.mu["w"], 0.1 * np.array([1.0, -1.0, 0.5, 0.0]), rtol=1e-6)
    np.testing.assert_allclose(adam.nu["w"], 0.05 * np.array([1.0, 1.0, 0.25, 0.0]), rtol=1e-6)
    # first bias-corrected Adam step at lr 1: m̂/(√v̂ + eps) with eps = 1e-5; zero gradient → 0
    want = -np.array([1.0, -1.0, 0.5, 0.0]) / (np.abs([1.0, -1.0, 0.5, 0.0]) + 1e-5)
    np.testing.assert_allclose(updates["w"], want, rtol=1e-5)


def test_bf16_zero_gradient_rows_stay_finite(data):
    model = _standin()
    cfg = _tc(compute_dtype="bf16", learning_rate=1e-2, warmup_steps=0)
    opt = make_optimizer(cfg)
    params, static = eqx.partition(model, eqx.is_inexact_array)
    state = opt.init(params)
    step = make_step(opt, pad_id=0, compute_dtype=jnp.bfloat16)
    rows = jnp.asarray(data.train[:4])
    for _ in range(3):
        params, state, metrics = step(params, static, state, rows[:, :-1], rows[:, 1:])
    assert params.embedding.dtype == jnp.float32  # master weights stay float32
    assert jnp.isfinite(metrics["loss"])
    assert all(bool(jnp.isfinite(x).all()) for x in jax.tree.leaves(params))
    unused = np.setdiff1d(np.arange(32000), np.asarray(rows[:, :-1]))[:100]
    # rows never used got zero gradient: only weight decay moved them (finite, no NaN)
    before = np.asarray(model.embedding)[unused]
    after = np.asarray(params.embedding)[unused]
    assert np.isfinite(after).all() and np.abs(after - before).max() < 1e-2 * np.abs(before).max()


def test_step_compiles_once(data):
    model = _standin()
    opt = make_optimizer(_tc())
    params, static = eqx.partition(model, eqx.is_inexact_array)
    state = opt.init(params)
    step = make_step(opt, pad_id=0)
    for i in range(3):
        rows = jnp.asarray(data.train[4 * i : 4 * i + 4])
        params, state, _ = step(params, static, state, rows[:, :-1], rows[:, 1:])
    rows = jnp.asarray(data.train[:2])  # another shape would compile again: refused
    with pytest.raises(RuntimeError, match="traced"):
        step(params, static, state, rows[:, :-1], rows[:, 1:])


def test_dag_regulariser_enters_loss(data, tmp_path):
    res = train(
        _standin(),
        data,
        _tc(steps=2, dag_coefficients=(0.5, 0.0, 0.25)),
        out_dir=tmp_path / "r",
        progress=False,
        log=None,
    )
    lines = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    first = [x for x in lines if "dag" in x][0]
    M = np.asarray(_standin().M, np.float64)
    want = 0.5 * np.mean([abs(np.log(np.trace(scipy.linalg.expm(m * m)) / 4)) for m in M])
    want += 0.25 * np.mean([abs(np.log(np.trace(scipy.linalg.expm(m * m)) / 4)) for m in M])
    assert first["dag"] == pytest.approx(want, rel=1e-4)
    assert first["loss"] == pytest.approx(first["cross_entropy"] + first["dag"], rel=1e-6)
    assert res.step == 2


# -- the loop --------------------------------------------------------------------------------------


def test_resume_is_bit_for_bit(data, tmp_path):
    cfg = _tc(steps=7, checkpoint_every=2)
    straight = train(_standin(), data, cfg, out_dir=tmp_path / "a", progress=False, log=None)
    first = train(
        _standin(), data, cfg, out_dir=tmp_path / "b", stop_after=3, progress=False, log=None
    )
    assert first.step == 3
    resumed = train(
        _standin(), data, cfg, out_dir=tmp_path / "b", resume=True, progress=False, log=None
    )
    assert resumed.step == 7
    assert _leaves_equal(straight.model, resumed.model)
    assert _leaves_equal(straight.opt_state, resumed.opt_state)
    assert straight.history[3:] == resumed.history
    assert not _leaves_equal(first.model, resumed.model)
    # without --resume an existing run is never overwritten
    with pytest.raises(ValueError, match="already holds checkpoints"):
        train(_standin(), data, cfg, out_dir=tmp_path / "b", progress=False, log=None)


def test_corrupt_truncated_and_mismatched_checkpoints_refused(data, tmp_path):
    cfg = _tc(steps=3)
    run = tmp_path / "r"
    train(_standin(), data, cfg, out_dir=run, progress=False, log=None)
    (ckpt,) = checkpoint_dirs(run)
    model = _standin()
    like_opt = make_optimizer(cfg).init(eqx.filter(model, eqx.is_inexact_array))
    loaded, _, manifest = load_checkpoint(ckpt, like_model=model, like_opt_state=like_opt)
    assert manifest["step"] == 3 and manifest["format_version"] == 2

    def fresh_copy(name):
        dst = tmp_path / name
        shutil.copytree(run, dst)
        return dst, checkpoint_dirs(dst)[0]

    run_c, ck = fresh_copy("corrupt")
    blob = bytearray((ck / "model.eqx").read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    (ck / "model.eqx").write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match="model.eqx is corrupt"):
        train(_standin(), data, cfg, out_dir=run_c, resume=True, progress=False, log=None)

    run_t, ck = fresh_copy("truncated")
    blob = (ck / "opt_state.eqx").read_bytes()
    (ck / "opt_state.eqx").write_bytes(blob[: len(blob) - 7])
    with pytest.raises(CheckpointError, match="opt_state.eqx is truncated"):
        train(_standin(), data, cfg, out_dir=run_t, resume=True, progress=False, log=None)

    run_m, ck = fresh_copy("manifest")
    (ck / "manifest.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="manifest.json is corrupt"):
        train(_standin(), data, cfg, out_dir=run_m, resume=True, progress=False, log=None)

    other = StandIn(StandInConfig(vocab_size=32000, d=6), key=jax.random.key(0))
    with pytest.raises(CheckpointError, match="another model configuration:\n  d: checkpoint 8"):
        train(other, data, cfg, out_dir=run, resume=True, progress=False, log=None)
    with pytest.raises(CheckpointError, match="other training settings"):
        train(
            _standin(),
            data,
            _tc(steps=3, learning_rate=5e-3),
            out_dir=run,
            resume=True,
            progress=False,
            log=None,
        )
    with pytest.raises(ValueError, match="no checkpoint to resume"):
        train(
            _standin(), data, cfg, out_dir=tmp_path / "empty", resume=True, progress=False, log=None
        )


def test_resume_repairs_a_metrics_record_cut_off_mid_write(data, tmp_path):
    from jaxattn.plot._training import read_metrics

    cfg = _tc(steps=4)
    run = tmp_path / "r"
    train(_standin(), data, cfg, out_dir=run, stop_after=2, progress=False, log=None)
    log_path = run / "metrics.jsonl"
    whole = log_path.read_text()
    cut = '{"step": 3, "loss": 10.3'  # the kill came mid-write
    log_path.write_text(whole + cut)
    said = []
    train(_standin(), data, cfg, out_dir=run, resume=True, progress=False, log=said.append)
    assert any(f"dropped an unfinished last record ({len(cut)} bytes" in m for m in said), said
    text = log_path.read_text()
    assert text.startswith(whole) and text.endswith("\n")
    assert [r["step"] for r in read_metrics(run) if "loss" in r] == [1, 2, 3, 4]
    # A whole last record that only lost its newline is kept (helper-27: it was dropped).
    log_path.write_text(text.rstrip("\n"))
    said.clear()
    train(_standin(), data, _tc(steps=5), out_dir=run, resume=True, allow_changed_settings=True,
          progress=False, log=said.append)  # fmt: skip
    assert not any("dropped" in m for m in said)
    assert [r["step"] for r in read_metrics(run) if "loss" in r] == [1, 2, 3, 4, 5]


def test_resume_on_other_data_or_tokenizer_is_refused(data, tmp_path):
    """The saved data position indexes the checkpoint's token rows: a resume on other rows
    (another corpus, tokenizer, split or seq_len: `data_sha256` differs) is refused unless
    settings may change; a different tokenizer (`tokenizer_sha256`, as the command line
    records it) is refused always."""
    from jaxattn.plga._train import data_fingerprint

    cfg = _tc(steps=4)
    run = tmp_path / "r"
    tok = {"tokenizer_sha256": "a" * 64}
    first = train(
        _standin(), data, cfg, out_dir=run, stop_after=2, manifest=tok, progress=False, log=None
    )
    assert first.step == 2
    assert read_manifest(run)["data_sha256"] == data_fingerprint(data)
    other = load_text_data(Tokenizer(), seq_len=16, val_fraction=0.25)
    assert data_fingerprint(other) != data_fingerprint(data)
    kw = dict(out_dir=run, resume=True, progress=False)
    with pytest.raises(CheckpointError, match="other training data"):
        train(_standin(), other, cfg, manifest=tok, log=None, **kw)
    with pytest.raises(CheckpointError, match="another tokenizer"):
        train(
            _standin(),
            data,
            cfg,
            manifest={"tokenizer_sha256": "b" * 64},
            allow_changed_settings=True,
            log=None,
            **kw,
        )
    said = []
    done = train(
        _standin(), other, cfg, manifest=tok, allow_changed_settings=True, log=said.append, **kw
    )
    assert done.step == 4 and any("other training data" in m for m in said)


def test_nan_loss_stops_and_keeps_last_good_checkpoint(data, tmp_path):
    cfg = _tc(steps=20, learning_rate=1e30, warmup_steps=1, checkpoint_every=1)
    run = tmp_path / "r"
    with pytest.raises(NonFiniteLossError) as info:
        train(_standin(), data, cfg, out_dir=run, progress=False, log=None)
    msg = str(info.value)
    saved = checkpoint_dirs(run)
    assert saved, "the checkpoints written before the NaN are kept"
    last = saved[-1]
    bad_step = int(msg.split("at step ")[1].split(" ")[0])
    assert f"step {bad_step - 1}" in msg and str(last) in msg and "nothing was overwritten" in msg
    assert int(last.name.split("_")[1]) == bad_step - 1
    model = _standin()
    like_opt = make_optimizer(cfg).init(eqx.filter(model, eqx.is_inexact_array))
    loaded, _, _ = load_checkpoint(last, like_model=model, like_opt_state=like_opt)
    assert all(
        bool(jnp.isfinite(x).all()) for x in jax.tree.leaves(eqx.filter(loaded, eqx.is_array))
    )


def test_a_few_steps_reduce_the_loss_on_real_text(data, tmp_path):
    tc = _tc(steps=30, learning_rate=0.1, eval_every=0)
    model = _standin()
    res = train(model, data, tc, out_dir=tmp_path / "r", progress=False, log=None)
    losses = [loss for _, loss in res.history]
    assert np.mean(losses[-5:]) < losses[0] - 1.0
    assert res.val_history[-1][1] < losses[0] - 1.0


@pytest.mark.slow
def test_real_model_learns_real_text(tmp_path):
    """A micro PLDR-LLM on the packaged corpus: a few steps reduce the training and validation loss
    from the uniform log(32000); the step compiles once (train() raises otherwise)."""
    from jaxattn.plga import CONFIGS, PLDRLLM

    cfg = CONFIGS["tiny"].replace(
        d_model=16,
        num_layers=1,
        num_heads=2,
        head_dim=8,
        dff=32,
        A_dff=16,
        num_reslayerA=1,
        num_denseA=1,
        context_length=32,
    )
    data = load_text_data(Tokenizer(), seq_len=32)
    data.val = data.val[:8]
    tc = TrainConfig(
        steps=30,
        batch_size=4,
        seq_len=32,
        learning_rate=3e-2,
        warmup_steps=3,
        checkpoint_every=0,
        eval_every=0,
    )
    res = train(
        PLDRLLM(cfg, key=jax.random.key(0)),
        data,
        tc,
        out_dir=tmp_path / "r",
        progress=False,
        log=None,
    )
    losses = [loss for _, loss in res.history]
    assert losses[0] == pytest.approx(math.log(32000), abs=0.5)
    assert np.mean(losses[-5:]) < losses[0] - 1.5
    assert res.val_history[-1][1] < losses[0] - 1.5


@pytest.mark.slow
def test_real_model_resume_bit_for_bit_with_dag_regulariser(tmp_path):
    """PLDRLLM, DAG regulariser on all three tensors: 4 steps straight equal 2 + resume 2."""
    from jaxattn.plga import CONFIGS, PLDRLLM

    cfg = CONFIGS["tiny"].replace(
        d_model=16, num_layers=1, num_heads=2, head_dim=8, dff=32, A_dff=16, num_reslayerA=1,
        num_denseA=1, context_length=16,
    )  # fmt: skip
    data = load_text_data(Tokenizer(), seq_len=16)
    data.val = data.val[:2]
    tc = TrainConfig(
        steps=4, batch_size=2, seq_len=16, learning_rate=1e-2, warmup_steps=1,
        dag_coefficients=(1e-3, 1e-3, 1e-3), checkpoint_every=0, eval_every=0,
    )  # fmt: skip

    def model():
        return PLDRLLM(cfg, key=jax.random.key(0))

    straight = train(model(), data, tc, out_dir=tmp_path / "a", progress=False, log=None)
    train(model(), data, tc, out_dir=tmp_path / "b", stop_after=2, progress=False, log=None)
    resumed = train(
        model(), data, tc, out_dir=tmp_path / "b", resume=True, progress=False, log=None
    )
    assert _leaves_equal(straight.model, resumed.model)
    assert straight.history[2:] == resumed.history
    lines = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert all(x["dag"] > 0 and math.isfinite(x["loss"]) for x in lines if "dag" in x)
