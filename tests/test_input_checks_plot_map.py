"""Bad input to the regime map (a family's predictions, `basin_fractions`) and to the
figures of `jaxattn.plot` is refused by name, before any work is lost or figure is left
open. Inputs are built by hand and tiny; the regime map's sweep is never run."""

import warnings

import matplotlib
import numpy as np
import pytest

import jaxattn.dynamics as jd
from jaxattn import plot as jplot
from jaxattn.dynamics import FAILED, NOT_RUN, REGIME_NAMES, Family, basin_fractions
from jaxattn.dynamics import _regime_map as rm

CODE = {n: i for i, n in enumerate(REGIME_NAMES)}
TOP = len(REGIME_NAMES) - 1


@pytest.fixture(autouse=True)
def agg():
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.close("all")
    yield
    plt.close("all")


def _open_figures():
    import matplotlib.pyplot as plt

    return plt.get_fignums()


# ------------------------------------------------------------------ regime_map predictions


def _family(predict, build=None):
    build = build or (lambda a: (np.eye(2), a * np.eye(2), 1.0))
    return Family("m", "d", dict(a=1.0), build, predict)


@pytest.fixture
def no_sweep(monkeypatch):
    """`regime_map`'s sweep: any call fails the test (the predictions are checked first)."""

    def fail(*args, **kwargs):
        raise AssertionError("the sweep ran before the predictions were checked")

    monkeypatch.setattr(rm, "sweep", fail)


KW = dict(method="ott_antonsen", inits=1, t1=5.0, num_save=21, progress=False)


@pytest.mark.parametrize(
    "predict, match",
    [
        (
            lambda A, V, b: np.zeros(5, int),
            r"regime_map: the predict of family 'm' returned shape \(5,\) for 2 members; "
            r"expected \(2,\), one regime code per member\.",
        ),
        (lambda A, V, b: 0, r"family 'm' returned shape \(\) for 2 members"),
        (lambda A, V, b: np.zeros((2, 1), int), r"returned shape \(2, 1\) for 2 members"),
        (
            lambda A, V, b: np.full(len(b), 7),
            rf"regime_map: the codes returned by the predict of family 'm' must be whole "
            rf"numbers in -1\.\.{TOP} \(0\.\.{TOP}: the regimes .*; -1: no claim\), got \[7\]\.",
        ),
        (lambda A, V, b: np.array([0, -2]), r"must be whole numbers in -1\.\..*got \[-2\]"),
        (lambda A, V, b: np.array([0.5, 1.0]), r"must be whole numbers .*got \[0\.5\]"),
        (lambda A, V, b: np.array([np.nan, 1.0]), r"must be whole numbers .*got \[nan\]"),
    ],
)
def test_regime_map_refuses_bad_predictions_before_the_sweep(no_sweep, predict, match):
    with pytest.raises(ValueError, match=match):
        jd.regime_map(_family(predict), {"a": [0.5, 0.7]}, **KW)


def test_regime_map_refuses_bad_predict_dtype_and_predict_of_a_flow_module(no_sweep):
    with pytest.raises(TypeError, match="predict of family 'm' must be integer regime codes"):
        jd.regime_map(_family(lambda A, V, b: np.array(["a", "b"])), {"a": [0.5, 0.7]}, **KW)
    module = _family(
        lambda A, V, b: np.zeros(len(b), int),
        build=lambda a: jd.AttentionDynamics(np.eye(2), a * np.eye(2), beta=1.0),
    )
    with pytest.raises(ValueError, match="family 'm' has a predict .* a family of flow modules"):
        jd.regime_map(module, {"a": [0.5, 0.7]}, **KW)


def test_whole_float_predictions_are_codes():
    codes = rm._predict_at(
        "regime_map",
        "m",
        lambda a: (np.eye(2), a * np.eye(2), 1.0),
        lambda A, V, b: np.array([-1.0, 3.0]),
        {},
        [dict(a=0.5), dict(a=0.7)],
    )
    assert codes.dtype == np.int64 and codes.tolist() == [-1, 3]


# ------------------------------------------------------------------ basin_fractions


def test_basin_fractions_accepts_array_likes():
    got = basin_fractions([[0, 0, 1], [FAILED, NOT_RUN, 1]])
    want = basin_fractions(np.array([[0, 0, 1], [FAILED, NOT_RUN, 1]]))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    fractions, failed_fraction, dominant, multistable = got
    np.testing.assert_allclose(fractions.sum(-1) + failed_fraction, 1.0)
    assert dominant.tolist() == [CODE["clustering"], CODE["rotating"]]
    assert multistable.tolist() == [True, False]
    # whole floats are codes too; an empty grid of cells is an empty map
    np.testing.assert_array_equal(basin_fractions(np.array([[0.0, 0.0, 1.0]]))[0], got[0][:1])
    assert basin_fractions(np.zeros((0, 3), int))[0].shape == (0, len(REGIME_NAMES))


@pytest.mark.parametrize("bad", [99, np.nan, -5, 0.5, TOP + 1, NOT_RUN - 1])
def test_basin_fractions_refuses_unknown_codes(bad):
    regime = np.array([[0, 1, bad]])  # integers, or floats with NaN or 0.5
    with pytest.raises(
        ValueError,
        match=rf"basin_fractions: the regime codes must be whole numbers in -2\.\.{TOP} "
        rf"\(0\.\.{TOP}: the regimes .*; -1: FAILED, -2: NOT_RUN\), got \[{bad}\]\.",
    ):
        basin_fractions(regime)


def test_basin_fractions_refuses_no_inits_0d_and_non_numbers():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # refused before NumPy warns of empty means
        with pytest.raises(
            ValueError, match=r"basin_fractions: regime has shape \(3, 0\): no inits per cell"
        ):
            basin_fractions(np.zeros((3, 0), int))
    with pytest.raises(ValueError, match=r"basin_fractions: regime must have shape cells \+ \(K,"):
        basin_fractions(np.array(1))
    with pytest.raises(TypeError, match="basin_fractions: the regime codes must be integer"):
        basin_fractions(np.array([[True, False]]))


# ------------------------------------------------------------------ trajectory figures


def _tokens(times=3, n=4, d=2):
    th = np.linspace(0, 2 * np.pi, n, endpoint=False)[None] + np.arange(times)[:, None]
    xs = np.stack([np.cos(th), np.sin(th)], -1)
    return np.concatenate([xs, np.zeros((times, n, d - 2))], -1)


XS_SHAPE = r"xs must have shape \(times, n, d\) with times >= 1, n >= 1 tokens and d >= 2"


@pytest.mark.parametrize(
    "ts, xs, error, match",
    [
        (
            np.zeros(0),
            np.zeros((0, 4, 2)),
            ValueError,
            rf"plot_tokens: {XS_SHAPE}, got \(0, 4, 2\)",
        ),
        (np.arange(3.0), np.ones((3, 4)), ValueError, rf"plot_tokens: {XS_SHAPE}, got \(3, 4\)"),
        (np.arange(3.0), np.ones((3, 4, 1)), ValueError, rf"{XS_SHAPE}, got \(3, 4, 1\)"),
        (np.arange(3.0), np.ones((3, 0, 2)), ValueError, rf"{XS_SHAPE}, got \(3, 0, 2\)"),
        (
            np.arange(2.0),
            _tokens(),
            ValueError,
            r"plot_tokens: ts must have shape \(times,\) = \(3,\), one time per save of xs, "
            r"got \(2,\)\.",
        ),
        (np.ones((3, 1)), _tokens(), ValueError, r"ts must have shape .* got \(3, 1\)"),
        (
            np.arange(3.0),
            _tokens() + 0j,
            ValueError,
            r"plot_tokens: xs must be real, got complex values \(complex128\)\.",
        ),
        (np.arange(3.0), np.full((3, 4, 2), "a"), TypeError, "xs must be an array of real numbers"),
    ],
)
def test_plot_tokens_refuses_bad_input(ts, xs, error, match):
    with pytest.raises(error, match=match):
        jplot.plot_tokens(ts, xs)
    assert _open_figures() == []  # refused before a figure is made


@pytest.mark.parametrize("d", [2, 3])
def test_plot_tokens_draws_a_single_save_time_without_warnings(d):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ax = jplot.plot_tokens(np.array([2.0]), _tokens(1, 4, d))
    if d == 2:
        lo, hi = ax.get_xlim()
        assert lo < 2.0 < hi
        assert len(ax.collections[-1].get_offsets()) == 4  # the tokens, as points


def test_order_parameter_figures_refuse_bad_series():
    with pytest.raises(
        ValueError,
        match=r"plot_order_parameter_plane: R2 must have shape \(times,\) with times >= 1, "
        r"got \(0,\)\.",
    ):
        jplot.plot_order_parameter_plane(np.zeros(0, complex))
    with pytest.raises(
        ValueError,
        match=r"plot_order_parameter_plane: ts must have shape \(times,\) = \(3,\), one time "
        r"per save of R2, got \(5,\)\.",
    ):
        jplot.plot_order_parameter_plane(np.ones(3, complex), ts=np.arange(5.0))
    with pytest.raises(ValueError, match=r"plot_order_parameter: ts must have shape .*got \(2,\)"):
        jplot.plot_order_parameter(np.arange(2.0), np.ones(3, complex))
    assert _open_figures() == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jplot.plot_order_parameter_plane(np.ones(1, complex), ts=np.zeros(1))  # one save time
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # refused before NumPy warns of an empty mean
        with pytest.raises(
            ValueError,
            match=r"order_parameter_series: xs must have shape \(times, n, d\) with n >= 1 "
            r"tokens and d >= 2, got \(3, 0, 2\)\.",
        ):
            jplot.order_parameter_series(np.zeros((3, 0, 2)))
    assert jplot.order_parameter_series(np.zeros((0, 4, 2))).shape == (0,)


def test_save_trajectory_figures_validates_first_and_leaves_no_figure_open(tmp_path):
    out = tmp_path / "figs"
    with pytest.raises(ValueError, match=rf"save_trajectory_figures: {XS_SHAPE}, got \(0, 4, 2\)"):
        jplot.save_trajectory_figures(np.zeros(0), np.zeros((0, 4, 2)), out)
    with pytest.raises(ValueError, match=r"save_trajectory_figures: ts must have shape"):
        jplot.save_trajectory_figures(np.arange(2.0), _tokens(), out)
    assert _open_figures() == [] and not out.exists()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        paths = jplot.save_trajectory_figures(np.array([0.0]), _tokens(1, 4, 3), out)
    assert [p.name for p in paths] == [
        "tokens.png",
        "order_parameter.png",
        "order_parameter_plane.png",
    ]
    assert _open_figures() == []


# ------------------------------------------------------------------ regime-map figure


class _Map:
    """The fields `plot_regime_map` reads, by hand: a 1 × 2 map, K = 2."""

    def __init__(self, **edit):
        self.axes = (("a", np.array([0.0, 1.0])), ("b", np.array([0.0])))
        self.fractions = np.zeros((2, 1, len(REGIME_NAMES)))
        self.fractions[:, :, 0] = 1.0
        self.failed_fraction = np.zeros((2, 1))
        self.dominant = np.zeros((2, 1), int)
        self.multistable = np.zeros((2, 1), bool)
        self.inits = 2
        self.predicted = np.zeros((2, 1), int)
        self.boundaries = [dict(label="b", x=np.array([0.5, 0.5]), y=np.array([-0.5, 0.5]))]
        self.__dict__.update(edit)


@pytest.mark.parametrize(
    "edit, error, match",
    [
        (
            dict(predicted=np.array([[0], [TOP + 1]])),
            ValueError,
            rf"plot_regime_map: predicted holds codes outside -1\.\.{TOP} \(0\.\.{TOP}: the "
            rf"regimes .*; -1: no claim\): \[{TOP + 1}\]\.",
        ),
        (dict(predicted=np.array([[0], [-3]])), ValueError, r"predicted holds codes .*: \[-3\]"),
        (
            dict(dominant=np.array([[0], [17]])),
            ValueError,
            r"plot_regime_map: dominant holds codes outside .*-1: every init failed\): \[17\]\.",
        ),
        (dict(dominant=np.array([[0], [-2]])), ValueError, r"dominant holds codes .*: \[-2\]"),
        (dict(dominant=np.array([[0.0], [0.5]])), ValueError, r"dominant holds .*: \[0\.5\]"),
        (dict(dominant=np.array([["a"], ["b"]])), TypeError, "dominant must hold integer"),
        (
            dict(boundaries=[dict(label="b", y=[0.0, 1.0])]),
            ValueError,
            r"plot_regime_map: boundaries\[0\] must be a dict\(label, x, y\) with the "
            r"boundary's x \(and y, or None\), got a dict with keys \['label', 'y'\]\.",
        ),
        (dict(boundaries=[(0.0, 1.0)]), ValueError, r"boundaries\[0\] must be a dict.*got \(0"),
        (
            dict(boundaries=[dict(x=[0.0, 1.0], y=[0.0])]),
            ValueError,
            r"plot_regime_map: boundaries\[0\]\['y'\] must be None or real numbers of the "
            r"shape of its x \(2,\), got float64 of shape \(1,\)\.",
        ),
    ],
)
def test_plot_regime_map_refuses_bad_codes_and_boundaries(edit, error, match):
    jplot.plot_regime_map(_Map())  # the map as built draws
    with pytest.raises(error, match=match):
        jplot.plot_regime_map(_Map(**edit))


# ------------------------------------------------------------------ chaos figure


def _section(**edit):
    rng = np.random.default_rng(0)
    times = np.linspace(1.0, 10.0, 6)
    section = dict(
        ts=np.linspace(0, 5, 20),
        theta=rng.uniform(-np.pi, np.pi, (20, 3)),
        poincare=rng.uniform(-np.pi, np.pi, (4, 2)),
        section="θ₁ ≡ 0 (mod 2π)",
        times=times,
        history=np.stack([0.2 + 1 / times, 0.1 / times, -3.8 - 1 / times], -1),
        exponents=np.array([[0.21, 0.001, -3.81]]),
        uncertainty=np.array([[0.01, 0.005, 0.02]]),
    )
    return {**section, **edit}


@pytest.mark.parametrize(
    "edit, match",
    [
        (
            dict(history=np.linspace(0, 1, 6)),
            r"plot_chaos: history must have shape \(num_renorm, k\), got \(6,\)\.",
        ),
        (
            dict(exponents=np.array([0.2, 0.0])),
            r"plot_chaos: exponents must have shape \(K, k\) or \(k,\) with K >= 1 and the "
            r"k = 3 exponents of history, got \(2,\)\.",
        ),
        (dict(uncertainty=np.zeros((1, 2))), r"uncertainty must have shape .*got \(1, 2\)"),
        (dict(exponents=np.zeros((0, 3))), r"exponents must have shape .*got \(0, 3\)"),
        (
            dict(times=np.linspace(1, 10, 5)),
            r"plot_chaos: times must have shape \(num_renorm,\) = \(6,\), one time per row of "
            r"history, got \(5,\)\.",
        ),
        (
            dict(ts=np.linspace(0, 5, 19)),
            r"plot_chaos: ts must have shape \(times,\) = \(20,\), one time per row of theta, "
            r"got \(19,\)\.",
        ),
        (
            dict(poincare=np.zeros(5)),
            r"plot_chaos: poincare must have shape \(m, 2\), got \(5,\)\.",
        ),
        (dict(poincare=np.zeros((3, 3))), r"poincare must have shape \(m, 2\), got \(3, 3\)"),
    ],
)
def test_plot_chaos_refuses_mismatched_arrays(edit, match):
    from jaxattn.plot import plot_chaos

    with pytest.raises(ValueError, match=match):
        plot_chaos(_section(**edit))
    assert _open_figures() == []


def test_plot_chaos_draws_a_section_without_crossings():
    from jaxattn.plot import plot_chaos

    for poincare in (np.zeros((0, 2)), []):
        fig = plot_chaos(_section(poincare=poincare, exponents=np.array([0.21, 0.001, -3.81])))
        assert [t.get_text() for t in fig.axes[1].get_legend().get_texts()] == ["0 crossings"]


def test_regime_map_refuses_a_fractional_number_of_inits():
    # 1.5 inits used to run as 1 (int() truncated it)
    for inits in (1.5, True, 0):
        with pytest.raises(ValueError, match="regime_map: inits must be an integer >= 1"):
            jd.regime_map("case4", {"v11": [0.2, 0.4]}, inits=inits, method="ott_antonsen")


def test_regime_map_names_a_family_whose_d_changes_across_the_map():
    fam = Family(
        "grow",
        "d = 2 or 4",
        dict(a=1.0),
        lambda a: (np.eye(2 if a < 1 else 4), np.eye(2 if a < 1 else 4), 1.0),
        None,
    )
    with pytest.raises(ValueError, match=r"family 'grow' returned A of shape \(2, 2\) at"):
        jd.regime_map(fam, {"a": [0.5, 1.5]}, inits=1, method="particles", progress=False)


def test_plots_and_cross_ratio_name_an_argument_of_the_wrong_kind():
    with pytest.raises(TypeError, match="plot_regime_map: regime_map must be a RegimeMap"):
        jplot.plot_regime_map({"a": 1})
    with pytest.raises(TypeError, match="plot_twirl: audit must be a TwirlAudit, got NoneType"):
        jplot.plot_twirl(None)
    with pytest.raises(TypeError, match="plot_concentration: audit must be a Concentration"):
        jplot.plot_concentration(object())
    with pytest.raises(TypeError, match="plot_contraction: audit must be a ContractionAudit"):
        jplot.plot_contraction(None)
    from types import SimpleNamespace

    for norm, bound in (
        (np.ones(3), np.ones(3)),
        (np.ones((0, 3)),) * 2,
        (np.ones((2, 3)), np.ones((1, 3))),
    ):
        with pytest.raises(ValueError, match=r"plot_contraction: audit.norm and audit.produc"):
            jplot.plot_contraction(SimpleNamespace(norm=norm, product_bound=bound))
    assert _open_figures() == []


@pytest.mark.parametrize(
    "runs, error, match",
    [
        ([1, 2], TypeError, "runs must map a label to a run .* got list"),
        ({}, ValueError, "runs is empty"),
        ({"a": [0, 1]}, TypeError, "run 'a' must be a dict of sequences, got list"),
        ({"a": {"loss": [1.0]}}, ValueError, "run 'a' has no 'steps'"),
        ({"a": {"steps": 3}}, ValueError, r"'steps' must be a sequence of numbers, got shape \(\)"),
        (
            {"a": {"steps": [0, 5], "loss": [1.0]}},
            ValueError,
            r"run 'a': 'loss' has shape \(1,\), its 'steps' \(2,\); give one number per step",
        ),
        # (helper-25: a ZeroDivisionError, matplotlib's and NumPy's errors)
        ({"a": {"steps": [1, 2], "note": "x"}}, ValueError, "no run has a quantity to plot"),
        ({"a": {"steps": [1, 2], "loss": None}}, ValueError, r"'loss' has shape \(\), its"),
        ({"a": {"steps": [1, 2], "loss": ["a", "b"]}}, ValueError, "'loss' must be a sequenc"),
        ({"a": {"steps": [[1], [2, 3]]}}, ValueError, "'steps' must be a sequence of numbers"),
    ],
)
def test_plot_mechanism_over_training_names_a_bad_run(runs, error, match):
    with pytest.raises(error, match=match):
        jplot.plot_mechanism_over_training(runs)
    assert _open_figures() == []


def test_plots_refuse_save_times_that_are_not_finite():
    ts = np.array([0.0, np.nan, 2.0])
    with pytest.raises(ValueError, match=r"plot_tokens: ts must be finite save times, got nan at"):
        jplot.plot_tokens(ts, _tokens())
    with pytest.raises(ValueError, match="plot_order_parameter: ts must be finite save times"):
        jplot.plot_order_parameter(ts, np.full(3, 0.5 + 0j))
    assert _open_figures() == []


def test_plot_tokens_refuses_tokens_with_nothing_finite():
    xs = np.full((3, 4, 2), np.nan)
    with pytest.raises(ValueError, match="plot_tokens: xs holds no finite value"):
        jplot.plot_tokens(np.arange(3.0), xs)
    assert _open_figures() == []
    xs[0] = _tokens(1, 4, 2)[0]  # a solve that failed after its first save: drawn
    jplot.plot_tokens(np.arange(3.0), xs)
    with pytest.raises(ValueError, match="cross_ratio: z1 must hold numbers, got 'a'"):
        jd.cross_ratio("a", 2.0, 3.0, 4.0)
