"""`jaxattn plga train` / `jaxattn plga generate`: parser, clear errors, and an end-to-end run."""

import json

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
    assert (args.cache, args.sampling, args.top_p) == ("kvg", "greedy", 0.9)
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

    assert main(["plga", "train", "--out", str(tmp_path / "r"), "--seq-len", "4096"]) == 2
    assert "context length 128" in capsys.readouterr().err

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

    texts = {}
    for cache in ("none", "kv", "kvg"):
        argv = ["plga", "generate", "--ckpt", str(run), "--prompt", "I was", "--cache", cache]
        assert main(argv + ["--max-new-tokens", "5", "--ids"]) == 0
        out = capsys.readouterr()
        assert out.out.startswith("I was")
        texts[cache] = out.out
        assert f"cache={cache}" in out.err and "step 4" in out.err
    argv = ["plga", "generate", "--ckpt", str(run / "step_00000002"), "--prompt", "I was"]
    argv += ["--sampling", "top_p", "--top-p", "0.5", "--temperature", "0.7", "--seed", "3"]
    assert main(argv + ["--max-new-tokens", "4"]) == 0
    assert "step 2" in capsys.readouterr().err
    argv = ["plga", "generate", "--ckpt", str(run), "--prompt", "I was", "--max-new-tokens", "40"]
    assert main(argv) == 2
    assert "exceeds context_length=32" in capsys.readouterr().err
