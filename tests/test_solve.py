"""simulate / Trajectory: accuracy on the sphere, transforms, bad input and numerical traps.

Compiles are expensive, so the tests share a few problem shapes: n = 12 tokens in d = 4.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxattn.dynamics import RESULTS, AttentionDynamics, simulate
from jaxattn.dynamics import usa_score_shift as jd_usa_score_shift
from jaxattn.dynamics._presets import preset
from jaxattn.dynamics._regimes import classify_regime as _classify_eager
from jaxattn.dynamics._regimes import regime_name
from jaxattn.sphere import sample_uniform

N, D = 12, 4
classify_regime = jax.jit(_classify_eager)


def _x0(dtype=jnp.float64, seed=0):
    # the same tokens in every dtype (sampling in float32 would draw different numbers)
    x = sample_uniform(jax.random.key(seed), N, D, dtype=jnp.float64)
    return (x / jnp.linalg.norm(x, axis=1, keepdims=True)).astype(dtype)


def _max_norm_error(xs):
    return float(jnp.max(jnp.abs(jnp.linalg.norm(xs.astype(jnp.float64), axis=-1) - 1)))


# ---------------------------------------------------------------- long horizon on the sphere


def _mean_speed(traj):
    """Mean angular speed of the tokens over the saved window (radians per unit time)."""
    xs = traj.xs.astype(jnp.float64)
    cos = jnp.clip(jnp.sum(xs[1:] * xs[:-1], axis=-1), -1, 1)
    return float(jnp.mean(jnp.arccos(cos)) / (traj.ts[1] - traj.ts[0]))


_LATE = jnp.linspace(800.0, 1000.0, 1001)  # dense saves over the last 200 time units


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
def test_sphere_drift_and_time_over_t1_1000(dtype):
    # Case 3 (rotating clusters) embedded in d = 4: the tokens never stop moving, which is the
    # hard case for both the sphere constraint and a float32 clock.
    A, V = preset("case3-rotating").matrices(D, dtype)
    field = AttentionDynamics(A, V, beta=1.0)
    traj = simulate(field, _x0(dtype), t1=1000.0, ts=_LATE)
    assert traj.successful
    assert traj.xs.dtype == dtype
    on_sphere = _max_norm_error(traj.xs)
    print(
        f"{jnp.dtype(dtype).name}: max ||x|-1| over saves {on_sphere:.2e}, per-step drift "
        f"before projection {float(traj.sphere_deviation):.2e}, steps {int(traj.num_steps)}"
    )
    assert on_sphere <= 1e-6
    assert float(traj.sphere_deviation) <= 1e-6
    # time keeps advancing: the solve reaches t1 and at t ~ 1000 the tokens still turn
    regime, _ = classify_regime(traj)
    assert regime_name(regime) == "rotating"
    assert float(traj.ts[-1]) == 1000.0
    if dtype == jnp.float32:
        # ... at the rate of the float64 solution (the phase itself differs after t = 1000)
        ref_field = AttentionDynamics(*preset("case3-rotating").matrices(D, jnp.float64))
        ref = simulate(ref_field, _x0(jnp.float64), t1=1000.0, ts=_LATE)
        speed, speed_ref = _mean_speed(traj), _mean_speed(ref)
        print(f"mean angular speed over [800, 1000]: float32 {speed:.5f}, float64 {speed_ref:.5f}")
        assert speed > 0.5
        np.testing.assert_allclose(speed, speed_ref, rtol=2e-2)


@pytest.mark.slow
def test_tokens_drift_without_projection_report_drift():
    A, V = preset("case3-rotating").matrices(D)
    traj = simulate(AttentionDynamics(A, V), _x0(), t1=1000.0, ts=_LATE, project=False)
    assert traj.successful
    # the field is evaluated at x/|x|, so |x_k| is invariant of the exact flow; without the
    # projection the truncation error accumulates (measured ~5e-6 at rtol 1e-7 over t = 1000),
    # which is why simulate projects by default (~4e-9 per step, see above)
    print(f"drift without projection over t1 = 1000: {float(traj.sphere_deviation):.2e}")
    assert 1e-10 < float(traj.sphere_deviation) < 1e-4
    assert _max_norm_error(traj.xs) <= 1e-12  # saves are returned normalised


# ---------------------------------------------------------------- known answers


@pytest.mark.parametrize("kernel", ["usa", "sa"])
def test_identity_usa_sa_form_one_cluster(kernel):
    # Geshkovski et al. (2312.10794), Thm 4.1 / 5.x: A = V = I in d >= 3 -> one cluster.
    eye = jnp.eye(D)
    traj = simulate(AttentionDynamics(eye, eye, kernel=kernel), _x0(), t1=40.0, num_save=101)
    regime, ev = classify_regime(traj)
    assert regime_name(regime) == "clustering"
    assert int(ev.num_clusters) == 1 and int(ev.antipodal_pairs) == 0
    G = traj.final @ traj.final.T
    assert float(jnp.min(G)) > 1 - 1e-9


def test_identity_lsa_forms_antipodal_pair():
    eye = jnp.eye(D)
    traj = simulate(AttentionDynamics(eye, eye), _x0(), t1=1000.0, ts=_LATE)
    regime, ev = classify_regime(traj)
    assert regime_name(regime) == "clustering"
    assert int(ev.num_clusters) == 2 and int(ev.antipodal_pairs) == 1
    # LSA with A = V = I is a projective flow driven by C = XᵀX/n: the clusters sit on the
    # top eigenvector of the final moment matrix
    X = traj.final
    w, U = np.linalg.eigh(np.asarray(X.T @ X / N))
    assert np.max(np.abs(np.abs(np.asarray(X) @ U[:, -1]) - 1)) < 1e-9


# ---------------------------------------------------------------- jit / vmap / grad


def _run(A, V, beta, x0=None):
    x0 = _x0() if x0 is None else x0
    field = AttentionDynamics(A, V, beta=beta)
    return simulate(field, x0, t1=5.0, num_save=11, max_steps=300, throw=False)


_run_jit = jax.jit(_run)
_run_batch = jax.jit(jax.vmap(_run))


def _matrices(key, batch=None, scale=0.7):
    shape = (D, D) if batch is None else (batch, D, D)
    k1, k2 = jax.random.split(key)
    return scale * jax.random.normal(k1, shape), scale * jax.random.normal(k2, shape)


def test_jit_equals_eager():
    A, V = _matrices(jax.random.key(3))
    eager = _run(A, V, 1.0)
    jitted = _run_jit(A, V, 1.0)
    assert eager.successful and jitted.successful
    np.testing.assert_allclose(jitted.xs, eager.xs, rtol=0, atol=1e-13)


def test_vmap_members_equal_solo_runs_and_failures_stay_local():
    As, Vs = _matrices(jax.random.key(4), batch=4)
    betas = jnp.array([1.0, 0.5, 1.0, 400.0])
    As = As.at[2, 0, 1].set(jnp.nan)  # member 2: non-finite A; member 3: too stiff
    out = _run_batch(As, Vs, betas)
    results = np.asarray(out.result._value)
    assert results[0] == RESULTS.successful._value
    assert results[1] == RESULTS.successful._value
    assert results[2] == RESULTS.nonfinite_argument._value
    assert results[3] == RESULTS.max_steps_reached._value
    assert np.all(np.isnan(out.xs[2]))
    for i in (0, 1):
        solo = _run_jit(As[i], Vs[i], betas[i])
        # identical up to the reduction order of batched matmuls
        np.testing.assert_allclose(out.xs[i], solo.xs, rtol=0, atol=1e-13)
        assert int(out.num_steps[i]) == int(solo.num_steps)


def test_max_steps_raises_with_throw():
    A, V = _matrices(jax.random.key(4))
    field = AttentionDynamics(A, V, beta=400.0)
    # Eagerly a plain RuntimeError naming the code and the way to keep the result.
    with pytest.raises(
        RuntimeError, match="simulate: the solve did not succeed: The maximum "
    ) as e:
        simulate(field, _x0(), t1=5.0, num_save=11, max_steps=300)
    assert "throw=False" in str(e.value) and "Trajectory.result" in str(e.value)
    assert not isinstance(e.value, eqx.EquinoxRuntimeError)
    # Under jit the check runs with the program.
    run = jax.jit(lambda f: simulate(f, _x0(), t1=5.0, num_save=11, max_steps=300).xs)
    with pytest.raises((eqx.EquinoxRuntimeError, jax.errors.JaxRuntimeError), match="maximum"):
        run(field)
    traj = _run(A, V, 400.0)
    assert traj.result == RESULTS.max_steps_reached
    # How far it got, read from the same solve kept with throw=False: its steps, the last
    # save time with a finite state, and a lower bound on the steps the horizon needs (it
    # stopped before the next save).
    reached = int(np.sum(np.all(np.isfinite(np.asarray(traj.xs)), axis=(1, 2))))
    assert 1 <= reached < 11
    ts = np.asarray(traj.ts)
    need = 300 * 5.0 / ts[reached]
    text = str(e.value)
    assert (
        f"It stopped after 300 steps ({int(traj.num_accepted_steps)} accepted); the last save "
        f"reached is t = {ts[reached - 1]:.6g} (t1 = 5). At that pace t = 5 needs at least "
        f"{need:.2g} steps: raise max_steps above that. Pass throw=False" in text
    )
    assert "steps`. It stopped" in text  # one full stop between the sentences


def _loss(A, V, beta, x0, W):
    field = AttentionDynamics(A, V, beta=beta)
    traj = simulate(field, x0, t1=2.0, ts=jnp.array([0.0, 2.0]), rtol=1e-11, atol=1e-13)
    return jnp.sum(W * traj.final) + traj.sphere_deviation


_loss_jit = jax.jit(_loss)
_grad_jit = jax.jit(jax.grad(_loss, argnums=(0, 1, 2, 3)))


def test_grad_wrt_A_matches_central_differences():
    A, V = _matrices(jax.random.key(5))
    x0 = _x0()
    W = jax.random.normal(jax.random.key(6), (N, D))
    gA, gV, gb, gx = _grad_jit(A, V, 1.0, x0, W)
    for g in (gA, gV, gb, gx):
        assert np.all(np.isfinite(g))
    h = 1e-5
    for i, j in [(0, 0), (1, 3), (3, 2)]:
        E = jnp.zeros((D, D)).at[i, j].set(h)
        fd = (_loss_jit(A + E, V, 1.0, x0, W) - _loss_jit(A - E, V, 1.0, x0, W)) / (2 * h)
        np.testing.assert_allclose(gA[i, j], fd, rtol=1e-5, atol=1e-8)


def test_forward_mode_through_the_projected_solver():
    # diffrax forwards isinstance checks through the SphereProjection wrapper and then sets
    # the wrapped solver's scan_kind for DirectAdjoint / ForwardMode; a JVP wrt A through
    # ForwardMode equals the reverse-mode gradient contracted with the same tangent.
    import diffrax

    A, V = _matrices(jax.random.key(5))
    x0 = _x0()
    W = jax.random.normal(jax.random.key(6), (N, D))
    E = jax.random.normal(jax.random.key(8), (D, D))

    def loss(A, adjoint):
        field = AttentionDynamics(A, V)
        traj = simulate(
            field, x0, t1=2.0, ts=jnp.array([0.0, 2.0]), rtol=1e-11, atol=1e-13, adjoint=adjoint
        )
        return jnp.sum(W * traj.final)

    _, jvp = jax.jit(lambda A, E: jax.jvp(lambda a: loss(a, diffrax.ForwardMode()), (A,), (E,)))(
        A, E
    )
    gA = _grad_jit(A, V, 1.0, x0, W)[0]
    np.testing.assert_allclose(float(jvp), float(jnp.sum(gA * E)), rtol=1e-7)
    direct = jax.jit(lambda A: loss(A, diffrax.DirectAdjoint()))(A)
    np.testing.assert_allclose(float(direct), float(_loss_jit(A, V, 1.0, x0, W)), rtol=1e-12)


def test_grad_finite_at_exact_consensus():
    A, V = _matrices(jax.random.key(7))
    x0 = jnp.tile(_x0()[:1], (N, 1))  # all tokens equal
    W = jax.random.normal(jax.random.key(8), (N, D))
    grads = _grad_jit(A, V, 1.0, x0, W)
    for g in grads:
        assert np.all(np.isfinite(g))


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["usa", "sa"])
def test_grad_finite_at_exact_consensus_softmax(kernel):
    x0 = jnp.tile(_x0()[:1], (N, 1))

    def loss(A):
        traj = simulate(AttentionDynamics(A, jnp.eye(D), kernel=kernel), x0, t1=1.0, num_save=3)
        return jnp.sum(traj.final) + traj.sphere_deviation

    g = jax.jit(jax.grad(loss))(jnp.eye(D))
    assert np.all(np.isfinite(g))


def test_first_and_later_calls_identical():
    A, V = _matrices(jax.random.key(9))
    field = AttentionDynamics(A, V)
    first = simulate(field, _x0(), t1=5.0, num_save=11, max_steps=300, throw=False)
    again = simulate(field, _x0(), t1=5.0, num_save=11, max_steps=300, throw=False)
    rebuilt = simulate(
        AttentionDynamics(np.asarray(A), np.asarray(V)),
        _x0(),
        t1=5.0,
        num_save=11,
        max_steps=300,
        throw=False,
    )
    assert bool(eqx.tree_equal(first, again))
    assert bool(eqx.tree_equal(first, rebuilt))


# ---------------------------------------------------------------- bad input


def test_bad_token_shapes_and_values():
    field = AttentionDynamics(jnp.eye(D), jnp.eye(D))
    x0 = _x0()
    with pytest.raises(ValueError, match=r"x0 must have shape \(n, d\)"):
        simulate(field, x0[0], t1=1.0)
    with pytest.raises(ValueError, match="d = 3 columns"):
        simulate(field, x0[:, :3], t1=1.0)
    with pytest.raises(ValueError, match="n = 0"):
        simulate(field, x0[:0], t1=1.0)
    with pytest.raises(ValueError, match="token 3 is the zero vector"):
        simulate(field, x0.at[3].set(0.0), t1=1.0)
    with pytest.raises(ValueError, match="token 5 has non-finite"):
        simulate(field, x0.at[5, 1].set(jnp.inf), t1=1.0)
    with pytest.raises(ValueError, match="field must be a flow, an equinox Module"):
        simulate(lambda t, x, a: x, x0, t1=1.0)


def test_traced_zero_token_gets_result_code():
    # under jit the values are unknown at trace time: a zero token becomes a result code
    A, V = _matrices(jax.random.key(10))
    traj = _run_jit(A, V, 1.0, _x0().at[3].set(0.0))
    assert traj.result == RESULTS.zero_token
    assert np.all(np.isnan(traj.xs))


def test_off_sphere_tokens_are_normalised_with_warning():
    eye = jnp.eye(D)
    field = AttentionDynamics(eye, eye)
    with pytest.warns(UserWarning, match="normalised before solving") as w:
        off = simulate(field, 2.0 * _x0(), t1=1000.0, ts=_LATE)
    assert [x.filename for x in w] == [__file__]
    on = simulate(field, _x0(), t1=1000.0, ts=_LATE)
    np.testing.assert_allclose(float(off.initial_deviation), 1.0, rtol=1e-12)
    np.testing.assert_array_equal(off.xs, on.xs)


def test_usa_overflow_is_reported_and_score_shift_runs():
    dtype = jnp.float32
    A = 100.0 * jnp.eye(D, dtype=dtype)
    x0 = _x0(dtype)
    # the advice is the smallest shift that fits float32 (100 - log(max)/2), and float64
    # (where no shift is needed) as the other way out
    with pytest.raises(ValueError, match=r"score_shift=55\.6386 .*float64 \(no shift needed\)"):
        simulate(AttentionDynamics(A, jnp.eye(D, dtype=dtype), kernel="usa"), x0, t1=1.0)
    field = AttentionDynamics(A, jnp.eye(D, dtype=dtype), kernel="usa", score_shift=100.0)
    traj = simulate(field, x0, t1=40.0, num_save=101)
    assert traj.successful
    assert np.all(np.isfinite(traj.xs))
    assert _max_norm_error(traj.xs) < 1e-6


@pytest.mark.slow
def test_usa_overflow_traced_gives_result_code_per_member():
    dtype = jnp.float32
    eye = jnp.eye(D, dtype=dtype)

    def run(beta):
        field = AttentionDynamics(eye, eye, beta=beta, kernel="usa")
        return simulate(field, _x0(dtype), t1=1.0, num_save=3, throw=False)

    out = jax.jit(jax.vmap(run))(jnp.array([1.0, 200.0], dtype))
    results = np.asarray(out.result._value)
    assert results[0] == RESULTS.successful._value
    assert results[1] == RESULTS.usa_overflow._value
    assert np.all(np.isfinite(out.xs[0])) and np.all(np.isnan(out.xs[1]))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(t1=float("nan")), "t1 must be finite"),
        (dict(t1=float("inf")), "t1 must be finite"),
        (dict(t1=-1.0), "need t1 > t0"),
        (dict(t1=0.0), "need t1 > t0"),
        (dict(t1=1.0, ts=jnp.array([0.0, 2.0])), "inside \\[t0, t1\\]"),
        (dict(t1=1.0, rtol=-1e-6), "rtol must be a finite positive"),
        (dict(t1=1.0, atol=0.0), "atol must be a finite positive"),
        (dict(t1=1.0, max_steps=0), "max_steps must be >= 1"),
    ],
)
def test_bad_times_and_tolerances(kwargs, message):
    """A NaN/inf/backward horizon or a non-positive tolerance is refused up front, never a
    silent NaN trajectory reported as successful."""
    field = AttentionDynamics(jnp.eye(2), jnp.eye(2))
    x0 = sample_uniform(jax.random.key(0), 4, 2)
    with pytest.raises(ValueError, match=message):
        simulate(field, x0, **kwargs)


@pytest.mark.parametrize("half", [jnp.float16, jnp.bfloat16])
@pytest.mark.filterwarnings("error::UserWarning")
def test_half_precision_is_refused_by_name(half):
    """float16 / bfloat16 inputs (refused before any warning) made a half-precision solve
    that ran to max_steps (simulate, solve_ott_antonsen), or failed inside JAX (a TypeError
    from the complex arithmetic of the Watanabe–Strogatz constants, a LAPACK
    NotImplementedError in lyapunov_spectrum)."""
    from jaxattn.dynamics import (
        MultiHeadDynamics,
        lyapunov_spectrum,
        lyapunov_spectrum_ott_antonsen,
        solve_ott_antonsen,
        solve_watanabe_strogatz,
        watanabe_strogatz_constants,
    )

    A = jnp.array([[1.0, 0.2], [0.1, 0.5]], half)
    V = jnp.array([[0.2, 1.0], [-1.0, -0.2]], half)
    x0 = sample_uniform(jax.random.key(0), 8, 2, dtype=jnp.float64).astype(half)
    theta = jnp.array([0.1, 0.9, 2.0, -1.3], half)
    name = jnp.dtype(half).name
    heads = MultiHeadDynamics(jnp.stack([A, A]), jnp.stack([V, V]))
    calls = {
        "simulate": lambda: simulate(AttentionDynamics(A, V), x0, t1=1.0),
        "lyapunov_spectrum": lambda: lyapunov_spectrum(AttentionDynamics(A, V), x0, t1=5.0),
        "solve_ott_antonsen": lambda: solve_ott_antonsen(A, V, 0.3, t1=1.0),
        "solve_watanabe_strogatz": lambda: solve_watanabe_strogatz(A, V, theta, t1=1.0),
        "watanabe_strogatz_constants": lambda: watanabe_strogatz_constants(theta),
        "lyapunov_spectrum_ott_antonsen": lambda: lyapunov_spectrum_ott_antonsen(
            A, V, 0.3 + 0.1j, t1=10.0
        ),
    }
    for where, call in calls.items():
        with pytest.raises(ValueError, match=rf"{where}: the inputs make a {name} solve"):
            call()
    with pytest.raises(ValueError, match=rf"simulate: the inputs make a {name} solve"):
        simulate(heads, x0, t1=1.0)
    # half-precision tokens beside float32 angles were refused as "not the token of theta0"
    theta32 = theta.astype(jnp.float32)
    points = jnp.stack([jnp.cos(theta32), jnp.sin(theta32)], -1).astype(half)
    with pytest.raises(ValueError, match=rf"points are {name}; half precision is not supp"):
        solve_watanabe_strogatz(
            A.astype(jnp.float32), V.astype(jnp.float32), theta32, t1=1.0, points=points
        )


def test_the_suggested_score_shift_passes_the_overflow_check():
    """Value maps so large that they add to the bound (|V| = 1e20 in float32): the shift
    the refusal suggested was usa_score_shift, which left the bound over the limit, so the
    field built with it was refused again with the same number."""
    import re

    from jaxattn.dynamics._solve import check_usa_overflow

    A = 2 * jnp.eye(2, dtype=jnp.float32)
    V = 1e20 * jnp.eye(2, dtype=jnp.float32)
    field = AttentionDynamics(A, V, beta=40.0, kernel="usa")
    with pytest.raises(ValueError, match="Pass score_shift=") as e:
        check_usa_overflow("simulate", field, jnp.float32)
    shift = float(re.search(r"Pass score_shift=([0-9.e+]+)", str(e.value)).group(1))
    # 80 + log(1e20) - (log(float32 max) - log 64) = 80 + 46.05 - 84.56: above the 35.64
    # that leaves half the exponent range to the scores alone.
    assert shift > 41.4 and shift > float(jd_usa_score_shift(field, jnp.float32))
    check_usa_overflow(
        "simulate", AttentionDynamics(A, V, beta=40.0, kernel="usa", score_shift=shift), jnp.float32
    )
