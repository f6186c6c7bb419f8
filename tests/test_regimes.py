"""Regime classification: closed-form R₂ series, particle runs of the presets, traps."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxattn.dynamics import RESULTS, AttentionDynamics, Trajectory, simulate
from jaxattn.dynamics._circle import angles_from_tokens, order_parameter
from jaxattn.dynamics._presets import PRESETS
from jaxattn.dynamics._regimes import (
    REGIMES,
    classify_order_parameter,
    classify_regime,
    classify_tokens,
    cluster_structure,
    clustering_gap,
    decision_margin,
    default_gap_floor,
    regime_name,
)
from jaxattn.sphere import sample_uniform

_classify_R2_batch = jax.jit(jax.vmap(classify_order_parameter))
_classify_batch = jax.jit(jax.vmap(classify_regime))


def _series():
    """Closed-form R₂(t) for each regime and for the traps, on t ∈ [0, 100]."""
    t = jnp.linspace(0.0, 100.0, 1001)
    e = lambda phase: jnp.exp(1j * phase)
    cases = {
        "clustering": (1 - 0.5 * jnp.exp(-0.1 * t)) * e(0.3),
        "rotating": (1 - 0.5 * jnp.exp(-0.3 * t)) * e(1.3 * t),
        # rotation at a non-uniform speed (as in Case 3): still Type 2
        "rotating-nonuniform": (1 - 0.5 * jnp.exp(-0.3 * t)) * e(1.3 * t + 0.5 * jnp.sin(1.3 * t)),
        "oscillation": 0.3 + 0.2 * e(2 * jnp.pi * t / 5),
        "interior": 0.4 + 0.3 * jnp.exp(-0.3 * t) * e(t),
        # traps: algebraic convergence (saddle-node), a plateau left late, damped oscillation
        "algebraic": (1 - 1 / (1 + t) ** 2) * e(0.2),
        "plateau": (0.5 + 0.5 * jax.nn.sigmoid(t - 90.0)) * e(0.1),
        "damped": 0.3 + 0.2 * jnp.exp(-0.02 * t) * e(2 * jnp.pi * t / 5),
    }
    expected = {
        "clustering": "clustering",
        "rotating": "rotating",
        "rotating-nonuniform": "rotating",
        "oscillation": "oscillation",
        "interior": "interior",
        "algebraic": "undetermined",
        "plateau": "undetermined",
        "damped": "undetermined",
    }
    names = list(cases)
    R = jnp.stack([cases[k].astype(jnp.complex128) for k in names])
    return names, jnp.broadcast_to(t, R.shape), R, expected


def test_closed_form_series_vmapped():
    names, ts, R, expected = _series()
    regimes, ev = _classify_R2_batch(ts, R)
    got = regime_name(regimes)
    for i, name in enumerate(names):
        assert got[i] == expected[name], (name, got[i], jax.tree.map(lambda a: a[i], ev).as_dict())
    i = names.index("rotating")
    np.testing.assert_allclose(ev.drift_rate[i], 1.3, rtol=1e-6)
    np.testing.assert_allclose(ev.rotation_rate[i], 0.65, rtol=1e-6)
    i = names.index("oscillation")
    np.testing.assert_allclose(ev.period[i], 5.0, rtol=1e-3)
    np.testing.assert_allclose(ev.amplitude[i], 0.2, rtol=1e-3)
    i = names.index("clustering")
    np.testing.assert_allclose(ev.final_order[i], 1 - 0.5 * np.exp(-10.0), rtol=1e-12)
    # gap = 1 - |R|² ≈ e^{-0.1 t}: 0.1 × (distance of the thirds' centres) e-folds, steady rate
    np.testing.assert_allclose(ev.gap_decay[i], 0.1 * (2 / 3) * 50, rtol=2e-2)
    assert abs(ev.gap_rate_ratio[i] - 1) < 1e-3
    i = names.index("algebraic")
    assert ev.gap_rate_ratio[i] < 0.9  # the rate slows down: not geometric
    # plain call equals the vmapped call
    single, ev0 = classify_order_parameter(ts[0], R[0])
    assert single == REGIMES.clustering
    np.testing.assert_allclose(ev0.final_order, ev.final_order[0], rtol=1e-14)


def test_order_parameter_bad_input():
    t = jnp.linspace(0.0, 1.0, 20)
    with pytest.raises(ValueError, match="equal length"):
        classify_order_parameter(t, jnp.ones(19, complex))
    with pytest.raises(ValueError, match="need at least 9"):
        classify_order_parameter(t, jnp.ones(20, complex), window=0.2)
    with pytest.raises(ValueError, match="expected a Trajectory"):
        classify_regime(np.zeros((20, 3, 2)))
    # R₂ is complex and a mean of unit phasors: a real series or |R₂| > 1 is refused, with
    # the save where it happens; |R₂| = 1 (a cluster) and solver noise just above it are not.
    with pytest.raises(ValueError, match="must be complex"):
        classify_order_parameter(t, jnp.ones(20))
    R = jnp.full(20, 0.5 + 0j).at[13].set(1.5j)
    with pytest.raises(ValueError, match=r"\|R₂\| = 1.5 > 1 at save 13"):
        classify_order_parameter(t, R)
    regime, _ = classify_order_parameter(t, jnp.full(20, 1 + 1e-9 + 0j))
    assert regime == REGIMES.clustering
    # a token of zero norm is not a point of the sphere
    xs = jnp.tile(jnp.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]]), (20, 1, 1))
    with pytest.raises(ValueError, match="token 1 has zero norm at save 4"):
        classify_tokens(t, xs.at[4, 1].set(0.0))
    # settings are refused by name, as the sweep refuses them; so is an empty series
    for kw, word in ((dict(gap_floor=-1.0), "gap_floor"), (dict(rest_tol=np.nan), "rest_tol")):
        with pytest.raises(ValueError, match=f"classify_order_parameter: {word} must be"):
            classify_order_parameter(t, jnp.full(20, 0.5 + 0j), **kw)
        with pytest.raises(ValueError, match=f"classify_tokens: {word} must be"):
            classify_tokens(t, xs, **kw)
    with pytest.raises(ValueError, match="classify_order_parameter: the late window holds 0"):
        classify_order_parameter(jnp.zeros(0), jnp.zeros(0, complex))


def test_clustering_gap_is_one_minus_R2_squared_in_d2(getkey):
    x = sample_uniform(getkey(), 50, 2)
    R = order_parameter(angles_from_tokens(x), 2)
    np.testing.assert_allclose(clustering_gap(x), 1 - jnp.abs(R) ** 2, atol=1e-14)
    # zero on one antipodal pair, one for the isotropic state (d orthonormal directions)
    u = sample_uniform(getkey(), 1, 5)
    assert abs(float(clustering_gap(jnp.concatenate([u, -u, u])))) < 1e-14
    np.testing.assert_allclose(clustering_gap(jnp.eye(5)), 1.0, atol=1e-14)


def test_cluster_structure(getkey):
    u = sample_uniform(getkey(), 3, 3)
    noise = 1e-6 * jax.random.normal(getkey(), (12, 3))
    x = jnp.concatenate([jnp.tile(u[0], (4, 1)), jnp.tile(-u[0], (3, 1)), jnp.tile(u[1], (5, 1))])
    num, pairs = jax.jit(cluster_structure)(x + noise)
    assert int(num) == 3 and int(pairs) == 1


# ----------------------------------------------------------------------------- particles

_NAMES = list(PRESETS)
N = 16


def _particle_batch():
    """All d = 2 presets plus one member with a NaN matrix, in one compiled vmapped solve."""
    As = jnp.stack([jnp.asarray(PRESETS[k].A) for k in _NAMES] + [jnp.full((2, 2), jnp.nan)])
    Vs = jnp.stack([jnp.asarray(PRESETS[k].V) for k in _NAMES] + [jnp.eye(2)])
    x0 = sample_uniform(jax.random.key(0), N, 2)

    def run(A, V):
        return simulate(AttentionDynamics(A, V), x0, t1=150.0, num_save=1501, throw=False)

    return jax.jit(jax.vmap(run))(As, Vs)


@pytest.fixture(scope="module")
def particle_batch():
    return _particle_batch()


def test_presets_particles_vmapped(particle_batch):
    traj = particle_batch
    regimes, ev = _classify_batch(traj)
    got = regime_name(regimes)
    for i, name in enumerate(_NAMES):
        assert got[i] == PRESETS[name].expected, (name, jax.tree.map(lambda a: a[i], ev).as_dict())
    # the rejected member is reported, classified undetermined, and poisons nothing
    assert int(traj.result._value[-1]) == int(RESULTS.nonfinite_argument._value)
    assert got[-1] == "undetermined"
    for i, name in enumerate(_NAMES):
        if PRESETS[name].expected in ("clustering", "rotating"):
            assert int(ev.num_clusters[i]) == 2 and int(ev.antipodal_pairs[i]) == 1
    # d = 2 evidence agrees with R₂ computed directly from the angles
    i = _NAMES.index("case3-rotating")
    R = order_parameter(angles_from_tokens(traj.xs[i]), 2)
    _, ev_R = classify_order_parameter(traj.ts[i], R)
    np.testing.assert_allclose(ev.drift_rate[i], ev_R.drift_rate, rtol=1e-10)
    assert abs(float(ev.drift_rate[i])) > 0.1


def test_classify_twice_identical(particle_batch):
    one = jax.tree.map(lambda a: a[0], particle_batch)
    classify = jax.jit(classify_regime)
    r1, e1 = classify(one)
    r2, e2 = classify(one)
    assert r1 == r2
    for name in e1.__dataclass_fields__:
        np.testing.assert_array_equal(getattr(e1, name), getattr(e2, name))  # NaN == NaN here
    # and the member of the vmapped batch agrees with the solo classification
    rb, eb = _classify_batch(particle_batch)
    assert int(rb._value[0]) == int(r1._value)
    np.testing.assert_allclose(eb.final_gap[0], e1.final_gap, rtol=0, atol=1e-12)


def _trajectory(xs, ts):
    z = jnp.zeros((), jnp.int32)
    return Trajectory(
        ts=ts,
        xs=xs,
        result=RESULTS.successful,
        num_steps=z,
        num_accepted_steps=z,
        num_rejected_steps=z,
        sphere_deviation=jnp.zeros(()),
        initial_deviation=jnp.zeros(()),
    )


@pytest.mark.parametrize("d", [2, 3])
def test_gradient_finite_at_exact_consensus(getkey, d):
    ts = jnp.linspace(0.0, 10.0, 41)
    u = sample_uniform(getkey(), 1, d)[0]

    def evidence_sum(xs):
        regime, ev = classify_regime(_trajectory(xs, ts))
        floats = [
            getattr(ev, k)
            for k in ev.__dataclass_fields__
            if jnp.issubdtype(getattr(ev, k).dtype, jnp.floating)
        ]
        return sum(jnp.where(jnp.isfinite(f), f, 0.0) for f in floats)

    xs = jnp.broadcast_to(u, (41, 6, d))  # all tokens equal at all times
    g = jax.jit(jax.grad(evidence_sum))(xs)
    assert np.all(np.isfinite(g))
    regime, ev = jax.jit(classify_regime)(_trajectory(xs, ts))
    assert regime == REGIMES.clustering
    assert int(ev.num_clusters) == 1
    np.testing.assert_allclose(float(ev.final_order), 1.0, atol=1e-14)


@pytest.mark.slow
def test_high_d_block_embedding_keeps_regimes():
    # docs/theory: A = I ⊗ A₂, V = I ⊗ V₂ reproduces the d = 2 regimes in high dimension.
    d = 8
    names = ["case3-rotating", "case4-oscillating", "case4-clustering", "case2-interior"]
    As = jnp.stack([PRESETS[k].matrices(d, jnp.float64)[0] for k in names])
    Vs = jnp.stack([PRESETS[k].matrices(d, jnp.float64)[1] for k in names])
    x0 = sample_uniform(jax.random.key(1), 24, d)

    def run(A, V):
        return simulate(AttentionDynamics(A, V), x0, t1=150.0, num_save=1501, throw=False)

    regimes, ev = _classify_batch(jax.jit(jax.vmap(run))(As, Vs))
    got = regime_name(regimes)
    expected = ["rotating", "oscillation", "clustering", "interior"]
    for i, name in enumerate(names):
        assert got[i] == expected[i], (name, jax.tree.map(lambda a: a[i], ev).as_dict())


def _geometric_clustering():
    """R₂ with the gap exactly `0.5 e^{−0.1 t}` (geometric), on t ∈ [0, 100]: clustering,
    decided by the steady rate of the gap (its rate ratio is 1, 0.105 from 0.9)."""
    t = jnp.linspace(0.0, 100.0, 1001)
    R2 = jnp.sqrt(1 - 0.5 * jnp.exp(-0.1 * t)) * jnp.exp(0.3j)
    regime, ev = classify_order_parameter(t, R2)
    motion = np.abs(np.diff(np.asarray(R2))) / 0.1
    thresholds = dict(
        gap_floor=default_gap_floor(np.float64),
        motion_floor=1e-5 * max(motion.max(), 1 / 0.1),  # default rest_tol in float64
        window_span=50.0,
    )
    return regime, ev, thresholds


def test_decision_margin_is_the_distance_to_the_nearest_deciding_threshold():
    regime, ev, thr = _geometric_clustering()
    assert regime_name(regime) == "clustering"
    margin, rule = decision_margin(ev, regime=regime, **thr)
    # an exact geometric decay: rate ratio 1, log(1/0.9) e-folds from the steady test
    np.testing.assert_allclose(margin, np.log(1 / 0.9), rtol=1e-6)
    assert rule == "gap_rate_above"
    # move the deciding quantity towards either threshold: the margin follows it
    for ratio, expected, name in [
        (0.92, np.log(0.92 / 0.9), "gap_rate_above"),
        (1.48, np.log(1.5 / 1.48), "gap_rate_below"),
    ]:
        moved = eqx.tree_at(lambda e: e.gap_rate_ratio, ev, jnp.asarray(ratio))
        margin, rule = decision_margin(moved, **thr)
        np.testing.assert_allclose(margin, expected, rtol=1e-12)
        assert rule == name
    # e-folds are logarithms already: the distance is their difference
    moved = eqx.tree_at(lambda e: e.gap_decay, ev, jnp.asarray(2.01))
    margin, rule = decision_margin(moved, **thr)
    np.testing.assert_allclose(margin, 0.01, rtol=1e-9)
    assert rule == "gap_efolds"


def test_decision_margin_batches_and_reports_what_it_cannot_judge():
    regime, ev, thr = _geometric_clustering()
    fields = {k: np.asarray(getattr(ev, k)) for k in ev.__dataclass_fields__}
    batch = {
        k: np.stack([v, np.full_like(v, np.nan) if v.dtype.kind == "f" else -1 + 0 * v])
        for k, v in fields.items()
    }
    margin, rule = decision_margin(batch, **thr)
    np.testing.assert_allclose(margin[0], np.log(1 / 0.9), rtol=1e-6)
    assert np.isnan(margin[1]) and rule[1] == ""  # no measurement: no margin
    # the classifier decided otherwise than the rules re-evaluated here: margin 0
    margin, rule = decision_margin(ev, regime=REGIMES.undetermined, **thr)
    assert margin == 0 and rule == "rules disagree"
    with pytest.raises(ValueError, match="lacks the field 'period'"):
        decision_margin({k: v for k, v in fields.items() if k != "period"}, **thr)
