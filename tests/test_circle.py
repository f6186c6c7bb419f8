"""d = 2: the Kuramoto–Daido form against the full attention field."""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxattn.dynamics import AttentionDynamics, simulate
from jaxattn.dynamics._circle import (
    KuramotoDaido,
    angles_from_tokens,
    angular_velocity,
    doubled_phase_forcing,
    kuramoto_daido,
    order_parameter,
    tokens_from_angles,
)


def _problem(key, n=7):
    k1, k2, k3, k4 = jax.random.split(key, 4)
    A = jax.random.normal(k1, (2, 2))
    V = jax.random.normal(k2, (2, 2))
    beta = jax.random.uniform(k3, (), minval=0.3, maxval=2.0)
    theta = jax.random.uniform(k4, (n,), minval=-np.pi, maxval=np.pi)
    return A, V, beta, theta


@jax.jit
def _both_fields(A, V, beta, theta):
    x = tokens_from_angles(theta)
    full = angular_velocity(x, AttentionDynamics(A, V, beta=beta)(0.0, x))
    return full, kuramoto_daido(theta, A, V, beta), KuramotoDaido(A, V, beta=beta)(0.0, theta)


def test_kuramoto_daido_equals_full_field(getkey):
    worst = 0.0
    for _ in range(5):
        A, V, beta, theta = _problem(getkey())
        full, kd, module = _both_fields(A, V, beta, theta)
        scale = 1 + float(jnp.max(jnp.abs(full)))
        err = max(float(jnp.max(jnp.abs(kd - full))), float(jnp.max(jnp.abs(module - full))))
        worst = max(worst, err / scale)
    print(f"max |KD − full| / (1 + max|full|) over 5 seeds: {worst:.2e}")
    assert worst < 1e-12


def test_riccati_form_of_doubled_angles(getkey):
    # z = e^{2iθ} obeys dz/dt = iωz + (H̃ − conj(H̃) z²)/2 with (ω, H̃) = doubled_phase_forcing.
    A, V, beta, theta = _problem(getkey(), n=11)
    z = jnp.exp(2j * theta)
    dz_from_angles = 2j * z * kuramoto_daido(theta, A, V, beta)
    omega, Ht = doubled_phase_forcing(order_parameter(theta, 2), A, V, beta)
    dz_riccati = 1j * omega * z + 0.5 * (Ht - jnp.conj(Ht) * z**2)
    assert float(jnp.max(jnp.abs(dz_from_angles - dz_riccati))) < 1e-13


def test_angles_round_trip(getkey):
    theta = jax.random.uniform(getkey(), (9,), minval=-np.pi, maxval=np.pi)
    assert float(jnp.max(jnp.abs(angles_from_tokens(tokens_from_angles(theta)) - theta))) < 1e-15
    # Antipodal tokens carry the same R₂ but opposite R₁.
    assert abs(complex(order_parameter(theta + np.pi, 2) - order_parameter(theta, 2))) < 1e-15
    assert abs(complex(order_parameter(theta + np.pi, 1) + order_parameter(theta, 1))) < 1e-15


def test_kuramoto_daido_module_integrates_like_particles(getkey):
    # The θ-field in diffrax reproduces the projected particle solve on the circle.
    A, V, beta, theta = _problem(getkey(), n=6)
    ts = jnp.linspace(0.0, 3.0, 7)
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(KuramotoDaido(A, V, beta=beta)),
        diffrax.Tsit5(),
        t0=0.0,
        t1=3.0,
        dt0=None,
        y0=theta,
        saveat=diffrax.SaveAt(ts=ts),
        stepsize_controller=diffrax.PIDController(rtol=1e-12, atol=1e-12),
    )
    traj = simulate(
        AttentionDynamics(A, V, beta=beta),
        tokens_from_angles(theta),
        t1=3.0,
        ts=ts,
        rtol=1e-12,
        atol=1e-12,
    )
    diff = jnp.angle(jnp.exp(1j * (sol.ys - angles_from_tokens(traj.xs))))
    err = float(jnp.max(jnp.abs(diff)))
    print(f"KuramotoDaido diffrax solve vs particles: {err:.2e}")
    assert err < 1e-9


def test_vmap_matches_loop(getkey):
    problems = [_problem(getkey()) for _ in range(3)]
    A, V, beta, theta = (jnp.stack(p) for p in zip(*problems))
    batched = jax.vmap(lambda a, v, b, t: KuramotoDaido(a, v, beta=b)(0.0, t))(A, V, beta, theta)
    for i, (a, v, b, t) in enumerate(problems):
        assert float(jnp.max(jnp.abs(batched[i] - kuramoto_daido(t, a, v, b)))) < 1e-14


def test_bad_input():
    I2 = jnp.eye(2)
    theta = jnp.linspace(0.0, 1.0, 4)
    with pytest.raises(ValueError, match="A must be a 2×2 matrix"):
        kuramoto_daido(theta, jnp.eye(3), I2)
    with pytest.raises(ValueError, match="V must be a 2×2 matrix"):
        KuramotoDaido(I2, jnp.ones((2, 3)))
    with pytest.raises(ValueError, match="theta must be a 1-d array"):
        kuramoto_daido(jnp.zeros((2, 3)), I2, I2)
    with pytest.raises(ValueError, match=r"theta\[2\] is not finite"):
        kuramoto_daido(theta.at[2].set(jnp.nan), I2, I2)
    with pytest.raises(ValueError, match="A has non-finite"):
        KuramotoDaido(I2.at[0, 1].set(jnp.inf), I2)
    with pytest.raises(ValueError, match="beta must be a scalar"):
        KuramotoDaido(I2, I2, beta=jnp.ones(2))
    with pytest.raises(ValueError, match="last axis of size 2"):
        angular_velocity(jnp.ones((3, 3)), jnp.ones((3, 3)))


def test_helpers_refuse_what_they_cannot_mean():
    from jaxattn.dynamics._circle import angular_velocity
    from jaxattn.dynamics._hamiltonian import (
        case4_hamiltonian,
        measured_rotation_rate,
        rotation_rate_on_circle,
    )

    theta = jnp.array([0.1, 0.7, 2.0])
    for m in (0, 1.5, True):
        with pytest.raises(ValueError, match="order_parameter: m must be an integer >= 1"):
            order_parameter(theta, m)
    with pytest.raises(ValueError, match="order_parameter: theta must be real angles"):
        order_parameter(theta + 0j, 2)
    # H of Case 4 lives in the open disc: NaN on and outside the circle, finite inside
    H = case4_hamiltonian(jnp.array([0.5j, 1.0 + 0j, 1.2 + 0j]), 0.5, 1.0)
    assert float(H[0]) == pytest.approx((2 * 0.5 * 0.5 + 1.0 * 1.25) / 0.75**2, rel=1e-14)
    assert bool(jnp.isnan(H[1])) and bool(jnp.isnan(H[2]))
    with pytest.raises(ValueError, match="num must be an integer >= 16"):
        rotation_rate_on_circle(jnp.eye(2), jnp.eye(2), num=1)
    ts = jnp.linspace(0.0, 10.0, 101)
    R = jnp.exp(0.8j * ts)
    assert measured_rotation_rate(ts, R) == pytest.approx(0.8, rel=1e-10)
    with pytest.raises(ValueError, match="ts and R must be 1-d of the same length"):
        measured_rotation_rate(ts, R[:-1])
    with pytest.raises(ValueError, match=r"start must be a fraction in \[0, 1\)"):
        measured_rotation_rate(ts, R, start=1.0)
    with pytest.raises(ValueError, match="holds 1 sample"):
        measured_rotation_rate(ts[:1], R[:1])
    assert measured_rotation_rate(ts, R, start=jnp.array(0.5)) == pytest.approx(0.8, rel=1e-10)
    with pytest.raises(ValueError, match="ts must be strictly increasing"):
        measured_rotation_rate(ts[::-1], R)
    # R = 0 has no phase: NaN when it is in the late part, ignored before it
    assert np.isnan(measured_rotation_rate(ts, R.at[80].set(0)))
    assert measured_rotation_rate(ts, R.at[10].set(0)) == pytest.approx(0.8, rel=1e-10)
    assert complex(order_parameter(theta, jnp.array(2))) == complex(order_parameter(theta, 2))
    with pytest.raises(ValueError, match="x and v must broadcast together"):
        angular_velocity(jnp.ones((3, 2)), jnp.ones((4, 2)))
