"""What a sweep saves and how it lays out the state, checked against the whole solve:

- a segmented solve on several save grids (the moment series at every save, the tokens on
  the late grid only) saves exactly what the whole solve saves there (to 1e-12);
- `classify_tokens` computed from what it reads (`_token_series` + late tokens) equals
  `classify_tokens` of every token (regime, evidence to 1e-12), in d = 2 and d = 3;
- the Watanabe–Strogatz sweep judge (R₂ from the Möbius parameters, tail tokens only)
  equals `classify_tokens` of the reconstructed tokens;
- the token-major particle state `(d, n)` gives the states of the token-row one to 1e-10
  and the same regimes;
- the classifiers' `atan`-based angles (`_atan2`, `_step_angle`) equal `numpy.arctan2` and
  `geodesic_distance` to a few roundings, on every quadrant, the axes and extreme scales.
"""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxattn.dynamics import (
    AttentionDynamics,
    classify_tokens,
    regime_name,
    sample_wrapped_cauchy,
    solve_ott_antonsen,
    solve_watanabe_strogatz,
)
from jaxattn.dynamics._regimes import (
    _classify_circle,
    _classify_series,
    _direction_moments,
    _late_start,
    _series_from_moments,
    _tail_start,
    _token_series,
)
from jaxattn.dynamics._segments import advance_segments, solve_problem, start_segments
from jaxattn.dynamics._solve import finish_particles, prepare_particles
from jaxattn.dynamics._watanabe_strogatz import _points, _token_speeds
from jaxattn.sphere import (
    _atan,
    _atan2,
    _sincos,
    _sort,
    _step_angle,
    geodesic_distance,
    normalise,
    sample_uniform,
)

T1 = 20.0
TS = jnp.linspace(0.0, T1, 41)
KW = dict(window=0.5, cluster_tol=1e-3, gap_floor=1e-6, rest_tol=None)
CASE3_A = np.diag([2.0, 1.0])
CASE3_V = np.array([[1.0, -1.0], [1.0, 1.0]])


def _evidence_equal(a, b):
    for k in a.__dataclass_fields__:
        np.testing.assert_allclose(
            np.asarray(getattr(a, k)), np.asarray(getattr(b, k)), rtol=1e-12, atol=1e-12, err_msg=k
        )


@pytest.mark.parametrize("token_major", [False, True])
def test_segmented_saves_on_two_grids_equal_the_whole_solve(token_major):
    theta = sample_wrapped_cauchy(jax.random.key(0), 64, 0.2 + 0.1j)
    x0 = jnp.stack([jnp.cos(theta), jnp.sin(theta)], -1)
    field = AttentionDynamics(jnp.asarray(CASE3_A), jnp.asarray(CASE3_V), beta=1.0)
    problem, checks = prepare_particles(
        field, x0, diffrax.Tsit5(), 1e-8, 1e-10, True, token_major=token_major
    )
    whole = solve_problem(problem, 0.0, T1, None, TS, diffrax.RecursiveCheckpointAdjoint(), 4096)
    late = _late_start(TS.shape[0], 0.5, 2)
    grids = (TS, TS[late:])

    def series(y):  # what the compact sweep saves: the moment of the directions
        return _direction_moments(y, token_major)

    fns = (series, None)
    state = start_segments(problem, 0.0, jnp.asarray(T1), None, (41, 41 - late), fns)
    step = jax.jit(
        lambda s: advance_segments(problem, s, T1, grids, steps=7, max_steps=4096, save_fns=fns)
    )
    while not bool(state.done):
        state = step(state)
    assert int(state.num_steps) == int(whole.stats["num_steps"])
    moments, late_ys = state.ys
    np.testing.assert_allclose(moments, jax.vmap(series)(whole.ys), rtol=0, atol=1e-12)
    # ... and they are `_token_series` of the whole solve's tokens, as the judge reads them.
    Q, R2 = _series_from_moments(moments, 2)
    Q_whole, R2_whole = _token_series(
        normalise(jnp.swapaxes(whole.ys, -1, -2) if token_major else whole.ys)
    )
    np.testing.assert_allclose(Q, Q_whole, rtol=0, atol=1e-12)
    np.testing.assert_allclose(R2, R2_whole, rtol=0, atol=1e-12)
    np.testing.assert_allclose(late_ys, whole.ys[late:], rtol=0, atol=1e-12)
    # The late tokens come back as (times, n, d) whatever the layout.
    traj = finish_particles(checks, whole, TS)
    assert traj.xs.shape == (41, 64, 2)


@pytest.mark.parametrize("token_major", [False, True])
@pytest.mark.parametrize("d", [2, 3, 6])
def test_direction_moments_are_the_token_series_of_the_directions(d, token_major):
    # Tokens off the sphere (norms from 1e-3 to 1e3) and one zero token, which counts as
    # zero (as `normalise` leaves it): Q has trace (n − 1)/n, R₂ = Q₀₀ − Q₁₁ + 2i Q₀₁.
    rng = np.random.default_rng(d)
    n = 40
    x = rng.normal(size=(n, d)) * 10.0 ** rng.uniform(-3, 3, size=(n, 1))
    x[5] = 0.0
    u = normalise(jnp.asarray(x))
    Q_ref, R2_ref = _token_series(u)
    m = _direction_moments(jnp.asarray(x.T if token_major else x), token_major)
    assert m.shape == (d * (d + 1) // 2,)
    Q, R2 = _series_from_moments(m, d)
    np.testing.assert_allclose(Q, Q_ref, rtol=0, atol=1e-15)
    np.testing.assert_allclose(np.trace(Q), (n - 1) / n, rtol=0, atol=1e-15)
    np.testing.assert_array_equal(Q, np.swapaxes(Q, 0, 1))
    if d == 2:
        np.testing.assert_allclose(R2, R2_ref, rtol=0, atol=1e-15)
        np.testing.assert_allclose(
            R2, np.mean(np.exp(2j * np.arctan2(x[:, 1], x[:, 0])) * (np.arange(n) != 5)), atol=1e-15
        )
    else:
        assert R2 is None and R2_ref is None
    # A batch of saves (times, entries) maps to (times, d, d).
    Qs, _ = _series_from_moments(jnp.stack([m, m]), d)
    np.testing.assert_array_equal(Qs, jnp.stack([Q, Q]))


@pytest.mark.parametrize("d", [2, 3])
def test_classify_from_series_equals_classify_tokens(d):
    key = jax.random.key(d)
    A = jax.random.normal(key, (d, d))
    V = jnp.eye(d) + 0.5 * jax.random.normal(jax.random.fold_in(key, 1), (d, d))
    from jaxattn.dynamics import simulate

    x0 = sample_uniform(jax.random.key(7), 24, d)
    traj = simulate(AttentionDynamics(A, V, beta=1.0), x0, t1=T1, ts=TS)
    regime, ev = classify_tokens(TS, traj.xs, **KW)
    xs = normalise(traj.xs)
    Q, R2 = _token_series(xs)
    late = _late_start(TS.shape[0], KW["window"], d)
    regime2, ev2 = _classify_series(TS, Q, R2, xs[late:], **KW)
    assert int(regime._value) == int(regime2._value)
    _evidence_equal(ev, ev2)


def test_watanabe_strogatz_judge_equals_classify_tokens_of_the_points():
    theta = sample_wrapped_cauchy(jax.random.key(3), 48, 0.3 + 0.0j)
    sol = solve_watanabe_strogatz(jnp.asarray(CASE3_A), jnp.asarray(CASE3_V), theta, t1=T1, ts=TS)
    regime, ev = classify_tokens(TS, sol.points(), **KW)
    R2 = sol.order_parameter()
    np.testing.assert_allclose(R2, jnp.mean(jnp.exp(2j * sol.angles()), axis=-1), atol=1e-12)
    tail = _tail_start(TS.shape[0], KW["window"])
    xs = _points(sol.zeta[tail:], sol.Psi[tail:], sol.constants.psi)
    np.testing.assert_allclose(xs, sol.points()[tail:], rtol=0, atol=1e-15)
    # The sweep's judge: the tokens' speeds on the tail from the Möbius parameters, the
    # last tokens only.
    speeds = _token_speeds(TS[tail:], sol.zeta[tail:], sol.Psi[tail:], sol.constants.psi)
    gap = 1 - jnp.abs(R2) ** 2
    regime2, ev2 = _classify_circle(TS, R2, gap, speeds, xs[-1], **KW)
    assert int(regime._value) == int(regime2._value)
    # The gap from R₂ and from the moment of the tokens agree to rounding (1e-15 here);
    # the rest of the evidence is identical up to it.
    for k in ev.__dataclass_fields__:
        np.testing.assert_allclose(
            np.asarray(getattr(ev, k)),
            np.asarray(getattr(ev2, k)),
            rtol=1e-9,
            atol=1e-12,
            err_msg=k,
        )


def test_token_major_state_equals_the_token_row_state():
    theta = sample_wrapped_cauchy(jax.random.key(5), 128, 0.1 + 0.1j)
    x0 = jnp.stack([jnp.cos(theta), jnp.sin(theta)], -1)
    field = AttentionDynamics(jnp.asarray(CASE3_A), jnp.asarray(CASE3_V), beta=1.0)
    out = []
    for major in (False, True):
        problem, checks = prepare_particles(field, x0, diffrax.Tsit5(), 1e-8, 1e-10, True, major)
        sol = solve_problem(problem, 0.0, T1, None, TS, diffrax.RecursiveCheckpointAdjoint(), 4096)
        out.append(finish_particles(checks, sol, TS))
    rows, major = out
    np.testing.assert_allclose(major.xs, rows.xs, rtol=0, atol=1e-10)
    assert abs(int(major.num_steps) - int(rows.num_steps)) <= 1
    r1, _ = classify_tokens(TS, rows.xs, **KW)
    r2, _ = classify_tokens(TS, major.xs, **KW)
    assert int(r1._value) == int(r2._value)
    # The drift each step made before projection is the same in both layouts.
    np.testing.assert_allclose(major.sphere_deviation, rows.sphere_deviation, rtol=1e-3)


@pytest.mark.parametrize("method", ["ott_antonsen", "watanabe_strogatz", "particles"])
def test_nonpositive_beta_fails_alone_for_every_method(method):
    from jaxattn.dynamics._solve import RESULTS
    from jaxattn.dynamics._sweep import sweep

    A = np.broadcast_to(CASE3_A, (3, 2, 2))
    V = np.broadcast_to(CASE3_V, (3, 2, 2))
    res = sweep(
        A,
        V,
        np.array([1.0, 0.0, -1.0]),
        0,
        method=method,
        n=16,
        t1=10.0,
        num_save=21,
        progress=False,
    )
    assert res.failed.tolist() == [False, True, True]
    assert np.all(res.result[1:] == RESULTS.nonpositive_beta._value)
    assert np.all(np.isfinite(res.R2[0]))


@pytest.mark.parametrize("method", ["ott_antonsen", "watanabe_strogatz"])
def test_an_overflowing_field_fails_at_once_on_every_path(method):
    """Finite weights whose products overflow (A = V = 1e200 I) make the reduced field
    non-finite from the start: `nonfinite_flow` without stepping, in the standalone solve
    (which has the stall guard) and in both sweep strategies (which do without it: the
    compacting WS member used to run 4096 steps to read max_steps_reached); the member
    beside it runs on."""
    from jaxattn.dynamics._solve import RESULTS
    from jaxattn.dynamics._sweep import sweep

    big = 1e200 * np.eye(2)
    A = np.stack([CASE3_A, big])
    V = np.stack([CASE3_V, big])
    kw = dict(method=method, n=16, t1=10.0, num_save=21, progress=False)
    runs = {s: sweep(A, V, 1.0, 0, strategy=s, **kw) for s in ("lockstep", "compact")}
    for strategy, res in runs.items():
        assert res.failed.tolist() == [False, True], strategy
        assert res.result[1] == RESULTS.nonfinite_flow._value, strategy
        assert res.failures()[0]["last_save"] is None, strategy
        assert np.all(np.isfinite(res.R2[0])), strategy
    # The healthy member runs on alike in both strategies (steps may differ by rounding).
    assert runs["lockstep"].regime[0] == runs["compact"].regime[0]
    np.testing.assert_allclose(runs["lockstep"].R2[0], runs["compact"].R2[0], atol=1e-6)
    if method == "ott_antonsen":
        sol = solve_ott_antonsen(big, big, 0.3 + 0.1j, t1=10.0, num_save=21, throw=False)
    else:
        theta = sample_wrapped_cauchy(jax.random.key(1), 16, 0.1 + 0j)
        sol = solve_watanabe_strogatz(big, big, theta, t1=10.0, num_save=21, throw=False)
    assert sol.result == RESULTS.nonfinite_flow
    assert int(sol.num_accepted_steps) == int(sol.num_steps)  # the zero field: no rejection


def test_one_save_time_is_refused_by_the_solvers():
    from jaxattn.dynamics import simulate

    theta = sample_wrapped_cauchy(jax.random.key(1), 8, 0.1 + 0j)
    x0 = jnp.stack([jnp.cos(theta), jnp.sin(theta)], -1)
    field = AttentionDynamics(jnp.eye(2), jnp.eye(2), beta=1.0)
    with pytest.raises(ValueError, match="num_save must be >= 2"):
        simulate(field, x0, t1=1.0, num_save=1)
    with pytest.raises(ValueError, match="num_save must be >= 2"):
        solve_watanabe_strogatz(jnp.eye(2), jnp.eye(2), theta, t1=1.0, num_save=1)


def test_vectorised_atan_is_within_one_ulp_of_the_c_library():
    # Every branch of the argument reduction (|x| ≤ 0.66, up to tan(3π/8), beyond), the
    # branch points themselves, tiny and huge magnitudes and the special values.
    rng = np.random.default_rng(11)
    mags = 10.0 ** rng.uniform(-300, 300, size=20000)
    x = np.concatenate(
        [
            rng.standard_cauchy(40000),
            rng.uniform(-3, 3, size=40000),
            mags * rng.choice([-1.0, 1.0], size=20000),
            [0.66, np.nextafter(0.66, 1), 2.414213562373095, np.nextafter(2.414213562373095, 3)],
            [1.0, -1.0, 1e-310, 1e308, -1e308],
        ]
    )
    got = np.asarray(jax.jit(_atan)(jnp.asarray(x)))
    want = np.arctan(x)
    ulps = np.abs(got - want) / np.spacing(np.abs(want))
    assert np.max(ulps[np.abs(x) > 1e-300]) <= 1.0
    special = np.asarray(_atan(jnp.asarray([0.0, -0.0, np.inf, -np.inf, np.nan])))
    np.testing.assert_array_equal(special[2:4], [np.pi / 2, -np.pi / 2])
    assert np.signbit(special[1]) and not np.signbit(special[0]) and special[0] == 0
    assert np.isnan(special[4])
    # float32 stays float32, about 1.3 ulp of the exact angle (jnp.arctan: about 0.8).
    x32 = rng.standard_cauchy(100000).astype(np.float32)
    got32 = np.asarray(_atan(jnp.asarray(x32)))
    assert got32.dtype == np.float32
    exact = np.arctan(x32.astype(np.float64))
    assert np.max(np.abs(got32 - exact) / np.spacing(np.abs(exact).astype(np.float32))) < 1.5
    # Integers read as floats; the derivative 1/(1 + x²), at ±0 too (also through _atan2).
    np.testing.assert_allclose(_atan(jnp.asarray([1, -5])), np.arctan([1.0, -5.0]), rtol=1e-15)
    edges = jnp.asarray([0.0, -0.0, 0.66, 2.414213562373095])
    xs = jnp.concatenate([edges, jnp.linspace(-9, 9, 101)])
    grads = jax.vmap(jax.grad(_atan))(xs)
    np.testing.assert_allclose(grads, 1 / (1 + xs**2), rtol=1e-14)
    dy, dx = jax.grad(_atan2, (0, 1))(0.0, -1.0)
    assert (float(dy), float(dx)) == (-1.0, 0.0)
    with pytest.raises(TypeError, match="real input only"):
        _atan(jnp.asarray([1j]))


def test_sincos_equals_the_library_sine_and_cosine_on_its_interval():
    # |x| <= π: a dense grid, every quadrant switch (±π/4, ±3π/4), the ends and zero;
    # within one rounding of 1 in absolute terms (the sampler's e^{iu}).
    x = np.concatenate(
        [
            np.linspace(-np.pi, np.pi, 400001),
            [0.0, np.pi, -np.pi] + [k * np.pi / 4 for k in (-3, -1, 1, 3)],
            [np.nextafter(k * np.pi / 4, 0) for k in (-3, -1, 1, 3)],
        ]
    )
    s, c = jax.jit(_sincos)(jnp.asarray(x))
    assert np.max(np.abs(np.asarray(s) - np.sin(x))) <= 2.3e-16
    assert np.max(np.abs(np.asarray(c) - np.cos(x))) <= 2.3e-16
    # sin² + cos² = 1 to rounding
    assert np.max(np.abs(np.asarray(s) ** 2 + np.asarray(c) ** 2 - 1)) < 5e-16
    # float32 stays float32, within one float32 rounding
    x32 = jnp.asarray(x[::7], jnp.float32)
    s32, c32 = _sincos(x32)
    assert s32.dtype == c32.dtype == jnp.float32
    assert float(jnp.max(jnp.abs(s32 - jnp.sin(x32)))) <= 1.2e-7
    assert float(jnp.max(jnp.abs(c32 - jnp.cos(x32)))) <= 1.2e-7
    # its derivative is the library's (d sin = cos, d cos = −sin)
    xs = jnp.linspace(-3.0, 3.0, 61)
    ds = jax.vmap(jax.grad(lambda t: _sincos(t)[0]))(xs)
    dc = jax.vmap(jax.grad(lambda t: _sincos(t)[1]))(xs)
    np.testing.assert_allclose(ds, jnp.cos(xs), rtol=0, atol=1e-15)
    np.testing.assert_allclose(dc, -jnp.sin(xs), rtol=0, atol=1e-15)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_integer_key_sort_equals_jnp_sort(dtype):
    rng = np.random.default_rng(12)
    lim = np.finfo(dtype).maxexp * 0.28  # decimal exponents well inside the range
    x = rng.normal(size=(7, 300)) * 10.0 ** rng.integers(-lim, lim, size=(7, 300))
    sub = np.finfo(dtype).tiny / 4  # a subnormal
    specials = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, sub, -sub, 5.0, 5.0]
    x[:, : len(specials)] = specials
    x = rng.permuted(x, axis=1).astype(dtype)
    # A NaN with the sign bit set, as x86 makes it, sorts last too.
    x[0, 0] = np.copysign(np.nan, -1.0)
    got = np.asarray(jax.jit(_sort)(jnp.asarray(x)))
    assert got.dtype == dtype
    # numpy's order (NaN last, as jnp.sort). jnp.sort on the CPU differs only in reading
    # subnormals as zero (their order among the zeros is kept as given).
    np.testing.assert_array_equal(got, np.sort(x, axis=-1))  # NaN equal here; −0 == +0
    # Other dtypes go to jnp.sort (integers keep every digit).
    big = jnp.asarray([2**53 + 1, 2**53, -3])
    np.testing.assert_array_equal(_sort(big), [-3, 2**53, 2**53 + 1])
    assert _sort(big).dtype == big.dtype
    np.testing.assert_array_equal(_sort(jnp.asarray([3 + 1j, 1 + 0j])), [1 + 0j, 3 + 1j])
    tiny = np.finfo(dtype).tiny
    normal = np.asarray(jnp.sort(jnp.asarray(np.where(np.abs(x) < tiny, 0, x)), axis=-1))
    np.testing.assert_array_equal(got[np.abs(got) >= tiny], normal[np.abs(normal) >= tiny])
    assert np.all(np.isnan(got[:, -2:])) and not np.any(np.isnan(got[:, :-3]))


def test_atan_based_angles_equal_atan2_and_the_geodesic_distance():
    rng = np.random.default_rng(3)
    scale = lambda k: rng.choice([1e-300, 1e-8, 1.0, 1e8, 0.0], size=k)  # noqa: E731
    y = rng.normal(size=20000) * scale(20000)
    x = rng.normal(size=20000) * scale(20000)
    # The axes, the origin and the four quadrant boundaries by hand.
    y = np.concatenate([y, [0.0, 1.0, -1.0, 0.0, 2.0, -3.0, 1e-310]])
    x = np.concatenate([x, [0.0, 0.0, 0.0, -1.0, -1e-300, -5.0, -1.0]])
    got = np.asarray(_atan2(jnp.asarray(y), jnp.asarray(x)))
    want = np.arctan2(y, x)
    origin = (x == 0) & (y == 0)
    np.testing.assert_array_equal(got[origin], 0.0)
    # Equal as angles (y = −0 with x < 0 gives π where arctan2 gives −π).
    diff = np.angle(np.exp(1j * (got - want)))[~origin]
    assert np.max(np.abs(diff)) < 4 * np.finfo(float).eps * np.pi
    assert np.all((got >= -np.pi) & (got <= np.pi))
    # Geodesic steps of unit vectors, antipodes and coincident points included.
    u = normalise(jnp.asarray(rng.normal(size=(2000, 3))))
    v = normalise(u + jnp.asarray(rng.normal(size=(2000, 3))) * jnp.asarray(scale(2000))[:, None])
    v = v.at[0].set(-u[0]).at[1].set(u[1])
    np.testing.assert_allclose(_step_angle(u, v), geodesic_distance(u, v), rtol=1e-14, atol=1e-15)
    assert float(_step_angle(u, v)[0]) == np.pi


def test_one_token_is_undetermined_from_the_series_too():
    # What a sweep's judge reads (`_classify_series`) reads one token as `classify_tokens`
    # does: a degenerate configuration, undetermined (a rotating single token used to read
    # as "rotating" in a sweep and "undetermined" solo).
    ts = jnp.linspace(0.0, 10.0, 41)
    theta = 0.5 * ts
    xs = jnp.stack([jnp.cos(theta), jnp.sin(theta)], -1)[:, None, :]
    Q, R2 = _token_series(xs)
    regime, _ = _classify_series(ts, Q, R2, xs[_late_start(41, 0.5, 2) :], **KW)
    with pytest.warns(UserWarning, match="n = 1 token"):
        solo, _ = classify_tokens(ts, xs, **KW)
    assert regime_name(regime) == regime_name(solo) == "undetermined"


def test_the_reductions_refuse_a_nonpositive_beta_as_simulate_does():
    from jaxattn.dynamics import solve_ott_antonsen

    theta = sample_wrapped_cauchy(jax.random.key(2), 8, 0.1 + 0j)
    for beta in (-1.0, 0.0):
        with pytest.raises(ValueError, match="beta is an inverse temperature and must be > 0"):
            solve_ott_antonsen(jnp.eye(2), jnp.eye(2), 0.1 + 0j, beta=beta, t1=1.0)
        with pytest.raises(ValueError, match="beta is an inverse temperature and must be > 0"):
            solve_watanabe_strogatz(jnp.eye(2), jnp.eye(2), theta, beta=beta, t1=1.0)
