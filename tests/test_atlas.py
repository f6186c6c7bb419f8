"""The regime atlas: sections produce the numbers they claim; the `jaxattn atlas --quick`
command writes a complete report (slow)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from jaxattn.dynamics import REGIMES
from jaxattn.dynamics._atlas import load_g_lm, run_atlas
from jaxattn.dynamics._sweep import REGIME_NAMES


def test_regime_codes_match_the_regimes_enumeration():
    names = ("clustering", "rotating", "oscillation", "interior", "chaotic", "undetermined")
    for i, name in enumerate(names):
        assert int(REGIMES._name_to_item[name]._value) == i
    assert REGIME_NAMES == names


def test_g_lm_ships_with_the_package():
    G = load_g_lm()
    assert G.shape == (5, 14, 64, 64) and G.dtype == np.float32
    assert 70 < np.abs(G).max() < 100


def test_import_changes_no_jax_setting():
    code = (
        "import jax; import jaxattn, jaxattn.dynamics, jaxattn.dynamics._cli_atlas; "
        "print(jax.config.jax_enable_x64)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ, JAX_ENABLE_X64="0"),
    )
    assert out.stdout.strip() == "False"


@pytest.mark.slow
def test_bifurcation_and_hamiltonian_sections(tmp_path):
    rep = run_atlas(
        quick=True, out_dir=str(tmp_path), progress=False, sections=("bifurcation", "hamiltonian")
    )
    folds = rep["bifurcation"]["saddle_nodes"]
    assert [round(f["expected"]) for f in folds] == [-1, 1]
    assert all(f["error"] < 1e-8 and f["bracket"][1] - f["bracket"][0] <= 1e-8 for f in folds)
    osc = rep["hamiltonian"]["orbits"]["v11=0.2,v12=1.0"]
    assert max(osc["H_relative_drift"]) < 1e-8
    assert all(3.0 < p < 5.0 for p in osc["periods"])
    assert all(r > 1 - 1e-6 for r in rep["hamiltonian"]["orbits"]["v11=1.0,v12=0.2"]["final_abs_R"])
    assert rep["hamiltonian"]["case3_rotation"]["relative_error"] < 1e-5
    for f in ("bifurcation_case4.png", "case4_phase_portrait.png"):
        assert os.path.getsize(tmp_path / "figures" / f) > 10_000


@pytest.mark.slow
def test_atlas_quick_command_writes_the_report(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "jaxattn.cli",
            "atlas",
            "--quick",
            "--out",
            str(tmp_path),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    rep = json.loads((tmp_path / "atlas.json").read_text())
    md = (tmp_path / "atlas.md").read_text()
    sections = ("cases", "maps", "bifurcation", "hamiltonian", "high_d", "search", "g_lm")
    for section in sections + ("multistability", "chaos"):
        assert section in rep
        assert os.path.exists(rep[section]["figure"])
        assert os.path.basename(rep[section]["figure"]) in md
    for row in rep["cases"]["rows"]:
        for m in ("particles", "watanabe_strogatz", "ott_antonsen"):
            assert row[m]["regime"] == row["expected"], (row["case"], m)
        if row["expected"] in ("clustering", "rotating"):  # two antipodal clusters
            for m in ("particles", "watanabe_strogatz"):
                assert (row[m]["num_clusters"], row[m]["antipodal_pairs"]) == (2, 1), row["case"]
    for v in rep["maps"]["maps"].values():
        assert v["disagreement_rate"] < 0.05
    assert rep["search"]["reached"] and rep["search"]["end_lambda_max"] >= 0
    assert len(rep["g_lm"]["rows"]) == 28
    assert all(r["regime"] != "undetermined" for r in rep["high_d"]["rows"])
    # Basin fractions split on the multistability slice: clustering on the circle beside a
    # periodic orbit inside the disc, for some initial states of the same cell.
    ms = rep["multistability"]
    assert ms["multistable_cells"] > 0 and ms["failed_members"] == 0
    assert "clustering + oscillation" in ms["coexisting"]
    # The three-token candidate: its exponents sum to the mean divergence (< 0, dissipative);
    # the verdict is the package's rule applied to the measured spectrum.
    ch = rep["chaos"]
    for lam, sig, chaotic in zip(ch["exponents"], ch["uncertainty"], ch["chaotic"]):
        assert lam[0] >= lam[1] >= lam[2] and sum(lam) < 0
        assert chaotic == (lam[0] > max(3 * sig[0], 1e-3))
    assert "Chaos in three tokens" in md and "Multistability" in md
    assert rep["seconds"] > 0 and "Timings" in md
