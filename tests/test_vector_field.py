"""AttentionDynamics: the O(n d²) LSA path, the USA/SA kernels, argument checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import random_matrix

from jaxattn.dynamics import AttentionDynamics
from jaxattn.sphere import sample_uniform


def _numpy_field(A, V, beta, x, kernel):
    """Independent float64 numpy evaluation of eq. (1): explicit double loop over k, j."""
    A, V, x = (np.asarray(a, np.float64) for a in (A, V, x))
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    n = x.shape[0]
    out = np.zeros_like(x)
    for k in range(n):
        s = np.array([beta * x[k] @ A @ x[j] for j in range(n)])
        if kernel == "lsa":
            w = s
        elif kernel == "usa":
            w = np.exp(s)
        else:
            w = n * np.exp(s - s.max()) / np.sum(np.exp(s - s.max()))
        drive = sum(w[j] * (V @ x[j]) for j in range(n)) / n
        out[k] = drive - (x[k] @ drive) * x[k]
    return out


@pytest.mark.parametrize("d", [2, 3, 8])
@pytest.mark.parametrize("kernel", ["lsa", "usa", "sa"])
def test_fast_path_equals_direct_sum(getkey, d, kernel):
    n = 37
    A = random_matrix(getkey(), d)
    V = random_matrix(getkey(), d)
    beta = 0.7
    # tokens deliberately off the sphere: the field is evaluated at x/|x|
    x = 1.3 * sample_uniform(getkey(), n, d)
    field = AttentionDynamics(A, V, beta=beta, kernel=kernel)
    fast = field(0.0, x, None)
    direct = field.direct_sum(x)
    ref = _numpy_field(A, V, beta, x, kernel)
    scale = np.max(np.abs(ref))
    assert np.max(np.abs(fast - direct)) <= 1e-12 * max(scale, 1.0)
    assert np.max(np.abs(fast - ref)) <= 1e-12 * max(scale, 1.0)


def test_field_is_tangent_and_degree_zero(getkey):
    n, d = 20, 5
    field = AttentionDynamics(random_matrix(getkey(), d), random_matrix(getkey(), d), beta=1.1)
    x = sample_uniform(getkey(), n, d)
    F = field(0.0, x, None)
    assert np.max(np.abs(jnp.sum(F * x, axis=1))) < 1e-13
    # homogeneous of degree zero: scaling each token changes nothing
    scales = jnp.linspace(0.5, 2.0, n)[:, None]
    np.testing.assert_allclose(field(0.0, scales * x, None), F, atol=1e-13)


def test_project_tangent_broadcasts_and_names_mismatched_shapes(getkey):
    from jaxattn.sphere import project_tangent

    x = sample_uniform(getkey(), 6, 3)
    v = jax.random.normal(getkey(), (3,))
    p = project_tangent(x, v)  # one vector at every point: v - <x_k, v> x_k
    np.testing.assert_allclose(p, v - (x @ v)[:, None] * x, rtol=0, atol=1e-15)
    assert np.max(np.abs(jnp.sum(p * x, axis=1))) < 1e-15
    with pytest.raises(ValueError, match=r"same last axis .* got shapes \(6, 3\) and \(6, 2\)"):
        project_tangent(x, jnp.ones((6, 2)))
    with pytest.raises(ValueError, match=r"got shapes \(\) and \(\)"):
        project_tangent(1.0, 2.0)
    with pytest.raises(ValueError, match=r"leading axes of x \(6, 3\) and v \(4, 3\)"):
        project_tangent(x, jnp.ones((4, 3)))


def test_jit_vmap_grad_of_field(getkey):
    n, d = 10, 4
    x = sample_uniform(getkey(), n, d)
    V = random_matrix(getkey(), d)
    As = jax.random.normal(getkey(), (6, d, d))

    def f(A):
        return AttentionDynamics(A, V, beta=0.5)(0.0, x, None)

    batched = jax.jit(jax.vmap(f))(As)
    for i in range(6):
        np.testing.assert_allclose(batched[i], f(As[i]), rtol=1e-12, atol=1e-14)
    # LSA is linear in A: the gradient of <W, F(A)> is exact, check against a central difference
    W = jax.random.normal(getkey(), (n, d))
    loss = lambda A: jnp.sum(W * f(A))
    g = jax.grad(loss)(As[0])
    E = jnp.zeros((d, d)).at[1, 2].set(1.0)
    fd = (loss(As[0] + 1e-4 * E) - loss(As[0] - 1e-4 * E)) / 2e-4
    np.testing.assert_allclose(g[1, 2], fd, rtol=1e-9)


def test_float32_path(getkey):
    n, d = 16, 3
    A = random_matrix(getkey(), d, dtype=jnp.float32)
    V = random_matrix(getkey(), d, dtype=jnp.float32)
    x = sample_uniform(getkey(), n, d, dtype=jnp.float32)
    for kernel in ("lsa", "usa", "sa"):
        field = AttentionDynamics(A, V, kernel=kernel)
        F = field(0.0, x, None)
        assert F.dtype == jnp.float32
        ref = _numpy_field(A, V, 1.0, x, kernel)
        assert np.max(np.abs(np.asarray(F, np.float64) - ref)) < 1e-5 * max(np.max(np.abs(ref)), 1)


def test_nonfinite_token_poisons_every_row_hence_simulate_rejects_it(getkey):
    # the softmax row of token k only involves scores s_kj; a non-finite token j poisons
    # every row (it enters all sums). This documents why simulate rejects it up front.
    n, d = 5, 3
    field = AttentionDynamics(jnp.eye(d), jnp.eye(d), kernel="sa")
    x = sample_uniform(getkey(), n, d).at[2].set(jnp.nan)
    assert not np.all(np.isfinite(field(0.0, x, None)))


@pytest.mark.parametrize(
    "A, V, kwargs, match",
    [
        (np.zeros((2, 3)), np.zeros((2, 3)), {}, "A must be a square"),
        (np.zeros((3, 3)), np.zeros((2, 2)), {}, "same shape"),
        (np.zeros((1, 1)), np.zeros((1, 1)), {}, "d >= 2"),
        (np.eye(2), np.eye(2), {"kernel": "relu"}, "kernel must be one of"),
        (np.array([[np.nan, 0], [0, 1]]), np.eye(2), {}, "A has non-finite"),
        (np.eye(2), np.array([[np.inf, 0], [0, 1]]), {}, "V has non-finite"),
        (np.eye(2), np.eye(2), {"beta": np.nan}, "beta has non-finite"),
        (np.eye(2), np.eye(2), {"beta": np.ones(2)}, "beta must be a scalar"),
    ],
)
def test_bad_arguments(A, V, kwargs, match):
    with pytest.raises(ValueError, match=match):
        AttentionDynamics(A, V, **kwargs)


@pytest.mark.parametrize("d", [2, 3, 4, 5])
@pytest.mark.parametrize("normalisation", ["post_ln", "pre_ln", "ngpt"])
def test_token_major_field_equals_the_token_row_field(getkey, d, normalisation):
    # The token-major state y = xᵀ is what simulate and the sweep integrate for small d
    # (`_solve.token_major_pays`); LSA is evaluated on its rows (written-out sums for
    # d <= 4, dots above), the other kernels and a causal mask through transposes.
    n = 29
    A, V = random_matrix(getkey(), d), random_matrix(getkey(), d)
    scale = jax.random.uniform(getkey(), (n, 1), minval=0.5, maxval=2.0)
    x = scale * sample_uniform(getkey(), n, d)  # off the sphere, as in Pre-LN
    for kernel, causal in (("lsa", False), ("lsa", True), ("sa", False)):
        f = AttentionDynamics(
            A, V, beta=0.9, kernel=kernel, causal=causal, normalisation=normalisation
        )
        rows = f(0.0, x)
        major = jax.jit(lambda f, y: f.token_major(0.0, y))(f, x.T)
        assert major.shape == (d, n)
        np.testing.assert_allclose(major.T, rows, rtol=0, atol=1e-14)
    # and against the independent double loop (post-LN LSA)
    if normalisation == "post_ln":
        f = AttentionDynamics(A, V, beta=0.9)
        np.testing.assert_allclose(
            f.token_major(0.0, x.T).T, _numpy_field(A, V, 0.9, x, "lsa"), rtol=0, atol=1e-13
        )
