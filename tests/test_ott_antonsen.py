"""The Ott–Antonsen reduction: field, solver, wrapped-Cauchy sampling, particles at n = 10⁴."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxattn.dynamics import RESULTS, AttentionDynamics, simulate
from jaxattn.dynamics._circle import (
    angles_from_tokens,
    angular_velocity,
    order_parameter,
    tokens_from_angles,
)
from jaxattn.dynamics._ott_antonsen import (
    _wrapped_cauchy,
    ott_antonsen_field,
    sample_wrapped_cauchy,
    solve_ott_antonsen,
)

TS = jnp.linspace(0.0, 10.0, 101)
TIGHT = dict(rtol=1e-11, atol=1e-12)


def _random_problem(key):
    k1, k2, k3, k4, k5 = jax.random.split(key, 5)
    A = jax.random.normal(k1, (2, 2))
    V = jax.random.normal(k2, (2, 2))
    beta = jax.random.uniform(k3, (), minval=0.3, maxval=2.0)
    R = jax.random.uniform(k4, (), maxval=0.8) * jnp.exp(
        1j * jax.random.uniform(k5, (), maxval=2 * np.pi)
    )
    return A, V, beta, R


@jax.jit
def _oa_field_and_particle_drift(A, V, beta, z):
    # A deterministic "quantile" ensemble of the wrapped Cauchy law with resultant z: the
    # images under u ↦ (z + u)/(1 + conj(z) u) of N equally spaced points of the circle.
    # Its empirical moments are z^m up to |z|^(N−m), so the mean-field drift of R₂ computed
    # from the *full* attention field at these tokens is the Poisson-kernel drift.
    N = 256
    u = jnp.exp(2j * jnp.pi * (jnp.arange(N) + 0.5) / N)
    phi = jnp.angle((z + u) / (1 + jnp.conj(z) * u))
    theta = 0.5 * phi + jnp.pi * (jnp.arange(N) % 2)  # token identity: either lift
    x = tokens_from_angles(theta)
    dphi = 2 * angular_velocity(x, AttentionDynamics(A, V, beta=beta)(0.0, x))
    drift = jnp.mean(1j * jnp.exp(1j * phi) * dphi)
    return ott_antonsen_field(z, A, V, beta), drift, order_parameter(theta, 2)


def test_field_is_poisson_kernel_mean_field(getkey):
    worst = 0.0
    for _ in range(5):
        A, V, beta, z = _random_problem(getkey())
        oa, drift, R_emp = _oa_field_and_particle_drift(A, V, beta, z)
        assert abs(complex(R_emp - z)) < 1e-13
        worst = max(worst, abs(complex(oa - drift)) / (1 + abs(complex(drift))))
    print(f"OA field vs Poisson-kernel mean-field drift of the full field: {worst:.2e}")
    assert worst < 1e-12


def test_closed_form_A_V_identity():
    # A = V = I: H = R, Ω = 0, so dR/dt = (β/2) R (1 − |R|²): arg R constant and
    # |R|² = r0² e^{βt} / (1 − r0² + r0² e^{βt}).
    beta, r0, arg0 = 1.3, 0.3, 0.7
    I2 = jnp.eye(2)
    sol = solve_ott_antonsen(I2, I2, r0 * np.exp(1j * arg0), beta=beta, t1=10.0, ts=TS, **TIGHT)
    growth = np.exp(beta * np.asarray(TS))
    exact = r0**2 * growth / (1 - r0**2 + r0**2 * growth)
    err_mod = float(np.max(np.abs(np.abs(sol.R) ** 2 - exact)))
    err_arg = float(np.max(np.abs(np.angle(sol.R) - arg0)))
    print(f"closed form |R|²: {err_mod:.2e}, arg: {err_arg:.2e}, steps {int(sol.num_steps)}")
    assert err_mod < 1e-9 and err_arg < 1e-12
    assert bool(sol.successful) and float(sol.disc_overshoot) < 1e-14
    # The circle |R| = 1 is invariant (two antipodal clusters stay clustered). In a clustering
    # regime it is attracting, so the numerical solution must stay on it to rounding (in the
    # oscillating Case 4 it repels and truncation error drifts inwards, ~4e-9 at rtol 1e-11).
    A1 = jnp.array([[1.0, 0.5], [-0.3, 0.8]])
    on_circle = solve_ott_antonsen(A1, I2, np.exp(0.4j), t1=10.0, ts=TS, **TIGHT)
    dev = float(jnp.max(jnp.abs(jnp.abs(on_circle.R) - 1)))
    print(
        f"|R0| = 1: max ||R| − 1| = {dev:.2e}, "
        f"overshoot clipped {float(on_circle.disc_overshoot):.2e}"
    )
    assert dev < 1e-12 and float(on_circle.disc_overshoot) < 1e-12
    # A rounding-sized overshoot of the initial value is clipped and reported.
    outside = solve_ott_antonsen(A1, I2, (1 + 5e-13) * np.exp(0.4j), t1=10.0, ts=TS, **TIGHT)
    assert abs(float(outside.disc_overshoot) - 5e-13) < 1e-15
    assert float(jnp.max(jnp.abs(outside.R))) <= 1.0


def test_sample_wrapped_cauchy(getkey):
    n = 20000
    R0 = 0.6 * np.exp(-1.1j)
    theta = sample_wrapped_cauchy(getkey(), n, R0)
    assert theta.shape == (n,)
    assert float(jnp.min(theta)) >= -np.pi and float(jnp.max(theta)) <= np.pi
    # Moments of φ = 2θ: E e^{imφ} = R0^m, sampling error ≤ 1/√n per moment.
    for m in (1, 2, 3):
        err = abs(complex(order_parameter(theta, 2 * m)) - R0**m)
        assert err < 4 / np.sqrt(n), (m, err)
    # symmetric=True: antipodal lift drawn at random, so R₁ ≈ 0; symmetric=False: θ ∈ (−π/2, π/2].
    assert abs(complex(order_parameter(theta, 1))) < 4 / np.sqrt(n)
    half = sample_wrapped_cauchy(getkey(), 1000, R0, symmetric=False)
    assert float(jnp.max(jnp.abs(half))) <= np.pi / 2
    # jit/vmap over R0.
    batch = jax.jit(jax.vmap(lambda k, r: sample_wrapped_cauchy(k, 4000, r)))(
        jax.random.split(getkey(), 2), jnp.array([0.2j, -0.5 + 0j])
    )
    for row, r in zip(batch, (0.2j, -0.5)):
        assert abs(complex(order_parameter(row, 2)) - r) < 4 / np.sqrt(4000)


def test_sample_wrapped_cauchy_keeps_its_half_open_range_in_float32():
    # Near R0 = -1 many doubled angles φ = 2θ sit at ±π; in float32 some land on −π
    # exactly (12 of these 3·10⁶ did), which must read as θ = π/2, not −π/2.
    from jaxattn.dynamics._ott_antonsen import _wrapped_cauchy

    draw = jax.jit(lambda k: _wrapped_cauchy(k, 10**6, -0.99, False, jnp.float32, "t"))
    low, edge = np.float32(-np.pi / 2), 0
    for seed in range(3):
        theta, x = map(np.asarray, draw(jax.random.key(seed)))
        assert theta.min() > low and theta.max() <= -low
        edge += int(np.sum(theta >= -low - 1e-6))  # the end φ = π is reached
        # The tokens are those of the angles (the antipode of the one first computed).
        np.testing.assert_allclose(x, np.stack([np.cos(theta), np.sin(theta)], -1), atol=4e-7)
    assert edge > 0


@pytest.mark.parametrize(
    "n, R0, kwargs, match",
    [
        (2.5, 0.3, {}, "n must be an integer"),
        ("5", 0.3, {}, "n must be an integer"),
        (True, 0.3, {}, "n must be an integer"),
        (0, 0.3, {}, "need n >= 1"),
        (5, 0.3, dict(dtype=jnp.float16), "dtype must be float32 or float64"),
        (5, 0.3, dict(dtype=jnp.int32), "dtype must be float32 or float64"),
        (5, 0.3, dict(dtype=jnp.complex64), "dtype must be float32 or float64"),
        (5, 0.3, dict(dtype="banana"), "dtype must be float32 or float64"),
        (5, 1.0, {}, r"\|R0\| < 1"),
        (5, np.nan, {}, "not finite"),
        (5, np.ones(2), {}, "complex scalar"),
        # below 1 in float64, 1 once rounded to float32: the point mass, refused
        (5, 1 - 1e-9, dict(dtype=jnp.float32), r"\|R0\| < 1 .*float32"),
    ],
)
def test_sample_wrapped_cauchy_bad_arguments(getkey, n, R0, kwargs, match):
    with pytest.raises(ValueError, match=match):
        sample_wrapped_cauchy(getkey(), n, R0, **kwargs)


def test_sample_wrapped_cauchy_float32_near_the_circle(getkey):
    # The largest |R0| a float32 sample takes is one below 1 in float32: its angles are
    # float32 and concentrate on the antipodal pair of arg(R0)/2, as the law says.
    R0 = float(np.nextafter(np.float32(1), np.float32(0)))
    theta = sample_wrapped_cauchy(getkey(), 1000, R0, dtype=jnp.float32)
    assert theta.dtype == jnp.float32
    assert abs(complex(order_parameter(theta.astype(jnp.float64), 2)) - R0) < 1e-3


def test_wrapped_cauchy_tokens_without_trigonometry(getkey):
    # The sweep's sampler returns the public sampler's angles and their tokens, the latter
    # from e^{2iθ} in roots and divisions; both equal the library's trigonometry to
    # rounding, in every quadrant and with either lift.
    for R0 in (0.0, 0.3 + 0.1j, -0.9 + 0.2j, 0.999j):
        for symmetric in (True, False):
            key = getkey()
            theta, x = _wrapped_cauchy(key, 5000, R0, symmetric, jnp.float64, "test")
            public = sample_wrapped_cauchy(key, 5000, R0, symmetric=symmetric)
            np.testing.assert_array_equal(theta, public)
            np.testing.assert_allclose(x[:, 0], jnp.cos(theta), rtol=0, atol=5e-16)
            np.testing.assert_allclose(x[:, 1], jnp.sin(theta), rtol=0, atol=5e-16)
            # the angles are those of the exact construction (library e^{iu} and angle)
            k_u, _ = jax.random.split(key)
            u = jax.random.uniform(k_u, (5000,), jnp.float64, minval=-np.pi, maxval=np.pi)
            v = jnp.exp(1j * u)
            half = 0.5 * jnp.angle((R0 + v) / (1 + np.conj(R0) * v))
            lifted = jnp.round((theta - half) / np.pi)
            assert set(np.unique(np.asarray(lifted)).tolist()) <= (
                {-1.0, 0.0, 1.0} if symmetric else {0.0}
            )
            np.testing.assert_allclose(theta - np.pi * lifted, half, rtol=0, atol=2e-15)
    # near the circle a tiny half angle flipped by −π rounds to −π: returned as π
    edge = sample_wrapped_cauchy(getkey(), 20000, 1 - 1e-15)
    assert float(jnp.min(edge)) > -np.pi and float(jnp.max(edge)) <= np.pi
    # tokens in float32 stay float32
    theta32, x32 = _wrapped_cauchy(getkey(), 100, 0.5, True, jnp.float32, "test")
    assert theta32.dtype == x32.dtype == jnp.float32
    assert float(jnp.max(jnp.abs(x32[:, 0] - jnp.cos(theta32)))) < 3e-7


# Regimes (docs/theory/regimes.md): Case 4 oscillation (closed orbits), Case 2 clustering
# (λ_max(V) > 0) and convergence to an interior point (V negative definite), Case 3 rotating
# clusters.
# Measured max |R_particles − R_OA|·√n over seeds 0–4 (t ≤ 10): oscillation ≤ 1.31,
# clustering ≤ 1.22, interior ≤ 1.14. (Case 1 with A = [[1, .5], [−.3, .8]], V = I reached
# 2.1–3.1/√n: the final cluster direction depends on the initial state, so the initial
# sampling offset is not damped; it is not part of the 3/√n check.)
_J = np.array([[0.0, -1.0], [1.0, 0.0]])
REGIMES = {
    "case4_oscillation": (np.eye(2), np.array([[0.2, 1.0], [-1.0, -0.2]]), 10.0),
    "case2_clustering": (np.eye(2), np.array([[1.0, 0.3], [0.3, -0.5]]), 10.0),
    "case2_interior": (np.eye(2), np.array([[-1.0, 0.3], [0.3, -0.5]]), 10.0),
    # Rotating clusters drift in phase: an O(1/√n) offset at t = 0 turns into a phase lag
    # that grows (measured 5–8/√n by t = 10 for three seeds), so only t ≤ 1 is compared.
    "case3_rotating": (np.diag([2.0, 1.0]), np.eye(2) + _J, 1.0),
}


@pytest.mark.slow
def test_particles_follow_ott_antonsen(getkey):
    n = 10_000
    R0 = 0.3 * np.exp(0.5j)
    theta0 = sample_wrapped_cauchy(getkey(), n, R0)
    x0 = tokens_from_angles(theta0)
    As = jnp.asarray(np.stack([r[0] for r in REGIMES.values()]))
    Vs = jnp.asarray(np.stack([r[1] for r in REGIMES.values()]))

    @jax.jit
    @jax.vmap
    def run(A, V):
        traj = simulate(
            AttentionDynamics(A, V), x0, t1=10.0, ts=TS, rtol=1e-8, atol=1e-10, throw=False
        )
        oa = solve_ott_antonsen(A, V, R0, t1=10.0, ts=TS, rtol=1e-10, atol=1e-12, throw=False)
        return order_parameter(angles_from_tokens(traj.xs), 2), oa.R, traj.result, oa.result

    R_particles, R_oa, res_p, res_oa = run(As, Vs)
    assert bool(jnp.all(res_p == RESULTS.successful)) and bool(
        jnp.all(res_oa == RESULTS.successful)
    )
    bound = 3 / np.sqrt(n)
    for i, (name, (_, _, horizon)) in enumerate(REGIMES.items()):
        mask = np.asarray(TS) <= horizon
        err = float(jnp.max(jnp.abs(R_particles[i] - R_oa[i])[mask]))
        print(
            f"{name}: max |R_particles − R_OA| over t ≤ {horizon} = {err:.4f} "
            f"= {err * np.sqrt(n):.2f}/√n"
        )
        assert err < bound, name
    # The regimes are what they claim: oscillation stays inside, clustering approaches |R| = 1,
    # the interior case settles inside the disc.
    modulus = np.abs(np.asarray(R_oa))
    print(
        "final |R_OA|:",
        modulus[:, -1].round(4),
        "min |R| over t ≥ 5 (oscillation):",
        modulus[0, 50:].min().round(3),
    )
    assert modulus[0, 50:].max() < 0.9 and modulus[0, 50:].max() - modulus[0, 50:].min() > 0.05
    assert modulus[1, -1] > 0.99
    assert modulus[2, -1] < 0.9 and abs(complex(R_oa[2, -1] - R_oa[2, -11])) < 2e-2


def _final_R(A, V):
    return solve_ott_antonsen(
        A, V, 0.4 + 0.1j, beta=0.9, t1=3.0, ts=jnp.linspace(0.0, 3.0, 4), **TIGHT, throw=False
    ).R


def test_jit_vmap_grad(getkey):
    A, V, _, _ = _random_problem(getkey())

    def loss(A):
        R = _final_R(A, V)[-1]
        return jnp.real(R) + 2 * jnp.imag(R)

    # Central differences in every entry of A, evaluated as one vmapped, jitted batch; the
    # same batch checks vmap against solo runs.
    h = 1e-5
    E = jnp.eye(4).reshape(4, 2, 2) * h
    As = jnp.concatenate([A + E, A - E])
    batched = jax.jit(jax.vmap(_final_R, in_axes=(0, None)))(As, V)
    for i in (0, 5):
        solo = _final_R(As[i], V)
        assert float(jnp.max(jnp.abs(batched[i] - solo))) < 1e-13
    assert bool(jnp.all(jnp.isfinite(batched)))
    values = jnp.real(batched[:, -1]) + 2 * jnp.imag(batched[:, -1])
    fd = np.asarray((values[:4] - values[4:]) / (2 * h)).reshape(2, 2)
    g = np.asarray(jax.jit(jax.grad(loss))(A))
    rel = float(np.max(np.abs(g - fd)) / np.max(np.abs(fd)))
    print(f"grad wrt A vs central differences: relative error {rel:.2e}")
    assert rel < 1e-6


def test_bad_input():
    I2 = jnp.eye(2)
    with pytest.raises(ValueError, match="A must be a 2×2 matrix"):
        solve_ott_antonsen(jnp.eye(3), I2, 0.1, t1=1.0)
    with pytest.raises(ValueError, match="V has non-finite"):
        solve_ott_antonsen(I2, I2.at[1, 1].set(jnp.nan), 0.1, t1=1.0)
    with pytest.raises(ValueError, match=r"\|R0\| = 1.5 > 1"):
        solve_ott_antonsen(I2, I2, 1.5j, t1=1.0)
    with pytest.raises(ValueError, match="R0 is not finite"):
        solve_ott_antonsen(I2, I2, complex(np.nan, 0), t1=1.0)
    with pytest.raises(ValueError, match="R0 must be a complex scalar"):
        solve_ott_antonsen(I2, I2, jnp.zeros(2), t1=1.0)
    with pytest.raises(ValueError, match="ts must be a non-empty 1-d array"):
        solve_ott_antonsen(I2, I2, 0.1, t1=1.0, ts=jnp.zeros((2, 2)))
    with pytest.raises(ValueError, match=r"need \|R0\| < 1"):
        sample_wrapped_cauchy(jax.random.key(0), 10, 1.0)
    with pytest.raises(ValueError, match="need n >= 1"):
        sample_wrapped_cauchy(jax.random.key(0), 0, 0.5)

    # Under vmap with throw=False a bad member is reported and the others are intact.
    ts = jnp.linspace(0.0, 1.0, 3)
    V = jnp.array([[0.2, 1.0], [-1.0, -0.2]])
    run = jax.jit(jax.vmap(lambda r: solve_ott_antonsen(I2, V, r, t1=1.0, ts=ts, throw=False)))
    sol = run(jnp.array([0.3 + 0j, 1.5 + 0j, complex(np.nan, 0)]))
    codes = (
        [bool(c) for c in (sol.result == RESULTS.successful)],
        [bool(c) for c in (sol.result == RESULTS.outside_disc)],
        [bool(c) for c in (sol.result == RESULTS.nonfinite_argument)],
    )
    assert codes == ([True, False, False], [False, True, False], [False, False, True])
    assert bool(jnp.all(jnp.isnan(sol.R[1:])))
    good = solve_ott_antonsen(I2, V, 0.3, t1=1.0, ts=ts)
    assert float(jnp.max(jnp.abs(sol.R[0] - good.R))) < 1e-13
    # a traced β ≤ 0 (refused when concrete) is the code simulate gives, with NaN R
    betas = jnp.array([1.0, 0.0, -2.0])
    sol = jax.vmap(lambda b: solve_ott_antonsen(I2, V, 0.3, beta=b, t1=1.0, ts=ts, throw=False))(
        betas
    )
    assert [bool(c) for c in (sol.result == RESULTS.nonpositive_beta)] == [False, True, True]
    assert (
        bool(jnp.all(jnp.isnan(sol.R[1:]))) and float(jnp.max(jnp.abs(sol.R[0] - good.R))) < 1e-13
    )
    # With throw=True the traced |R0| > 1 raises with a message naming it.
    runtime_errors = (eqx.EquinoxRuntimeError, jax.errors.JaxRuntimeError)
    with pytest.raises(runtime_errors, match=r"\|R0\| > 1"):
        jax.jit(lambda r: solve_ott_antonsen(I2, V, r, t1=1.0, ts=ts).R)(1.5 + 0j)
    # max_steps: a result code with throw=False, an error with throw=True.
    few = solve_ott_antonsen(I2, V, 0.3, t1=10.0, ts=ts * 10, max_steps=2, throw=False)
    assert bool(few.result == RESULTS.max_steps_reached)
    with pytest.raises(RuntimeError, match="solve_ott_antonsen: .*maximum number of solver steps"):
        solve_ott_antonsen(I2, V, 0.3, t1=10.0, ts=ts * 10, max_steps=2)
