"""The documentation site: `mkdocs build --strict` passes, the API reference lists every public
name, and every Python code block on the site runs (blocks of one page in order, one namespace).

A block fenced as ```` ```python {.no-run} ```` is shown but not executed; only GPU- or
multi-host-specific blocks may be marked so (at most `MAX_NO_RUN` on the whole site).
"""

import importlib
import inspect
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PACKAGES = ("jaxattn", "jaxattn.dynamics", "jaxattn.plga", "jaxattn.plot", "jaxattn.sphere")
MAX_NO_RUN = 4

_FENCE = re.compile(r"^```(?P<info>[^\n`]*)\n(?P<body>.*?)^```\s*$", re.MULTILINE | re.DOTALL)


def code_blocks(page: pathlib.Path) -> list[tuple[int, str, bool]]:
    """`(line, source, runs)` of every ```python fence of a page, in order."""
    text = page.read_text()
    blocks = []
    for m in _FENCE.finditer(text):
        words = m.group("info").replace("{", " ").replace("}", " ").split()
        if not words or words[0].lstrip(".") != "python":
            continue
        line = text.count("\n", 0, m.start()) + 1
        blocks.append((line, m.group("body"), ".no-run" not in words))
    return blocks


PAGES = sorted(p for p in DOCS.rglob("*.md") if any(runs for _, _, runs in code_blocks(p)))
# Pages whose blocks compile several solves or a training step (about 10-20 s each on two free
# cores): run in CI and with `-m slow`, deselected by `-m "not slow"`.
SLOW_PAGES = {
    "getting-started.md",
    "how-to/own-flow.md",
    "how-to/reference-weights.md",
    "how-to/regime-map.md",
    "how-to/train-audit.md",
}


def public_names(package: str) -> set[str]:
    """Names a user imports from `package`: everything public that is defined in jaxattn
    (constants included), not modules and not names re-exported from other libraries."""
    mod = importlib.import_module(package)
    names = set()
    for name, obj in vars(mod).items():
        if name.startswith("_") or inspect.ismodule(obj):
            continue
        origin = getattr(obj, "__module__", None)  # None for plain constants (tuples, dicts, …)
        if isinstance(origin, str) and not origin.startswith("jaxattn"):
            continue  # a name imported from another library (e.g. a jaxtyping annotation)
        names.add(name)
    return names


def test_mkdocs_build_strict(tmp_path):
    """No broken reference, no unknown docstring object, no warning (strict mode)."""
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml")]
        + ["-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    site = tmp_path / "site"
    # The reference pages hold the rendered docstrings, not only the `:::` lines.
    simulate = (site / "api" / "dynamics-flows" / "index.html").read_text()
    assert "jaxattn.dynamics.simulate" in simulate and "Arguments" in simulate
    assert "jaxattn.plga.PLDRLLM" in (site / "api" / "plga" / "index.html").read_text()


def test_api_reference_lists_every_public_name():
    """Adding a public name to a package means adding its `::: package.NAME` line."""
    listed: dict[str, set[str]] = {p: set() for p in PACKAGES}
    for page in (DOCS / "api").glob("*.md"):
        entry = r"^::: (jaxattn(?:\.\w+)?)\.(\w+)\s*$"
        for m in re.finditer(entry, page.read_text(), re.MULTILINE):
            assert m.group(1) in listed, f"{page.name}: unknown package {m.group(1)}"
            listed[m.group(1)].add(m.group(2))
    for package in PACKAGES:
        names = public_names(package)
        missing = sorted(names - listed[package])
        stale = sorted(listed[package] - names)
        assert not missing, f"{package}: public names without an API entry in docs/api: {missing}"
        assert not stale, f"{package}: API entries for names that are not public: {stale}"


def test_code_block_collection():
    """The collector sees the fences the site has (a broken regex would run nothing)."""
    assert len(PAGES) >= 8, [p.name for p in PAGES]
    blocks = [b for p in DOCS.rglob("*.md") for b in code_blocks(p)]
    assert sum(runs for *_, runs in blocks) >= 15
    no_run = [b for b in blocks if not b[2]]
    assert len(no_run) <= MAX_NO_RUN, f"{len(no_run)} blocks are marked .no-run"


@pytest.mark.parametrize(
    "page",
    [
        pytest.param(
            p,
            id=str(p.relative_to(DOCS)),
            marks=[pytest.mark.slow] if str(p.relative_to(DOCS)) in SLOW_PAGES else [],
        )
        for p in PAGES
    ],
)
def test_code_blocks_run(page, tmp_path, monkeypatch):
    """Every ```python block of the page runs, in order, in one namespace (in a temp dir)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    namespace = {"__name__": f"docs_{page.stem.replace('-', '_')}"}
    try:
        for line, source, runs in code_blocks(page):
            if not runs:
                continue
            code = compile(source, f"{page.relative_to(ROOT)}:{line}", "exec")
            try:
                exec(code, namespace)
            except Exception as err:
                raise AssertionError(
                    f"the code block at {page.relative_to(ROOT)} line {line} raised "
                    f"{type(err).__name__}: {err}"
                ) from err
    finally:
        plt.close("all")
