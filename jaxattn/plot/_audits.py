"""Figures of the PLGA collapse audits (matplotlib, imported lazily by the callers)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

__all__ = [
    "plot_singular_spectra",
    "plot_order_parameter",
    "plot_order_parameter_over_training",
    "plot_cache_fidelity",
]

_TENSORS = ("A", "A_LM", "A_P", "G_LM")


def _plt():
    import matplotlib.pyplot as plt

    return plt


def plot_singular_spectra(
    singular_values, *, rtol: float | None = None, title: str = "", path=None
):
    """One panel per layer: `s_i / s₁` against `i` for every head (log scale).

    **Arguments:** `singular_values` of shape `(layers, heads, k)` (descending); `rtol` draws the
    numerical-rank threshold; `path` saves the figure there.

    **Returns:** the matplotlib figure.
    """
    plt = _plt()
    s = np.asarray(singular_values, dtype=np.float64)
    if s.ndim != 3:
        raise ValueError(f"plot_singular_spectra: need shape (layers, heads, k), got {s.shape}.")
    layers, heads, k = s.shape
    fig, axes = plt.subplots(1, layers, figsize=(3.0 * layers, 3.0), sharey=True, squeeze=False)
    floor = 1e-18
    s1 = np.where(s[..., :1] > 0, s[..., :1], 1.0)
    r = np.maximum(s / s1, floor)
    cmap = plt.get_cmap("viridis")
    for layer, ax in enumerate(axes[0]):
        for h in range(heads):
            ax.semilogy(np.arange(1, k + 1), r[layer, h], color=cmap(h / max(heads - 1, 1)), lw=0.8)
        if rtol is not None:
            ax.axhline(rtol, color="k", ls="--", lw=0.8, label="rank threshold")
        ax.set_title(f"layer {layer}")
        ax.set_xlabel("index i")
    axes[0, 0].set_ylabel("s_i / s_1")
    if rtol is not None:
        axes[0, 0].legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def plot_order_parameter(values: Mapping[str, np.ndarray], *, title: str = "", path=None):
    """Distribution over prompt pairs of the order parameter, per layer, one panel per tensor.

    **Arguments:** `values[tensor]` of shape `(pairs, layers)`.
    """
    plt = _plt()
    names = [t for t in _TENSORS if t in values] or list(values)
    fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 3.0), squeeze=False)
    for ax, name in zip(axes[0], names):
        v = np.asarray(values[name], dtype=np.float64)
        ax.boxplot([v[:, layer] for layer in range(v.shape[1])], showfliers=True)
        ax.set_xticks(range(1, v.shape[1] + 1), [str(i) for i in range(v.shape[1])])
        ax.set_yscale("symlog", linthresh=1e-6)
        ax.set_title(name)
        ax.set_xlabel("layer")
    axes[0, 0].set_ylabel("order parameter")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def plot_order_parameter_over_training(
    steps: Sequence[int],
    runs: Mapping[str, Mapping[str, np.ndarray]],
    *,
    title: str = "",
    path=None,
):
    """Median order parameter against training step, one panel per tensor, one line per run.

    **Arguments:** `steps`; `runs[label][tensor]` of shape `(len(steps), layers)` (the median over
    prompt pairs per layer); layers are averaged in the line and shaded between min and max.
    """
    plt = _plt()
    names = [t for t in _TENSORS if any(t in r for r in runs.values())]
    fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 3.0), squeeze=False)
    for ax, name in zip(axes[0], names):
        for label, run in runs.items():
            if name not in run:
                continue
            v = np.asarray(run[name], dtype=np.float64)
            st = np.asarray(run.get("steps", steps))
            line = ax.plot(st, v.mean(axis=1), label=label)[0]
            ax.fill_between(st, v.min(axis=1), v.max(axis=1), color=line.get_color(), alpha=0.2)
        ax.set_yscale("log")
        ax.set_title(name)
        ax.set_xlabel("step")
    axes[0, 0].set_ylabel("order parameter (median over pairs)")
    axes[0, 0].legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def plot_cache_fidelity(
    fidelity: Mapping[str, Mapping[str, np.ndarray]], *, title: str = "", path=None
):
    """Per decode step: max |Δlogit| of each cache against full recomputation (left), and the
    relative ‖ΔG_LM‖ per layer (right).

    **Arguments:** `fidelity[cache]` with `"max_abs_dlogit"` `(steps,)` and `"rel_dG"`
    `(steps, layers)` (as returned by `cache_fidelity`).
    """
    plt = _plt()
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(7.0, 3.0))
    for name, f in fidelity.items():
        d = np.asarray(f["max_abs_dlogit"], dtype=np.float64)
        ax0.semilogy(np.arange(1, d.size + 1), np.maximum(d, 1e-18), marker="o", ms=3, label=name)
    # every cache freezes the prompt's G (KV freezes A, hence G): draw its drift once
    dG = [np.asarray(f["rel_dG"], dtype=np.float64) for f in fidelity.values() if "rel_dG" in f]
    if dG:
        for layer in range(dG[0].shape[1]):
            ax1.semilogy(
                np.arange(1, dG[0].shape[0] + 1),
                np.maximum(dG[0][:, layer], 1e-18),
                label=f"layer {layer}",
            )
    ax0.set_xlabel("decode step")
    ax0.set_ylabel("max |Δlogit| vs recompute")
    ax0.legend(fontsize=7)
    ax1.set_xlabel("decode step")
    ax1.set_ylabel("‖G_cached − G_full‖/‖G_full‖")
    ax1.legend(fontsize=6, ncol=2)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig
