"""The Watanabe–Strogatz reduction against particle solutions, and its invariants."""

import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxattn.dynamics import RESULTS, AttentionDynamics, simulate
from jaxattn.dynamics._circle import angles_from_tokens, order_parameter, tokens_from_angles
from jaxattn.dynamics._ott_antonsen import solve_ott_antonsen
from jaxattn.dynamics._watanabe_strogatz import (
    cross_ratio,
    solve_watanabe_strogatz,
    watanabe_strogatz_constants,
    watanabe_strogatz_reconstruct,
)

N_TOKENS = 9
SEEDS = 4
T1 = 4.0
TS = jnp.linspace(0.0, T1, 21)
TIGHT = dict(rtol=1e-12, atol=1e-12)


def _mobius(c, u, v):
    """Disc automorphism `v ↦ (c + u v)/(1 + conj(c) u v)`, |c| < 1, |u| = 1."""
    return (c + u * v) / (1 + jnp.conj(c) * u * v)


def _ws_run(A, V, beta, theta0):
    sol = solve_watanabe_strogatz(A, V, theta0, beta=beta, t1=T1, ts=TS, **TIGHT, throw=False)
    theta = sol.angles()
    # points() is the same reconstruction without inverse trigonometry
    points = jnp.stack([jnp.cos(theta), jnp.sin(theta)], -1)
    points_err = jnp.max(jnp.abs(sol.points() - points))
    return theta, sol.zeta, sol.Psi, sol.order_parameter(), sol.result, points_err


@pytest.fixture(scope="module")
def runs():
    """Particle solutions (projected LSA flow in R²) and WS solutions for random A, V, β, θ0."""
    keys = jax.random.split(jax.random.key(2024), 4)
    A = jax.random.normal(keys[0], (SEEDS, 2, 2))
    V = jax.random.normal(keys[1], (SEEDS, 2, 2))
    beta = jax.random.uniform(keys[2], (SEEDS,), minval=0.5, maxval=1.5)
    theta0 = jax.random.uniform(keys[3], (SEEDS, N_TOKENS), minval=-np.pi, maxval=np.pi)

    @jax.jit
    @jax.vmap
    def particles(A, V, beta, theta0):
        traj = simulate(
            AttentionDynamics(A, V, beta=beta),
            tokens_from_angles(theta0),
            t1=T1,
            ts=TS,
            **TIGHT,
            throw=False,
        )
        return angles_from_tokens(traj.xs), traj.result

    theta_p, res_p = particles(A, V, beta, theta0)
    ws = jax.jit(jax.vmap(_ws_run))(A, V, beta, theta0)
    assert bool(jnp.all(res_p == RESULTS.successful)) and bool(jnp.all(ws[4] == RESULTS.successful))
    assert float(jnp.max(ws[5])) < 1e-13
    return dict(A=A, V=V, beta=beta, theta0=theta0, theta_p=theta_p, ws=ws)


def test_cross_ratio_invariance_and_degenerate_points(getkey):
    k1, k2, k3 = jax.random.split(getkey(), 3)
    z = jax.random.normal(k1, (4, 5)) + 1j * jax.random.normal(k2, (4, 5))
    c, u = 0.4 - 0.3j, jnp.exp(0.9j)
    before = cross_ratio(*z)
    after = cross_ratio(*_mobius(c, u, z))
    assert float(jnp.max(jnp.abs(after - before) / jnp.abs(before))) < 1e-13
    # On the unit circle the cross-ratio is real.
    on_circle = jnp.exp(1j * jax.random.uniform(k3, (4, 5), maxval=2 * np.pi))
    cr = cross_ratio(*on_circle)
    assert float(jnp.max(jnp.abs(jnp.imag(cr)) / jnp.abs(cr))) < 1e-13
    # Degenerate quadruples: z1 = z4 is the point at infinity, z1 = z3 = z4 is undefined.
    a, b, c3 = jnp.exp(0.1j), jnp.exp(1.0j), jnp.exp(2.0j)
    assert bool(jnp.isinf(jnp.real(cross_ratio(a, b, c3, a))))
    assert bool(jnp.isnan(cross_ratio(a, b, a, a)))
    assert complex(cross_ratio(a, b, a, c3)) == 0  # z1 = z3: a regular zero
    g = jax.grad(lambda s: jnp.real(cross_ratio(jnp.exp(1j * s), b, c3, jnp.exp(0.1j))))(0.1)
    assert bool(jnp.isfinite(g))
    # Real points are points of the plane: complex results, no casting warning; an
    # undefined quadruple is nan + nan·i as documented.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert complex(cross_ratio(0, 1, 2, 3)) == (0 - 2) * (1 - 3) / ((0 - 3) * (1 - 2))
        assert bool(jnp.isinf(jnp.real(cross_ratio(0.0, 1.0, 2.0, 0.0))))
        undefined = complex(cross_ratio(0.0, 0.0, 0.0, 0.0))
    assert np.isnan(undefined.real) and np.isnan(undefined.imag)
    with pytest.raises(ValueError, match=r"must broadcast together, got shapes \(2,\), \(3,\)"):
        cross_ratio(jnp.zeros(2), jnp.zeros(3), 0.0, 1.0)


def test_constants_gauge_and_round_trip(getkey):
    theta0 = jax.random.uniform(getkey(), (7,), minval=-np.pi, maxval=np.pi)
    consts = watanabe_strogatz_constants(theta0)
    assert bool(consts.valid)
    assert abs(complex(jnp.mean(consts.w))) < 1e-14  # gauge Σ_k w_k = 0
    # θ_k(t0) is reproduced exactly (with its lift), and e^{2iθ_k} = M(w_k).
    back = watanabe_strogatz_reconstruct(consts.zeta0, consts.Psi0, consts)
    assert float(jnp.max(jnp.abs(back - theta0))) < 1e-14
    image = _mobius(consts.zeta0, jnp.exp(1j * consts.Psi0), consts.w)
    assert float(jnp.max(jnp.abs(image - jnp.exp(2j * theta0)))) < 1e-14
    # Closed form of the barycentre: points M_c(roots of unity) have barycentre c.
    c = 0.7 * np.exp(2.1j)
    n = 11
    roots = jnp.exp(2j * np.pi * (jnp.arange(n) + 0.3) / n)
    consts = watanabe_strogatz_constants(
        0.5 * jnp.angle(_mobius(c, 1.0, roots)) + np.pi * (jnp.arange(n) % 3 == 0)
    )
    assert abs(complex(consts.zeta0) - c) < 1e-14
    # Concentrated but legal sets (|R₂| ≈ 0.9995) still fix the gauge.
    tight = jnp.concatenate(
        [0.1 + 1e-3 * jax.random.uniform(getkey(), (50,)), jnp.array([1.0, 2.0])]
    )
    assert bool(watanabe_strogatz_constants(tight).valid)


def test_half_angle_and_given_tokens(getkey):
    # half_angle = e^{iψ_k/2} (no trigonometry): its square is w_k; constants built from
    # the tokens (cos θ_k, sin θ_k) equal those built from the angles to rounding.
    theta0 = jax.random.uniform(getkey(), (40,), minval=-3 * np.pi, maxval=3 * np.pi)
    consts = watanabe_strogatz_constants(theta0)
    hc, hs = consts.half_angle
    # |ψ| reaches ~6π here: the library's cos(ψ/2) itself rounds at |ψ| eps
    np.testing.assert_allclose(hc, jnp.cos(consts.psi / 2), rtol=0, atol=2e-15)
    np.testing.assert_allclose(hs, jnp.sin(consts.psi / 2), rtol=0, atol=2e-15)
    np.testing.assert_allclose(hc**2 - hs**2 + 1j * 2 * hc * hs, consts.w, rtol=0, atol=4e-15)
    points = jnp.stack([jnp.cos(theta0), jnp.sin(theta0)], -1)
    given = watanabe_strogatz_constants(theta0, points=points)
    for a, b in ((given.psi, consts.psi), (given.zeta0, consts.zeta0)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-14)
    sol = solve_watanabe_strogatz(jnp.eye(2), -jnp.eye(2), theta0, t1=1.0, points=points)
    ref = solve_watanabe_strogatz(jnp.eye(2), -jnp.eye(2), theta0, t1=1.0)
    np.testing.assert_allclose(sol.order_parameter(), ref.order_parameter(), rtol=0, atol=1e-13)
    # the points of the solution from the half angle are those from ψ
    from jaxattn.dynamics._watanabe_strogatz import _points

    np.testing.assert_allclose(
        _points(sol.zeta, sol.Psi, sol.constants.psi, sol.constants.half_angle),
        sol.points(),
        rtol=0,
        atol=1e-14,
    )
    with pytest.raises(ValueError, match=r"points must be the tokens .* shape \(40, 2\)"):
        watanabe_strogatz_constants(theta0, points=points[:, :1])
    # concrete points are checked against theta0: finite, real, the same lift, full precision
    with pytest.raises(ValueError, match=r"points\[3\] is not finite"):
        watanabe_strogatz_constants(theta0, points=points.at[3, 0].set(jnp.nan))
    with pytest.raises(ValueError, match=r"points\[\d+\] = .* is not the token"):
        watanabe_strogatz_constants(theta0, points=-points)  # the tokens of θ + π
    with pytest.raises(ValueError, match="is not the token"):
        watanabe_strogatz_constants(theta0, points=points.astype(jnp.float32))
    with pytest.raises(ValueError, match="real floating-point tokens"):
        watanabe_strogatz_constants(theta0, points=points + 0j)
    with pytest.raises(ValueError, match="is not the token"):
        solve_watanabe_strogatz(jnp.eye(2), -jnp.eye(2), theta0, t1=1.0, points=points[:, ::-1])


def test_cross_ratios_conserved_along_particles(runs):
    z = jnp.exp(2j * runs["theta_p"])  # (seeds, times, n)
    k = np.arange(N_TOKENS)
    quads = [z[..., (k + s) % N_TOKENS] for s in range(4)]
    cr = cross_ratio(*quads)  # (seeds, times, n) — n quadruples per state
    drift = jnp.abs(cr - cr[:, :1]) / jnp.maximum(1, jnp.abs(cr[:, :1]))
    worst = float(jnp.max(drift))
    spread = float(jnp.max(jnp.abs(order_parameter(runs["theta_p"][:, -1], 2))))
    print(
        f"cross-ratio drift along particle solutions ({SEEDS} seeds, t ≤ {T1}): {worst:.2e}; "
        f"max final |R₂| {spread:.6f}"
    )
    assert worst < 1e-8
    assert float(jnp.max(jnp.abs(jnp.imag(cr)) / jnp.maximum(1, jnp.abs(cr)))) < 1e-10


def test_ws_reproduces_particle_trajectories(runs):
    angles, zeta, _, R_ws, _, _ = runs["ws"]
    diff = jnp.angle(jnp.exp(1j * (angles - runs["theta_p"])))  # every token, modulo 2π
    err = float(jnp.max(jnp.abs(diff)))
    err_R = float(jnp.max(jnp.abs(R_ws - order_parameter(runs["theta_p"], 2))))
    print(
        f"WS vs particles: max token angle error {err:.2e}, max |ΔR₂| {err_R:.2e}, "
        f"max |ζ| {float(jnp.max(jnp.abs(zeta))):.6f}"
    )
    assert err < 1e-8 and err_R < 1e-8
    # The lift is continuous: no jumps of ≈ π between save times that the particles do not make.
    steps_ws = jnp.diff(angles, axis=1)
    steps_p = jnp.angle(jnp.exp(1j * jnp.diff(runs["theta_p"], axis=1)))
    assert float(jnp.max(jnp.abs(steps_ws - steps_p))) < 1e-8


def test_constants_of_motion_recovered_from_later_state(runs):
    # The gauge makes (ζ, w mod rotation) functions of the state: applied to the particles at
    # t1 it gives the solver's ζ(t1) and the same w_k up to one common rotation.
    angles, zeta, _, _, _, _ = runs["ws"]
    for s in range(SEEDS):
        first = watanabe_strogatz_constants(runs["theta0"][s])
        later = watanabe_strogatz_constants(runs["theta_p"][s, -1])
        assert abs(complex(later.zeta0 - zeta[s, -1])) < 1e-8
        rel_first = first.w * jnp.conj(first.w[0])
        rel_later = later.w * jnp.conj(later.w[0])
        assert float(jnp.max(jnp.abs(rel_first - rel_later))) < 1e-8


def test_vmap_and_jit_match_solo(runs):
    for s in (0, SEEDS - 1):
        solo = _ws_run(runs["A"][s], runs["V"][s], runs["beta"][s], runs["theta0"][s])
        for field_solo, field_batch in zip(solo[:4], runs["ws"][:4]):
            assert float(jnp.max(jnp.abs(field_solo - field_batch[s]))) < 1e-13


def test_grad_wrt_A_matches_central_differences(runs):
    A, V, beta, theta0 = (runs[k][0] for k in ("A", "V", "beta", "theta0"))

    def loss(A):
        R = _ws_run(A, V, beta, theta0)[3][-1]
        return jnp.real(R) - 0.5 * jnp.imag(R)

    g = np.asarray(jax.jit(jax.grad(loss))(A))
    h = 1e-5
    fd = np.zeros((2, 2))
    for i in range(2):
        for j in range(2):
            E = jnp.zeros((2, 2)).at[i, j].set(h)
            fd[i, j] = (float(loss(A + E)) - float(loss(A - E))) / (2 * h)
    rel = float(np.max(np.abs(g - fd)) / np.max(np.abs(fd)))
    print(f"WS grad wrt A vs central differences: relative error {rel:.2e}")
    assert rel < 1e-6


def test_evenly_spread_constants_follow_ott_antonsen():
    # Constants at the n-th roots of unity make R₂ = ζ + O(|ζ|^(n−1)): the WS centre then
    # solves the OA equation (the Poisson kernel is the n → ∞ limit of these states).
    n, c = 48, 0.3 * np.exp(0.5j)
    roots = jnp.exp(2j * np.pi * (jnp.arange(n) + 0.5) / n)
    theta0 = 0.5 * jnp.angle(_mobius(c, 1.0, roots))
    A, V = jnp.eye(2), jnp.array([[0.2, 1.0], [-1.0, -0.2]])  # Case 4: oscillation
    ts = jnp.linspace(0.0, 10.0, 41)
    ws = solve_watanabe_strogatz(A, V, theta0, t1=10.0, ts=ts, **TIGHT)
    oa = solve_ott_antonsen(A, V, c, t1=10.0, ts=ts, **TIGHT)
    err_zeta = float(jnp.max(jnp.abs(ws.zeta - oa.R)))
    err_R = float(jnp.max(jnp.abs(ws.order_parameter() - oa.R)))
    print(
        f"WS (evenly spread constants, n = {n}) vs OA: |ζ − R_OA| {err_zeta:.2e}, "
        f"|R₂ − R_OA| {err_R:.2e}"
    )
    assert err_zeta < 1e-9 and err_R < 1e-9


def test_float32_inputs_give_a_float32_solution_with_a_python_beta():
    # A Python float beta is weakly typed: it does not widen float32 inputs (it used to give
    # complex128 solutions of float32 members under x64); a float64 beta does.
    theta0 = jnp.linspace(-1.0, 1.2, 9)
    A, V = jnp.eye(2), jnp.array([[0.2, 1.0], [-1.0, -0.2]])
    f32 = [jnp.asarray(a, jnp.float32) for a in (A, V, theta0)]
    ws64 = solve_watanabe_strogatz(A, V, theta0, t1=2.0, num_save=5)
    ws32 = solve_watanabe_strogatz(*f32, t1=2.0, num_save=5, beta=1.0)
    assert ws32.zeta.dtype == jnp.complex64 and ws32.ts.dtype == jnp.float32
    assert float(jnp.max(jnp.abs(ws32.zeta - ws64.zeta))) < 1e-5
    oa32 = solve_ott_antonsen(*f32[:2], 0.3 + 0.1j, t1=2.0, num_save=5, beta=1.0)
    assert oa32.R.dtype == jnp.complex64
    wide = solve_watanabe_strogatz(*f32, t1=2.0, num_save=5, beta=jnp.float64(1.0))
    assert wide.zeta.dtype == jnp.complex128


def test_bad_input():
    I2 = jnp.eye(2)
    good = jnp.array([0.1, 0.9, 2.0, -1.3])
    with pytest.raises(ValueError, match="need n >= 3 tokens, got n = 2"):
        watanabe_strogatz_constants(jnp.array([0.1, 0.5]))
    with pytest.raises(ValueError, match="theta0 must be a 1-d array"):
        solve_watanabe_strogatz(I2, I2, good[None, :], t1=1.0)
    with pytest.raises(ValueError, match="A must be a 2×2 matrix"):
        solve_watanabe_strogatz(jnp.eye(3), I2, good, t1=1.0)
    with pytest.raises(ValueError, match="all points coincide"):
        watanabe_strogatz_constants(jnp.array([0.3, 0.3, 0.3 + np.pi, 0.3]))
    with pytest.raises(ValueError, match="2 of n = 4 tokens coincide"):
        watanabe_strogatz_constants(jnp.array([0.3, 0.3 + np.pi, 1.0, 2.0]))
    with pytest.raises(ValueError, match=r"theta0\[1\] is not finite"):
        watanabe_strogatz_constants(good.at[1].set(jnp.inf))
    with pytest.raises(ValueError, match="V has non-finite"):
        solve_watanabe_strogatz(I2, I2.at[0, 0].set(jnp.nan), good, t1=1.0)

    # Under vmap (traced θ0) the problems become result codes; the good member is intact.
    ts = jnp.linspace(0.0, 1.0, 3)
    V = jnp.array([[0.2, 1.0], [-1.0, -0.2]])
    batch = jnp.stack([good, jnp.array([0.3, 0.3, 0.3 + np.pi, 0.3]), good.at[2].set(jnp.nan)])
    sol = jax.jit(
        jax.vmap(lambda th: solve_watanabe_strogatz(I2, V, th, t1=1.0, ts=ts, throw=False))
    )(batch)
    expected = (RESULTS.successful, RESULTS.degenerate_configuration, RESULTS.nonfinite_argument)
    for i, e in enumerate(expected):
        assert bool((sol.result == e)[i]), i
    assert bool(jnp.all(jnp.isfinite(sol.zeta[0]))) and bool(jnp.all(jnp.isnan(sol.zeta[1:])))
    assert [bool(v) for v in sol.constants.valid] == [True, False, False]
    with pytest.raises((eqx.EquinoxRuntimeError, jax.errors.JaxRuntimeError), match="degenerate"):
        jax.jit(lambda th: solve_watanabe_strogatz(I2, V, th, t1=1.0, ts=ts).zeta)(batch[1])
    # Eagerly, a solve that fails is a plain RuntimeError naming the code.
    few = solve_watanabe_strogatz(I2, V, good, t1=10.0, max_steps=2, throw=False)
    assert bool(few.result == RESULTS.max_steps_reached)
    with pytest.raises(RuntimeError, match="solve_watanabe_strogatz: .*maximum number") as e:
        solve_watanabe_strogatz(I2, V, good, t1=10.0, max_steps=2)
    assert "WatanabeStrogatzSolution.result" in str(e.value)


def test_token_speeds_equal_the_motion_of_the_reconstructed_tokens(runs):
    """`_token_speeds` (the sweep's rotation rate of WS members, from the Möbius parameters
    only) equals `_token_motion` of the reconstructed tokens: on the solutions, and on
    parameter paths with save steps of ΔΨ up to ±8 (token steps past π, which wrap) and
    |ζ| up to 0.98."""
    from jaxattn.dynamics._regimes import _token_motion
    from jaxattn.dynamics._watanabe_strogatz import _points, _token_speeds

    consts = jax.vmap(watanabe_strogatz_constants)(runs["theta0"])
    _, zeta, Psi, _, _, _ = runs["ws"]
    rng = np.random.default_rng(5)
    radius = rng.uniform(0, 0.98, (SEEDS, TS.shape[0]))
    zeta_wild = jnp.asarray(radius * np.exp(2j * np.pi * rng.uniform(size=radius.shape)))
    Psi_wild = jnp.asarray(np.cumsum(rng.uniform(-8, 8, radius.shape), axis=1))
    for z, P in ((zeta, Psi), (zeta_wild, Psi_wild)):
        fast = jax.vmap(lambda z, P, psi: _token_speeds(TS, z, P, psi))(z, P, consts.psi)
        slow = jax.vmap(lambda z, P, psi: _token_motion(TS, _points(z, P, psi)))(z, P, consts.psi)
        assert fast.shape == (SEEDS, TS.shape[0] - 1)
        np.testing.assert_allclose(np.asarray(fast), np.asarray(slow), rtol=1e-12, atol=1e-13)
    # The wild path does wrap: some token steps exceed π before wrapping.
    assert float(jnp.max(jnp.abs(jnp.diff(Psi_wild, axis=1)))) / 2 > np.pi
