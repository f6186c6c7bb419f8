"""Execute a notebook of `notebooks/` with nbclient; a failure names the notebook and the cell."""

import pathlib
import re

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"


def run_notebook(notebook, *, cwd: pathlib.Path | None = None, timeout: int = 900):
    """Run every cell of `notebooks/<notebook>` (or of the notebook at an absolute path) in a
    fresh `python3` kernel started in `cwd` (default `notebooks/`, as Jupyter does). The kernel
    inherits this process's environment (e.g. `JAXATTN_QUICK`). Returns the executed notebook.

    A failing cell, a cell past `timeout` seconds or a dead kernel raise `AssertionError`
    naming the notebook, the cell index and the first line of the cell's source.
    """
    path = pathlib.Path(notebook)
    path = path if path.is_absolute() else NOTEBOOKS / path
    name = path.name
    nb = nbformat.read(path, as_version=4)
    current = {"index": None}

    def on_cell_start(cell, cell_index, **kwargs):
        current["index"] = cell_index

    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(cwd or NOTEBOOKS)}},
        on_cell_start=on_cell_start,
    )
    try:
        client.execute()
    except (CellExecutionError, CellTimeoutError, DeadKernelError) as err:
        index = current["index"]
        first = ""
        if index is not None:
            first = (nb.cells[index].source.strip().splitlines() or [""])[0]
        what = {
            DeadKernelError: "the kernel died",
            CellTimeoutError: f"timed out after {timeout} s",
        }.get(type(err), "raised")
        detail = re.sub(r"\x1b\[[0-9;]*m", "", str(err))  # the kernel's coloured traceback
        raise AssertionError(
            f"{name}: cell {index} ({first!r}) {what}: {type(err).__name__}: {detail[-3000:]}"
        ) from err
    return nb
