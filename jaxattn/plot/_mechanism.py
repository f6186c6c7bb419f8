"""Figures of the PLGA collapse mechanism: rotary twirl, concentration, contraction, their
course over training, and the regimes of the trained operator as a particle flow.

Each helper takes the result object of its audit (`TwirlAudit`, `ConcentrationAudit`,
`ContractionAudit` from `jaxattn.plga`) or the plain dicts the experiments write, labels
every axis and line, and returns the matplotlib figure (saved to `path` when given).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

__all__ = [
    "plot_twirl",
    "plot_concentration",
    "plot_contraction",
    "plot_mechanism_over_training",
    "plot_operator_regimes",
]


def _plt():
    import matplotlib.pyplot as plt

    return plt


def _audit_fields(where: str, audit, kind: str, fields: tuple[str, ...]) -> None:
    """**Raises:** `TypeError` naming `kind` when `audit` lacks any of `fields` (e.g. None or
    another audit), before any figure is opened."""
    missing = [f for f in fields if not hasattr(audit, f)]
    if missing:
        raise TypeError(
            f"{where}: audit must be a {kind}, got {type(audit).__name__} "
            f"(no {', '.join(missing)})."
        )


_TRAINING_PANELS = (  # (key, axis label, log scale) of plot_mechanism_over_training
    ("loss", "training loss", False),
    ("order_parameter_A", "order parameter of A", True),
    ("order_parameter_G_LM", "order parameter of G_LM", True),
    ("rank_one_deficit_A", "rank-one deficit of A", True),
    ("twirl_residual", "twirl residual (after RoPE)", False),
    ("concentration_exponent", "concentration exponent", False),
    ("contraction_norm", "median ‖J_φ‖", True),
)


def _check_runs(runs) -> None:
    """The checks of `plot_mechanism_over_training`'s `runs` (see there)."""
    where = "plot_mechanism_over_training"
    if not isinstance(runs, Mapping):
        raise TypeError(
            f"{where}: runs must map a label to a run (a dict of sequences), got "
            f"{type(runs).__name__}."
        )
    if not runs:
        raise ValueError(f"{where}: runs is empty; give at least one run.")

    def numbers(label, key, values):
        try:
            return np.asarray(values, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(
                f"{where}: run {label!r}: {key!r} must be a sequence of numbers, got "
                f"{type(values).__name__}."
            ) from None

    keys = [key for key, _, _ in _TRAINING_PANELS]
    for label, run in runs.items():
        if not isinstance(run, Mapping):
            raise TypeError(
                f"{where}: run {label!r} must be a dict of sequences, got {type(run).__name__}."
            )
        if "steps" not in run:
            raise ValueError(f"{where}: run {label!r} has no 'steps'.")
        steps = numbers(label, "steps", run["steps"]).shape
        if len(steps) != 1:
            raise ValueError(
                f"{where}: run {label!r}: 'steps' must be a sequence of numbers, got shape {steps}."
            )
        for key in keys:
            if key in run and numbers(label, key, run[key]).shape != steps:
                raise ValueError(
                    f"{where}: run {label!r}: {key!r} has shape {np.shape(run[key])}, its "
                    f"'steps' {steps}; give one number per step."
                )
    if not any(key in run for run in runs.values() for key in keys):
        raise ValueError(f"{where}: no run has a quantity to plot (any of {', '.join(keys)}).")


def _length_ticks(ax, S):
    """Integer tick labels at the audited lengths on a log axis (no overlapping minor labels)."""
    from matplotlib.ticker import NullLocator

    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticks(list(S), [str(int(s)) for s in S], fontsize=7)


def _finish(fig, title: str, path):
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def plot_twirl(audit, *, title: str = "", path=None):
    """Commutant residual of the density operator against the prefix length, one panel per
    layer: the median over prompts and heads before RoPE (dashed) and after RoPE (solid), with
    the interquartile range over prompts and heads shaded.

    **Arguments:** `audit`, a `TwirlAudit` (`residual_before`, `residual_after`
    `(prompts, S, layers, heads)`, `lengths` `(S,)`).

    **Raises:** `TypeError` when `audit` is not a `TwirlAudit` (lacks its fields).
    """
    _audit_fields(
        "plot_twirl", audit, "TwirlAudit", ("lengths", "residual_before", "residual_after")
    )
    plt = _plt()
    S = np.asarray(audit.lengths)
    b = np.asarray(audit.residual_before, dtype=np.float64)
    a = np.asarray(audit.residual_after, dtype=np.float64)
    layers = b.shape[2]
    fig, axes = plt.subplots(1, layers, figsize=(3.2 * layers, 3.0), sharey=True, squeeze=False)
    for layer, ax in enumerate(axes[0]):
        for values, style, label in ((b, "--", "before RoPE"), (a, "-", "after RoPE")):
            v = np.moveaxis(values[:, :, layer], 1, 0).reshape(len(S), -1)
            q25, med, q75 = np.quantile(v, [0.25, 0.5, 0.75], axis=1)
            line = ax.plot(S, med, style, marker="o", ms=3, label=label)[0]
            ax.fill_between(S, q25, q75, color=line.get_color(), alpha=0.2)
        ax.set_xscale("log")
        _length_ticks(ax, S)
        ax.set_ylim(0, 1.05)
        ax.set_title(f"layer {layer}")
        ax.set_xlabel("sequence length S")
    axes[0, 0].set_ylabel("‖D − ΠD‖_F / ‖D‖_F")
    axes[0, 0].legend(fontsize=7)
    return _finish(fig, title or "rotary twirl of the density operator", path)


def plot_concentration(audit, *, title: str = "", path=None):
    """Spread of `D/S` across prompts against the prefix length (log–log), one panel per
    layer: the mean over heads with the bootstrap band (mean of the heads' 2.5–97.5 % bands)
    and the fitted exponent in the legend, beside the `S^{−1/2}` law of large numbers through
    the first point.

    **Arguments:** `audit`, a `ConcentrationAudit` with batch axes `(layers, heads)`.

    **Raises:** `TypeError` when `audit` is not a `ConcentrationAudit` (lacks its fields).
    """
    fields = ("lengths", "spread", "band", "exponent", "exponent_ci")
    _audit_fields("plot_concentration", audit, "ConcentrationAudit", fields)
    plt = _plt()
    S = np.asarray(audit.lengths, dtype=np.float64)
    sp = np.asarray(audit.spread, dtype=np.float64)
    band = np.asarray(audit.band, dtype=np.float64)
    ex = np.asarray(audit.exponent, dtype=np.float64)
    ci = np.asarray(audit.exponent_ci, dtype=np.float64)
    if sp.ndim == 1:
        sp, band, ex, ci = sp[:, None, None], band[:, None, None], ex[None, None], ci[None, None]
    layers = sp.shape[1]
    fig, axes = plt.subplots(1, layers, figsize=(3.2 * layers, 3.0), squeeze=False)
    for layer, ax in enumerate(axes[0]):
        m = sp[:, layer].mean(axis=-1)
        e, (lo, hi) = ex[layer].mean(), ci[layer].mean(axis=0)
        label = f"D/S, exponent {e:.2f} [{lo:.2f}, {hi:.2f}]"
        line = ax.loglog(S, m, marker="o", ms=3, label=label)
        ax.fill_between(
            S,
            band[:, layer, ..., 0].mean(axis=-1),
            band[:, layer, ..., 1].mean(axis=-1),
            color=line[0].get_color(),
            alpha=0.2,
        )
        if getattr(audit, "learner_input_spread", None) is not None:
            li = np.asarray(audit.learner_input_spread, dtype=np.float64)[:, layer].mean(axis=-1)
            le = np.asarray(audit.learner_input_exponent, dtype=np.float64)[layer].mean()
            ax.loglog(S, li, "s-", ms=3, label=f"LN(D), exponent {le:.2f}")
        ax.loglog(S, m[0] * (S / S[0]) ** -0.5, "k:", label="S^(-1/2)")
        _length_ticks(ax, S)
        ax.set_title(f"layer {layer}")
        ax.set_xlabel("sequence length S")
        ax.legend(fontsize=6)
    axes[0, 0].set_ylabel("spread across prompts")
    return _finish(fig, title or "concentration of the density operator", path)


def plot_contraction(audit, *, title: str = "", path=None):
    """Distribution of the Jacobian spectral norm of the metric learner's row map over the
    visited rows, per layer (box plots, log scale): the whole learner `‖J_φ‖` beside the
    product bound `Π_k ‖J_{u_k}‖`, with the contraction threshold 1.

    **Arguments:** `audit`, a `ContractionAudit` (`norm`, `product_bound` `(layers, rows)`).

    **Raises:** `TypeError` when `audit` is not a `ContractionAudit` (lacks its fields);
    `ValueError` when `norm` and `product_bound` are not of one shape `(layers, rows)` with
    `layers, rows >= 1`.
    """
    _audit_fields("plot_contraction", audit, "ContractionAudit", ("norm", "product_bound"))
    n = np.asarray(audit.norm, dtype=np.float64)
    pb = np.asarray(audit.product_bound, dtype=np.float64)
    if n.ndim != 2 or n.shape != pb.shape or 0 in n.shape:
        raise ValueError(
            "plot_contraction: audit.norm and audit.product_bound must both have shape "
            f"(layers, rows) with layers, rows >= 1, got {n.shape} and {pb.shape}."
        )
    plt = _plt()
    layers = n.shape[0]
    fig, ax = plt.subplots(figsize=(max(3.5, 1.4 * layers + 1.5), 3.0))
    floor = 1e-12
    pos = np.arange(layers)
    kw = dict(widths=0.3, showfliers=True, patch_artist=True)
    b1 = ax.boxplot([np.maximum(v, floor) for v in n], positions=pos - 0.18, **kw)
    b2 = ax.boxplot([np.maximum(v, floor) for v in pb], positions=pos + 0.18, **kw)
    for box in b1["boxes"]:
        box.set_facecolor("tab:blue")
    for box in b2["boxes"]:
        box.set_facecolor("tab:orange")
    ax.axhline(1.0, color="k", ls="--", lw=0.8)
    ax.set_yscale("log")
    ax.set_xticks(pos, [str(i) for i in range(layers)])
    ax.set_xlabel("layer")
    ax.set_ylabel("Jacobian spectral norm")
    ax.legend(
        [b1["boxes"][0], b2["boxes"][0], ax.lines[-1]],
        ["‖J_φ‖ (learner)", "Π‖J_unit‖ (bound)", "contraction threshold 1"],
        fontsize=7,
    )
    return _finish(fig, title or "row-map contraction at the visited rows", path)


def plot_mechanism_over_training(
    runs: Mapping[str, Mapping[str, Sequence]], *, title: str = "", path=None
):
    """The course of training, one line per run, one panel per quantity: loss, the order
    parameter of A and G_LM (median over pairs and layers), the rank-one deficit of A, the
    twirl residual after RoPE, the concentration exponent and the median Jacobian norm.

    **Arguments:** `runs[label]` a dict with `"steps"` and any of `"loss"`,
    `"order_parameter_A"`, `"order_parameter_G_LM"`, `"rank_one_deficit_A"`,
    `"twirl_residual"`, `"concentration_exponent"`, `"contraction_norm"`: sequences of one
    number per step (missing keys are skipped, other keys ignored).

    **Raises:** `TypeError` when `runs` is not a mapping of mappings; `ValueError` when it
    is empty, a run has no `"steps"`, a quantity is not numbers or its length differs from
    its run's steps (the run and the quantity are named), or no run has any quantity; all
    before any figure is opened.
    """
    _check_runs(runs)
    plt = _plt()
    panels = [p for p in _TRAINING_PANELS if any(p[0] in r for r in runs.values())]
    cols = min(4, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.8 * rows), squeeze=False)
    for ax, (key, label, log) in zip(axes.ravel(), panels):
        for name, run in runs.items():
            if key in run:
                ax.plot(run["steps"], run[key], marker="o", ms=3, label=name)
        if key == "concentration_exponent":
            ax.axhline(-0.5, color="k", ls=":", lw=0.8, label="LLN rate −1/2")
        if key == "contraction_norm":
            ax.axhline(1.0, color="k", ls="--", lw=0.8, label="threshold 1")
        if log:
            ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel(label)
        ax.legend(fontsize=6)
    for ax in axes.ravel()[len(panels) :]:
        ax.set_visible(False)
    return _finish(fig, title or "collapse mechanism over training", path)


def plot_operator_regimes(result: Mapping, *, title: str = "", path=None):
    """Regime fractions of the trained operator's flow over random initial tokens: one group
    of bars per checkpoint, one bar per regime (stacked over flows: the summed heads and each
    head).

    **Arguments:** `result`, as returned by `jaxattn.plga.operator_regimes`:
    `result["checkpoints"]` a list of `{"label", "flows": {flow: {"fractions": {regime:
    fraction}}}}`.
    """
    plt = _plt()
    cps = list(result["checkpoints"])
    flows = list(cps[0]["flows"])
    names = []
    for cp in cps:
        for f in cp["flows"].values():
            for r in f["fractions"]:
                if r not in names:
                    names.append(r)
    fig, axes = plt.subplots(
        1, len(cps), figsize=(max(3.2, 0.5 * len(flows) + 1.5) * len(cps), 3.2), squeeze=False
    )
    cmap = plt.get_cmap("tab10")
    for ax, cp in zip(axes[0], cps):
        bottom = np.zeros(len(flows))
        for i, r in enumerate(names):
            h = np.array([cp["flows"][f]["fractions"].get(r, 0.0) for f in flows])
            ax.bar(np.arange(len(flows)), h, bottom=bottom, color=cmap(i % 10), label=r)
            bottom += h
        ax.set_xticks(np.arange(len(flows)), flows, rotation=45, ha="right", fontsize=7)
        ax.set_ylim(0, 1.0)
        ax.set_title(str(cp["label"]))
        ax.set_xlabel("flow")
    axes[0, 0].set_ylabel("fraction of initial conditions")
    axes[0, -1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _finish(fig, title or "regimes of the trained operator", path)
