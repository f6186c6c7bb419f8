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
    fig, axes = plt.subplots(
        1,
        layers,
        figsize=(3.0 * layers + 1.2, 3.2),
        sharey=True,
        squeeze=False,
        layout="constrained",
    )
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
    _head_colourbar(fig, axes[0], heads, cmap)
    if title:
        fig.suptitle(title)
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def _head_colourbar(fig, axes, heads, cmap):
    """The key of the per-head line colours: a discrete colour bar labelled `head`."""
    import matplotlib as mpl

    bounds = np.arange(heads + 1) - 0.5
    colours = [cmap(h / max(heads - 1, 1)) for h in range(heads)]
    sm = mpl.cm.ScalarMappable(
        cmap=mpl.colors.ListedColormap(colours), norm=mpl.colors.BoundaryNorm(bounds, heads)
    )
    cb = fig.colorbar(sm, ax=list(axes), pad=0.02, aspect=25)
    cb.set_ticks(np.arange(0, heads, max(1, heads // 8)))
    cb.set_label("head")
    return cb


def _log_axis_with_labels(ax, values):
    """A log y axis that shows tick labels whatever the data range: over less than 1.5
    decades, 1-2-5 ticks (or every integer mantissa under 0.7 decades) are labelled."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_yscale("log")
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v) & (v > 0)]
    if not v.size:
        return
    lo, hi = v.min(), v.max()
    decades = np.log10(hi / lo)
    if decades >= 1.5:
        return
    subs = (1.0, 2.0, 5.0) if decades >= 0.7 else tuple(float(k) for k in range(1, 10))

    def fmt(y, _pos):
        m, e = f"{y:.1e}".split("e")
        m = m.rstrip("0").rstrip(".")
        return rf"${m}\times10^{{{int(e)}}}$" if m != "1" else rf"$10^{{{int(e)}}}$"

    ax.yaxis.set_major_locator(LogLocator(base=10, subs=subs))
    ax.yaxis.set_major_formatter(FuncFormatter(fmt))
    ax.yaxis.set_minor_formatter(NullFormatter())
    pad = 10 ** max(0.15, 0.1 * decades)
    ax.set_ylim(lo / pad, hi * pad)


def plot_order_parameter(values: Mapping[str, np.ndarray], *, title: str = "", path=None):
    """Distribution over prompt pairs of the order parameter, per layer, one panel per tensor.

    **Arguments:** `values[tensor]` of shape `(pairs, layers)`.
    """
    plt = _plt()
    names = [t for t in _TENSORS if t in values] or list(values)
    fig, axes = plt.subplots(
        1, len(names), figsize=(3.2 * len(names), 3.2), squeeze=False, layout="constrained"
    )
    floor = 1e-18
    clipped = False
    for ax, name in zip(axes[0], names):
        v = np.asarray(values[name], dtype=np.float64)
        clipped |= bool(np.any(v < floor))
        v = np.maximum(v, floor)  # a log axis: exact zeros sit on the floor
        ax.boxplot([v[:, layer] for layer in range(v.shape[1])], showfliers=True)
        ax.set_xticks(range(1, v.shape[1] + 1), [str(i) for i in range(v.shape[1])])
        _log_axis_with_labels(ax, v)
        ax.set_title(name)
        ax.set_xlabel("layer")
        ax.set_ylabel("order parameter (log)")
    if title or clipped:
        fig.suptitle((title or "") + (f" (values below {floor:g} drawn at it)" if clipped else ""))
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
    fig, axes = plt.subplots(
        1, len(names), figsize=(3.2 * len(names) + 1.6, 3.2), squeeze=False, layout="constrained"
    )
    for ax, name in zip(axes[0], names):
        for label, run in runs.items():
            if name not in run:
                continue
            v = np.asarray(run[name], dtype=np.float64)
            st = np.asarray(run.get("steps", steps))
            line = ax.plot(st, v.mean(axis=1), label=label)[0]
            ax.fill_between(st, v.min(axis=1), v.max(axis=1), color=line.get_color(), alpha=0.2)
        _log_axis_with_labels(
            ax, np.concatenate([np.ravel(np.asarray(r[name])) for r in runs.values() if name in r])
        )
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.set_ylabel("order parameter (median over pairs)", fontsize=8)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    if handles:
        fig.legend(
            handles,
            labels,
            loc="outside right upper",
            fontsize=7,
            title="run (line: mean over layers,\nband: min–max)",
            title_fontsize=7,
        )
    if title:
        fig.suptitle(title)
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
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(7.6, 3.2), layout="constrained")
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
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig
