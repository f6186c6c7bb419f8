"""Figures of the regime atlas (matplotlib, Agg backend; imported lazily by the atlas)."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import ListedColormap  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

__all__ = [
    "REGIME_COLOURS",
    "plot_cases",
    "plot_regime_maps",
    "plot_bifurcation",
    "plot_phase_portrait",
    "plot_search",
    "plot_high_d",
    "plot_glm",
]

REGIME_LABELS = (
    "Type 1 clusters",
    "Type 2 rotating",
    "Type 3 oscillation",
    "interior",
    "undetermined",
)
REGIME_COLOURS = ("#2b83ba", "#abdda4", "#d7191c", "#fdae61", "#bbbbbb")
_CMAP = ListedColormap(REGIME_COLOURS)


def _save(fig, path):
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _legend(ax, **kw):
    ax.legend(
        handles=[Patch(color=c, label=lab) for c, lab in zip(REGIME_COLOURS, REGIME_LABELS)],
        fontsize=7,
        **kw,
    )


def plot_cases(cases, path):
    """`cases`: list of dicts with `title`, and per method (`particles`, `watanabe_strogatz`,
    `ott_antonsen`) a dict with `ts`, `R2`, `label`."""
    k = len(cases)
    fig, axes = plt.subplots(2, k, figsize=(3.2 * k, 6.2))
    styles = {
        "particles": ("k", "-", 1.6),
        "watanabe_strogatz": ("#d7191c", "--", 1.2),
        "ott_antonsen": ("#2b83ba", ":", 1.6),
    }
    th = np.linspace(0, 2 * np.pi, 200)
    for j, c in enumerate(cases):
        ax, bx = axes[0, j], axes[1, j]
        ax.plot(np.cos(th), np.sin(th), color="0.7", lw=0.8)
        for m, (col, ls, lw) in styles.items():
            if m not in c:
                continue
            R = c[m]["R2"]
            ax.plot(R.real, R.imag, color=col, ls=ls, lw=lw, label=f"{m}: {c[m]['label']}")
            bx.plot(c[m]["ts"], np.abs(R), color=col, ls=ls, lw=lw)
        ax.set_aspect("equal")
        ax.set_xlim(-1.05, 1.05)
        ax.set_ylim(-1.05, 1.05)
        ax.set_title(c["title"], fontsize=8)
        ax.legend(fontsize=6, loc="lower left")
        bx.set_xlabel("t")
        bx.set_ylim(0, 1.05)
        if j == 0:
            ax.set_ylabel("Im R₂")
            bx.set_ylabel("|R₂|")
    fig.suptitle(
        "The four cases in d = 2: particles, Watanabe–Strogatz and Ott–Antonsen", fontsize=10
    )
    return _save(fig, path)


def plot_regime_maps(maps, path):
    """`maps`: list of dicts with `title`, `x`, `y` (1-d grids), `measured` (ny, nx) codes,
    `disagree` (ny, nx) bool, `boundaries` list of (xs, ys) polylines, `xlabel`, `ylabel`."""
    k = len(maps)
    fig, axes = plt.subplots(1, k, figsize=(4.4 * k, 4.2))
    axes = np.atleast_1d(axes)
    for ax, m in zip(axes, maps):
        x, y = m["x"], m["y"]
        ax.imshow(
            m["measured"],
            origin="lower",
            extent=(x[0], x[-1], y[0], y[-1]),
            cmap=_CMAP,
            vmin=-0.5,
            vmax=4.5,
            aspect="auto",
            interpolation="nearest",
        )
        for bxs, bys in m["boundaries"]:
            ax.plot(bxs, bys, color="k", lw=1.6)
        yy, xx = np.nonzero(m["disagree"])
        if len(xx):
            ax.scatter(x[xx], y[yy], marker="x", color="k", s=12, lw=0.8, label="disagrees")
            ax.legend(fontsize=7, loc="upper left")
        ax.set_xlim(x[0], x[-1])
        ax.set_ylim(y[0], y[-1])
        ax.set_xlabel(m["xlabel"])
        ax.set_ylabel(m["ylabel"])
        ax.set_title(m["title"], fontsize=9)
    _legend(axes[-1], loc="lower right")
    fig.suptitle(
        "Measured regimes (Ott–Antonsen sweeps) with the paper's stated boundaries (black)",
        fontsize=10,
    )
    return _save(fig, path)


def plot_bifurcation(diagram, path):
    """`diagram`: `p`, `fixed` list of (p, Im R, kind, on_circle), `orbit_lo`, `orbit_hi`
    (Im R range over the late window of OA runs), `folds` (refined parameters)."""
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.fill_between(
        diagram["p_orbit"],
        diagram["orbit_lo"],
        diagram["orbit_hi"],
        color="#d7191c",
        alpha=0.25,
        label="OA orbit range (late window)",
    )
    colours = {
        "sink": "#2b83ba",
        "source": "#fdae61",
        "saddle": "k",
        "centre": "#d7191c",
        "degenerate": "0.5",
    }
    seen = set()
    for p, y, kind, circ in diagram["fixed"]:
        lab = f"{kind}{' (on |R|=1)' if circ else ''}"
        ax.scatter(
            [p],
            [y],
            s=10,
            color=colours[kind],
            marker="o" if not circ else "s",
            label=None if lab in seen else lab,
        )
        seen.add(lab)
    for f in diagram["folds"]:
        ax.axvline(f, color="k", ls="--", lw=0.8)
    ax.set_xlabel(diagram.get("xlabel", "v11"))
    ax.set_ylabel("Im R₂")
    ax.set_title(diagram.get("title", ""), fontsize=9)
    ax.legend(fontsize=7, loc="lower left")
    return _save(fig, path)


def plot_phase_portrait(portraits, path):
    """`portraits`: list of dicts with `title`, `grid` (X, Y, H) and `orbits` (list of complex)."""
    k = len(portraits)
    fig, axes = plt.subplots(1, k, figsize=(4.4 * k, 4.4))
    axes = np.atleast_1d(axes)
    th = np.linspace(0, 2 * np.pi, 300)
    for ax, pp in zip(axes, portraits):
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
    axes[0].set_ylabel("Im R₂")
    fig.suptitle(
        "Case 4: level sets of the hidden Hamiltonian (contours) and OA orbits (red)", fontsize=10
    )
    return _save(fig, path)


def plot_search(search, path):
    """`search`: `path` (steps, 2), `score` (steps,), `map` (as in plot_regime_maps)."""
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(9, 4))
    m = search["map"]
    x, y = m["x"], m["y"]
    ax.imshow(
        m["measured"],
        origin="lower",
        extent=(x[0], x[-1], y[0], y[-1]),
        cmap=_CMAP,
        vmin=-0.5,
        vmax=4.5,
        aspect="auto",
        interpolation="nearest",
    )
    for bxs, bys in m["boundaries"]:
        ax.plot(bxs, bys, color="k", lw=1.6)
    P = search["path"]
    ax.plot(P[:, 0], P[:, 1], "o-", color="k", ms=3, lw=1)
    ax.plot(P[-1, 0], P[-1, 1], "*", color="w", ms=12, mec="k")
    ax.set_xlabel(m["xlabel"])
    ax.set_ylabel(m["ylabel"])
    ax.set_title("Adam steps on ⟨|R₂|⟩ (Case 2, A = I)", fontsize=9)
    bx.plot(search["score"], "o-", ms=3)
    bx.axhline(search["threshold"], color="k", ls="--", lw=0.8)
    bx.set_xlabel("step")
    bx.set_ylabel("score ⟨|R₂|⟩ over the late window")
    return _save(fig, path)


def plot_high_d(runs, path):
    """`runs`: list of dicts with `title`, `ts`, `order` (times,)."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in runs:
        ax.plot(r["ts"], r["order"], label=r["title"], lw=1.2)
    ax.set_xscale("symlog", linthresh=100.0)  # one slow case runs 10× longer
    ax.set_xlabel("t (linear to 100, then logarithmic)")
    ax.set_ylabel("ρ = sqrt(1 − clustering gap)")
    ax.set_title("d = 100: order ρ along the flow (1 = one antipodal pair)", fontsize=9)
    ax.legend(fontsize=6)
    return _save(fig, path)


def plot_glm(table, path):
    """`table`: list of dicts with `layer`, `head`, `lsa`, `usa` regime codes."""
    layers = sorted({r["layer"] for r in table})
    heads = sorted({r["head"] for r in table})
    fig, axes = plt.subplots(1, 2, figsize=(9, 0.6 * len(layers) + 1.8))
    for ax, key in zip(axes, ("lsa", "usa")):
        M = np.full((len(layers), len(heads)), 4.0)
        for r in table:
            M[layers.index(r["layer"]), heads.index(r["head"])] = r[key]
        ax.imshow(M, cmap=_CMAP, vmin=-0.5, vmax=4.5, aspect="auto")
        ax.set_yticks(range(len(layers)), [f"layer {i}" for i in layers])
        ax.set_xticks(range(len(heads)), heads)
        ax.set_xlabel("head")
        ax.set_title(f"{key.upper()} with A = G_LM (V = I, β = 1/8)", fontsize=9)
    _legend(axes[1], loc="upper left", bbox_to_anchor=(1.02, 1))
    return _save(fig, path)
