"""`jaxattn map`: a regime map from the shell, written to a folder that reloads alone."""

import json

import numpy as np
import pytest

from jaxattn.cli import main
from jaxattn.dynamics import RegimeMap


def test_map_command_writes_a_reloadable_map(tmp_path, capsys):
    out = tmp_path / "m"
    args = [
        "map",
        "case4",
        "--x",
        "v11=-1.5:1.5:4",
        "--y",
        "v12=0.25:1.75:3",
        "--inits",
        "2",
        "--t1",
        "120",
        "--num-save",
        "241",
        "--out",
        str(out),
        "--no-progress",
    ]
    assert main(args) == 0
    said = capsys.readouterr().out
    assert "12 cells × 2 inits" in said and "theory disagreements 0/" in said
    for f in ("regime_map.npz", "regime_map.json", "regime_map.png", "summary.md"):
        assert (out / f).is_file(), f
    m = RegimeMap.load(out)
    assert m.family == "case4" and m.cells == (4, 3) and m.inits == 2
    meta = json.loads((out / "regime_map.json").read_text())
    assert meta["axes"] == ["v11", "v12"] and meta["fixed"] == {"beta": 1.0}
    # |v11| < |v12|: oscillation, |v11| > |v12|: clustering (Case 4).
    v11, v12 = np.meshgrid(m.axes[0][1], m.axes[1][1], indexing="ij")
    assert np.all(m.predicted[np.abs(v11) < np.abs(v12)] == 2)
    assert "Regime map: case4" in (out / "summary.md").read_text()
    # Rerunning resumes: nothing recomputed, same map.
    assert main(args) == 0
    assert "resumed" in capsys.readouterr().out
    again = RegimeMap.load(out)
    assert again.sweep.chunks_computed == 0
    np.testing.assert_array_equal(again.regime, m.regime)
    # A different map in the same folder is refused by name, or replaced on request.
    other = args[:3] + ["v11=-1.5:1.5:3"] + args[4:]
    assert main(other) == 2
    err = capsys.readouterr().err
    assert "holds a different map (" in err and "); pass another --out" in err  # says what
    assert main(other + ["--overwrite"]) == 0
    assert RegimeMap.load(out).cells == (3, 3)
    # A warning is one line in the command's name (not the entry script's source line).
    capsys.readouterr()
    sorted((out / "sweep").glob("chunk_*.npz"))[0].write_bytes(b"damaged")
    assert main(other) == 0
    err = capsys.readouterr().err
    assert "jaxattn map: warning: sweep: recomputing " in err and "not a NumPy .npz" in err
    assert "UserWarning" not in err and "sys.exit" not in err
    # A damaged sweep manifest: the advice is this command's flag, not the library's.
    (out / "sweep" / "manifest.json").write_text("{")
    assert main(other) == 2
    err = capsys.readouterr().err
    assert "manifest.json is damaged" in err and "pass --overwrite" in err
    assert "resume=False" not in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["map", "nosuch"], "unknown family"),
        (["map", "case4", "--x", "v11"], "NAME=LO:HI:NUM"),
        (["map", "case4", "--x", "v11=1:0:3"], "strictly increasing"),
        (["map", "case4", "--set", "beta"], "NAME=VALUE"),
        (["map", "case4", "--set", "gamma=1"], "unknown parameter"),
        (["map", "case4", "--inits", "0"], "--inits must be >= 1"),
        (["map", "case4", "--set", "v11=1", "--x", "v11=0:1:3"], "both as an axis"),
    ],
)
def test_map_command_names_bad_input(argv, message, capsys):
    assert main(argv + ["--no-progress"]) == 2
    assert message in capsys.readouterr().err
