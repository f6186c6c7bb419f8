"""Figures of the regime atlas (matplotlib, imported lazily by the atlas).

Every function takes the atlas section's data (plain dicts of arrays, documented per
function), writes one PNG to `path` and returns the path. The backend is never changed here:
the `jaxattn atlas` command selects Agg itself when it runs headless.
"""

from __future__ import annotations

import numpy as np

from ._regime_map import (
    _regime_names,
    draw_boundaries,
    draw_cells,
    legend_handles,
    regime_colour,
)

__all__ = [
    "plot_cases",
    "plot_regime_maps",
    "plot_bifurcation",
    "plot_phase_portrait",
    "plot_search",
    "plot_high_d",
    "plot_glm",
    "plot_flow_families",
]

_SHORT = {"particles": "particles", "watanabe_strogatz": "WS", "ott_antonsen": "OA"}
_METHOD_LABELS = {
    "particles": "particles",
    "watanabe_strogatz": "Watanabe–Strogatz",
    "ott_antonsen": "Ott–Antonsen",
}


def _plt():
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path):
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return path


def plot_cases(cases, path):
    """The d = 2 cases, particles against their reductions.

    `cases`: list of dicts with `title`, and per method (`particles`, `watanabe_strogatz`,
    `ott_antonsen`) a dict with `ts`, `R2` (complex) and `label` (its measured regime).
    Top row: the path of `R₂` in the unit disc; bottom row: `|R₂|` against time.
    """
    plt = _plt()
    k = len(cases)
    fig, axes = plt.subplots(2, k, figsize=(3.1 * k, 6.6), layout="constrained", squeeze=False)
    styles = {
        "particles": ("k", "-", 1.6),
        "watanabe_strogatz": ("#d7191c", "--", 1.2),
        "ott_antonsen": ("#2b83ba", ":", 1.8),
    }
    th = np.linspace(0, 2 * np.pi, 200)
    for j, c in enumerate(cases):
        ax, bx = axes[0, j], axes[1, j]
        ax.plot(np.cos(th), np.sin(th), color="0.75", lw=0.8)
        regimes = []
        for m, (col, ls, lw) in styles.items():
            if m not in c:
                continue
            R = np.asarray(c[m]["R2"])
            ax.plot(R.real, R.imag, color=col, ls=ls, lw=lw)
            ax.plot(R.real[0], R.imag[0], "o", color=col, ms=3)
            bx.plot(c[m]["ts"], np.abs(R), color=col, ls=ls, lw=lw)
            regimes.append(f"{_SHORT[m]}: {c[m]['label']}")
        ax.set_aspect("equal")
        ax.set_xlim(-1.05, 1.05)
        ax.set_ylim(-1.05, 1.05)
        ax.set_title(c["title"] + "\n" + "\n".join(regimes), fontsize=8)
        ax.set_xlabel("Re R₂", fontsize=8)
        bx.set_xlabel("t (physical)", fontsize=8)
        bx.set_ylim(0, 1.05)
        ax.set_ylabel("Im R₂", fontsize=8)
        bx.set_ylabel("|R₂|", fontsize=8)
    from matplotlib.lines import Line2D

    handles = [
        Line2D(
            [],
            [],
            color=col,
            ls=ls,
            lw=lw,
            label=_METHOD_LABELS[m] + ("" if m == "particles" else f" ({_SHORT[m]})"),
        )
        for m, (col, ls, lw) in styles.items()
    ] + [Line2D([], [], ls="none", marker="o", color="0.3", ms=3, label="R₂(0)")]
    fig.legend(handles=handles, loc="outside lower center", ncol=4, fontsize=8)
    fig.suptitle(
        "d = 2: particles, Watanabe–Strogatz (exact, same tokens) and Ott–Antonsen (started "
        "from the particles' R₂(0)); panel titles: the measured regime of each",
        fontsize=9,
    )
    return _save(fig, path)


def _boundary_dicts(bnds):
    out = []
    for b in bnds:
        if isinstance(b, dict):
            out.append(b)
        else:
            xs, ys, *rest = b
            out.append(dict(label=rest[0] if rest else "stated boundary", x=xs, y=ys))
    return out


def _draw_atlas_map(ax, m):
    """A one-init-per-cell atlas map: `measured` `(ny, nx)` codes, optional `failed`,
    `disagree`; returns (boundary handles, disagreements, claimed)."""
    names = _regime_names()
    dom = np.asarray(m["measured"]).astype(int)
    failed = m.get("failed")
    if failed is not None:
        dom = np.where(np.asarray(failed, bool), -1, dom)
    disagree = m.get("disagree")
    if disagree is not None and failed is not None:
        disagree = np.asarray(disagree, bool) & ~np.asarray(failed, bool)
    draw_cells(ax, m["x"], m["y"], dom, names=names, disagree=disagree)
    handles = draw_boundaries(ax, _boundary_dicts(m.get("boundaries", [])))
    ax.set_xlabel(m["xlabel"])
    ax.set_ylabel(m["ylabel"])
    nd = None if disagree is None else int(np.sum(disagree))
    return handles, nd, m.get("claimed")


def _merge_handles(groups):
    seen, out = set(), []
    for hs in groups:
        for h in hs:
            if h.get_label() not in seen:
                seen.add(h.get_label())
                out.append(h)
    return out


def plot_regime_maps(maps, path, *, suptitle=None):
    """Panels of one-init-per-cell regime maps with the stated boundaries and one legend.

    `maps`: list of dicts with `title`, `x`, `y` (cell centres), `measured` `(ny, nx)`
    regime codes, optional `failed` `(ny, nx)` bool, `disagree` `(ny, nx)` bool, `claimed`
    (number of cells with a theory claim), `boundaries` (list of `(xs, ys, label)` or
    `dict(label, x, y)` polylines), `xlabel`, `ylabel`. Cells are drawn on edges computed
    from their centres; the legend (every regime, failed, disagreement crosses per panel,
    boundaries) sits outside the panels.
    """
    plt = _plt()
    k = len(maps)
    fig, axes = plt.subplots(
        1, k, figsize=(3.9 * k + 2.6, 4.3), layout="constrained", squeeze=False
    )
    groups, per_panel = [], []
    for ax, m in zip(axes[0], maps):
        hs, nd, claimed = _draw_atlas_map(ax, m)
        groups.append(hs)
        ax.set_title(m["title"], fontsize=8)
        if nd is not None:
            per_panel.append(
                f"{m.get('short', m['xlabel'] + ', ' + m['ylabel'])}: {nd}"
                + (f"/{claimed}" if claimed is not None else "")
            )
    names = _regime_names()
    handles = legend_handles(names, failed="failed solve", boundaries=_merge_handles(groups))
    if per_panel:
        from matplotlib.lines import Line2D

        handles.insert(
            len(names) + 1,
            Line2D(
                [],
                [],
                ls="none",
                marker="x",
                color="k",
                ms=6,
                label="disagrees with theory\n(" + "; ".join(per_panel) + " claimed cells)",
            ),
        )
    fig.legend(
        handles=handles,
        loc="outside right upper",
        fontsize=7,
        title="measured regime",
        title_fontsize=8,
    )
    fig.suptitle(
        suptitle
        or "Measured regimes (Ott–Antonsen, one initial condition per cell) with the stated "
        "boundaries",
        fontsize=10,
    )
    return _save(fig, path)


_KIND_COLOURS = {
    "sink": "#2b83ba",
    "source": "#fdae61",
    "saddle": "k",
    "centre": "#d7191c",
    "degenerate": "0.55",
}


def plot_bifurcation(diagram, path):
    """Fixed points of the OA flow along a one-parameter path, in coordinates that separate them.

    `diagram`: `fixed` list of `(p, R, kind, on_circle)` with `R` the complex fixed point
    and `kind` its stability from the Jacobian eigenvalues (`sink`, `source`, `saddle`,
    `centre`, `degenerate`); `p_orbit`, `orbit_abs_lo`, `orbit_abs_hi` (range of `|R₂|`
    over the late window of OA runs along the path, NaN where the run does not oscillate);
    `folds` (refined saddle-node parameters); `xlabel`, `title`.

    Top: `arg R₂ / π` (a sink and a source on the circle share `Im R₂` but not `arg R₂`);
    bottom: `|R₂|` with the orbit band. Colour: stability; marker: on or inside the circle.
    """
    plt = _plt()
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    fig, (ax, bx) = plt.subplots(2, 1, figsize=(7.5, 6.8), sharex=True, layout="constrained")
    fixed = diagram["fixed"]
    kinds = sorted({f[2] for f in fixed}, key=list(_KIND_COLOURS).index)
    for kind in kinds:
        for circ, marker in ((False, "o"), (True, "s")):
            pts = [(p, complex(R)) for p, R, kd, c in fixed if kd == kind and bool(c) == circ]
            if not pts:
                continue
            p = np.array([q[0] for q in pts])
            R = np.array([q[1] for q in pts])
            style = dict(color=_KIND_COLOURS[kind], marker=marker, lw=0)
            ax.scatter(p, np.angle(R) / np.pi, s=9, **style)
            # |R₂| = 1 for every circle point: sinks drawn larger so sources do not hide them
            bx.scatter(
                p,
                np.abs(R),
                s=30 if kind == "sink" else 9,
                zorder=2 if kind == "sink" else 3,
                **style,
            )
    band = None
    if "p_orbit" in diagram:
        band = bx.fill_between(
            diagram["p_orbit"],
            diagram["orbit_abs_lo"],
            diagram["orbit_abs_hi"],
            color="#d7191c",
            alpha=0.2,
            lw=0,
        )
    for f in diagram["folds"]:
        for a in (ax, bx):
            a.axvline(f, color="k", ls="--", lw=0.8)
    ax.set_ylabel("arg R₂ / π")
    ax.set_ylim(-1.05, 1.05)
    bx.set_ylabel("|R₂|")
    bx.set_ylim(-0.02, 1.05)
    bx.set_xlabel(diagram.get("xlabel", "parameter"))
    fig.suptitle(diagram.get("title", ""), fontsize=9)
    handles = [Patch(color=_KIND_COLOURS[k], label=k) for k in kinds]
    handles += [
        Line2D([], [], ls="none", marker="o", color="0.4", ms=4, label="inside the disc"),
        Line2D(
            [], [], ls="none", marker="s", color="0.4", ms=4, label="on |R₂| = 1 (two clusters)"
        ),
        Line2D([], [], color="k", ls="--", lw=0.8, label="saddle-node (bisection)"),
    ]
    if band is not None:
        handles.append(Patch(color="#d7191c", alpha=0.2, label="OA orbit: |R₂| range, late window"))
    fig.legend(
        handles=handles,
        loc="outside lower center",
        fontsize=7,
        ncol=4,
        title="fixed points: colour = stability from the Jacobian eigenvalues",
        title_fontsize=8,
    )
    return _save(fig, path)


def plot_phase_portrait(portraits, path):
    """`portraits`: list of dicts with `title`, `grid` (X, Y, H) and `orbits` (list of complex)."""
    plt = _plt()
    from matplotlib.lines import Line2D

    k = len(portraits)
    fig, axes = plt.subplots(
        1, k, figsize=(4.2 * k + 1.8, 4.4), layout="constrained", squeeze=False
    )
    th = np.linspace(0, 2 * np.pi, 300)
    for ax, pp in zip(axes[0], portraits):
        X, Y, H = pp["grid"]
        Hc = np.sign(H) * np.log1p(np.abs(H))
        ax.contour(X, Y, Hc, levels=30, cmap="viridis", linewidths=0.6)
        for R in pp["orbits"]:
            ax.plot(R.real, R.imag, color="#d7191c", lw=1.2)
            ax.plot(R.real[0], R.imag[0], "o", color="#d7191c", ms=3)
        ax.plot(np.cos(th), np.sin(th), color="k", lw=1)
        ax.set_aspect("equal")
        ax.set_title(pp["title"], fontsize=9)
        ax.set_xlabel("Re R₂")
        ax.set_ylabel("Im R₂")
    handles = [
        Line2D(
            [],
            [],
            color=plt.get_cmap("viridis")(0.5),
            lw=0.8,
            label="level sets of H\n(sign(H) log(1 + |H|))",
        ),
        Line2D([], [], color="#d7191c", lw=1.2, label="OA orbit"),
        Line2D([], [], ls="none", marker="o", color="#d7191c", ms=3, label="its start"),
        Line2D([], [], color="k", lw=1, label="|R₂| = 1"),
    ]
    fig.legend(handles=handles, loc="outside right upper", fontsize=7)
    fig.suptitle("Case 4: the hidden Hamiltonian and Ott–Antonsen orbits", fontsize=10)
    return _save(fig, path)


def plot_search(search, path):
    """`search`: `path` `(steps, 2)` parameters, `score` `(steps,)`, `threshold`, `map` (as in
    `plot_regime_maps`)."""
    plt = _plt()
    from matplotlib.lines import Line2D

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10.5, 4.2), layout="constrained")
    m = search["map"]
    hs, _, _ = _draw_atlas_map(ax, dict(m, disagree=None))
    P = np.asarray(search["path"])
    ax.plot(P[:, 0], P[:, 1], "o-", color="k", ms=3, lw=1, zorder=6)
    ax.plot(P[-1, 0], P[-1, 1], "*", color="w", ms=12, mec="k", zorder=7)
    ax.set_title("Adam steps on the score ⟨|R₂|⟩ (Case 2, A = I)", fontsize=9)
    names = _regime_names()
    handles = legend_handles(names, failed="failed solve", boundaries=hs) + [
        Line2D([], [], color="k", marker="o", ms=3, lw=1, label="Adam steps"),
        Line2D([], [], ls="none", marker="*", color="w", mec="k", ms=10, label="end point"),
    ]
    ax.legend(
        handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0, fontsize=7
    )
    bx.plot(search["score"], "o-", ms=3, label="score")
    bx.axhline(search["threshold"], color="k", ls="--", lw=0.8, label="target")
    bx.set_xlabel("Adam step")
    bx.set_ylabel("score ⟨|R₂|⟩ over the late window")
    bx.legend(fontsize=7, loc="lower right")
    return _save(fig, path)


def plot_high_d(runs, path, *, title=None):
    """High-dimensional runs: what tells the regimes apart.

    `runs`: list of dicts with `case`, `kernel`, `ts`, `order` (`ρ(t) = sqrt(1 − gap)`),
    `regime` (measured name), `final_motion` (the classifier's motion over the last third
    of the late window: in d > 2 the motion of the moment `Q = XᵀX/n`, `√2 ‖dQ/dt‖_F`),
    `final_gap` (`1 − ρ²` at the end), `rotation_rate`, `period`.

    Top row, one panel per case: `ρ(t)` for each kernel on its own y-range (an oscillation
    shows), titled with the measured regimes. Bottom: the classifier's evidence plane, final
    gap `1 − ρ²` against the final token speed, one point per run coloured by its regime: at
    rest clusters sit low-left, rotating clusters low gap but moving, oscillation and interior
    states have a gap.
    """
    plt = _plt()
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    cases = list(dict.fromkeys(r["case"] for r in runs))
    kernels = list(dict.fromkeys(r["kernel"] for r in runs))
    styles = {
        k: s for k, s in zip(kernels, (("C0", "-", "o"), ("C1", "--", "s"), ("C2", ":", "^")))
    }
    fig = plt.figure(figsize=(3.1 * len(cases) + 2.2, 7.4), layout="constrained")
    gs = fig.add_gridspec(2, len(cases), height_ratios=(1.0, 1.15))
    top = [fig.add_subplot(gs[0, j]) for j in range(len(cases))]
    ev = fig.add_subplot(gs[1, :])
    for ax, case in zip(top, cases):
        lines = []
        for r in (r for r in runs if r["case"] == case):
            col, ls, _ = styles[r["kernel"]]
            ax.plot(r["ts"], r["order"], color=col, ls=ls, lw=1.2)
            lines.append(f"{r['kernel'].upper()}: {r['regime']}")
        ax.set_title(case + "\n" + "\n".join(lines), fontsize=8)
        ax.set_xlabel("t (physical)", fontsize=8)
        ax.set_ylabel("ρ = √(1 − gap)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.margins(y=0.15)
    seen = set()
    floor = 1e-12  # exact zeros (rounding level) are drawn on the floor, and it is labelled
    # Labels of one case's runs: the higher point's above it, the lower's below (two
    # kernels of a case often land close together; fixed offsets per kernel crossed them).
    above = {}
    for case in cases:
        own = sorted(
            (r for r in runs if r["case"] == case),
            key=lambda r: max(float(r["final_motion"]), floor),
            reverse=True,
        )
        for i, r in enumerate(own):
            above[id(r)] = i % 2 == 0
    for r in runs:
        _, _, mk = styles[r["kernel"]]
        gap = max(float(r["final_gap"]), floor)
        mot = max(float(r["final_motion"]), floor)
        ev.scatter(
            [gap],
            [mot],
            s=60,
            marker=mk,
            color=regime_colour(r["regime"]),
            edgecolors="k",
            lw=0.6,
            zorder=3,
        )
        ev.annotate(
            f"{r['case']} ({r['kernel'].upper()})",
            (gap, mot),
            xytext=(7, 5 if above[id(r)] else -11),
            textcoords="offset points",
            fontsize=7,
            arrowprops=dict(arrowstyle="-", lw=0.4, color="0.4"),
            annotation_clip=True,
        )
        seen.add(r["regime"])
    ev.set_xscale("log")
    ev.set_yscale("log")
    ev.set_xlabel(
        f"final clustering gap 1 − ρ² (0 on one cluster or one antipodal pair; ≤ {floor:g} "
        "drawn at it)"
    )
    ev.set_ylabel("final motion √2‖dQ/dt‖_F (classifier evidence)")
    ev.set_title("Evidence the classifier reads (late window)", fontsize=9)
    handles = [
        Line2D(
            [],
            [],
            color=styles[k][0],
            ls=styles[k][1],
            marker=styles[k][2],
            mfc="w",
            mec="k",
            label=f"{k.upper()} kernel",
        )
        for k in kernels
    ]
    names = [n for n in _regime_names() if n in seen]
    handles += [
        Patch(facecolor=regime_colour(n), edgecolor="k", lw=0.5, label=f"measured: {n}")
        for n in names
    ]
    fig.legend(handles=handles, loc="outside right upper", fontsize=7)
    fig.suptitle(
        title
        or "High d: order ρ of the tokens (ρ = 1: every token on one line, i.e. one cluster or "
        "one antipodal pair)",
        fontsize=9,
    )
    return _save(fig, path)


_GAP_FLOOR = 1e-9


def plot_glm(table, path, *, threshold=0.99):
    """Per head of a learned `G_LM` used as `A`: what was measured, so heads can be compared.

    `table`: list of dicts with `layer`, `head`, `sigma_max`, and per kernel `k` in
    (`lsa`, `usa`) `{k}_regime` (name), `{k}_final_order` (final ρ) and
    `{k}_time_to_order` (first time ρ ≥ `threshold`, NaN if never).

    One column per layer; rows: σ_max(G_LM) per head; `1 − ρ` at the end (log: how tight
    the clusters got); time to ρ ≥ threshold
    (log scale). Markers: kernel (circle LSA, square USA); face colour: measured regime.
    """
    plt = _plt()
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    layers = sorted({r["layer"] for r in table})
    heads = sorted({r["head"] for r in table})
    kernels = [k for k in ("lsa", "usa") if any(f"{k}_regime" in r for r in table)]
    marks = {"lsa": ("o", -0.15), "usa": ("s", 0.15)}
    fig, axes = plt.subplots(
        3,
        len(layers),
        figsize=(2.9 * len(layers) + 2.4, 7.0),
        sharex=True,
        sharey="row",
        layout="constrained",
        squeeze=False,
    )
    seen = set()
    for j, layer in enumerate(layers):
        rows = sorted((r for r in table if r["layer"] == layer), key=lambda r: r["head"])
        h = np.array([r["head"] for r in rows])
        axes[0, j].bar(h, [r["sigma_max"] for r in rows], color="0.6", width=0.7)
        axes[0, j].set_title(f"layer {layer}", fontsize=9)
        for k in kernels:
            mk, dx = marks[k]
            for r in rows:
                reg = r.get(f"{k}_regime", "undetermined")
                seen.add(reg)
                style = dict(marker=mk, s=28, color=regime_colour(reg), edgecolors="k", lw=0.5)
                rho = r.get(f"{k}_final_order", np.nan)
                rho = np.nan if rho is None else float(rho)
                axes[1, j].scatter([r["head"] + dx], [max(1.0 - rho, _GAP_FLOOR)], **style)
                t = r.get(f"{k}_time_to_order", np.nan)
                if t is not None and np.isfinite(t):
                    axes[2, j].scatter([r["head"] + dx], [t], **style)
                else:  # never reached: a hollow marker on the top edge
                    axes[2, j].scatter(
                        [r["head"] + dx],
                        [1.0],
                        marker=mk,
                        s=28,
                        facecolors="none",
                        edgecolors=regime_colour(reg),
                        lw=1.0,
                        transform=axes[2, j].get_xaxis_transform(),
                        clip_on=False,
                    )
        axes[1, j].axhline(1.0 - threshold, color="k", ls=":", lw=0.8)
        axes[2, j].set_xlabel("head")
        axes[2, j].set_xticks(heads[:: max(1, len(heads) // 7)])
    axes[0, 0].set_ylabel("σ_max(G_LM)")
    axes[1, 0].set_ylabel(f"1 − final order ρ\n(≤ {_GAP_FLOOR:g} drawn at it)")
    axes[1, 0].set_yscale("log")
    axes[2, 0].set_ylabel(f"time to ρ ≥ {threshold}")
    axes[2, 0].set_yscale("log")
    from matplotlib.ticker import FuncFormatter

    axes[2, 0].yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axes[2, 0].yaxis.set_minor_formatter(
        FuncFormatter(lambda v, _: f"{v:g}" if f"{v:.0e}"[0] in "25" else "")
    )
    handles = [
        Line2D([], [], ls="none", marker=marks[k][0], mfc="w", mec="k", label=f"{k.upper()}")
        for k in kernels
    ]
    handles += [
        Patch(facecolor=regime_colour(n), edgecolor="k", lw=0.5, label=n)
        for n in _regime_names()
        if n in seen
    ]
    handles += [
        Line2D(
            [],
            [],
            color="k",
            ls=":",
            lw=0.8,
            label=f"ρ = {threshold} (1 − ρ = {1 - threshold:.2g})",
        ),
        Line2D(
            [],
            [],
            ls="none",
            marker="o",
            mfc="none",
            mec="0.4",
            label="ρ never reached it\n(top edge)",
        ),
    ]
    fig.legend(
        handles=handles,
        loc="outside right upper",
        fontsize=7,
        title="kernel / regime",
        title_fontsize=8,
    )
    fig.suptitle(
        "Learned G_LM heads as A (V = I, β = 1/8): per head what the flow did", fontsize=10
    )
    return _save(fig, path)


def plot_flow_families(curves, plga_rows, path):
    """Flow families: left, the spread `V(t) = 1 − |mean θ|²` of each flow on log–log
    axes with its exponential (dashed) and power-law (dotted) fits over the fit window, the
    better fit bold; right, the regime fractions of the PLGA flow per layer and initial
    law (stacked bars).

    **Arguments:** `curves` a list of `{"label", "ts", "spread", "fit"}` (`fit` from
    `jaxattn.dynamics.decay_fits`); `plga_rows` a list of `{"flow", "law", "fractions":
    {regime: fraction}}`; `path` of the PNG.
    """
    plt = _plt()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12.5, 4.6), gridspec_kw=dict(width_ratios=[1.3, 1]))
    colours = plt.get_cmap("tab10")
    for i, c in enumerate(curves):
        ts, v = np.asarray(c["ts"]), np.asarray(c["spread"])
        keep = (ts > 0) & (v > 0)
        col = colours(i)
        ax.loglog(ts[keep], v[keep], color=col, lw=1.6, label=c["label"])
        f = c["fit"]
        if "law" in f:
            t = np.geomspace(*f["t_window"], 50)
            exp_fit = np.exp(f["exp_intercept"] - f["exp_rate"] * t)
            pow_fit = np.exp(f["power_intercept"] - f["power_exponent"] * np.log(t))
            best_exp = f["law"] == "exponential"
            best_pow = f["law"] == "algebraic"  # "no_decay": neither fit is the better
            # One style per law (exponential dashed, power dotted); the better fit is bold.
            ax.loglog(
                t, exp_fit, color=col, lw=1.8 if best_exp else 0.8, ls="--",
                label=f"  exp fit λ = {f['exp_rate']:.3g} (R² {f['exp_r2']:.3f})"
                + (" ← better" if best_exp else ""),
            )  # fmt: skip
            ax.loglog(
                t, pow_fit, color=col, lw=1.8 if best_pow else 0.8, ls=":",
                label=f"  power fit p = {f['power_exponent']:.3g} (R² {f['power_r2']:.3f})"
                + (" ← better" if best_pow else ""),
            )  # fmt: skip
    ax.axhspan(1e-12, 1e-2, color="0.9", zorder=0, label="fit window")
    ax.set_xlabel("time t")
    ax.set_ylabel("spread V(t) = 1 − |mean θ|²")
    ax.set_ylim(1e-16, 2.0)
    ax.set_title("Softmax, A = V = I, β = 1: contraction by normalisation", fontsize=10)
    ax.legend(fontsize=6.5, loc="lower left", ncol=1, framealpha=0.85)
    labels = [f"{r['flow'].split(' (')[0]}\n{r['law']}" for r in plga_rows]
    names = []
    for r in plga_rows:
        for k in r["fractions"]:
            if k not in names:
                names.append(k)
    bottom = np.zeros(len(plga_rows))
    for name in names:
        h = np.array([r["fractions"].get(name, 0.0) for r in plga_rows])
        bx.bar(np.arange(len(plga_rows)), h, bottom=bottom, color=regime_colour(name), label=name)
        bottom += h
    bx.set_xticks(np.arange(len(plga_rows)), labels, fontsize=7)
    bx.set_ylim(0, 1.0)
    bx.set_xlabel("PLGA layer and initial law")
    bx.set_ylabel("fraction of initial conditions")
    bx.set_title("The PLGA flow (G regenerated from D = Σ θθᵀ)", fontsize=10)
    bx.legend(fontsize=7, title="regime", title_fontsize=7, loc="upper left",
              bbox_to_anchor=(1.0, 1.0))  # fmt: skip
    fig.tight_layout()
    return _save(fig, path)
