"""Execute notebooks/01_regimes.ipynb in quick mode (nbclient) and check what it found."""

import json
import os
import re

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook
from notebook_runner import NOTEBOOKS, run_notebook


def _inline_images(nb) -> int:
    return sum(
        "image/png" in out.get("data", {})
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
    )


@pytest.mark.slow
def test_regimes_notebook_runs_in_quick_mode(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXATTN_QUICK", "1")
    monkeypatch.setenv("JAXATTN_OUT", str(tmp_path))
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the notebook draws inline
    nb = run_notebook("01_regimes.ipynb")
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["quick"] is True
    assert res["cases"]["case3-rotating"]["watanabe_strogatz"] == "rotating"
    assert res["cases"]["case4-oscillating"]["ott_antonsen"] == "oscillation"
    assert res["ws_minus_particles"] < 1e-4
    assert res["case4_map_disagreement_rate"] < 0.1
    assert abs(res["saddle_node"] - 1.0) < 1e-8
    assert res["H_drift"] < 1e-8
    assert res["search"]["reached"] and max(res["search"]["lambda_end"]) >= 0
    for f in ("cases.png", "case4_map.png", "case4_hamiltonian.png"):
        assert os.path.getsize(tmp_path / f) > 5_000
    assert _inline_images(nb) >= 3  # figures are shown in the notebook, not only saved


def test_notebooks_use_public_api_and_one_quick_convention():
    """No private module, no citation of files outside the project, one QUICK switch
    (`JAXATTN_QUICK`, default off) and one output override (`JAXATTN_OUT`)."""
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        source = "\n".join(c.source for c in nb.cells)
        code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
        private = re.findall(r"jaxattn(?:\.\w+)*\._[a-z]\w*", code)
        assert not private, f"{path.name} uses private modules: {sorted(set(private))}"
        assert "MATH.md" not in source, f"{path.name} cites a file that is not in the project"
        assert 'os.environ.get("JAXATTN_QUICK", "0") == "1"' in code, path.name
        assert 'os.environ.get("JAXATTN_OUT")' in code, path.name
        assert '"notebooks" / "out"' in code, path.name


def test_notebook_failure_names_notebook_and_cell(tmp_path):
    """A failing cell and a dead kernel are reported with the notebook's name and cell index."""
    bad = tmp_path / "bad.ipynb"
    nb = new_notebook(cells=[new_code_cell("x = 1"), new_code_cell('raise ValueError("boom")')])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    nbformat.write(nb, bad)
    expected = r"(?s)bad\.ipynb: cell 1 \('raise ValueError\(\"boom\"\)'\) raised.*ValueError: boom"
    with pytest.raises(AssertionError, match=expected):
        run_notebook(bad, cwd=tmp_path, timeout=120)
    nb.cells = [new_code_cell("y = 2"), new_code_cell("import os\nos._exit(1)")]
    nbformat.write(nb, bad)
    with pytest.raises(AssertionError, match=r"bad\.ipynb: cell 1 \('import os'\) the kernel died"):
        run_notebook(bad, cwd=tmp_path, timeout=120)
