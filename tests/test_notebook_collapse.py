"""Runs notebooks/02_plga_collapse.ipynb in quick mode (nbclient) and checks what it wrote."""

import json
import os
import pathlib

import nbformat
from nbclient import NotebookClient

NOTEBOOK = pathlib.Path(__file__).resolve().parents[1] / "notebooks" / "02_plga_collapse.ipynb"


def test_collapse_notebook_quick(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXATTN_QUICK", "1")
    monkeypatch.setenv("JAXATTN_OUT", str(tmp_path))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    resources = {"metadata": {"path": str(NOTEBOOK.parents[1])}}
    NotebookClient(nb, timeout=600, kernel_name="python3", resources=resources).execute()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["quick"] is True and summary["steps"] == [4, 8, 12]
    op = summary["order_parameter_by_rms"]  # (checkpoints, layers, tensors), each in [0, 2]
    assert len(op) == 3 and all(0 < x <= 2 for ck in op for layer in ck for x in layer)
    assert summary["A_LM_entrywise_positive"] == [[True, True]]  # (layers, heads); iSwiGLU + ε > 0
    assert summary["A_LM_perron_vector_positive"] == [[True, True]]
    fid = summary["cache_fidelity"]["kvg"]
    assert fid["max_abs_dlogit"][0] < 1e-10  # the prompt step: cached = uncached
    assert summary["collapse_error_own_prompt"]["rel_dlogit"] < 1e-12
    assert summary["collapse_error"]["argmax_agreement"] > 0
    for name in (
        "order_parameter_over_training.png",
        "A_singular_spectra.png",
        "cache_fidelity.png",
    ):
        assert (tmp_path / name).stat().st_size > 1000
    assert not os.environ.get("JAX_ENABLE_X64")
