"""`jaxattn simulate` end to end (small n, short t1) and its bad-input exits."""

import json

import numpy as np
import pytest

from jaxattn.cli import main

SMALL = ["--n", "8", "--num-save", "201"]


def test_simulate_preset_end_to_end(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["simulate", "--preset", "case4-clustering", "--t1", "40", *SMALL, "--out", str(out)])
    assert rc == 0
    err = capsys.readouterr().err
    assert "regime: clustering" in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["regime"]["name"] == "clustering"
    assert summary["expected_regime"] == "clustering"
    assert summary["stated_criterion"] == {"claims": True, "regime": "clustering"}
    assert summary["result"]["successful"] is True
    assert summary["regime"]["evidence"]["num_clusters"] == 2
    assert summary["sphere"]["max_norm_error_saved"] < 1e-12
    assert summary["steps"]["num_steps"] > 0
    with np.load(out / "trajectory.npz") as z:
        assert z["xs"].shape == (201, 8, 2)
        assert z["ts"][-1] == 40.0
        np.testing.assert_allclose(np.linalg.norm(z["xs"], axis=-1), 1, atol=1e-12)
        np.testing.assert_array_equal(z["V"], [[1.0, 0.2], [-0.2, -1.0]])
    for name in ("tokens.png", "order_parameter.png", "order_parameter_plane.png"):
        png = out / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_simulate_matrices_from_json_and_npz(tmp_path):
    (tmp_path / "A.json").write_text(json.dumps([[1.0, 2.0], [-3.0, 0.5]]))
    np.savez(tmp_path / "V.npz", V=np.eye(2))
    out = tmp_path / "run"
    rc = main(
        [
            "simulate",
            "--A",
            str(tmp_path / "A.json"),
            "--V",
            str(tmp_path / "V.npz"),
            "--t1",
            "40",
            *SMALL,
            "--no-figures",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["parameters"]["preset"] == "custom"
    assert summary["parameters"]["A"] == [[1.0, 2.0], [-3.0, 0.5]]
    assert summary["stated_criterion"]["regime"] == "clustering"  # Case 1, tr A > 0
    assert summary["regime"]["name"] == "clustering"
    assert summary["figures"] == []


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--preset", "case9"], "unknown preset 'case9'"),
        (["--A", "{missing}"], "no such file"),
        (["--A", "{bad_shape}"], "square d×d"),
        (["--A", "{nan}"], "non-finite"),
        (["--A", "{not_json}"], "cannot read a matrix"),
        (["--A", "{eye3}", "--V", "{eye2}"], "same shape"),
        (["--preset", "case1", "--d", "3"], "d must be even"),
        (["--n", "0"], "--n must be at least 1"),
        # Sizes that cannot fit are refused before anything is allocated (they were an
        # out-of-memory traceback from XLA or NumPy, or the process was killed).
        (["--n", "100000000"], "(LSA) need about 1.52e+03 GiB (saved states, solver"),
        (["--d", "100000000"], "d = 100000000, --num-save 1001 (LSA) need about 4.47e+08 GiB"),
        (["--kernel", "sa", "--n", "200000"], "n² scores, solver buffers, A and V), more than"),
        (["--A", "{eye512}", "--n", "40960"], "--n 40960, d = 512, --num-save 1001"),  # d: file
        (["--beta", "-1"], "--beta must be a finite positive"),
        (["--t1", "nan"], "--t1 must be a finite positive"),
        (["--A", "{ragged}"], "--A: cannot read a matrix"),
        (["--A", "{bools}"], "holds true/false; A must hold numbers"),  # read as 1 before
        (["--rtol", "-1"], "rtol must be a finite positive"),
        (["--out", "{a_file}"], "is a file; give a folder"),
    ],
)
def test_simulate_bad_input_exits_2(tmp_path, capsys, extra, message):
    files = {
        "missing": tmp_path / "nope.json",
        "bad_shape": tmp_path / "bad.json",
        "nan": tmp_path / "nan.npy",
        "not_json": tmp_path / "garbage.json",
        "eye3": tmp_path / "eye3.json",
        "eye2": tmp_path / "eye2.json",
        "ragged": tmp_path / "ragged.json",
        "a_file": tmp_path / "a_file",
        "bools": tmp_path / "bools.json",
        "eye512": tmp_path / "eye512.npy",
    }
    np.save(files["eye512"], np.eye(512))
    files["bools"].write_text("[[1, true], [0, 1]]")
    files["ragged"].write_text("[[1, 2], [3]]")
    files["a_file"].write_text("not a folder")
    files["bad_shape"].write_text(json.dumps([[1, 2, 3], [4, 5, 6]]))
    np.save(files["nan"], np.array([[np.nan, 0.0], [0.0, 1.0]]))
    files["not_json"].write_text("[[1, 2], [3")
    files["eye3"].write_text(json.dumps(np.eye(3).tolist()))
    files["eye2"].write_text(json.dumps(np.eye(2).tolist()))
    args = [a.format(**files) for a in extra]
    out = [] if "--out" in args else ["--out", str(tmp_path / "out")]
    rc = main(["simulate", *args, *out])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("jaxattn simulate: error:")
    assert message in err[0]
    assert not (tmp_path / "out" / "summary.json").exists()


def test_simulate_help_lists_presets(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert "case4-oscillating" in text and "--preset" in text


def _run(tmp_path, *extra, name="run"):
    out = tmp_path / name
    rc = main(["simulate", "--n", "4", "--t1", "4", "--out", str(out), *extra])
    return rc, out


def test_simulate_documented_minimum_num_save_and_results_before_a_failed_figure(tmp_path, capsys):
    """--num-save 20 (the documented minimum) used to solve and then fail in the
    classifier's window check with nothing written; a figure whose path is blocked used to
    lose summary.json. Now every save time is kept, the results are written first and the
    figure failure is labelled (exit code 3)."""
    out = tmp_path / "run"
    (out / "tokens.png").mkdir(parents=True)  # a directory where a figure should go
    rc, out = _run(tmp_path, "--num-save", "20", "--preset", "case4-clustering")
    err = capsys.readouterr().err
    assert rc == 3, err
    assert "figures FAILED (results are written)" in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["parameters"]["num_save"] == 20
    assert summary["figures_error"] and summary["result"]["successful"] is True
    with np.load(out / "trajectory.npz") as z:
        assert z["xs"].shape == (20, 4, 2)
        env = json.loads(str(z["environment"]))
    # where and how it ran (issue 14): backend, device count, matmul precision
    import jax

    assert summary["environment"]["backend"] == jax.default_backend() == env["backend"]
    assert summary["environment"]["device_count"] == jax.device_count()
    assert "matmul_precision" in summary["environment"]


def test_simulate_usa_score_shift_auto_advice_and_frozen_runs(tmp_path, capsys):
    usa = ["--kernel", "usa", "--preset", "identity", "--beta", "800", "--no-figures"]
    # float64 overflow: the advice names the smallest shift and does not say "use float64"
    rc, _ = _run(tmp_path, *usa, name="a")
    err = capsys.readouterr().err
    assert rc == 2 and "score_shift=445.109" in err and "solve in float64" not in err
    assert "--score-shift auto" in err
    # a shift so large that nothing moves is reported, not classified ("interior" before)
    rc, out = _run(tmp_path, *usa, "--score-shift", "2000", name="b")
    err = capsys.readouterr().err
    assert rc == 1 and "frozen run: no token moved" in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["regime"]["name"] == "undetermined" and summary["regime"]["frozen"]
    assert summary["regime"]["classified"] is False and "regime: not classified" in err
    assert summary["time"]["score_shift"] == 2000.0
    # auto: time in units of the fastest initial pair of distinct tokens (its weight is 1),
    # at least the smallest shift that fits; the run moves and is classified
    rc, out = _run(tmp_path, *usa, "--score-shift", "auto", name="c")
    summary = json.loads((out / "summary.json").read_text())
    assert 800 - 0.5 * np.log(np.finfo(float).max) <= summary["time"]["score_shift"] < 800
    assert summary["regime"]["frozen"] is None and summary["time"]["max_displacement"] > 1e-3
    assert summary["regime"]["classified"] is True
    assert rc == 0, capsys.readouterr().err


def test_simulate_single_token_is_reported_degenerate(tmp_path, capsys):
    rc = main(
        [
            "simulate",
            "--n",
            "1",
            "--t1",
            "4",
            "--num-save",
            "20",
            "--no-figures",
            "--out",
            str(tmp_path / "one"),
        ]
    )
    assert rc == 0
    summary = json.loads((tmp_path / "one" / "summary.json").read_text())
    assert summary["regime"]["name"] == "undetermined"
    assert summary["regime"]["degenerate"].startswith("n = 1")


def test_simulate_unavailable_platform_is_one_line(tmp_path):
    import os
    import subprocess
    import sys

    env = dict(os.environ, JAX_PLATFORMS="cuda")
    code = (
        "import sys; from jaxattn.cli import main; "
        f"sys.exit(main(['simulate', '--n', '4', '--out', {str(tmp_path / 'x')!r}]))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if proc.returncode == 0:  # a machine with a GPU: nothing to refuse
        pytest.skip("JAX_PLATFORMS=cuda is usable here")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "no usable JAX backend (JAX_PLATFORMS='cuda')" in proc.stderr
