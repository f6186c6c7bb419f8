"""Gradient-based regime search: gradients through the solve against central differences,
vmap(grad) against a loop of grad, and a search that crosses the Case-2 boundary."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxattn.dynamics._search import regime_score, regime_search

TIGHT = dict(rtol=1e-12, atol=1e-14, t1=20.0, num_save=21)


@eqx.filter_jit
def _score(V):
    return regime_score(jnp.diag(jnp.array([1.5, 0.5])), V, 1.0, **TIGHT)


def test_gradient_matches_central_differences():
    V = jnp.array([[0.3, 0.8], [-0.6, -0.2]])
    g = eqx.filter_jit(jax.grad(_score))(V)
    h = 1e-5
    fd = np.zeros((2, 2))
    for i in range(2):
        for j in range(2):
            e = jnp.zeros((2, 2)).at[i, j].set(h)
            fd[i, j] = (_score(V + e) - _score(V - e)) / (2 * h)
    np.testing.assert_allclose(np.asarray(g), fd, rtol=1e-5, atol=1e-7)
    assert np.max(np.abs(fd)) > 1e-2  # a real, nonzero gradient


def test_vmap_grad_equals_loop_of_grad():
    Vs = jnp.stack(
        [
            jnp.array([[0.3, 0.8], [-0.6, -0.2]]),
            jnp.array([[1.0, 0.1], [0.1, -0.5]]),
            jnp.array([[-1.0, 0.0], [0.0, -0.4]]),
        ]
    )
    grad = eqx.filter_jit(jax.grad(_score))
    batched = eqx.filter_jit(jax.vmap(jax.grad(_score)))(Vs)
    for k in range(3):
        np.testing.assert_allclose(
            np.asarray(batched[k]), np.asarray(grad(Vs[k])), rtol=1e-9, atol=1e-12
        )


def test_search_crosses_the_case2_boundary():
    # A = I, V = diag(l1, l2): clustering iff max(l) >= 0 (Case 2). Start inside the
    # no-clustering region and climb the order score.
    res = regime_search(
        jnp.array([-1.0, -0.5]),
        lambda p: (jnp.eye(2), jnp.diag(p)),
        target="clustering",
        learning_rate=0.1,
        max_iters=40,
        threshold=0.9,
    )
    assert res.reached
    assert res.history["score"][0] < 0.5 <= 0.9 <= res.history["score"][-1]
    lam_max = float(jnp.max(res.params))
    assert 0.0 <= lam_max < 0.1  # landed just past the boundary max(l) = 0


def test_settings_and_params_are_checked_before_any_step():
    eye = jnp.eye(2)

    def build(p):
        return eye, jnp.array([[p[0], p[1]], [-p[1], -p[0]]])

    for beta in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="regime_search: beta must be finite and > 0"):
            regime_search(jnp.array([0.3, 1.0]), build, beta=beta, max_iters=1)
    with pytest.raises(ValueError, match=r"regime_score: window must be in \(0, 1\]"):
        regime_score(eye, eye, window=0.0)
    with pytest.raises(ValueError, match="regime_score: num_save must be an integer >= 2"):
        regime_score(eye, eye, num_save=1)
    with pytest.raises(ValueError, match="regime_search: params has no numbers"):
        regime_search({}, build, max_iters=1)
    with pytest.raises(ValueError, match="params must hold real numbers, got a leaf of dtype"):
        regime_search(jnp.array([0.3 + 1j, 1.0]), build, max_iters=1)
    # a traced β ≤ 0 cannot be refused: NaN, as the solve's RESULTS.nonpositive_beta
    assert np.isnan(float(jax.jit(lambda b: regime_score(eye, eye, b))(-1.0)))
    # integer and list parameters are promoted to floats and move like float ones
    kw = dict(max_iters=2, t1=20.0)
    ints = regime_search(jnp.array([0, 1]), build, **kw)
    floats = regime_search(jnp.array([0.0, 1.0]), build, **kw)
    listed = regime_search([0.0, 1.0], build, **kw)
    np.testing.assert_allclose(ints.history["score"], floats.history["score"], rtol=0, atol=1e-14)
    np.testing.assert_allclose(listed.history["score"], floats.history["score"], rtol=0, atol=1e-14)
    assert ints.history["score"][1] != ints.history["score"][0]
