import jax
import pytest

import jaxattn

# XLA's elemental CPU emitters, as the `jaxattn` command uses them: compilation is most of the
# suite's time and they compile sweeps in ~0.7x the time (experiments/bench_compile.py).
# Subprocesses (the command line, notebooks) inherit the flag; an XLA_FLAGS naming it wins.
jaxattn.prefer_fast_cpu_compiles()
# Small while loops compiled whole (the solver loops of sweeps and simulate), as the `jaxattn`
# command does: results are bitwise the same, particle sweeps ~1.6x faster.
jaxattn.prefer_fast_cpu_loops()

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
