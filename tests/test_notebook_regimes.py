"""Execute notebooks/01_regimes.ipynb in quick mode (nbclient) and check what it found."""

import json
import os
import pathlib

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK = pathlib.Path(__file__).resolve().parents[1] / "notebooks" / "01_regimes.ipynb"


@pytest.mark.slow
def test_regimes_notebook_runs_in_quick_mode(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXATTN_QUICK", "1")
    monkeypatch.setenv("JAXATTN_NOTEBOOK_OUT", str(tmp_path))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(
        nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["quick"] is True
    assert res["cases"]["case3-rotating"]["watanabe_strogatz"] == "rotating"
    assert res["cases"]["case4-oscillating"]["ott_antonsen"] == "oscillation"
    assert res["ws_minus_particles"] < 1e-4
    assert res["case4_map_disagreement_rate"] < 0.1
    assert abs(res["saddle_node"] - 1.0) < 1e-8
    assert res["H_drift"] < 1e-8
    assert res["search"]["reached"] and max(res["search"]["lambda_end"]) >= 0
    for f in ("cases.png", "case4_map.png"):
        assert os.path.getsize(tmp_path / f) > 5_000
