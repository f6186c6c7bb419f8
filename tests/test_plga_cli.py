"""`jaxattn plga train` / `jaxattn plga generate`: parser, clear errors, and an end-to-end run."""

import json
import os
import pathlib
import re

import numpy as np
import pytest

from jaxattn.cli import build_parser, main

MICRO = [
    "--set", "d_model=16", "--set", "num_layers=1", "--set", "num_heads=2", "--set", "head_dim=8",
    "--set", "dff=32", "--set", "A_dff=16", "--set", "num_reslayerA=1", "--set", "num_denseA=1",
    "--set", "context_length=32",
]  # fmt: skip


def test_plga_group_registers_train_and_generate(capsys):
    parser = build_parser()
    args = parser.parse_args(["plga", "train", "--out", "x", "--dag", "0.1", "0", "0.2"])
    assert args.dag == [0.1, 0.0, 0.2] and args.steps == 300 and args.dtype == "float32"
    args = parser.parse_args(["plga", "generate", "--ckpt", "d", "--prompt", "hi"])
    assert (args.cache, args.sampling) == ("none", "greedy")  # exact by default
    assert (args.top_p, args.temperature, args.seed) == (None, None, None)  # top_p's; 0.9, 1, 0
    args = parser.parse_args(
        ["plga", "generate", "--ckpt", "d", "--prompt", "hi", "--cache", "auto"]
    )
    assert args.cache == "auto"
    assert parser.parse_args(["plga", "train", "--out", "x", "--keep-last", "3"]).keep == 3
    assert parser.parse_args(["plga", "train", "--out", "x", "--keep", "2"]).keep == 2
    with pytest.raises(SystemExit):
        parser.parse_args(["plga", "generate", "--ckpt", "d", "--prompt", "hi", "--cache", "g"])
    with pytest.raises(SystemExit):
        parser.parse_args(["plga", "--help"])
    assert "generate" in capsys.readouterr().out


def test_bad_input_is_a_clear_error(tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n \n")
    assert main(["plga", "train", "--out", str(tmp_path / "r"), "--text", str(empty)]) == 2
    assert "input is empty" in capsys.readouterr().err

    fake = tmp_path / "fake.model"
    fake.write_text("not a model")
    assert main(["plga", "train", "--out", str(tmp_path / "r"), "--tokenizer", str(fake)]) == 2
    assert "is not a SentencePiece model" in capsys.readouterr().err

    assert main(["plga", "train", "--out", str(tmp_path / "r"), "--set", "depth=3"]) == 2
    assert "has no field 'depth'" in capsys.readouterr().err
    assert main(["plga", "train", "--out", str(tmp_path / "r"), "--set", "d_model=-4"]) == 2
    assert "--set d_model=-4: PLDRLLMConfig.d_model must be a positive" in capsys.readouterr().err

    assert main(["plga", "train", "--out", str(tmp_path / "r"), "--seq-len", "4096"]) == 2
    assert "context length 128" in capsys.readouterr().err

    for flag, value in (("--clip", "-1"), ("--lr", "nan"), ("--weight-decay", "inf")):
        assert main(["plga", "train", "--out", str(tmp_path / "r"), flag, value]) == 2
        assert f"error: {flag}: TrainConfig." in capsys.readouterr().err
    assert not (tmp_path / "r").exists()  # refused before anything is written

    assert main(["plga", "generate", "--ckpt", str(tmp_path / "none"), "--prompt", "x"]) == 2
    assert "no such directory" in capsys.readouterr().err

    (tmp_path / "emptyrun").mkdir()
    assert main(["plga", "generate", "--ckpt", str(tmp_path / "emptyrun"), "--prompt", "x"]) == 2
    assert "holds no checkpoint" in capsys.readouterr().err


@pytest.mark.slow
def test_train_resume_generate_end_to_end(tmp_path, capsys):
    run = tmp_path / "run"
    base = ["plga", "train", "--out", str(run), *MICRO, "--seq-len", "16", "--batch-size", "2"]
    base += ["--steps", "4", "--warmup", "1", "--lr", "1e-2", "--ckpt-every", "2", "--no-progress"]
    assert main(base + ["--stop-after", "2"]) == 0
    assert "continue with --resume" in capsys.readouterr().out
    assert main(base) == 2  # existing run, no --resume: refused, nothing overwritten
    assert "already holds checkpoints" in capsys.readouterr().err
    assert main(base + ["--resume"]) == 0
    out = capsys.readouterr()
    assert "final: step 4, validation loss" in out.out and "unigram entropy 6.3" in out.out
    steps = sorted(p.name for p in run.glob("step_*"))
    assert steps == ["step_00000002", "step_00000004"]
    manifest = json.loads((run / "step_00000004" / "manifest.json").read_text())
    assert manifest["model_config"]["d_model"] == 16 and manifest["step"] == 4
    assert manifest["data_position"] == 8 and (run / "tokenizer.model").is_file()

    # a different config against the same run is refused, naming the field
    other = [a if a != "d_model=16" else "d_model=24" for a in base]
    assert main(other + ["--resume", "--steps", "4"]) == 2
    assert "d_model: checkpoint 16, this run 24" in capsys.readouterr().err

    assert (run / "loss_curve.png").stat().st_size > 1000 and (run / "metrics.jsonl").is_file()

    texts = {}
    for cache in ("none", "kv", "kvg", "auto"):
        argv = ["plga", "generate", "--ckpt", str(run), "--prompt", "I was", "--cache", cache]
        assert main(argv + ["--max-new-tokens", "5", "--ids"]) == 0
        out = capsys.readouterr()
        assert out.out.startswith("I was")
        texts[cache] = out.out
        assert f"cache={cache}" in out.err or cache == "auto"
        assert "step 4" in out.err
        if cache in ("kv", "kvg"):
            assert "an approximation unless the model has collapsed" in out.err
    # auto measured KV+G against exact on this prompt and says what it chose; the text is then
    # the exact one or the (agreeing) cached one
    line = [ln for ln in out.err.splitlines() if ln.startswith("cache auto:")]
    assert len(line) == 1 and "5 greedy tokens: max rel |Δlogit|" in line[0]
    chosen = line[0].rsplit("cache=", 1)[1]
    assert chosen in ("none", "kvg") and f"cache={chosen} (auto)" in out.err
    assert texts["auto"] == texts[chosen]
    # default: exact recomputation
    argv = ["plga", "generate", "--ckpt", str(run), "--prompt", "I was", "--max-new-tokens", "5"]
    assert main(argv + ["--ids"]) == 0
    out = capsys.readouterr()
    assert "cache=none]" in out.err and out.out == texts["none"]
    argv = ["plga", "generate", "--ckpt", str(run / "step_00000002"), "--prompt", "I was"]
    argv += ["--sampling", "top_p", "--top-p", "0.5", "--temperature", "0.7", "--seed", "3"]
    assert main(argv + ["--max-new-tokens", "4"]) == 0
    assert "step 2" in capsys.readouterr().err
    argv = ["plga", "generate", "--ckpt", str(run), "--prompt", "I was", "--max-new-tokens", "40"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "with --max-new-tokens 40 the model's context of 32 tokens leaves room for 0" in err
    long = ["plga", "generate", "--ckpt", str(run), "--prompt", "I was " * 20]
    assert main(long + ["--max-new-tokens", "5"]) == 2  # named as the flag, not prompt_ids
    assert "--prompt is 40 tokens; with --max-new-tokens 5" in capsys.readouterr().err

    # a corrupt newest checkpoint: generate falls back to the previous good step and says so
    blob = bytearray((run / "step_00000004" / "model.eqx").read_bytes())
    blob[100] ^= 0xFF
    (run / "step_00000004" / "model.eqx").write_bytes(bytes(blob))
    argv = ["plga", "generate", "--ckpt", str(run), "--prompt", "I was", "--max-new-tokens", "3"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert (
        "using checkpoint step_00000002 (step 2); skipped unusable step_00000004: model.eqx "
        "is corrupt"
        in err
        and "(step 2)" in err
    )
    # ... and so does --resume (which then rewrites step 4 bit for bit)
    assert main(base + ["--resume"]) == 0
    assert "using checkpoint step_00000002 (step 2)" in capsys.readouterr().err


def _fake_train(write_metrics=True, interrupt_after=None):
    """A stand-in for `train` that writes what the real one writes (a checkpoint directory and
    metrics.jsonl) without compiling a model."""
    from jaxattn.plga._train import TrainResult

    def fake(model, data, config, *, out_dir, log, **kw):
        out_dir = pathlib.Path(out_dir)
        (out_dir / "step_00000002").mkdir(parents=True)
        (out_dir / "step_00000002" / "model.eqx").write_bytes(b"\0" * 1000)
        if write_metrics:
            rec = [{"step": s, "loss": 10.0 / s, "cross_entropy": 10.0 / s, "dag": 0.0}
                   for s in (1, 2)]  # fmt: skip
            rec.append({"step": 2, "val_loss": 6.0, "val_perplexity": float(np.exp(6.0))})
            (out_dir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rec))
        if interrupt_after is not None:
            log(f"interrupted at step {interrupt_after}: saved {out_dir}/step_00000002; "
                "continue with --resume")  # fmt: skip
            raise KeyboardInterrupt
        return TrainResult(model=model, opt_state=None, step=config.steps, history=[(1, 10.0)],
                           val_history=[(2, 6.0)], checkpoint=out_dir / "step_00000002",
                           seconds=1.0)  # fmt: skip

    return fake


def _train_argv(run):
    return ["plga", "train", "--out", str(run), *MICRO, "--seq-len", "16", "--steps", "2",
            "--warmup", "1", "--no-progress"]  # fmt: skip


def test_train_interrupt_is_one_line_and_status_130(tmp_path, capsys, monkeypatch):
    import jaxattn.plga._train as T

    monkeypatch.setattr(T, "train", _fake_train(interrupt_after=2))
    assert main(_train_argv(tmp_path / "r")) == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("interrupt")]
    assert lines == [f"interrupted at step 2: saved {tmp_path / 'r'}/step_00000002; continue "
                     "with --resume"]  # fmt: skip
    # The metrics written before the interruption: the loss curve is drawn up to it.
    assert (tmp_path / "r" / "loss_curve.png").stat().st_size > 1000


def test_train_writes_loss_curve_and_sizes_and_labels_a_blocked_figure(tmp_path, capsys,
                                                                       monkeypatch):  # fmt: skip
    import jaxattn.plga._train as T

    monkeypatch.setattr(T, "train", _fake_train())
    run = tmp_path / "r"
    assert main(_train_argv(run)) == 0
    err = capsys.readouterr().err
    assert (run / "loss_curve.png").stat().st_size > 1000
    assert "each checkpoint ≈" in err and "(float32 weights + Adam moments)" in err
    assert "1 checkpoint of 0.0 MB each" in err and "--keep-last K" in err
    # a blocked figure path: the results stay, the failure is named, the status says so
    blocked = tmp_path / "b"
    (blocked / "loss_curve.png").mkdir(parents=True)
    assert main(_train_argv(blocked)) == 3
    err = capsys.readouterr().err
    assert f"figure {blocked / 'loss_curve.png'} not written (" in err
    assert "results kept" in err and (blocked / "metrics.jsonl").is_file()


def test_loss_curve_figure_labels(tmp_path):
    from jaxattn.plot._training import plot_loss_curve, read_metrics

    recs = [{"step": s, "loss": 5.0 - 0.01 * s, "dag": 0.0} for s in range(1, 301)]
    recs += [{"step": s, "loss": 9.0, "dag": 0.0} for s in (299, 300)]  # a resume repeats steps
    recs += [{"step": 100, "val_loss": 4.5}, {"step": 300, "val_loss": 2.5}]
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in recs))
    got = read_metrics(tmp_path)
    assert [r["loss"] for r in got if r["step"] == 300 and "loss" in r] == [9.0]  # last one wins
    fig = plot_loss_curve(tmp_path, unigram_entropy=6.3, path=tmp_path / "c.png")
    (ax,) = fig.axes
    assert ax.get_xlabel() == "optimiser step" and "nats/token" in ax.get_ylabel()
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["training loss (per step)", "training loss (mean of 3 steps)",
                      "validation loss", "unigram entropy 6.300"]  # fmt: skip
    np.testing.assert_array_equal(ax.lines[2].get_xdata(), [100, 300])
    assert (tmp_path / "c.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="no training-loss records"):
        plot_loss_curve([{"step": 1, "val_loss": 2.0}])
    # A last record cut off mid-write (a killed run) is skipped; a bad line elsewhere is not.
    path.write_text(path.read_text() + '\n{"step": 301, "loss": 1.')
    assert read_metrics(tmp_path) == got
    path.write_text('{"step": 1, "loss": 1.\n' + path.read_text())
    with pytest.raises(ValueError, match="line 1 is not a metrics record"):
        read_metrics(tmp_path)


def test_audit_writes_results_before_figures(tmp_path, capsys):
    out = tmp_path / "audit"
    (out / "g_lm_singular_spectra.png").mkdir(parents=True)  # the figure's path is blocked
    assert main(["plga", "audit", "--g-lm", "--out", str(out)]) == 3
    err = capsys.readouterr().err
    assert f"figure {out / 'g_lm_singular_spectra.png'} not written (" in err
    assert "results kept in" in err
    report = json.loads((out / "audit.json").read_text())
    assert np.asarray(report["g_lm"]["numerical_rank"]).ndim == 2
    assert main(["plga", "audit", "--g-lm", "--out", str(tmp_path / "ok")]) == 0
    assert (tmp_path / "ok" / "g_lm_singular_spectra.png").stat().st_size > 1000


def test_generate_and_audit_say_which_step_they_fall_back_to(tmp_path, capsys):
    """A corrupt newest step of a run directory: both commands load the previous good step and
    say so in one line (here they then stop at the tokenizer check, before any compilation)."""
    import jax
    import jax.numpy as jnp

    from jaxattn.plga import PLDRLLM, PLDRLLMConfig
    from jaxattn.plga._checkpoint import config_dict, save_checkpoint

    cfg = PLDRLLMConfig(vocab_size=40, d_model=16, num_layers=1, num_heads=2, head_dim=8, dff=24,
                        A_dff=12, num_reslayerA=1, num_denseA=1, context_length=16)  # fmt: skip
    model = PLDRLLM(cfg, key=jax.random.key(0), dtype=jnp.float32)
    extra = {"model_config": config_dict(cfg), "attention": "plga"}
    for step in (5, 10):
        save_checkpoint(tmp_path, step=step, data_position=0, model=model, opt_state={},
                        manifest=extra)  # fmt: skip
    blob = bytearray((tmp_path / "step_00000010" / "model.eqx").read_bytes())
    blob[-1] ^= 0xFF
    (tmp_path / "step_00000010" / "model.eqx").write_bytes(bytes(blob))
    note = (
        "using checkpoint step_00000005 (step 5); skipped unusable step_00000010: model.eqx is "
        "corrupt (SHA-256 differs from the manifest)"
    )
    assert main(["plga", "generate", "--ckpt", str(tmp_path), "--prompt", "x"]) == 2
    out = capsys.readouterr()
    assert note in out.err.splitlines() and "the model 40" in out.err
    assert main(["plga", "audit", "--ckpt", str(tmp_path), "--out", str(tmp_path / "a")]) == 2
    out = capsys.readouterr()
    assert out.out.splitlines()[0] == note and "the model 40" in out.err


def test_generate_refuses_bad_or_ineffective_sampling_options(tmp_path, capsys):
    parser = build_parser()
    base = ["plga", "generate", "--ckpt", "d", "--prompt", "hi", "--sampling", "top_p"]
    for flag, value, why in (
        ("--temperature", "inf", "must be finite and > 0"),
        ("--temperature", "nan", "must be finite and > 0"),
        ("--temperature", "0", "must be finite and > 0"),
        ("--top-p", "1.5", r"must be in \(0, 1\]"),
        (
            "--seed",
            "99999999999999999999999",
            r"9{23} is outside \[0, 2\*\*32 - 1\], the seeds that give distinct keys",
        ),
    ):
        with pytest.raises(SystemExit):
            parser.parse_args(base + [flag, value])
        assert re.search(f"argument {flag}: {why}", capsys.readouterr().err)
    args = parser.parse_args(base + ["--temperature", "1e-300", "--seed", str(2**32 - 1)])
    assert (args.temperature, args.seed) == (1e-300, 2**32 - 1)
    for bad in (str(2**32), "-1"):  # without 64-bit JAX, 2**32 would be seed 0's key
        with pytest.raises(SystemExit):
            parser.parse_args(["plga", "train", "--out", "x", "--seed", bad])
    # an option greedy sampling ignores is refused, naming both options, before any loading
    for flag, value in (("--top-p", "0.5"), ("--temperature", "0.7"), ("--seed", "3")):
        argv = ["plga", "generate", "--ckpt", str(tmp_path / "none"), "--prompt", "x", flag, value]
        assert main(argv) == 2
        assert f"error: {flag} has no effect with --sampling greedy" in capsys.readouterr().err


def test_inputs_that_are_not_regular_files_are_named(tmp_path, capsys):
    """A folder, a device and a FIFO are each said to be what they are (a FIFO is never
    opened: that would block), and `--out` naming a file is refused before any work."""
    from jaxattn.plga._data import Tokenizer

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    afile = tmp_path / "afile"
    afile.write_text("x")
    train = ["plga", "train", "--out", str(tmp_path / "r"), "--text"]
    for path, what in (
        (tmp_path, "is a folder, not a file"),
        ("/dev/null", "is not a regular file (it is a device)"),
        (fifo, "is not a regular file (it is a named pipe (FIFO))"),
    ):
        assert main(train + [str(path)]) == 2
        assert f"error: text: {path} {what}" in capsys.readouterr().err
        with pytest.raises(ValueError, match=re.escape(f"tokenizer: {path} {what}")):
            Tokenizer(path)
    assert main(["plga", "train", "--out", str(afile)]) == 2
    # named by the subcommand as typed, not "jaxattn plga"
    assert f"jaxattn plga train: error: --out {str(afile)!r} is a file; give a folder." in (
        capsys.readouterr().err
    )
    audit = ["plga", "audit", "--out", str(tmp_path / "a")]
    assert main(audit + ["--g-lm", str(tmp_path)]) == 2
    assert f"error: --g-lm: {tmp_path} is a folder, not a file" in capsys.readouterr().err
    assert main(audit + ["--ckpt", str(tmp_path), "--prompts", str(fifo)]) == 2
    assert f"error: --prompts: {fifo} is not a regular file (it is a named pipe (FIFO))" in (
        capsys.readouterr().err
    )
    assert main(audit + ["--ckpt", str(tmp_path), "--new-tokens", "0"]) == 2
    assert "error: --new-tokens must be ≥ 1, got 0" in capsys.readouterr().err
    assert main(["plga", "audit", "--g-lm", "--out", str(afile)]) == 2
    assert "is a file; give a folder" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "r").exists()


@pytest.fixture(scope="module")
def audit_run(tmp_path_factory):
    """A checkpoint of an untrained micro model with the packaged tokenizer's vocabulary and a
    context of 16 (below the default --seq-len 64)."""
    import jax
    import jax.numpy as jnp

    from jaxattn.plga import PLDRLLM, PLDRLLMConfig
    from jaxattn.plga._checkpoint import config_dict, save_checkpoint

    cfg = PLDRLLMConfig(vocab_size=32000, d_model=16, num_layers=1, num_heads=2, head_dim=8,
                        dff=24, A_dff=12, num_reslayerA=1, num_denseA=1,
                        context_length=16)  # fmt: skip
    model = PLDRLLM(cfg, key=jax.random.key(0), dtype=jnp.float32)
    run = tmp_path_factory.mktemp("audit_run")
    save_checkpoint(run, step=1, data_position=0, model=model, opt_state={},
                    manifest={"model_config": config_dict(cfg), "attention": "plga"})  # fmt: skip
    return run


def _prepared(run, *extra):
    import jax

    from jaxattn.plga._cli_audit import _prepare_ckpt

    args = build_parser().parse_args(["plga", "audit", "--ckpt", str(run), *extra])
    with jax.enable_x64(True):
        return _prepare_ckpt(args)


def test_audit_checks_prompts_and_arguments_before_any_work(audit_run, tmp_path, capsys,
                                                            monkeypatch):  # fmt: skip
    from jaxattn import dynamics

    # the default --seq-len is capped at the model's context length
    prompts = _prepared(audit_run)[4]
    assert prompts.shape == (8, 16)
    with pytest.raises(ValueError, match=r"--seq-len 40 must be between 5 .* context length 16"):
        _prepared(audit_run, "--seq-len", "40")
    with pytest.raises(ValueError, match="--num-prompts 5000: the corpus gives only 3852 windows "
                       "of 16 tokens"):  # fmt: skip
        _prepared(audit_run, "--num-prompts", "5000")
    # one-token lines are too short, not empty; a line shorter than the minimum is named too
    short = tmp_path / "short.txt"
    short.write_text("hello\nworld\n")
    why = (
        "--prompts: need at least 2 prompts of at least 5 tokens each; .* has 2 non-empty "
        "lines, 2 of them shorter than 5 tokens"
    )
    with pytest.raises(ValueError, match=why):
        _prepared(audit_run, "--prompts", str(short))
    short.write_text("The cat sat on the mat\nI was\n")
    with pytest.raises(ValueError, match="2 non-empty lines, 1 of them shorter than 5 tokens"):
        _prepared(audit_run, "--prompts", str(short))
    # too many prompts for the memory: refused with the estimate and the count that fits
    monkeypatch.setattr(dynamics, "memory_available", lambda: 2**30)
    with pytest.raises(ValueError) as err:
        _prepared(audit_run, "--num-prompts", "3000")
    m = re.fullmatch(r"--num-prompts: auditing 3000 prompts of 16 tokens needs about ([\d.]+) GiB "
                     r"\(4498500 prompt pairs\), more than half of the 1 GiB available; at most "
                     r"(\d+) prompts fit", str(err.value))  # fmt: skip
    assert m and float(m[1]) > 0.5
    from jaxattn.plga._cli_audit import _audit_bytes

    model, fit = _prepared(audit_run)[2], int(m[2])
    assert _audit_bytes(model, fit, 16, 8) <= 2**29 < _audit_bytes(model, fit + 1, 16, 8)
    # --g-lm with a bad --seq-len: nothing printed, no output folder
    out = tmp_path / "out"
    argv = ["plga", "audit", "--g-lm", "--ckpt", str(audit_run), "--seq-len", "40"]
    assert main(argv + ["--out", str(out)]) == 2
    cap = capsys.readouterr()
    assert "G_LM" not in cap.out and "--seq-len 40 must be between" in cap.err
    assert not out.exists()
    # --num-prompts beside --prompts would be ignored: refused, naming both
    lines = tmp_path / "lines.txt"
    lines.write_text("The cat sat on the mat today\nI was born in a small town\n")
    argv = ["plga", "audit", "--ckpt", str(audit_run), "--prompts", str(lines)]
    assert main(argv + ["--num-prompts", "4", "--out", str(out)]) == 2
    assert "--num-prompts has no effect with --prompts FILE" in capsys.readouterr().err
    assert not out.exists()
