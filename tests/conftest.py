import jax
import pytest

# Tests run in float64 where accuracy is the point; the package itself never flips this.
jax.config.update("jax_enable_x64", True)


@pytest.fixture
def getkey():
    """A fresh PRNG key on every call, deterministic per test."""
    state = {"key": jax.random.key(1234)}

    def _getkey():
        state["key"], sub = jax.random.split(state["key"])
        return sub

    return _getkey
