"""Reliability of the particle half (issue 14): no silent wrong result, no misleading message.

Each test pins one failure that used to pass silently: a stalled float32 clock, an adjoint
that cannot follow the projection, a lossy float64 → float32 cast, the O(n²) memory of the
softmax kernels, β ≤ 0, the USA overflow advice, degenerate token counts and the
environment a result was computed in."""

import math
import subprocess
import sys

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxattn.dynamics import AttentionDynamics, simulate
from jaxattn.dynamics._solve import (
    RESULTS,
    environment_record,
    memory_available,
    memory_estimate,
    usa_score_shift,
)
from jaxattn.sphere import sample_uniform

ROT = [[1.0, 0.5], [-0.5, 1.0]]


def _x0(n=8, d=2, dtype=jnp.float64, seed=0):
    return sample_uniform(jax.random.key(seed), n, d, dtype=dtype)


def test_float32_clock_that_stops_is_reported_not_max_steps():
    """Near t = 1e5 the float32 spacing of t is 0.0078: the controller's retried step rounds
    to the same (t0, t1) forever. It used to burn all max_steps (4096 here, 22 accepted) and
    report max_steps_reached ('try increasing max_steps'); now it stops at once with
    RESULTS.time_stalled. The same run started at t0 = 0 succeeds."""
    f32 = jnp.float32
    field = AttentionDynamics(jnp.array(ROT, f32), jnp.eye(2, dtype=f32))
    x0 = _x0(dtype=f32)
    kw = dict(rtol=1e-6, atol=1e-8, max_steps=4096, num_save=11, throw=False)
    late = simulate(field, x0, t0=1e5, t1=1e5 + 10, **kw)
    assert late.result == RESULTS.time_stalled
    assert int(late.num_steps) < 200  # stopped at the first repeat, not at max_steps
    assert "spacing of t" in RESULTS[RESULTS.time_stalled]
    early = simulate(field, x0, t0=0.0, t1=10.0, **kw)
    assert early.successful


@pytest.mark.parametrize("project", [True, False])
def test_backsolve_adjoint_is_refused_with_a_reason(project):
    field = AttentionDynamics(jnp.array(ROT), jnp.eye(2))
    with pytest.raises(ValueError, match="BacksolveAdjoint is not supported.*RecursiveCheckpoint"):
        simulate(field, _x0(), t1=1.0, adjoint=diffrax.BacksolveAdjoint(), project=project)


def test_lossy_float64_to_float32_cast_warns_and_exact_cast_is_silent():
    script = (
        "import warnings, numpy as np\n"
        "from jaxattn.dynamics import AttentionDynamics\n"
        "A = np.array([[1.0, 0.0], [0.0, 1.0 + 1e-12]])\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    f = AttentionDynamics(A, np.eye(2))\n"
        "    AttentionDynamics(np.eye(2), np.eye(2))\n"
        "    AttentionDynamics(A.astype(np.float32), np.eye(2, dtype=np.float32))\n"
        "msgs = [str(x.message) for x in w]\n"
        "assert str(f.A.dtype) == 'float32' and float(f.A[1, 1]) == 1.0\n"
        "assert len(msgs) == 1, msgs\n"
        "print(msgs[0])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=_env_x32()
    )
    assert out.returncode == 0, out.stderr
    assert "A was given as float64 and cast to float32" in out.stdout
    assert "1 of 4 entries changed" in out.stdout and "1e-12" in out.stdout


def _env_x32():
    import os

    env = dict(os.environ)
    env.pop("JAX_ENABLE_X64", None)
    env["JAX_PLATFORMS"] = "cpu"
    return env


@pytest.mark.parametrize("beta", [0.0, -1.0])
def test_nonpositive_beta_is_refused_concrete_and_reported_traced(beta):
    with pytest.raises(ValueError, match="beta is an inverse temperature and must be > 0"):
        AttentionDynamics(jnp.eye(2), jnp.eye(2), beta=beta)

    def run(b):
        f = AttentionDynamics(jnp.eye(2), jnp.eye(2), beta=b)
        return simulate(f, _x0(), t1=1.0, num_save=3, throw=False)

    out = jax.vmap(run)(jnp.array([1.0, beta]))
    codes = np.asarray(out.result._value)
    assert codes[0] == RESULTS.successful._value
    assert codes[1] == RESULTS.nonpositive_beta._value
    assert np.all(np.isnan(out.xs[1]))


def test_memory_estimate_names_the_quadratic_score_memory():
    sa = AttentionDynamics(jnp.eye(4), jnp.eye(4), kernel="sa")
    lsa = AttentionDynamics(jnp.eye(4), jnp.eye(4), kernel="lsa")
    n, ns = 50_000, 101
    # 2 n² float64 words for the scores and weights, plus the saved states and buffers
    assert memory_estimate(sa, n, ns) == 8 * (2 * n * n + (ns + 16) * n * 4 + 64)
    assert memory_estimate(lsa, n, ns) == 8 * ((ns + 16) * n * 4 + 64)
    assert memory_estimate(sa, n, ns, dtype=jnp.float32) * 2 == memory_estimate(sa, n, ns)
    free = memory_available()
    assert free is None or free > 0
    # n = 10⁶ SA tokens need 16 TB: refused before any compilation, naming n and the bytes
    x0 = jnp.zeros((1_000_000, 4)).at[:, 0].set(1.0)
    with pytest.raises(ValueError, match=r"O\(n²\) memory.*n = 1000000 tokens.*GiB"):
        simulate(sa, x0, t1=1.0)


def test_usa_score_shift_is_the_smallest_documented_shift_and_fits():
    f32 = jnp.float32
    field = AttentionDynamics(150.0 * jnp.eye(2, dtype=f32), jnp.eye(2, dtype=f32), kernel="usa")
    shift = usa_score_shift(field)
    assert shift == pytest.approx(150.0 - 0.5 * math.log(float(np.finfo(np.float32).max)))
    assert usa_score_shift(field, np.float64) == 0.0
    # a shift that fits (weights up to e^80 < float32 max / 64) is accepted; it used to be
    # refused by a margin of e^10 · (σ(V) + 1)
    fits = AttentionDynamics(field.A, field.V, kernel="usa", score_shift=70.0)
    traj = simulate(fits, _x0(dtype=f32), t1=1e-30, num_save=3)
    assert traj.successful
    # float64: the advice does not suggest float64
    f64 = AttentionDynamics(800.0 * jnp.eye(2), jnp.eye(2), kernel="usa")
    with pytest.raises(ValueError) as err:
        simulate(f64, _x0(), t1=1.0)
    assert "float64" in str(err.value) and "solve in float64" not in str(err.value)
    assert f"score_shift={usa_score_shift(f64):.6g}" in str(err.value)


def test_environment_record():
    rec = environment_record()
    assert rec["backend"] == jax.default_backend()
    assert rec["device_count"] == jax.device_count() >= 1
    assert rec["matmul_precision"] == jax.config.jax_default_matmul_precision
    assert rec["x64"] is True  # the tests run in float64
    assert rec["jax"] == jax.__version__ and rec["diffrax"] == diffrax.__version__
