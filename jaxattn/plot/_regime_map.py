r"""Regime maps: the dominant regime per cell of a parameter grid, with basin fractions.

The figures here read a `jaxattn.dynamics.RegimeMap` (or the same fields given by hand) and
draw, on a grid of parameter cells aligned to their centres:

- the dominant regime of the `K` initial conditions of each cell as its colour, paler where
  fewer of the `K` inits fall in it (basin-fraction shading), and a ring where no regime holds
  90 % of the non-failed inits (multistability);
- cells where every init failed (solver failure, non-finite state) in their own colour, never
  that of `undetermined`;
- the theory's stated boundaries as lines and the cells whose measured regime disagrees with
  the theory's claim as crosses, each with its legend entry;
- a colour key that names every regime of `REGIMES`, outside the data area.

One-parameter maps are stacked bars of the basin fractions against the parameter.

matplotlib is imported when a figure is drawn; the backend is never changed here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

__all__ = [
    "REGIME_COLOURS",
    "FAILED_COLOUR",
    "plot_regime_map",
    "regime_colour",
]

# One colour per regime name of `REGIMES` (names added later get fallback colours).
REGIME_COLOURS = {
    "clustering": "#2b83ba",
    "rotating": "#1a9641",
    "oscillation": "#d7191c",
    "interior": "#fdae61",
    "chaotic": "#7b3294",
    "undetermined": "#bdbdbd",
}
"""The colour of each regime name of `REGIMES` in every jaxattn figure (`regime_colour`
gives it, with a fallback for names added later)."""
FAILED_COLOUR = "#e7298a"
"""The colour of cells (or inits) whose solve failed: never that of `undetermined`."""
_FALLBACK = ("#8c510a", "#01665e", "#737373")
MULTISTABLE_THRESHOLD = 0.9


def _regime_names() -> tuple[str, ...]:
    from ..dynamics._regimes import REGIMES

    return tuple(REGIMES._name_to_item)


def regime_colour(name: str) -> str:
    """The colour used for regime `name` in every jaxattn figure (`"failed"` included)."""
    if name == "failed":
        return FAILED_COLOUR
    if name in REGIME_COLOURS:
        return REGIME_COLOURS[name]
    names = [n for n in _regime_names() if n not in REGIME_COLOURS]
    return _FALLBACK[names.index(name) % len(_FALLBACK)] if name in names else _FALLBACK[-1]


def _plt():
    import matplotlib.pyplot as plt

    return plt


def cell_edges(centres) -> np.ndarray:
    """Cell edges of a grid of increasing cell centres, shape `(len(centres) + 1,)`: the
    midpoints between neighbours, and half a spacing beyond each end (±0.5 for one cell)."""
    c = np.asarray(centres, dtype=np.float64)
    if c.ndim != 1 or c.size == 0:
        raise ValueError(f"cell_edges: need a non-empty 1-D grid of centres, got shape {c.shape}.")
    if c.size == 1:
        return np.array([c[0] - 0.5, c[0] + 0.5])
    if not np.all(np.diff(c) > 0):
        raise ValueError("cell_edges: the centres must be strictly increasing.")
    mid = 0.5 * (c[1:] + c[:-1])
    return np.concatenate([[c[0] - (mid[0] - c[0])], mid, [c[-1] + (c[-1] - mid[-1])]])


def _agrees(measured: int, predicted: int, names) -> bool:
    # The papers' clustering claims are about |R₂| → 1: met by clusters at rest or rotating.
    if names[predicted] == "clustering":
        return names[measured] in ("clustering", "rotating")
    return measured == predicted


def _check_codes(what: str, codes: np.ndarray, names, below: str) -> np.ndarray:
    """`codes` (a field of a map) as ints, checked to be whole numbers in `-1 ..
    len(names) - 1` (`below` says what −1 means).

    **Raises:** `TypeError` for values that are not numbers, `ValueError` naming `what`
    for others."""
    from ..dynamics._sweep import _bad_codes

    codes = np.asarray(codes)
    top = len(names) - 1
    if codes.dtype.kind not in "iuf":
        raise TypeError(
            f"plot_regime_map: {what} must hold integer regime codes, got {codes.dtype}."
        )
    bad = _bad_codes(codes, -1)
    if bad.size:
        raise ValueError(
            f"plot_regime_map: {what} holds codes outside -1..{top} (0..{top}: the regimes "
            f"{list(names)}; -1: {below}): {bad[:5].tolist()}."
        )
    return codes.astype(int)


def _check_boundaries(boundaries) -> list:
    """The map's theory boundaries, each a dict with `x` (and `y`: `None` or a polyline of
    the length of `x`).

    **Raises:** `ValueError` naming the boundary that is not one."""
    out = list(boundaries)
    for i, b in enumerate(out):
        if not isinstance(b, Mapping) or "x" not in b:
            got = f"a dict with keys {sorted(map(str, b))}" if isinstance(b, Mapping) else repr(b)
            raise ValueError(
                f"plot_regime_map: boundaries[{i}] must be a dict(label, x, y) with the "
                f"boundary's x (and y, or None), got {got:.120}."
            )
        x = np.asarray(b["x"])
        y = b.get("y")
        if x.dtype.kind not in "iuf" or (y is not None and x.ndim != 1):
            raise ValueError(
                f"plot_regime_map: boundaries[{i}]['x'] must be real numbers"
                + (", a 1-D polyline" if y is not None else "")
                + f", got {x.dtype} of shape {x.shape}."
            )
        if y is not None:
            y = np.asarray(y)
            if y.dtype.kind not in "iuf" or y.shape != x.shape:
                raise ValueError(
                    f"plot_regime_map: boundaries[{i}]['y'] must be None or real numbers of the "
                    f"shape of its x {x.shape}, got {y.dtype} of shape {y.shape}."
                )
    return out


@dataclasses.dataclass
class _Cells:
    """A map reduced to what is drawn; arrays are cells_shape = (nx,) or (nx, ny)."""

    names: tuple
    axes: tuple  # ((name, centres), ...)
    fractions: np.ndarray  # cells + (regimes,)
    failed_fraction: np.ndarray
    dominant: np.ndarray  # -1 where every init failed
    multistable: np.ndarray
    inits: int
    disagree: np.ndarray | None
    claimed: int
    boundaries: list
    title: str


def _as_cells(m) -> _Cells:
    fields = ("axes", "fractions", "dominant", "failed_fraction", "multistable")
    missing = [f for f in fields if not hasattr(m, f)]
    if missing:
        raise TypeError(
            f"plot_regime_map: regime_map must be a RegimeMap (or have its fields), got "
            f"{type(m).__name__} without {', '.join(missing)}."
        )
    names = _regime_names()
    axes = tuple((str(a), np.asarray(v, dtype=np.float64)) for a, v in m.axes)
    if len(axes) not in (1, 2):
        raise ValueError(f"plot_regime_map: need a map over 1 or 2 axes, got {len(axes)}.")
    shape = tuple(len(v) for _, v in axes)
    fr = np.asarray(m.fractions, dtype=np.float64)
    if fr.shape != shape + (len(names),):
        raise ValueError(
            f"plot_regime_map: fractions has shape {fr.shape}, expected {shape + (len(names),)} "
            f"(cells × the {len(names)} regimes of REGIMES)."
        )
    dom = _check_codes("dominant", m.dominant, names, "every init failed")
    failed_frac = np.asarray(m.failed_fraction, dtype=np.float64)
    multi = np.asarray(m.multistable, dtype=bool)
    for name, arr in (("dominant", dom), ("failed_fraction", failed_frac), ("multistable", multi)):
        if arr.shape != shape:
            raise ValueError(f"plot_regime_map: {name} has shape {arr.shape}, expected {shape}.")
    pred = getattr(m, "predicted", None)
    disagree, claimed = None, 0
    if pred is not None:
        pred = np.asarray(pred)
        if pred.shape != shape:
            raise ValueError(
                f"plot_regime_map: predicted has shape {pred.shape}, expected {shape}."
            )
        pred = _check_codes("predicted", pred, names, "no claim")
        claimed = int(np.sum(pred >= 0))
        own = getattr(m, "disagreements", None)
        if callable(own):  # RegimeMap.disagreements(): the map's own rule
            disagree = np.asarray(own(), dtype=bool)
        else:
            disagree = np.zeros(shape, bool)
            undetermined = names.index("undetermined") if "undetermined" in names else -1
            for idx in zip(*np.nonzero((pred >= 0) & (dom >= 0) & (dom != undetermined))):
                disagree[idx] = not _agrees(int(dom[idx]), int(pred[idx]), names)
        if disagree.shape != shape:
            raise ValueError(
                f"plot_regime_map: disagreements has shape {disagree.shape}, expected {shape}."
            )
    fixed = getattr(m, "fixed", None) or {}
    fixed_txt = ", ".join(f"{k} = {_fmt(v)}" for k, v in fixed.items())
    kernel = getattr(m, "kernel", None)
    title = f"{getattr(m, 'family', 'map')} family, {getattr(m, 'method', '')}"
    if kernel:
        title += f" ({str(kernel).upper()})"
    if fixed_txt:
        title += f"\nfixed: {fixed_txt}"
    return _Cells(
        names=names,
        axes=axes,
        fractions=fr,
        failed_fraction=failed_frac,
        dominant=dom,
        multistable=multi,
        inits=int(getattr(m, "inits", 1)),
        disagree=disagree,
        claimed=claimed,
        boundaries=_check_boundaries(getattr(m, "boundaries", None) or []),
        title=title,
    )


def _cells(k: int) -> str:
    return f"{k} cell" if k == 1 else f"{k} cells"


def _with_inits(title: str, inits: int) -> str:
    first, *rest = title.split("\n")
    return "\n".join([f"{first}, K = {inits} inits per cell", *rest])


def _fmt(v) -> str:
    try:
        a = np.asarray(v)
    except Exception:  # noqa: BLE001 - anything printable
        return str(v)
    if a.ndim == 0 and np.issubdtype(a.dtype, np.number):
        return f"{float(a):g}"
    if a.ndim and a.size <= 4 and np.issubdtype(a.dtype, np.number):
        return "[" + ", ".join(f"{float(x):g}" for x in a.ravel()) + "]"
    return str(v)


def _rgba(name_codes, strength, names):
    """RGBA of each cell: the dominant regime's colour blended toward white by `strength`."""
    from matplotlib.colors import to_rgb

    base = np.array([to_rgb(regime_colour(n)) for n in names] + [to_rgb(FAILED_COLOUR)])
    idx = np.where(name_codes >= 0, name_codes, len(names))
    s = np.where(name_codes >= 0, strength, 1.0)[..., None]
    rgb = 1.0 - s * (1.0 - base[idx])
    return np.concatenate([rgb, np.ones(rgb.shape[:-1] + (1,))], axis=-1)


def _strength(fraction):
    # Full colour when every init agrees; a third of the colour at zero.
    return 1.0 / 3.0 + (2.0 / 3.0) * np.clip(fraction, 0.0, 1.0)


def _marker_size(ax, nx, ny, scale):
    """Scatter marker area (pt²) that fits `scale` of one cell of an `nx × ny` grid."""
    fig = ax.figure
    w, h = fig.get_size_inches()
    pos = ax.get_position()
    cell = 72.0 * min(w * pos.width / nx, h * pos.height / ny)
    return float(np.clip((scale * cell) ** 2, 1.0, 60.0))


def _halo(width: float = 1.6):
    import matplotlib.patheffects as pe

    return [pe.Stroke(linewidth=width + 1.6, foreground="white"), pe.Normal()]


_BOUNDARY_STYLES = ("-", "--", "-.", ":")


def draw_cells(
    ax,
    x,
    y,
    dominant,
    *,
    names,
    strength=None,
    multistable=None,
    disagree=None,
):
    """Draw a 2-D map on `ax`: arrays of shape `(ny, nx)` (rows = y), cell centres `x`, `y`.

    Returns the number of multistable and disagreeing cells drawn.
    """
    xe, ye = cell_edges(x), cell_edges(y)
    dominant = np.asarray(dominant).astype(int)
    s = np.ones(dominant.shape) if strength is None else np.asarray(strength)
    ax.pcolormesh(xe, ye, _rgba(dominant, s, names), shading="flat", rasterized=True)
    ax.set_xlim(xe[0], xe[-1])
    ax.set_ylim(ye[0], ye[-1])
    X, Y = np.meshgrid(x, y)
    counts = [0, 0]
    if multistable is not None and np.any(multistable):
        ax.scatter(
            X[multistable],
            Y[multistable],
            s=_marker_size(ax, len(x), len(y), 0.55),
            marker="o",
            facecolors="none",
            edgecolors="k",
            linewidths=0.6,
            zorder=3,
        )
        counts[0] = int(np.sum(multistable))
    if disagree is not None and np.any(disagree):
        ax.scatter(
            X[disagree],
            Y[disagree],
            s=_marker_size(ax, len(x), len(y), 0.75),
            marker="x",
            color="k",
            linewidths=1.0,
            zorder=6,  # above the boundary lines, with a white halo
            path_effects=_halo(1.0),
        )
        counts[1] = int(np.sum(disagree))
    return counts


def draw_boundaries(ax, boundaries, *, vertical=False):
    """Theory boundaries: `dict(label, x, y)` polylines (or, with `vertical=True`, crossing
    points `x` drawn as vertical lines). One style per distinct label."""
    handles, seen = [], {}
    from matplotlib.lines import Line2D

    for b in boundaries:
        label = str(b.get("label", "theory boundary"))
        if label not in seen:
            seen[label] = _BOUNDARY_STYLES[len(seen) % len(_BOUNDARY_STYLES)]
            handles.append(Line2D([], [], color="k", lw=1.6, ls=seen[label], label=label))
        style = dict(color="k", lw=1.6, ls=seen[label], path_effects=_halo(), zorder=5)
        if vertical or b.get("y") is None:
            for xv in np.atleast_1d(np.asarray(b["x"], dtype=np.float64)):
                ax.axvline(xv, **style)
        else:
            ax.plot(np.asarray(b["x"]), np.asarray(b["y"]), **style)
    return handles


def legend_handles(
    names,
    *,
    failed: bool | str = True,
    multistable=None,
    disagree=None,
    claimed=None,
    boundaries=(),
):
    """Legend handles: every regime, failed, the multistability ring, disagreement crosses
    (with their count) and the boundary lines."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    hs = [Patch(facecolor=regime_colour(n), edgecolor="0.3", lw=0.4, label=n) for n in names]
    if failed:
        label = failed if isinstance(failed, str) else "failed (every init)"
        hs.append(Patch(facecolor=FAILED_COLOUR, edgecolor="0.3", lw=0.4, label=label))
    if multistable is not None:
        hs.append(
            Line2D(
                [],
                [],
                ls="none",
                marker="o",
                mfc="none",
                mec="k",
                ms=6,
                label=f"multistable: no regime ≥ {MULTISTABLE_THRESHOLD:.0%} "
                f"({_cells(multistable)})",
            )
        )
    if disagree is not None:
        extra = f" of {claimed} claimed" if claimed is not None else ""
        hs.append(
            Line2D(
                [],
                [],
                ls="none",
                marker="x",
                color="k",
                ms=6,
                label=f"disagrees with theory ({disagree}{extra} cells)"
                if extra
                else f"disagrees with theory ({_cells(disagree)})",
            )
        )
    return hs + list(boundaries)


def _fraction_colourbar(fig, ax, inits):
    """A colour bar that reads the shading: share of the inits in the dominant regime."""
    import matplotlib as mpl
    from matplotlib.colors import ListedColormap

    f = np.linspace(0.0, 1.0, 256)
    ramp = 1.0 - _strength(f)[:, None] * (1.0 - np.array([0.3, 0.3, 0.3]))
    sm = mpl.cm.ScalarMappable(cmap=ListedColormap(ramp), norm=mpl.colors.Normalize(0, 1))
    cb = fig.colorbar(sm, ax=ax, location="bottom", shrink=0.7, aspect=30, pad=0.02)
    cb.set_label(f"share of the {inits} inits in the dominant regime (colour depth)")
    return cb


def plot_regime_map(
    regime_map,
    ax=None,
    *,
    title: str | None = None,
    xlabel: str | None = None,
    ylabel: str | None = None,
    shading: bool = True,
    legend: bool = True,
    colorbar: bool = True,
):
    r"""Draw a regime map: per cell the dominant regime of its `K` initial conditions.

    **2-D maps** (`axes` of two grids, the first along x): cells are drawn with `pcolormesh`
    on edges computed from the cell centres, so each cell sits on its parameter value. The
    colour is the dominant regime (`REGIME_COLOURS`), paler where a smaller share of the `K`
    inits falls in it (`shading`, with a colour bar that reads it), a ring where no regime
    holds ≥ 90 % of the non-failed inits, `FAILED_COLOUR` where every init failed; theory
    `boundaries` are black lines with a white halo, cells whose dominant regime disagrees
    with `predicted` are crossed (a clustering claim is met by clustering or rotating: both
    have `|R₂| → 1`; undetermined and failed cells never disagree; a `RegimeMap`'s own
    `disagreements()` is used when present). The legend names every regime of `REGIMES`,
    outside the data area.

    **1-D maps**: stacked bars of the basin fractions (and the failed share) against the
    parameter, theory crossings as vertical lines, disagreeing cells crossed above the bars.

    **Arguments:**

    - `regime_map`: a `jaxattn.dynamics.RegimeMap`, or any object with its fields `axes`
      (`((name, centres), ...)`, 1 or 2 increasing grids), `fractions` (cells × regimes),
      `failed_fraction`, `dominant` (-1 where every init failed), `multistable` (cells),
      `inits`, and optionally `predicted` (cells, -1 = no claim), `boundaries`
      (`[dict(label, x, y)]`), `family`, `method`, `fixed`.
    - `ax`: the matplotlib axes to draw on (a new constrained-layout figure when None).
    - `title`, `xlabel`, `ylabel`: override the defaults (family/method/fixed values, and the
      axis names).
    - `shading`, `legend`, `colorbar`: switch those parts off (e.g. for panels of a larger
      figure that carries one legend).

    **Returns:** the matplotlib axes.

    **Raises:** `ValueError` when the fields' shapes do not match the axes, `dominant` or
    `predicted` holds a code outside `-1 .. len(REGIMES) - 1`, or a boundary is not a
    `dict(label, x, y)` (`x` missing, or `y` not of the shape of `x`); `TypeError` when
    `regime_map` lacks a `RegimeMap`'s fields or `dominant` or `predicted` is not an array
    of numbers.
    """
    plt = _plt()
    cells = _as_cells(regime_map)
    if ax is None:
        _, ax = plt.subplots(
            figsize=(7.2, 4.8) if len(cells.axes) == 2 else (8.0, 3.8), layout="constrained"
        )
    fig = ax.figure
    names = cells.names
    ndisagree = None if cells.disagree is None else int(cells.disagree.sum())
    if len(cells.axes) == 2:
        (xn, x), (yn, y) = cells.axes
        # fields are (nx, ny) with x first; pcolormesh wants rows = y
        dom = cells.dominant.T
        share = np.take_along_axis(
            cells.fractions, np.maximum(cells.dominant, 0)[..., None], axis=-1
        )[..., 0].T
        strength = _strength(share) if (shading and cells.inits > 1) else None
        multi = cells.multistable.T & (dom >= 0) if cells.inits > 1 else None
        draw_cells(
            ax,
            x,
            y,
            dom,
            names=names,
            strength=strength,
            multistable=multi,
            disagree=None if cells.disagree is None else cells.disagree.T,
        )
        bh = draw_boundaries(ax, cells.boundaries)
        ax.set_xlabel(xlabel or xn)
        ax.set_ylabel(ylabel or yn)
        if strength is not None and colorbar:
            _fraction_colourbar(fig, ax, cells.inits)
        nmulti = int(np.sum(multi)) if multi is not None else None
    else:
        ((xn, x),) = cells.axes
        edges = cell_edges(x)
        width = np.diff(edges)
        bottom = np.zeros(len(x))
        for k, name in enumerate(names):
            h = cells.fractions[:, k]
            ax.bar(
                x, h, width=width, bottom=bottom, color=regime_colour(name), lw=0, align="center"
            )
            bottom = bottom + h
        ax.bar(x, cells.failed_fraction, width=width, bottom=bottom, color=FAILED_COLOUR, lw=0)
        ax.set_xlim(edges[0], edges[-1])
        # marks live in a strip above the bars: rings (multistable) and crosses (disagrees)
        ax.set_ylim(0, 1.13)
        ax.set_yticks(np.linspace(0, 1, 6))
        ax.axhline(1.0, color="0.4", lw=0.6)
        if cells.disagree is not None and ndisagree:
            ax.plot(x[cells.disagree], np.full(ndisagree, 1.095), "x", color="k", ms=5)
        if cells.inits > 1:
            multi_cells = cells.multistable & (cells.dominant >= 0)
            nmulti = int(multi_cells.sum())
            if nmulti:
                ax.plot(x[multi_cells], np.full(nmulti, 1.04), "o", mfc="none", mec="k", ms=4)
        else:
            nmulti = None
        bh = draw_boundaries(ax, cells.boundaries, vertical=True)
        ax.set_xlabel(xlabel or xn)
        ax.set_ylabel(ylabel or f"fraction of the {cells.inits} inits")
    ax.set_title(
        title if title is not None else _with_inits(cells.title, cells.inits),
        fontsize=10,
    )
    if legend:
        ax.legend(
            handles=legend_handles(
                names,
                failed=True if len(cells.axes) == 2 else "failed inits",
                multistable=nmulti,
                disagree=ndisagree,
                claimed=cells.claimed if cells.disagree is not None else None,
                boundaries=bh,
            ),
            loc="upper left",
            bbox_to_anchor=(1.02, 1.0),
            borderaxespad=0.0,
            fontsize=8,
            title="dominant regime" if len(cells.axes) == 2 else "regime",
            title_fontsize=8,
        )
    return ax
