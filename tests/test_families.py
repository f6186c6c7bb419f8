"""Attention-flow families: multi-head, causal masking, normalisation schemes, time-varying
weights and their homogenised OA reduction, the PLGA flow, user flows and bad flows."""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxattn.dynamics as jd
from jaxattn.plga import PowerLawGraphAttention
from jaxattn.plga._metric_learner import MetricLearner
from jaxattn.sphere import project_tangent, sample_uniform

KINDS = [(k, c, m) for k in jd.KERNELS for c in (False, True) for m in jd.NORMALISATIONS]


def _mats(key, shape, scale=1.0):
    return scale * jax.random.normal(key, shape, jnp.float64)


# ------------------------------------------------------------------------ a user flow


class LinearSphereFlow(eqx.Module):
    """A user's flow in ten lines: dx/dt = P⊥_x(B x), the projective linear flow."""

    B: jax.Array

    def __call__(self, t, x, args):
        xh = x / jnp.linalg.norm(x, axis=-1, keepdims=True)
        return project_tangent(xh, xh @ self.B.T)


def test_user_flow_through_simulate_matches_closed_form(getkey):
    # x(t) = e^{Bt} x0 / |e^{Bt} x0| exactly (every token moves under one linear map)
    B = _mats(getkey(), (3, 3))
    x0 = sample_uniform(getkey(), 5, 3, dtype=jnp.float64)
    ts = jnp.linspace(0.0, 2.0, 5)
    traj = jd.simulate(LinearSphereFlow(B), x0, t1=2.0, ts=ts, rtol=1e-11, atol=1e-13)
    exact = jnp.einsum("tij,kj->tki", jax.vmap(lambda t: jax.scipy.linalg.expm(B * t))(ts), x0)
    exact = exact / jnp.linalg.norm(exact, axis=-1, keepdims=True)
    assert bool(traj.successful)
    assert float(jnp.max(jnp.abs(traj.xs - exact))) < 1e-8


def test_user_flow_through_sweep_compiles_once_per_shape():
    # B = diag(b, 0, -1) with b > 0: every token goes to ±e₁ (projective linear flow),
    # clustering into one antipodal pair; a batch of user flows is one vmapped module.
    from jaxattn.dynamics import _sweep as sw

    def flows(b):
        B = jnp.zeros((b.shape[0], 3, 3)).at[:, 0, 0].set(b).at[:, 2, 2].set(-1.0)
        return LinearSphereFlow(B)

    kw = dict(
        integration=jd.Integration(t1=40.0, num_save=81, time_scale="physical"),
        runner=jd.Runner(chunk_size=4, progress=False),
    )
    before = sw.num_traces()
    res = jd.sweep(jd.Members(flows(jnp.array([0.5, 1.0, 2.0, 3.0])), seeds=0, n=16, d=3), **kw)
    assert sw.num_traces() - before == 1
    assert list(res.regime_names) == ["clustering"] * 4
    assert np.all(res.evidence["antipodal_pairs"] == 1)
    jd.sweep(jd.Members(flows(jnp.array([0.6, 1.1, 2.1, 3.1])), seeds=1, n=16, d=3), **kw)
    assert sw.num_traces() - before == 1


# ------------------------------------------------------------------------ bad flows


class _NotTangent(eqx.Module):
    def __call__(self, t, x, args):
        return x


class _NaNFlow(eqx.Module):
    def __call__(self, t, x, args):
        return x.at[2, 0].set(jnp.nan) * 0


class _WrongShape(eqx.Module):
    def __call__(self, t, x, args):
        return x[:, :2]


class _NotJittable(eqx.Module):
    def __call__(self, t, x, args):
        if x[0, 0] > 0:  # Python control flow on a traced value
            return x * 0
        return x * 0


def test_bad_flows_are_refused_by_name(getkey):
    x0 = sample_uniform(getkey(), 4, 3, dtype=jnp.float64)
    with pytest.raises(ValueError, match="flow _NotTangent leaves the tangent space"):
        jd.simulate(_NotTangent(), x0, t1=1.0)
    with pytest.raises(ValueError, match="flow _NaNFlow returned non-finite values"):
        jd.simulate(_NaNFlow(), x0, t1=1.0)
    with pytest.raises(ValueError, match=r"flow _WrongShape must return dx/dt of the tokens' "):
        jd.simulate(_WrongShape(), x0, t1=1.0)
    with pytest.raises(ValueError, match="flow _NotJittable cannot be traced by JAX"):
        jd.simulate(_NotJittable(), x0, t1=1.0)
    # a flow that declares its state Euclidean may move the norms
    traj = jd.simulate(_EuclideanGrowth(), 2 * x0, t1=1.0, ts=jnp.array([0.0, 1.0]))
    np.testing.assert_allclose(traj.xs[-1], 2 * np.e * x0, rtol=1e-6)
    assert bool(jnp.isnan(traj.sphere_deviation))


class _EuclideanGrowth(eqx.Module):
    manifold: str = eqx.field(static=True, default="euclidean")

    def __call__(self, t, x, args):
        return x


# ------------------------------------------------------------------------ multi-head


def test_one_head_equals_attention_dynamics_every_kind(getkey):
    A, V = _mats(getkey(), (1, 4, 4)), _mats(getkey(), (1, 4, 4))
    x = _mats(getkey(), (9, 4))
    for kernel, causal, norm in KINDS:
        single = jd.AttentionDynamics(
            A[0], V[0], beta=0.8, kernel=kernel, causal=causal, normalisation=norm
        )
        multi = jd.MultiHeadDynamics(
            A, V, beta=0.8, kernel=kernel, causal=causal, normalisation=norm
        )
        err = float(jnp.max(jnp.abs(single(0.0, x) - multi(0.0, x))))
        assert err < 1e-12, (kernel, causal, norm, err)
        # and the fast paths agree with the pairwise O(n² d) sum
        err = float(jnp.max(jnp.abs(single(0.0, x) - single.direct_sum(x))))
        assert err < 1e-12, (kernel, causal, norm, err)
        assert multi.manifold == single.manifold == ("euclidean" if norm == "pre_ln" else "sphere")


@pytest.mark.parametrize("kernel", jd.KERNELS)
def test_heads_sum_with_output_maps(getkey, kernel):
    H, d = 3, 4
    A, V = _mats(getkey(), (H, d, d), 0.5), _mats(getkey(), (H, d, d))
    W = _mats(getkey(), (H, d, d))
    beta = jnp.array([0.5, 1.0, 1.5])
    x = _mats(getkey(), (7, d))
    xh = x / jnp.linalg.norm(x, axis=-1, keepdims=True)
    # W_o^{(h)} drive_h is the drive of the head with value map W_o^{(h)} V_h (linear in V)
    heads = [jd.AttentionDynamics(A[h], W[h] @ V[h], beta=beta[h], kernel=kernel) for h in range(H)]
    expected = project_tangent(xh, sum(f.drive(x) for f in heads))
    multi = jd.MultiHeadDynamics(A, V, beta=beta, kernel=kernel, W_o=W)
    assert float(jnp.max(jnp.abs(multi(0.0, x) - expected))) < 1e-12
    # one output map for the sum
    W1 = W[0]
    expected = project_tangent(
        xh,
        sum(
            jd.AttentionDynamics(A[h], V[h], beta=beta[h], kernel=kernel).drive(x) for h in range(H)
        )
        @ W1.T,
    )
    multi = jd.MultiHeadDynamics(A, V, beta=beta, kernel=kernel, W_o=W1)
    assert float(jnp.max(jnp.abs(multi(0.0, x) - expected))) < 1e-12


def test_multihead_bad_shapes():
    with pytest.raises(ValueError, match=r"A must have shape \(heads, d, d\)"):
        jd.MultiHeadDynamics(jnp.eye(3), jnp.eye(3))
    with pytest.raises(ValueError, match="V must have the shape of A"):
        jd.MultiHeadDynamics(jnp.zeros((2, 3, 3)), jnp.zeros((3, 3, 3)))
    with pytest.raises(ValueError, match=r"beta must be a scalar or have shape \(heads,\)"):
        jd.MultiHeadDynamics(jnp.zeros((2, 3, 3)), jnp.zeros((2, 3, 3)), beta=jnp.ones(3))
    with pytest.raises(ValueError, match="must be > 0"):
        jd.MultiHeadDynamics(jnp.zeros((2, 3, 3)), jnp.zeros((2, 3, 3)), beta=jnp.array([1, -1]))
    with pytest.raises(ValueError, match="W_o must have shape"):
        jd.MultiHeadDynamics(jnp.zeros((2, 3, 3)), jnp.zeros((2, 3, 3)), W_o=jnp.eye(2))
    with pytest.raises(ValueError, match="normalisation must be one of"):
        jd.AttentionDynamics(jnp.eye(2), jnp.eye(2), normalisation="peri")
    # values AttentionDynamics refuses are refused here too (complex A gave complex velocities)
    Z = jnp.zeros((2, 3, 3))
    with pytest.raises(ValueError, match="MultiHeadDynamics: A must hold real numbers"):
        jd.MultiHeadDynamics(Z + 0j, Z)
    with pytest.raises(ValueError, match="MultiHeadDynamics: V has non-finite entries"):
        jd.MultiHeadDynamics(Z, Z.at[0, 0, 0].set(jnp.nan))
    with pytest.raises(ValueError, match="MultiHeadDynamics: W_o has non-finite entries"):
        jd.MultiHeadDynamics(Z, Z, W_o=jnp.full((3, 3), jnp.inf))


def test_multihead_usa_overflow_names_the_score_shift(getkey):
    """A USA head whose weights overflow is refused before solving with the shift that fits
    (the largest β_h σ_max(A_h) over the heads), as for AttentionDynamics; the field was
    reported as "non-finite values" before."""
    eye = jnp.eye(3)
    field = jd.MultiHeadDynamics(
        jnp.stack([400 * eye, eye]), jnp.stack([eye, eye]), beta=2.0, kernel="usa"
    )
    shift = 800 - 0.5 * math.log(float(np.finfo(np.float64).max))
    assert jd.usa_score_shift(field) == pytest.approx(shift, rel=1e-14)
    x0 = sample_uniform(getkey(), 6, 3)
    match = r"simulate: USA scores reach beta\*sigma_max\(A\) = 800 .* to MultiHeadDynamics"
    with pytest.raises(ValueError, match=match):
        jd.simulate(field, x0, t1=1.0)
    with pytest.raises(ValueError, match="lyapunov_spectrum: USA scores reach"):
        jd.lyapunov_spectrum(field, x0, t1=1.0)
    # The bound adds the heads' value norms: scores of 600 and σ_max(V_h) = e^104 fit one
    # head (704 < log(float max) - log 64 = 705.6) but not twelve (704 + log 12 = 706.5).
    from jaxattn.dynamics._solve import check_usa_overflow

    def heads(h):
        A = jnp.broadcast_to(300 * eye, (h, 3, 3))
        V = jnp.broadcast_to(math.exp(104) * eye, (h, 3, 3))
        return jd.MultiHeadDynamics(A, V, beta=2.0, kernel="usa")

    check_usa_overflow("simulate", heads(1), jnp.float64)
    with pytest.raises(ValueError, match="= 600 .* to MultiHeadDynamics"):
        jd.simulate(heads(12), x0, t1=1.0)
    # Traced (vmapped over the scores' scale and the second head's beta), a member gets its
    # code as an AttentionDynamics member does: usa_overflow (the same bound, per member),
    # nonpositive_beta; it read nonfinite_flow / ran on before.
    from jaxattn.dynamics._solve import _usa_log_limit, usa_log_bound

    assert float(usa_log_bound(heads(12))) == pytest.approx(600 + 104 + math.log(12), rel=1e-14)
    limit = _usa_log_limit(jnp.float64)
    assert float(usa_log_bound(heads(1))) < limit < float(usa_log_bound(heads(12)))

    def run(scale, beta2):
        f = jd.MultiHeadDynamics(
            jnp.stack([scale * eye, eye]),
            jnp.stack([eye, eye]),
            beta=jnp.stack([2.0, beta2]),
            kernel="usa",
        )
        return jd.simulate(f, x0, t1=1.0, num_save=3, throw=False)

    out = jax.jit(jax.vmap(run))(jnp.array([1.0, 400.0, 1.0]), jnp.array([1.0, 1.0, -1.0]))
    codes = np.asarray(out.result._value).tolist()
    assert codes == [
        jd.RESULTS.successful._value,
        jd.RESULTS.usa_overflow._value,
        jd.RESULTS.nonpositive_beta._value,
    ]
    assert np.all(np.isfinite(out.xs[0])) and np.all(np.isnan(out.xs[1:]))


@pytest.mark.parametrize("time_scale", ["physical", "natural"])
def test_sweep_members_get_the_input_codes_of_every_builtin_flow(time_scale):
    """A sweep wraps a member that is not a plain AttentionDynamics (MultiHeadDynamics, an
    nGPT AttentionDynamics) in its natural-time rescaling, whose weights the per-member
    checks did not see: a head with beta -1 read successful, an overflowing USA member
    nonfinite_flow, time_stalled or even successful (helper-25). Now as simulate does."""
    eye = jnp.eye(3)
    codes = [jd.RESULTS.successful, jd.RESULTS.usa_overflow, jd.RESULTS.nonpositive_beta]
    codes = [int(c._value) for c in codes]

    def multihead(scale, beta2):
        return jd.MultiHeadDynamics(
            jnp.stack([scale * eye, eye]),
            jnp.stack([eye, eye]),
            beta=jnp.stack([2.0, beta2]),
            kernel="usa",
        )

    def ngpt(scale, beta):
        # beta sigma_max(A) = 800 > log(float64 max) - log 64 for the scale 400 member
        return jd.AttentionDynamics(
            scale * eye, eye, beta=2 * beta, kernel="usa", normalisation="ngpt"
        )

    kw = dict(
        integration=jd.Integration(t1=2.0, num_save=21, time_scale=time_scale),
        runner=jd.Runner(progress=False),
    )
    scales, betas = jnp.array([1.0, 400.0, 1.0]), jnp.array([1.0, 1.0, -1.0])
    for make in (multihead, ngpt):
        flows = eqx.filter_vmap(make)(scales, betas)
        res = jd.sweep(jd.Members(flows, seeds=np.arange(3), n=6), **kw)
        assert np.asarray(res.result).tolist() == codes, make.__name__


# ------------------------------------------------------------------------ causal masking


SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    "kernel", ["sa", pytest.param("usa", marks=SLOW), pytest.param("lsa", marks=SLOW)]
)
def test_causal_identity_first_token_at_rest_others_join_it(getkey, kernel):
    # A = V = I: token 1 attends only to itself (at rest); every later token is pulled to it
    # (for LSA, to ±x_1: the LSA flow is odd in each token).
    n, d = 6, 3
    x0 = sample_uniform(getkey(), n, d, dtype=jnp.float64)
    x0 = x0 * jnp.sign(x0 @ x0[0])[:, None]  # one hemisphere around x_1
    field = jd.AttentionDynamics(jnp.eye(d), jnp.eye(d), kernel=kernel, causal=True)
    assert float(jnp.max(jnp.abs(field(0.0, x0)[0]))) < 1e-15
    ts = jnp.linspace(0.0, 50.0, 101)
    traj = jd.simulate(field, x0, t1=50.0, ts=ts, rtol=1e-10, atol=1e-12)
    assert float(jnp.max(jnp.abs(traj.xs[:, 0] - x0[0]))) < 1e-12
    align = np.asarray(traj.xs[-1] @ x0[0])
    assert np.all(align > 1 - 1e-8), align
    regime, ev = jd.classify_tokens(ts, traj.xs)
    assert jd.regime_name(regime) == "clustering"
    assert int(ev.num_clusters) == 1


# ------------------------------------------------------------------------ normalisation


def test_normalisation_schemes_single_token_closed_forms(getkey):
    # n = 1, SA, V = I: the drive is θ itself. Pre-LN: x(t) = (|x0| + t) θ0, a straight ray;
    # Post-LN and nGPT: at rest.
    x0 = 1.5 * sample_uniform(getkey(), 1, 3, dtype=jnp.float64)
    ts = jnp.array([0.0, 1.0, 2.5])
    pre = jd.AttentionDynamics(jnp.eye(3), jnp.eye(3), kernel="sa", normalisation="pre_ln")
    traj = jd.simulate(pre, x0, t1=2.5, ts=ts, rtol=1e-10, atol=1e-12)
    expected = (1.5 + ts)[:, None, None] * x0[None] / 1.5
    assert float(jnp.max(jnp.abs(traj.xs - expected))) < 1e-9
    for norm in ("post_ln", "ngpt"):
        f = jd.AttentionDynamics(jnp.eye(3), jnp.eye(3), kernel="sa", normalisation=norm)
        assert float(jnp.max(jnp.abs(f(0.0, x0)))) < 1e-15


def test_normalisation_fields_definitions(getkey):
    # Pre-LN: dr_k/dt = <θ_k, drive_k>, dθ_k/dt = P⊥ drive_k / r_k; nGPT: |dθ/dt| = sin ∠(θ, drive)
    A, V = _mats(getkey(), (3, 3)), _mats(getkey(), (3, 3))
    x = 2.0 * _mats(getkey(), (6, 3))
    r = jnp.linalg.norm(x, axis=-1, keepdims=True)
    th = x / r
    post = jd.AttentionDynamics(A, V, kernel="usa")
    pre = jd.AttentionDynamics(A, V, kernel="usa", normalisation="pre_ln")
    ngpt = jd.AttentionDynamics(A, V, kernel="usa", normalisation="ngpt")
    drive = post.drive(x)
    v = pre(0.0, x)
    np.testing.assert_allclose(jnp.sum(th * v, -1), jnp.sum(th * drive, -1), rtol=1e-13)
    np.testing.assert_allclose(project_tangent(th, v) / r, post(0.0, x) / r, rtol=1e-13)
    speed = jnp.linalg.norm(ngpt(0.0, x), axis=-1)
    cos = jnp.sum(th * drive, -1) / jnp.linalg.norm(drive, axis=-1)
    np.testing.assert_allclose(speed, jnp.sqrt(1 - cos**2), rtol=1e-10)
    assert pre.manifold == "euclidean" and ngpt.manifold == "sphere"
    assert float(ngpt.natural_rate()) == 1.0


# ------------------------------------------------------------------------ time-varying


def _periodic(eps):
    A0, A1 = jnp.eye(2), 0.8 * jnp.array([[0.0, 1.0], [1.0, 0.0]])
    A2 = jnp.diag(jnp.array([0.5, -0.5]))
    V0, V1 = jnp.array([[0.3, -1.0], [1.0, 0.2]]), jnp.array([[0.0, 0.7], [0.2, 0.0]])
    V2 = jnp.diag(jnp.array([0.6, -0.4]))
    return jd.TimeVaryingDynamics(
        jd.PeriodicMatrix(A1, A2, epsilon=eps, constant=A0),
        jd.PeriodicMatrix(V1, V2, epsilon=eps, constant=V0),
    )


def test_time_varying_field_and_its_period_average(getkey):
    eps = 0.3
    flow = _periodic(eps)
    x = _mats(getkey(), (7, 2))
    t = 0.7
    A, V = flow.weights(t)
    np.testing.assert_allclose(
        flow(t, x, None), jd.AttentionDynamics(A, V)(0.0, x), rtol=0, atol=1e-14
    )
    # the homogenised flow is the period average of the field (a trigonometric polynomial of
    # degree 2 in t/ε: 16 equally spaced nodes integrate it exactly)
    nodes = 2 * math.pi * eps * jnp.arange(16) / 16
    average = jnp.mean(jax.vmap(lambda s: flow(s, x, None))(nodes), axis=0)
    assert float(jnp.max(jnp.abs(flow.homogenised()(0.0, x) - average))) < 1e-13
    # a callable schedule gives the same field
    callable_flow = jd.TimeVaryingDynamics(flow.A.__call__, lambda s: flow.V(s))
    np.testing.assert_allclose(callable_flow(t, x, None), flow(t, x, None), atol=1e-15)


def test_time_varying_non_jittable_callable_is_named():
    def bad_A(t):
        return jnp.eye(2) * float(t)  # float() of a tracer

    with pytest.raises(ValueError, match=r"TimeVaryingDynamics: A\(t\) is not jittable"):
        jd.TimeVaryingDynamics(bad_A, jnp.eye(2))
    with pytest.raises(ValueError, match=r"V \(or V\(t\)\) must be a square"):
        jd.TimeVaryingDynamics(jnp.eye(2), lambda t: jnp.ones(3))
    with pytest.raises(ValueError, match="only LSA is bilinear"):
        jd.TimeVaryingDynamics(jnp.eye(2), jnp.eye(2), kernel="sa").homogenised()
    # The refusal names what fails (it listed d, kernel, causal, normalisation, all fine).
    heads = jd.MultiHeadDynamics(jnp.eye(2)[None], jnp.eye(2)[None], W_o=2 * jnp.eye(2))
    with pytest.raises(ValueError, match=r"no output map; got d = 2, .*, an output map W_o\."):
        jd.homogenised_ott_antonsen_field(0.3 + 0j, heads)


@pytest.mark.slow
def test_particles_follow_homogenised_ott_antonsen_with_error_of_order_epsilon():
    # Tokens on the OA manifold exactly (up to |R|^n): Möbius images of equally spaced
    # points. Their R₂ then follows the time-dependent OA ODE, which first-order averaging
    # puts within O(ε) of the homogenised OA trajectory.
    n, z0, t1 = 256, 0.3 * np.exp(0.7j), 2.0
    w = np.exp(1j * (2 * np.pi * np.arange(n) / n + 0.1))
    theta = np.angle((w + z0) / (1 + np.conj(z0) * w)) / 2
    x0 = jnp.stack([jnp.cos(theta), jnp.sin(theta)], -1)
    ts = jnp.linspace(0.0, t1, 41)
    errors = []
    for eps in (0.1, 0.05, 0.025):
        flow = _periodic(eps)
        traj = jd.simulate(flow, x0, t1=t1, ts=ts, rtol=1e-10, atol=1e-12)
        R = jnp.mean((traj.xs[..., 0] + 1j * traj.xs[..., 1]) ** 2, -1)
        oa = jd.solve_homogenised_ott_antonsen(flow, complex(R[0]), t1=t1, ts=ts)
        errors.append(float(jnp.max(jnp.abs(R - oa.R))))
    orders = np.log2(np.array(errors[:-1]) / np.array(errors[1:]))
    assert errors[-1] < 0.05, errors
    assert np.all((orders > 0.8) & (orders < 1.3)), (errors, orders)


def test_homogenised_ott_antonsen_reports_bad_members_as_solve_ott_antonsen_does():
    """One head: the homogenised OA ODE is the OA ODE of that head. Under vmap a member
    with |R0| > 1 ran as "successful" (clipped to the disc) and a NaN R0 ran to max_steps:
    now `outside_disc` / `nonfinite_argument` with NaN, the good member unchanged."""
    A = jnp.array([[1.0, 0.3], [0.2, 0.4]])
    V = jnp.array([[0.2, 1.0], [-1.0, -0.2]])
    heads = jd.MultiHeadDynamics(A[None], V[None], beta=0.7)
    ts = jnp.linspace(0.0, 5.0, 11)
    kw = dict(t1=5.0, ts=ts, throw=False)
    ref = jd.solve_ott_antonsen(A, V, 0.3 + 0.1j, beta=0.7, rtol=1e-9, atol=1e-11, **kw)
    R0s = jnp.array([0.3 + 0.1j, 1.5 + 0j, jnp.nan + 0j])
    out = jax.vmap(lambda r: jd.solve_homogenised_ott_antonsen(heads, r, **kw))(R0s)
    codes = [jd.RESULTS.successful, jd.RESULTS.outside_disc, jd.RESULTS.nonfinite_argument]
    assert [bool((out.result == c)[i]) for i, c in enumerate(codes)] == [True] * 3
    np.testing.assert_allclose(out.R[0], ref.R, rtol=0, atol=1e-12)
    assert bool(jnp.all(jnp.isnan(out.R[1:])))


# ------------------------------------------------------------------------ PLGA flow


def _layer(key, heads=2, dk=4):
    return PowerLawGraphAttention(8, heads, dk, 8, 1, 1, key=key, dtype=jnp.float64)


def test_plga_flow_generator_is_the_layers_G_LM(getkey):
    layer = _layer(getkey())
    flow = jd.PLGAFlow.from_layer(layer)
    x = _mats(getkey(), (5, 4))
    xh = x / jnp.linalg.norm(x, axis=-1, keepdims=True)
    q = jnp.broadcast_to(xh[:, None, :], (5, 2, 4))  # tokens as every head's queries
    _, _, _, G_LM = layer.deductive(q)
    np.testing.assert_allclose(flow.energy_curvature(x), G_LM, rtol=1e-12, atol=1e-14)
    assert flow.heads == 2 and float(flow.beta[0]) == pytest.approx(0.5)


def test_plga_flow_identity_output_is_the_sa_flow(getkey):
    # the layer's energy curvature forced to the identity (a = 0, b_a = I): the SA flow
    layer = _layer(getkey(), heads=1)
    layer = eqx.tree_at(lambda m: (m.a, m.b_a), layer, (jnp.zeros_like(layer.a), jnp.eye(4)[None]))
    flow = jd.PLGAFlow.from_layer(layer, beta=1.3)
    x = _mats(getkey(), (6, 4))
    sa = jd.AttentionDynamics(jnp.eye(4), jnp.eye(4), beta=1.3, kernel="sa")
    assert float(jnp.max(jnp.abs(flow(0.0, x) - sa(0.0, x)))) == 0.0


def test_plga_flow_frozen_G_is_the_fixed_A_flow(getkey):
    layer = _layer(getkey())
    V = _mats(getkey(), (2, 4, 4))
    flow = jd.PLGAFlow.from_layer(layer, V=V)
    x = _mats(getkey(), (6, 4))
    G = flow.energy_curvature(_mats(getkey(), (6, 4)))  # collapsed at another input
    frozen = flow.frozen(G)
    multi = jd.MultiHeadDynamics(G, V, beta=flow.beta, kernel="sa")
    assert float(jnp.max(jnp.abs(frozen(0.0, x) - multi(0.0, x)))) < 1e-13
    one = jd.PLGAFlow.from_layer(layer, heads=1).frozen(G[1])
    single = jd.AttentionDynamics(G[1], jnp.eye(4), beta=0.5, kernel="sa")
    assert float(jnp.max(jnp.abs(one(0.0, x) - single(0.0, x)))) < 1e-13
    # frozen at the current input, the flows agree at that input
    here = flow.frozen(flow.energy_curvature(x))
    assert float(jnp.max(jnp.abs(here(0.0, x) - flow(0.0, x)))) < 1e-15


def test_plga_flow_from_layer_checks_heads_and_V_when_built(getkey):
    layer = _layer(getkey())  # 2 heads, dk = 4
    x = _mats(getkey(), (5, 4))
    # NumPy integers are head indices
    one = jd.PLGAFlow.from_layer(layer, heads=np.int64(1))
    assert one.heads == 1 and one.generator.heads == (1,)
    assert jd.PLGAFlow.from_layer(layer, heads=np.array([1, 0])).generator.heads == (1, 0)
    with pytest.raises(ValueError, match=r"PLGAFlow.from_layer: heads must be distinct; \[0\] "):
        jd.PLGAFlow.from_layer(layer, heads=(0, 0))
    for bad in (2, -1, (0, 2)):
        with pytest.raises(ValueError, match=r"PLGAFlow.from_layer: heads must be in \[0, 2\)"):
            jd.PLGAFlow.from_layer(layer, heads=bad)
    with pytest.raises(ValueError, match="PLGAFlow.from_layer: heads selects no head"):
        jd.PLGAFlow.from_layer(layer, heads=())
    for bad in (1.0, True, "0", (0, 1.5)):
        with pytest.raises(TypeError, match="PLGAFlow.from_layer: heads must be a head index"):
            jd.PLGAFlow.from_layer(layer, heads=bad)
    # V of the wrong size is refused when built, not when called
    with pytest.raises(
        ValueError,
        match=r"PLGAFlow.from_layer: V must have shape \(dk, dk\) = \(4, 4\) \(every head\) or "
        r"\(heads, dk, dk\) = \(2, 4, 4\) .* got \(3, 3\)\.",
    ):
        jd.PLGAFlow.from_layer(layer, V=jnp.eye(3))
    with pytest.raises(ValueError, match=r"= \(1, 4, 4\) for the 1 head\(s\) \[1\] .*\(2, 4, 4\)"):
        jd.PLGAFlow.from_layer(layer, heads=1, V=_mats(getkey(), (2, 4, 4)))
    # a (dk, dk) V is every head's V: construction and call agree
    V = _mats(getkey(), (4, 4))
    shared = jd.PLGAFlow.from_layer(layer, V=V)
    assert shared.V.shape == (2, 4, 4)
    each = jd.PLGAFlow.from_layer(layer, V=jnp.stack([V, V]))
    assert float(jnp.max(jnp.abs(shared(0.0, x) - each(0.0, x)))) == 0.0
    # one head of a metric learner: its V is (d, d) or (1, d, d) of the learner's d
    learner = MetricLearner(4, 8, 1, 1, key=getkey(), dtype=jnp.float64)
    with pytest.raises(
        ValueError,
        match=r"PLGAFlow.from_metric_learner: V must have shape \(d, d\) = \(4, 4\) or "
        r"\(1, d, d\) \(one head\), got \(3, 3\)\.",
    ):
        jd.PLGAFlow.from_metric_learner(learner, V=jnp.eye(3))


@pytest.mark.slow
def test_plga_flow_runs_through_simulate(getkey):
    learner = MetricLearner(4, 8, 1, 1, key=getkey(), dtype=jnp.float64)
    flow = jd.PLGAFlow.from_metric_learner(learner)
    x0 = sample_uniform(getkey(), 8, 4, dtype=jnp.float64)
    traj = jd.simulate(flow, x0, t1=3.0, num_save=7)
    assert bool(traj.successful)
    assert float(jnp.max(jnp.abs(jnp.linalg.norm(traj.xs, axis=-1) - 1))) < 1e-12
    with pytest.raises(ValueError, match="SDPA layer"):
        jd.PLGAFlow.from_layer(
            PowerLawGraphAttention(8, 1, 4, 8, 1, 1, attention="sdpa", key=getkey())
        )


# ------------------------------------------------------------------------ notebook 03


@pytest.mark.slow
def test_flow_families_notebook_runs_in_quick_mode(tmp_path, monkeypatch):
    import json
    import os
    import pathlib

    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("JAXATTN_QUICK", "1")
    monkeypatch.setenv("JAXATTN_OUT", str(tmp_path))
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the notebook draws inline
    path = pathlib.Path(__file__).resolve().parents[1] / "notebooks" / "03_flow_families.ipynb"
    nb = nbformat.read(path, as_version=4)
    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["quick"] is True
    assert res["frame_error"] < 1e-5  # user flow = rotated built-in flow (solver tolerance)
    assert res["single_regime"] == "rotating"
    assert res["map_agreement"] >= 0.75 and res["map_failed"] == 0
    norm = res["normalisation"]
    assert norm["post_ln"]["law"] == "exponential" and norm["pre_ln"]["law"] == "algebraic"
    assert abs(norm["post_ln"]["exp_rate"] - 2) < 0.05  # V(t) ~ e^{-2t} near consensus
    assert res["causal"]["first_token_moved"] < 1e-12 and res["causal"]["clusters"] == 1
    assert res["causal"]["regime"] == "clustering"
    assert res["plga"]["frozen_equals_live_at_x0"] < 1e-15
    for f in ("user_flow.png", "user_map.png", "normalisation.png"):
        assert os.path.getsize(tmp_path / f) > 5_000
    images = sum(
        "image/png" in out.get("data", {})
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
    )
    assert images >= 3  # figures are shown inline, not only saved
