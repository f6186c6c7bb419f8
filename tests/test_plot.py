"""Figures: every plotting helper renders on Agg and labels its axes, colours and markers.

The checks read matplotlib's own objects (axis labels, titles, legend texts, colour-bar
labels, mesh coordinates), not pixels. Inputs are built by hand: no solves.
"""

import dataclasses
import types

import matplotlib
import numpy as np
import pytest

from jaxattn.dynamics._regimes import REGIMES

NAMES = tuple(REGIMES._name_to_item)
CODE = {n: i for i, n in enumerate(NAMES)}


@pytest.fixture(autouse=True)
def agg():
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    yield
    plt.close("all")


def _legend_texts(obj):
    leg = obj.get_legend() if hasattr(obj, "get_legend") else obj
    assert leg is not None
    return [t.get_text() for t in leg.get_texts()]


def _fig_legend_texts(fig):
    assert fig.legends, "figure has no legend"
    return [t.get_text() for leg in fig.legends for t in leg.get_texts()]


def _colourbar_labels(fig):
    # colour bars are extra axes whose x or y label is set
    return [a.get_ylabel() or a.get_xlabel() for a in fig.axes if hasattr(a, "_colorbar")]


# ------------------------------------------------------------------ regime maps


def _make_map(family, method, axes, K, regime, failed, predicted=None, boundaries=(), fixed=None):
    """A `RegimeMap` built by hand from per-init codes (no solve): failed inits get the
    sweep's FAILED code and the per-cell fields come from `basin_fractions`."""
    from jaxattn.dynamics import FAILED, RegimeMap, basin_fractions

    regime = np.where(failed, FAILED, regime)
    fractions, failed_fraction, dominant, multistable = basin_fractions(regime)
    return RegimeMap(
        family=family,
        method=method,
        kernel="lsa",
        axes=axes,
        fixed=fixed or {},
        inits=K,
        regime=regime,
        failed=failed,
        fractions=fractions,
        failed_fraction=failed_fraction,
        dominant=dominant,
        multistable=multistable,
        predicted=predicted,
        boundaries=list(boundaries),
    )


def _map_2d(nx=7, ny=5, K=4):
    a = np.linspace(-1.0, 1.0, nx)
    b = np.linspace(0.0, 2.0, ny)
    A, _ = np.meshgrid(a, b, indexing="ij")
    reg = np.where(A > 0, CODE["rotating"], CODE["interior"])[..., None] * np.ones(K, int)
    reg[nx // 2, :, : K // 2] = CODE["oscillation"]  # a split column: multistable
    failed = np.zeros(reg.shape, bool)
    failed[0, -1] = True  # one cell where every init failed
    pred = np.where(A > 0, CODE["clustering"], CODE["oscillation"])
    pred[:, 0] = -1  # no claim on the bottom row
    bnd = [dict(label="a = 0 (stated)", x=np.array([0.0, 0.0]), y=np.array([0.0, 2.0]))]
    return _make_map(
        "rotating", "ott_antonsen", (("a", a), ("b", b)), K, reg, failed, pred, bnd, {"beta": 1.0}
    )


def test_cell_edges_are_midpoints_and_half_spacings():
    from jaxattn.plot._regime_map import cell_edges

    np.testing.assert_allclose(cell_edges([0.0, 1.0, 3.0]), [-0.5, 0.5, 2.0, 4.0])
    np.testing.assert_allclose(cell_edges([2.0]), [1.5, 2.5])
    with pytest.raises(ValueError, match="increasing"):
        cell_edges([1.0, 0.0])


def test_plot_regime_map_2d_labels_legend_and_cell_alignment():
    from jaxattn.plot import plot_regime_map

    m = _map_2d()
    ax = plot_regime_map(m)
    fig = ax.figure
    assert ax.get_xlabel() == "a" and ax.get_ylabel() == "b"
    assert "rotating" in ax.get_title() and "K = 4" in ax.get_title()
    texts = _legend_texts(ax)
    for name in NAMES:  # the key names every regime, drawn or not
        assert name in texts
    assert "failed (every init)" in texts
    assert "a = 0 (stated)" in texts
    # disagreements, counted independently: claim made, some init not failed, and the
    # dominant regime differs (a clustering claim is met by rotating)
    dom, pred = m.dominant, m.predicted
    expect = (pred >= 0) & (dom >= 0) & (dom != pred)
    expect &= ~((pred == CODE["clustering"]) & (dom == CODE["rotating"]))
    assert any(
        t.startswith(
            f"disagrees with theory ({int(expect.sum())} of {int((pred >= 0).sum())} claimed"
        )
        for t in texts
    )
    assert any(
        t.startswith(f"multistable: no regime ≥ 90% ({int(m.multistable.sum())} ") for t in texts
    )
    assert int(expect.sum()) > 0 and int(m.multistable.sum()) > 0
    assert int(m.disagreements().sum()) == int(expect.sum())
    # the same fields without the class (no disagreements() method): the plot's own rule
    bare = types.SimpleNamespace(**{f.name: getattr(m, f.name) for f in dataclasses.fields(m)})
    assert f"disagrees with theory ({int(expect.sum())} of" in " ".join(
        _legend_texts(plot_regime_map(bare))
    )
    # the shading is read by a labelled colour bar
    assert any("share of the 4 inits" in lab for lab in _colourbar_labels(fig))
    # cells sit on their centres: the mesh edges are half a spacing around each centre
    mesh = ax.collections[0]
    coords = mesh.get_coordinates()  # (ny + 1, nx + 1, 2)
    (_, a), (_, b) = m.axes
    np.testing.assert_allclose(
        coords[0, :, 0],
        np.concatenate(
            [[a[0] - (a[1] - a[0]) / 2], (a[1:] + a[:-1]) / 2, [a[-1] + (a[-1] - a[-2]) / 2]]
        ),
    )
    np.testing.assert_allclose(coords[:, 0, 1][[0, -1]], [b[0] - 0.25, b[-1] + 0.25])
    # the failed cell has the failed colour, not the colour of undetermined
    from matplotlib.colors import to_rgba

    from jaxattn.plot._regime_map import FAILED_COLOUR, REGIME_COLOURS

    rgba = np.asarray(mesh.get_array()).reshape(len(b), len(a), 4)
    np.testing.assert_allclose(rgba[-1, 0], to_rgba(FAILED_COLOUR))
    assert FAILED_COLOUR != REGIME_COLOURS["undetermined"]
    # the legend sits outside the data area (hides no cell)
    fig.canvas.draw()
    leg_box = ax.get_legend().get_window_extent()
    assert leg_box.x0 >= ax.get_window_extent().x1


def test_plot_regime_map_1d_stacked_fractions():
    from jaxattn.plot import plot_regime_map

    rng = np.random.default_rng(0)
    a = np.linspace(-1.0, 1.0, 6)
    K = 5
    reg = rng.integers(0, len(NAMES), (len(a), K))
    failed = np.zeros(reg.shape, bool)
    failed[2, :2] = True
    m = _make_map(
        "case2",
        "particles",
        (("λ_max(V)", a),),
        K,
        reg,
        failed,
        np.full(len(a), CODE["clustering"]),
        [dict(label="λ_max(V) = 0 (stated)", x=np.array([0.0]), y=None)],
    )
    ax = plot_regime_map(m)
    assert ax.get_xlabel() == "λ_max(V)"
    assert ax.get_ylabel() == "fraction of the 5 inits"
    texts = _legend_texts(ax)
    assert set(NAMES) <= set(texts) and "failed inits" in texts
    assert "λ_max(V) = 0 (stated)" in texts
    # stacked bars: per cell the drawn heights add up to one (regimes + failed share)
    from matplotlib.patches import Rectangle

    bars = [p for p in ax.patches if isinstance(p, Rectangle)]
    tot = {}
    for p in bars:
        x = round(p.get_x() + p.get_width() / 2, 9)
        tot[x] = tot.get(x, 0.0) + p.get_height()
    np.testing.assert_allclose(sorted(tot), a, atol=1e-9)
    np.testing.assert_allclose(list(tot.values()), 1.0, atol=1e-12)


def test_plot_regime_map_refuses_mismatched_fields():
    from jaxattn.plot import plot_regime_map

    m = _map_2d()
    bad = dataclasses.replace(m, predicted=np.zeros((2, 2), int))
    with pytest.raises(ValueError, match="predicted has shape"):
        plot_regime_map(bad)


def test_importing_plot_modules_keeps_the_backend():
    """No plotting module switches the backend at import or when drawing (issue 14)."""
    import importlib
    import pkgutil

    import jaxattn.plot

    matplotlib.use("svg")
    try:
        for info in pkgutil.iter_modules(jaxattn.plot.__path__):
            importlib.reload(importlib.import_module(f"jaxattn.plot.{info.name}"))
        importlib.reload(jaxattn.plot)
        assert matplotlib.get_backend() == "svg"
        jaxattn.plot.plot_tokens(np.linspace(0, 1, 3), np.ones((3, 2, 2)) / np.sqrt(2))
        assert matplotlib.get_backend() == "svg"
    finally:
        matplotlib.use("Agg")


# ------------------------------------------------------------------ trajectory figures


def test_trajectory_figures_label_time_and_projection(tmp_path):
    import matplotlib.pyplot as plt

    from jaxattn.plot import (
        plot_order_parameter,
        plot_order_parameter_plane,
        plot_tokens,
        save_trajectory_figures,
    )

    ts = np.linspace(0.0, 10.0, 50)
    th = np.linspace(0, 2 * np.pi, 8, endpoint=False)[None] + 3.0 * ts[:, None]  # turning
    xs2 = np.stack([np.cos(th), np.sin(th)], -1)
    ax = plot_tokens(ts, xs2)
    assert ax.get_xlabel() == "t" and "unwrapped" in ax.get_ylabel()
    assert any("initial angle" in lab for lab in _colourbar_labels(ax.figure))
    # unwrapped: the angles climb by 3 rad per unit time, not folded into [0, 2π)
    assert ax.get_ylim()[1] > 25.0
    xs3 = np.concatenate([xs2, np.zeros(xs2.shape[:2] + (1,))], -1)
    ax = plot_tokens(ts, xs3)
    assert "principal plane" in ax.get_title()
    assert _colourbar_labels(ax.figure) == ["t"]
    axes = plot_order_parameter(ts, np.exp(1j * ts), projected=True)
    assert "principal plane" in axes[0].get_title()
    assert axes[0].get_ylabel() == r"$|R_2|$" and "unwrapped" in axes[1].get_ylabel()
    # a small orbit: the view zooms to it and says so
    R = -0.07j + 0.03 * np.exp(1j * ts)
    ax = plot_order_parameter_plane(R, ts=ts)
    assert "zoomed" in ax.get_title()
    assert ax.get_xlim()[1] - ax.get_xlim()[0] < 0.2
    assert set(_legend_texts(ax)) == {"start", "end"}
    assert "t" in _colourbar_labels(ax.figure)
    plt.close("all")
    paths = save_trajectory_figures(ts, xs3, tmp_path, title="x")
    assert [p.name for p in paths] == [
        "tokens.png",
        "order_parameter.png",
        "order_parameter_plane.png",
    ]
    assert all(p.stat().st_size > 5000 for p in paths)


# ------------------------------------------------------------------ audit figures


def test_audit_figures_label_every_log_panel_and_heads():
    from jaxattn.plot._audits import (
        plot_order_parameter,
        plot_order_parameter_over_training,
        plot_singular_spectra,
    )

    rng = np.random.default_rng(0)
    # narrow ranges (less than a decade) on three panels: each must still carry tick labels
    values = {
        "A": 1e-3 * (1 + 0.2 * rng.random((6, 3))),
        "A_LM": 1e-6 * (1 + 0.5 * rng.random((6, 3))),
        "A_P": 2e-2 * (1 + 0.1 * rng.random((6, 3))),
        "G_LM": 10.0 ** rng.uniform(-8, -2, (6, 3)),
    }
    fig = plot_order_parameter(values, title="order")
    fig.canvas.draw()
    for ax in fig.axes:
        lo, hi = ax.get_ylim()
        shown = [
            t.get_text()
            for t in ax.get_yticklabels()
            if t.get_text() and lo <= t.get_position()[1] <= hi
        ]
        assert len(shown) >= 2, (ax.get_title(), shown)
        assert ax.get_ylabel() and ax.get_xlabel() == "layer"
    fig = plot_order_parameter_over_training(
        [0, 10, 20], {"lr 1e-3": {"A": 1e-3 * np.ones((3, 2)) + 1e-4, "G_LM": np.ones((3, 2))}}
    )
    assert "lr 1e-3" in _fig_legend_texts(fig)
    s = np.sort(rng.random((2, 4, 8)), -1)[..., ::-1]
    fig = plot_singular_spectra(s, rtol=1e-6)
    assert "head" in _colourbar_labels(fig)
    assert "rank threshold" in _legend_texts(fig.axes[0])


# ------------------------------------------------------------------ atlas figures


@pytest.fixture
def keep_figure(monkeypatch):
    import jaxattn.plot._atlas as P

    monkeypatch.setattr(P, "_save", lambda fig, path: fig)
    return P


def _atlas_map(nx=6, ny=5):
    x = np.linspace(-2, 2, nx)
    y = np.linspace(-1, 1, ny)
    measured = np.where(x[None] > 0, CODE["clustering"], CODE["interior"]) * np.ones((ny, 1), int)
    failed = np.zeros((ny, nx), bool)
    failed[0, 0] = True
    disagree = np.zeros((ny, nx), bool)
    disagree[2, 3] = True
    return dict(
        title="Case 2: A = I",
        x=x,
        y=y,
        measured=measured,
        failed=failed,
        disagree=disagree,
        claimed=12,
        short="Case 2",
        xlabel="λ₁",
        ylabel="λ₂",
        boundaries=[(np.zeros(2), np.array([-1.0, 1.0]), "λ₁ = 0 (stated)")],
    )


def test_atlas_regime_maps_share_one_outside_legend(keep_figure):
    fig = keep_figure.plot_regime_maps([_atlas_map(), _atlas_map()], "unused.png")
    texts = _fig_legend_texts(fig)
    assert set(NAMES) <= set(texts) and "failed solve" in texts
    assert "λ₁ = 0 (stated)" in texts
    assert any(t.startswith("disagrees with theory") and "Case 2: 1/12" in t for t in texts)
    panels = [a for a in fig.axes if a.get_xlabel()]
    assert [a.get_ylabel() for a in panels] == ["λ₂", "λ₂"]
    # labels do not collide: each panel's y label lies right of the previous panel
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    left = panels[0].get_tightbbox(r)
    lab = panels[1].yaxis.label.get_window_extent(r)
    assert lab.x0 > panels[0].get_window_extent().x1 and left.x1 <= lab.x0 + 1


def test_atlas_cases_bifurcation_portrait_search(keep_figure):
    P = keep_figure
    ts = np.linspace(0, 10, 30)
    R = 0.1 + 0.8 * (1 - np.exp(-ts)) * np.exp(1j * ts)
    case = dict(
        title="case1",
        **{
            m: dict(ts=ts, R2=R, label="rotating")
            for m in ("particles", "watanabe_strogatz", "ott_antonsen")
        },
    )
    fig = P.plot_cases([case, case], "u.png")
    assert {"particles", "Watanabe–Strogatz (WS)", "Ott–Antonsen (OA)", "R₂(0)"} <= set(
        _fig_legend_texts(fig)
    )
    assert fig.axes[0].get_xlabel() == "Re R₂" and fig.axes[0].get_ylabel() == "Im R₂"

    fixed = [
        (p, np.exp(1j * a), kind, True)
        for p in (1.2, 1.5)
        for a, kind in ((0.3, "sink"), (np.pi - 0.3, "source"))
    ]
    fixed.append((0.0, 0.2j, "centre", False))
    diagram = dict(
        fixed=fixed,
        p_orbit=np.array([-0.5, 0.5]),
        orbit_abs_lo=np.array([0.1, 0.1]),
        orbit_abs_hi=np.array([0.5, 0.5]),
        folds=[1.0],
        xlabel="v11",
        title="t",
    )
    fig = P.plot_bifurcation(diagram, "u.png")
    ax, bx = fig.axes[:2]
    assert ax.get_ylabel() == "arg R₂ / π" and bx.get_ylabel() == "|R₂|"
    texts = _fig_legend_texts(fig)
    assert {"sink", "source", "centre", "saddle-node (bisection)"} <= set(texts)
    # the sink and the source at one parameter are apart in arg R₂ (the drawn coordinate)
    ys = np.concatenate([c.get_offsets()[:, 1] for c in ax.collections])
    assert len(np.unique(np.round(ys, 6))) >= 3

    X, Y = np.meshgrid(np.linspace(-0.9, 0.9, 20), np.linspace(-0.9, 0.9, 20))
    fig = P.plot_phase_portrait(
        [dict(title="v11 = 0.2", grid=(X, Y, X**2 + Y**2), orbits=[0.3 * np.exp(1j * ts)])], "u.png"
    )
    assert {"OA orbit", "|R₂| = 1"} <= set(_fig_legend_texts(fig))

    fig = P.plot_search(
        dict(
            path=np.array([[-1.0, -0.5], [-0.5, 0.1]]),
            score=[0.2, 0.99],
            threshold=0.99,
            map=_atlas_map(),
        ),
        "u.png",
    )
    ax, bx = fig.axes[:2]
    assert {"Adam steps", "end point", "λ₁ = 0 (stated)"} <= set(_legend_texts(ax))
    assert bx.get_xlabel() == "Adam step" and "target" in _legend_texts(bx)


def test_atlas_high_d_and_glm_show_the_evidence(keep_figure):
    P = keep_figure
    ts = np.linspace(0, 100, 40)
    runs = []
    for case, reg, gap, mot in (
        ("case1", "clustering", 1e-9, 1e-8),
        ("case3-rotating", "rotating", 1e-9, 0.3),
        ("case4-oscillating", "oscillation", 0.9, 0.1),
    ):
        for kernel in ("lsa", "usa"):
            runs.append(
                dict(
                    case=case,
                    kernel=kernel,
                    ts=ts,
                    order=0.1 + 0.01 * np.sin(ts),
                    regime=reg,
                    final_gap=gap,
                    final_motion=mot,
                    rotation_rate=0.0,
                    period=float("nan"),
                )
            )
    fig = P.plot_high_d(runs, "u.png", title="d = 100")
    texts = _fig_legend_texts(fig)
    assert {"LSA kernel", "USA kernel", "measured: rotating", "measured: oscillation"} <= set(texts)
    ev = [a for a in fig.axes if a.get_xscale() == "log"][0]
    assert "gap" in ev.get_xlabel() and "motion" in ev.get_ylabel()
    top = fig.axes[0]
    assert "LSA: clustering" in top.get_title() and top.get_ylabel().startswith("ρ")
    # the flat-looking oscillation gets its own y range
    assert fig.axes[2].get_ylim()[1] - fig.axes[2].get_ylim()[0] < 0.1
    # two kernels of one case close together: the higher point's label above it, the
    # lower's below, whichever kernel is higher (fixed offsets per kernel crossed them)
    runs[5]["final_motion"] = 0.2  # case4-oscillating: USA above LSA (0.1)
    ev = [a for a in P.plot_high_d(runs, "v.png").axes if a.get_xscale() == "log"][0]
    offsets = {t.get_text(): t.xyann[1] for t in ev.texts}
    assert offsets["case4-oscillating (USA)"] > 0 > offsets["case4-oscillating (LSA)"]

    table = [
        dict(
            layer=layer,
            head=h,
            sigma_max=10.0 + h,
            lsa_regime="clustering",
            usa_regime="rotating" if h % 2 else "undetermined",
            lsa_final_order=0.999,
            usa_final_order=0.5,
            lsa_time_to_order=3.0 + h,
            usa_time_to_order=float("nan"),
        )
        for layer in (0, 4)
        for h in range(4)
    ]
    fig = P.plot_glm(table, "u.png")
    texts = _fig_legend_texts(fig)
    assert {"LSA", "USA", "clustering", "rotating", "undetermined"} <= set(texts)
    labels = [a.get_ylabel() for a in fig.axes if a.get_ylabel()]
    assert labels[0] == "σ_max(G_LM)" and labels[1].startswith("1 − final order ρ")
    assert labels[2] == "time to ρ ≥ 0.99"
    assert [a.get_title() for a in fig.axes[:2]] == ["layer 0", "layer 4"]


def test_regime_map_summary_compares_only_decided_cells():
    # Failed and undetermined cells neither agree nor disagree with a stated claim: the
    # summary says how many claimed cells were compared at all.
    m = _map_2d()
    s = m.summary()
    dom, pred = m.dominant, m.predicted
    decided = (dom >= 0) & (dom != CODE["undetermined"])
    assert s["cells_compared"] == int(((pred >= 0) & decided).sum())
    assert s["cells_compared"] < s["cells_with_claim"] == int((pred >= 0).sum())
    assert s["disagreements"] == int(m.disagreements().sum()) <= s["cells_compared"]
