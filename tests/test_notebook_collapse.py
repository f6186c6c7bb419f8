"""Runs notebooks/02_plga_collapse.ipynb in quick mode (nbclient) and checks what it wrote."""

import json
import os

from notebook_runner import run_notebook


def test_collapse_notebook_quick(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXATTN_QUICK", "1")
    monkeypatch.setenv("JAXATTN_OUT", str(tmp_path))
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the notebook draws inline
    monkeypatch.delenv("JAX_ENABLE_X64", raising=False)
    nb = run_notebook("02_plga_collapse.ipynb", timeout=600)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["quick"] is True and summary["steps"] == [4, 8, 12]
    # Training in segments keeps one checkpoint (keep_checkpoints=1), not one per audit.
    assert summary["checkpoints_kept"] == ["step_00000012"]
    assert sorted(p.name for p in (tmp_path / "run").iterdir() if p.name.startswith("step_")) == [
        "step_00000012"
    ]
    op = summary["order_parameter_by_rms"]  # (audits, layers, tensors), each in [0, 2]
    assert len(op) == 3 and all(0 < x <= 2 for ck in op for layer in ck for x in layer)
    assert summary["A_LM_entrywise_positive"] == [[True, True]]  # (layers, heads); iSwiGLU + ε > 0
    assert summary["A_LM_perron_vector_positive"] == [[True, True]]
    fid = summary["cache_fidelity"]["kvg"]
    assert fid["max_abs_dlogit"][0] < 1e-10  # the prompt step: cached = uncached
    assert summary["collapse_error_own_prompt"]["rel_dlogit"] < 1e-12
    assert summary["collapse_error"]["argmax_agreement"] > 0
    # The released model: its first layer is close to rank one, its last one is not.
    s21 = summary["v51_median_s2_over_s1"]
    assert len(s21) == 5 and s21[0] < 0.1 < s21[-1]
    for name in (
        "loss.png",
        "order_parameter_over_training.png",
        "A_singular_spectra.png",
        "cache_fidelity.png",
        "v51_singular_spectra.png",
    ):
        assert (tmp_path / name).stat().st_size > 1000
    images = sum(
        "image/png" in out.get("data", {})
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
    )
    assert images >= 5  # every figure is shown in the notebook, not only saved
    assert not os.environ.get("JAX_ENABLE_X64")
