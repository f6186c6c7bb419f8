"""`UnrolledTsit5` is diffrax's Tsit5 with the stage loop written out: the same steps and
states to rounding, on the particle flow, on PyTree and float32 states, after jumps, under
vmap and in gradients; and its compiled step has no stage loop."""

import re

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxattn.dynamics import AttentionDynamics, UnrolledTsit5, simulate
from jaxattn.sphere import sample_uniform

jax.config.update("jax_enable_x64", True)


def _solve(solver, field, y0, *, t1=10.0, controller=None, dense=False, args=None, **kw):
    ts = jnp.linspace(0.0, t1, 41)
    return diffrax.diffeqsolve(
        diffrax.ODETerm(field),
        solver,
        0.0,
        t1,
        None,
        y0,
        args,
        saveat=diffrax.SaveAt(ts=ts, dense=dense),
        stepsize_controller=controller or diffrax.PIDController(rtol=1e-8, atol=1e-10),
        max_steps=4096,
        **kw,
    )


def _steps(sol):
    return {k: int(sol.stats[k]) for k in ("num_steps", "num_accepted_steps")}


def test_same_steps_and_states_as_diffrax_on_the_particle_flow():
    # An oscillating LSA flow in d = 3 with a projected (sphere) solve, through the public
    # `simulate`: the same step counts, tokens and sphere drift to rounding.
    key = jax.random.key(3)
    A = jnp.array([[0.2, -1.0, 0.1], [1.0, 0.3, 0.0], [0.0, 0.4, -0.5]])
    V = jnp.array([[0.5, 1.0, 0.0], [-1.0, 0.2, 0.3], [0.1, 0.0, 1.0]])
    field = AttentionDynamics(A, V, kernel="usa", beta=1.5)
    x0 = sample_uniform(key, 24, 3, dtype=jnp.float64)
    kw = dict(t1=20.0, ts=jnp.linspace(0.0, 20.0, 81), rtol=1e-9, atol=1e-11)
    ref = simulate(field, x0, solver=diffrax.Tsit5(), **kw)
    new = simulate(field, x0, solver=UnrolledTsit5(), **kw)
    assert int(new.num_steps) == int(ref.num_steps) > 20
    np.testing.assert_allclose(new.xs, ref.xs, rtol=0, atol=1e-12)
    assert abs(float(new.sphere_deviation) - float(ref.sphere_deviation)) < 1e-14


def test_dense_output_and_error_estimate_match_diffrax():
    # A linear system with a closed form: dense interpolation between saves, and the same
    # accepted and rejected steps (the error estimate drives the controller).
    M = jnp.array([[-0.3, 2.0], [-2.0, -0.3]])

    def field(t, y, args):
        return M @ y

    y0 = jnp.array([1.0, 0.5])
    ref = _solve(diffrax.Tsit5(), field, y0, dense=True)
    new = _solve(UnrolledTsit5(), field, y0, dense=True)
    assert _steps(new) == _steps(ref)
    assert int(new.stats["num_rejected_steps"]) == int(ref.stats["num_rejected_steps"])
    np.testing.assert_allclose(new.ys, ref.ys, rtol=0, atol=1e-14)
    t = 3.3
    exact = jax.scipy.linalg.expm(M * t) @ y0
    np.testing.assert_allclose(new.evaluate(t), ref.evaluate(t), rtol=0, atol=1e-14)
    np.testing.assert_allclose(new.evaluate(t), exact, rtol=0, atol=1e-7)


def test_pytree_and_float32_states():
    # A (scalar, vector) state: each leaf keeps its shape and dtype and matches diffrax.
    def field(t, y, args):
        z, v = y
        return (jnp.sin(3 * t) - 0.1 * z**3, -v + z)

    y0 = (jnp.asarray(0.5), jnp.array([1.0, -1.0]))
    ref = _solve(diffrax.Tsit5(), field, y0)
    new = _solve(UnrolledTsit5(), field, y0)
    assert _steps(new) == _steps(ref)
    for a, b in zip(new.ys, ref.ys):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-13)
    # float32 tokens: the same dtype as diffrax gives (it promotes to the time's float).
    y32 = jnp.array([1.0, 0.5], jnp.float32)
    c32 = diffrax.PIDController(rtol=1e-5, atol=1e-6)
    sol32 = _solve(UnrolledTsit5(), lambda t, y, a: -y, y32, controller=c32)
    ref32 = _solve(diffrax.Tsit5(), lambda t, y, a: -y, y32, controller=c32)
    assert sol32.ys.dtype == ref32.ys.dtype
    np.testing.assert_allclose(sol32.ys, ref32.ys, rtol=1e-6)
    np.testing.assert_allclose(sol32.ys[-1], np.exp(-10.0) * np.array([1.0, 0.5]), atol=1e-6)


def test_a_jump_restarts_the_first_stage():
    # A right-hand side that jumps at t = 2.5 (declared through `jump_ts`): after the jump the
    # first stage must be evaluated afresh, not carried over (first-same-as-last), exactly
    # as diffrax does; a stale stage would give another solution.
    def field(t, y, args):
        return jnp.where(t < 2.5, -y, 3.0 - y)

    controller = diffrax.PIDController(rtol=1e-8, atol=1e-10, jump_ts=jnp.array([2.5]))
    y0 = jnp.array([1.0])
    ref = _solve(diffrax.Tsit5(), field, y0, controller=controller)
    new = _solve(UnrolledTsit5(), field, y0, controller=controller)
    assert _steps(new) == _steps(ref)
    np.testing.assert_allclose(new.ys, ref.ys, rtol=0, atol=1e-14)
    # closed form: y = e^{-t} before the jump, 3 + (y(2.5) − 3) e^{-(t − 2.5)} after
    t = 10.0
    exact = 3.0 + (np.exp(-2.5) - 3.0) * np.exp(-(t - 2.5))
    assert abs(float(new.ys[-1, 0]) - exact) < 1e-7


def test_vmap_and_gradient_agree_with_diffrax():
    def field(t, y, a):
        return jnp.stack([y[1], -a * jnp.sin(y[0])])

    y0 = jnp.array([1.0, 0.0])
    a = jnp.array([0.5, 1.0, 2.0])

    def end(solver, a):
        return _solve(solver, field, y0, args=a).ys[-1, 0]

    batched = jax.vmap(lambda a: end(UnrolledTsit5(), a))(a)
    one_by_one = jnp.stack([end(diffrax.Tsit5(), x) for x in a])
    np.testing.assert_allclose(batched, one_by_one, rtol=0, atol=1e-12)
    g_new = jax.grad(lambda a: end(UnrolledTsit5(), a))(1.0)
    g_ref = jax.grad(lambda a: end(diffrax.Tsit5(), a))(1.0)
    h = 1e-5
    fd = (end(diffrax.Tsit5(), 1.0 + h) - end(diffrax.Tsit5(), 1.0 - h)) / (2 * h)
    assert abs(float(g_new) - float(g_ref)) < 1e-10
    assert abs(float(g_new) - float(fd)) < 1e-6


def test_dense_weights_are_diffraxs():
    # The interpolation's weights b_i(θ) against diffrax's Tsit5 interpolation (slopes = the
    # identity, so evaluate returns the weights), and one evaluation of a real state.
    ref_cls = diffrax.Tsit5.interpolation_cls
    new_cls = UnrolledTsit5.interpolation_cls
    eye = dict(t0=0.5, t1=2.0, y0=jnp.zeros(7), y1=jnp.zeros(7), k=jnp.eye(7))
    for t in np.linspace(0.5, 2.0, 13):
        ref = ref_cls(**eye).evaluate(t)
        new = new_cls(**eye).evaluate(t)
        np.testing.assert_allclose(new, ref, rtol=0, atol=1e-15)
    k = jax.random.normal(jax.random.key(0), (7, 3, 4))
    y0 = jax.random.normal(jax.random.key(1), (3, 4))
    state = dict(t0=0.0, t1=0.3, y0=y0, y1=y0, k=k)
    np.testing.assert_allclose(
        new_cls(**state).evaluate(0.1, 0.25), ref_cls(**state).evaluate(0.1, 0.25), atol=1e-15
    )
    # a step of zero length interpolates its start
    flat = dict(t0=1.0, t1=1.0, y0=y0, y1=y0, k=k)
    np.testing.assert_array_equal(new_cls(**flat).evaluate(1.0), y0)


def test_terms_without_fsal_take_diffraxs_loop():
    # diffrax turns first-same-as-last off for an expensive vector field (solver state
    # None); the written-out step then hands over to diffrax's (it used to fail unpacking).
    class Expensive(diffrax.ODETerm):
        def is_vf_expensive(self, t0, t1, y, args):
            return True

    def run(solver):
        return diffrax.diffeqsolve(
            Expensive(lambda t, y, a: -y), solver, 0.0, 1.0, 0.1, jnp.ones(2)
        ).ys[-1]

    np.testing.assert_allclose(run(UnrolledTsit5()), run(diffrax.Tsit5()), rtol=0, atol=0)
    np.testing.assert_allclose(run(UnrolledTsit5()), np.exp(-1.0) * np.ones(2), rtol=1e-6)


@pytest.mark.parametrize("solver_name", ["diffrax", "unrolled"])
def test_the_compiled_step_has_no_stage_loop(solver_name):
    # diffrax's solve compiles to three while loops (steps, the stages of a step, the saves
    # of a step); with the stages written out, two remain.
    solver = diffrax.Tsit5() if solver_name == "diffrax" else UnrolledTsit5()

    def run(y0):
        return _solve(solver, lambda t, y, a: -y, y0, adjoint=diffrax.ForwardMode()).ys

    text = jax.jit(run).lower(jnp.array([1.0, 2.0])).compile().as_text()
    loops = len(re.findall(r"\swhile\(", text))
    assert loops == (3 if solver_name == "diffrax" else 2)
