"""Figures of a PLDR-LLM training run (matplotlib's object API: no pyplot, no backend change)."""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["read_metrics", "plot_loss_curve"]


def read_metrics(run) -> list[dict]:
    """The records of a run's `metrics.jsonl` (a run directory or the file itself), one dict per
    line: `{"step", "loss", "cross_entropy", "dag"}` per optimiser step and
    `{"step", "val_loss", "val_perplexity"}` per validation.

    A resumed run repeats the steps after the checkpoint it resumed from; the record written last
    for a step (the run that continued) replaces the earlier ones.

    An unterminated last line that is not a record (a write cut short when the run was
    killed) is skipped.

    **Raises:** `FileNotFoundError` if there is no `metrics.jsonl`; `ValueError` for a line that is
    not a JSON object with an integer `step`.
    """
    path = pathlib.Path(run)
    if path.is_dir():
        path = path / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"read_metrics: no metrics file {path}")
    train, val = {}, {}
    text = path.read_text()
    lines = text.splitlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            step = int(rec["step"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            if n == len(lines) and not text.endswith("\n"):
                break  # a last record cut off mid-write (the run was killed): skipped
            raise ValueError(f"read_metrics: {path} line {n} is not a metrics record") from None
        (val if "val_loss" in rec else train)[step] = rec
    return [train[s] for s in sorted(train)] + [val[s] for s in sorted(val)]


def plot_loss_curve(
    metrics: Sequence[Mapping] | str | os.PathLike,
    *,
    unigram_entropy: float | None = None,
    title: str = "",
    path=None,
):
    """Training loss per optimiser step (and its running mean over 1 % of the run), validation
    loss at each validation, and the unigram entropy of the corpus (the loss of the best
    context-free predictor: a model must go below it), on one labelled axis.

    **Arguments:** `metrics`: the records of `read_metrics`, or a run directory / `metrics.jsonl`;
    `unigram_entropy` (nats/token) draws the bar; `path` saves the figure there.

    **Returns:** the `matplotlib.figure.Figure`.

    **Raises:** `ValueError` if there is no training-loss record.
    """
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    records = read_metrics(metrics) if isinstance(metrics, (str, os.PathLike)) else list(metrics)
    train = sorted((int(r["step"]), float(r["loss"])) for r in records if "loss" in r)
    val = sorted((int(r["step"]), float(r["val_loss"])) for r in records if "val_loss" in r)
    if not train:
        raise ValueError("plot_loss_curve: no training-loss records")
    steps, loss = np.array(train, dtype=np.float64).T
    fig = Figure(figsize=(6.4, 4.0), layout="constrained")
    ax = fig.add_subplot()
    window = max(len(loss) // 100, 1)
    faint = dict(lw=0.6, alpha=0.45) if window > 1 else dict(lw=1.2)
    ax.plot(steps, loss, color="C0", label="training loss (per step)", **faint)
    if window > 1:
        mean = np.convolve(loss, np.ones(window) / window, mode="valid")
        ax.plot(steps[window - 1 :], mean, color="C0", lw=1.6,
                label=f"training loss (mean of {window} steps)")  # fmt: skip
    if val:
        vs, vl = np.array(val, dtype=np.float64).T
        ax.plot(vs, vl, "o-", color="C1", ms=5, lw=1.0, label="validation loss")
    if unigram_entropy is not None:
        ax.axhline(unigram_entropy, color="0.3", ls="--", lw=1.0,
                   label=f"unigram entropy {unigram_entropy:.3f}")  # fmt: skip
    ax.set_xlabel("optimiser step")
    dag = any(float(r.get("dag", 0.0)) != 0.0 for r in records)
    ax.set_ylabel("loss, cross-entropy + DAG (nats/token)" if dag else "cross-entropy (nats/token)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")  # the place that hides the fewest points
    plural = lambda n, word: f"{n} {word}{'s' if n != 1 else ''}"  # noqa: E731
    ax.set_title(
        title or f"loss curve: {plural(len(train), 'step')}, {plural(len(val), 'validation')}"
    )
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig
