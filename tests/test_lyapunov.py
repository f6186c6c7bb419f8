"""Lyapunov spectra: closed forms on the sphere, Jacobians at sinks, zero exponents on closed
orbits, vmap against solo runs, the chaos verdict, and the three-token USA chaos candidate."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxattn.dynamics import (
    RESULTS,
    AttentionDynamics,
    LyapunovSpectrum,
    chaos_verdict,
    lyapunov_spectrum,
    lyapunov_spectrum_ott_antonsen,
)
from jaxattn.dynamics._chaos import poincare_section
from jaxattn.dynamics._circle import tokens_from_angles
from jaxattn.dynamics._lyapunov import TANGENT_STREAM
from jaxattn.dynamics._ott_antonsen import _oa_rhs
from jaxattn.sphere import sample_uniform


class LinearSphereFlow(eqx.Module):
    """A user flow: the projective linear flow `dx/dt = P⊥_x(M x)` of one token."""

    M: jax.Array

    def __call__(self, t, x, args):
        y = x @ self.M.T
        return y - jnp.sum(x * y, axis=-1, keepdims=True) * x


def test_linear_flow_on_the_sphere_matches_the_closed_form():
    # x(t) = e^{Mt} x0 / |e^{Mt} x0|; its derivative maps v to P⊥ e^{Mt} v / |e^{Mt} x0|, so
    # for real eigenvalues μ1 > μ2 > … of M and a generic x0 the exponents on S^{d-1} are
    # μ_j − μ1, j = 2..d (all d − 1 of them with k = d − 1).
    rng = np.random.default_rng(0)
    mu = np.array([0.9, 0.5, -0.2, -1.0])
    S = rng.normal(size=(4, 4))
    M = S @ np.diag(mu) @ np.linalg.inv(S)
    x0 = rng.normal(size=(1, 4))
    x0 /= np.linalg.norm(x0)
    sp = lyapunov_spectrum(LinearSphereFlow(jnp.asarray(M)), x0, t1=120.0, k=3, num_renorm=256)
    want = mu[1:] - mu[0]
    assert bool(sp.successful)
    err = np.abs(np.asarray(sp.exponents) - want)
    # the O(1/T) transient bias is what the stated uncertainty measures (measured: errors
    # 5e-5, 9e-6, 9e-6 at T = 120; 4.7e-3 at T = 60, inside its uncertainty too)
    assert np.all(err <= 3 * np.asarray(sp.uncertainty) + 1e-6), (sp.exponents, sp.uncertainty)
    assert np.all(err < 3e-4)
    # all exponents: their sum is the divergence on the sphere at the sink, Σ_j (μ_j − μ1)
    assert float(sp.sum) == pytest.approx(want.sum(), abs=5e-3)
    assert np.all(np.diff(np.asarray(sp.exponents)) < 0)
    assert sp.history.shape == (256, 3) and np.isnan(sp.history[0]).all()
    assert not bool(chaos_verdict(sp)[0])


I2 = np.eye(2)
# sink inside the disc (Case 1, sym A negative definite, V = I): complex Jacobian pair;
# Case-4 closed orbit (v11 = 0.2 < v12 = 1); Case 2 clustering on the circle (V = diag(1, .3)).
OA_A = np.stack([[[-1.0, 0.8], [-0.3, -0.5]], I2, I2])
OA_V = np.stack([I2, [[0.2, 1.0], [-1.0, -0.2]], np.diag([1.0, 0.3])])
OA_R0 = np.array([0.3 + 0.2j, 0.3 + 0.1j, 0.2 - 0.4j])
OA_T1 = np.array([100.0, 400.0, 100.0])


@eqx.filter_jit
def _oa(A, V, R0, t1):
    return lyapunov_spectrum_ott_antonsen(A, V, R0, t1=t1, k=2, num_renorm=256)


_oa_batch = jax.jit(jax.vmap(_oa))


@pytest.fixture(scope="module")
def oa_solo():
    return [_oa(OA_A[i], OA_V[i], OA_R0[i], OA_T1[i]) for i in range(3)]


@pytest.mark.parametrize("i", [0, 2])
def test_ott_antonsen_sink_exponents_are_the_jacobian_eigenvalues(oa_solo, i):
    sp = oa_solo[i]
    assert bool(sp.successful)
    y = sp.final
    args = (jnp.asarray(OA_A[i]), jnp.asarray(OA_V[i]), 1.0)
    assert float(jnp.max(jnp.abs(_oa_rhs(0.0, y, args)))) < 1e-10  # at the sink
    J = jax.jacfwd(lambda z: _oa_rhs(0.0, z, args))(y)
    want = np.sort(np.linalg.eigvals(np.asarray(J)).real)[::-1]
    err = np.abs(np.asarray(sp.exponents) - want)
    assert np.all(err <= 3 * np.asarray(sp.uncertainty) + 1e-8), (sp.exponents, want)
    assert np.all(err < 2e-3)
    assert not bool(chaos_verdict(sp)[0])


def test_case4_closed_orbit_has_zero_exponents_within_uncertainty(oa_solo):
    sp = oa_solo[1]
    assert bool(sp.successful)
    lam, sig = np.asarray(sp.exponents), np.asarray(sp.uncertainty)
    # both vanish (flow direction, and the shear across the family of closed orbits,
    # whose finite-time estimate decays like log t / t)
    assert np.all(np.abs(lam) <= 3 * sig), (lam, sig)
    assert np.all(sig < 0.02)
    # the orbit really oscillates (not a sink): the final point is not at rest
    assert float(jnp.max(jnp.abs(_oa_rhs(0.0, sp.final, (I2, OA_V[1], 1.0))))) > 0.05
    assert not bool(chaos_verdict(sp)[0])


def test_vmap_equals_solo_runs(oa_solo):
    batch = _oa_batch(OA_A, OA_V, OA_R0, OA_T1)
    for i, solo in enumerate(oa_solo):
        one = jax.tree.map(lambda a: a[i], batch)
        np.testing.assert_allclose(one.exponents, solo.exponents, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(one.uncertainty, solo.uncertainty, rtol=1e-7, atol=1e-12)
        assert int(one.num_steps) == int(solo.num_steps)
    chaotic, ev = chaos_verdict(batch)
    assert chaotic.shape == (3,) and ev["margin"].shape == (3,)
    # a bad member (NaN in V) reports NaN exponents and its code, and poisons nothing
    V_bad = OA_V.copy()
    V_bad[1, 0, 0] = np.nan
    bad = _oa_batch(OA_A, V_bad, OA_R0, OA_T1)
    code = int(RESULTS.nonfinite_argument._value)
    np.testing.assert_array_equal(bad.result._value, [0, code, 0])
    assert np.isnan(bad.exponents[1]).all()
    keep = np.array([0, 2])
    np.testing.assert_allclose(bad.exponents[keep], batch.exponents[keep], rtol=1e-12)
    assert not bool(chaos_verdict(bad)[0][1])


def test_clustering_without_continuous_symmetry_has_no_positive_exponent():
    # LSA, d = 2, A = I, V = diag(1, 0.3): two antipodal clusters on the top eigenvector of V
    # (isolated: no rotation invariance). All exponents are negative and equal the
    # eigenvalues of the Jacobian of the angle dynamics at the clustered state.
    field = AttentionDynamics(I2, np.diag([1.0, 0.3]), beta=1.0)
    theta0 = np.array([0.3, 1.2, 2.0, -2.5])
    sp = lyapunov_spectrum(field, tokens_from_angles(theta0), t1=120.0, k=2, num_renorm=128)
    assert bool(sp.successful)
    lam, sig = np.asarray(sp.exponents), np.asarray(sp.uncertainty)
    assert lam[0] + 3 * sig[0] < 0, (lam, sig)

    def angular(theta):
        x = tokens_from_angles(theta)
        f = field(0.0, x)
        return -jnp.sin(theta) * f[:, 0] + jnp.cos(theta) * f[:, 1]

    theta_end = jnp.arctan2(sp.final[:, 1], sp.final[:, 0])
    want = np.sort(np.linalg.eigvals(np.asarray(jax.jacfwd(angular)(theta_end))).real)[::-1]
    np.testing.assert_allclose(lam, want[:2], atol=max(3 * sig.max(), 1e-6))
    assert not bool(chaos_verdict(sp)[0])


def test_chaos_verdict_rule():
    def spectrum(lam, sig, ok=True):
        z = jnp.zeros((16,))
        return LyapunovSpectrum(
            exponents=jnp.array([lam, -1.0]),
            uncertainty=jnp.array([sig, 0.01]),
            times=z,
            history=jnp.zeros((16, 2)),
            local=jnp.zeros((16, 2)),
            result=RESULTS.successful if ok else RESULTS.max_steps_reached,
            num_steps=jnp.array(0),
            num_accepted_steps=jnp.array(0),
            num_rejected_steps=jnp.array(0),
            final=jnp.zeros((3, 2)),
        )

    assert bool(chaos_verdict(spectrum(0.2, 0.01))[0])
    assert not bool(chaos_verdict(spectrum(0.2, 0.1))[0])  # within 3σ of zero
    assert not bool(chaos_verdict(spectrum(5e-4, 1e-6))[0])  # below the floor
    assert not bool(chaos_verdict(spectrum(0.2, 0.01, ok=False))[0])  # failed solve
    assert not bool(chaos_verdict(spectrum(jnp.nan, jnp.nan))[0])
    _, ev = chaos_verdict(spectrum(0.2, 0.01))
    assert float(ev["margin"]) == pytest.approx(0.2 - 0.03)


def test_bad_input_is_refused_by_name():
    field = AttentionDynamics(I2, I2)
    x0 = tokens_from_angles(jnp.array([0.1, 0.7]))
    with pytest.raises(ValueError, match="k must be"):
        lyapunov_spectrum(field, x0, t1=10.0, k=3)  # dim = n (d - 1) = 2
    with pytest.raises(ValueError, match="num_renorm"):
        lyapunov_spectrum(field, x0, t1=10.0, num_renorm=4)
    with pytest.raises(ValueError, match="transient"):
        lyapunov_spectrum(field, x0, t1=10.0, transient=9.9)
    with pytest.raises(ValueError, match="t1 > t0"):
        lyapunov_spectrum(field, x0, t1=-1.0)
    with pytest.raises(ValueError, match="field must be a flow"):
        lyapunov_spectrum(lambda t, x, a: x, x0, t1=10.0)
    with pytest.raises(ValueError, match="R0"):
        lyapunov_spectrum_ott_antonsen(I2, I2, 1.5, t1=10.0)


# The three-token USA chaos candidate (d = 2): A = [[0, 0], [-2, 1]], V = [[0, 1], [-2, 0]].
CANDIDATE = dict(
    A=np.array([[0.0, 0.0], [-2.0, 1.0]]), V=np.array([[0.0, 1.0], [-2.0, 0.0]]), beta=1.0
)


@pytest.mark.slow
def test_chaos_candidate_estimates_agree_across_starts_and_intervals():
    # Measured properties only (no expected value of λ1): two initial conditions and two
    # renormalisation intervals (Δ = 2 and Δ = 1, the latter over half the horizon) give the
    # same spectrum within the stated uncertainties; the exponent along the flow direction
    # vanishes within its uncertainty; the three exponents sum to a negative number (the
    # flow contracts volume on the 3-torus).
    field = AttentionDynamics(**CANDIDATE, kernel="usa")
    theta = jnp.array([[0.4, 2.1, -1.9], [-1.0, 0.2, 2.8], [0.4, 2.1, -1.9]])
    t1 = jnp.array([800.0, 800.0, 400.0])

    @jax.vmap
    def run(th, t):
        return lyapunov_spectrum(field, tokens_from_angles(th), t1=t, k=3, num_renorm=400)

    sp = run(theta, t1)
    assert bool(jnp.all(sp.successful))
    lam, sig = np.asarray(sp.exponents), np.asarray(sp.uncertainty)
    for j in (1, 2):
        assert np.all(np.abs(lam[0] - lam[j]) <= 3 * np.hypot(sig[0], sig[j])), (lam, sig)
    assert np.all(np.abs(lam[:, 1]) <= 3 * sig[:, 1]), (lam, sig)
    assert np.all(np.asarray(sp.sum) < 0)


def test_poincare_section_of_a_linear_flow_on_the_torus():
    # θ1 = 0.3 − t, θ2 = 0.5 t, θ3 = 2: θ1 ≡ 0 (decreasing) at t = 0.3 + 2π m, where
    # θ2 = 0.15 + π m; linear interpolation is exact here
    ts = np.linspace(0.0, 40.0, 4001)
    theta = np.stack([0.3 - ts, 0.5 * ts, np.full_like(ts, 2.0)], -1)
    theta = np.mod(theta, 2 * np.pi)  # wrapped input, unwrapped inside
    t, pts = poincare_section(ts, theta, index=0, direction=-1)
    m = np.arange(len(t))
    np.testing.assert_allclose(t, 0.3 + 2 * np.pi * m, atol=1e-9)
    want = np.mod(0.15 + np.pi * m + np.pi, 2 * np.pi) - np.pi
    np.testing.assert_allclose(pts[:, 0], want, atol=1e-9)
    np.testing.assert_allclose(pts[:, 1], 2.0, atol=1e-12)
    assert len(t) == 7  # 0.3 + 2π·6 = 38.0 < 40 < 0.3 + 2π·7
    assert len(poincare_section(ts, theta, index=0, direction=1)[0]) == 0
    with pytest.raises(ValueError, match="index"):
        poincare_section(ts, theta, index=3)


def test_plot_chaos_labels_every_axis_and_legend_entry():
    import matplotlib

    matplotlib.use("Agg")
    from jaxattn.plot import plot_chaos

    rng = np.random.default_rng(0)
    times = np.linspace(1.0, 100.0, 50)
    history = np.stack([0.2 + 1 / times, 0.1 / times, -3.8 - 1 / times], -1)
    history[:5] = np.nan  # transient
    section = dict(
        ts=np.linspace(0, 50, 500),
        theta=rng.uniform(-np.pi, np.pi, (500, 3)),
        poincare=rng.uniform(-np.pi, np.pi, (20, 2)),
        section="θ₁ ≡ 0 (mod 2π), crossed with θ₁ decreasing; (θ₂, θ₃) at the crossings",
        times=times,
        history=history,
        exponents=np.array([[0.21, 0.001, -3.81]]),
        uncertainty=np.array([[0.01, 0.005, 0.02]]),
    )
    fig = plot_chaos(section)
    axes = [a for a in fig.axes if a.get_label() != "<colorbar>"]
    assert len(axes) == 3
    for ax in axes:
        assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title()
    colorbar = [a for a in fig.axes if a.get_label() == "<colorbar>"]
    assert colorbar and colorbar[0].get_ylabel() == "time t"
    assert [t.get_text() for t in axes[1].get_legend().get_texts()] == ["20 crossings"]
    labels = [t.get_text() for t in axes[2].get_legend().get_texts()]
    assert "running estimate λ1(t)" in labels and "zero" in labels
    assert "λ1 = +0.2100 ± 0.0100" in labels and "λ3 = -3.8100 ± 0.0200" in labels
    with pytest.raises(ValueError, match="lacks"):
        plot_chaos({"ts": section["ts"]})
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_tangent_vectors_are_independent_of_tokens_drawn_with_the_same_key():
    # Tokens drawn with key(0), the default tangent key: the tangent vectors come from their
    # own stream (fold_in), so none is parallel to a token and the spectrum does not hinge on
    # rounding: eager and jit agree (before, they differed by more than their uncertainty).
    x0 = sample_uniform(jax.random.key(0), 3, 2, dtype=jnp.float64)
    field = AttentionDynamics(jnp.eye(2), jnp.eye(2), beta=1.0)
    kw = dict(t1=20.0, k=2, num_renorm=64)
    eager = lyapunov_spectrum(field, x0, **kw)
    jitted = jax.jit(lambda x: lyapunov_spectrum(field, x, **kw))(x0)
    np.testing.assert_allclose(eager.exponents, jitted.exponents, rtol=0, atol=1e-10)
    W0 = jax.random.normal(
        jax.random.fold_in(jax.random.key(0), TANGENT_STREAM), (2, 3, 2), jnp.float64
    )
    cosines = np.abs(np.sum(np.asarray(W0) * np.asarray(x0), -1)) / np.linalg.norm(W0, axis=-1)
    assert cosines.max() < 0.999


def test_off_sphere_tokens_warn_and_traced_nonpositive_beta_is_a_code():
    x0 = sample_uniform(jax.random.key(1), 3, 2, dtype=jnp.float64)
    field = AttentionDynamics(jnp.eye(2), jnp.eye(2), beta=1.0)
    with pytest.warns(UserWarning, match="lyapunov_spectrum: initial tokens are off") as w:
        a = lyapunov_spectrum(field, 2 * x0, t1=10.0, k=1, num_renorm=32)
    assert w[0].filename == __file__
    b = lyapunov_spectrum(field, x0, t1=10.0, k=1, num_renorm=32)
    np.testing.assert_allclose(a.exponents, b.exponents, rtol=0, atol=1e-12)
    # the default transient (a tenth) leaves 16 of 18 segments: the documented minimum
    lyapunov_spectrum(field, x0, t1=10.0, k=1, num_renorm=18)
    with pytest.raises(ValueError, match="leave at least 16"):
        lyapunov_spectrum(field, x0, t1=10.0, k=1, num_renorm=17)
    # Ott–Antonsen: a traced β ≤ 0 gives NaN and the code simulate gives
    V = jnp.diag(jnp.array([1.0, -0.5]))
    sp = jax.jit(
        lambda b: lyapunov_spectrum_ott_antonsen(jnp.eye(2), V, 0.1, beta=b, t1=10.0, num_renorm=32)
    )(-1.0)
    assert sp.result == RESULTS.nonpositive_beta and np.isnan(sp.exponents).all()
