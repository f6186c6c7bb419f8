"""Shared test helpers: tree comparison and small problem catalogues."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np


def tree_allclose(x, y, *, rtol=1e-5, atol=1e-8):
    return eqx.tree_equal(x, y, typematch=True, rtol=rtol, atol=atol)


def max_normalised_error(port, ref) -> float:
    """max |port − ref| / max |ref| (the fixture README's measure)."""
    port = np.asarray(port, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    return float(np.max(np.abs(port - ref)) / np.max(np.abs(ref)))


def random_matrix(key, d, scale=1.0, dtype=jnp.float64):
    return scale * jax.random.normal(key, (d, d), dtype=dtype)
