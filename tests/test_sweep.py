"""Tests of jaxattn.dynamics.sweep: reductions against particles, compile-once, failures,
resumption after an interruption, sharding over 8 forced host devices."""

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxattn.dynamics import AttentionDynamics, simulate
from jaxattn.dynamics import _sweep as sw
from jaxattn.dynamics._sweep import REGIME_NAMES, sweep

I2 = np.eye(2)
J2 = np.array([[0.0, -1.0], [1.0, 0.0]])


def case4(v11, v12):
    return np.array([[v11, v12], [-v12, -v11]])


# The paper's four behaviours (MATH.md): Case 1 clustering, Case 3 rotating clusters,
# Case 4 oscillation and clustering, and Case 1 with negative-definite sym(A).
CASES_A = np.stack([I2, np.diag([2.0, 1.0]), I2, I2, -I2 + 0.2 * J2])
CASES_V = np.stack([I2, I2 + J2, case4(0.3, 1.0), case4(1.0, 0.3), I2])
EXPECTED = [
    "convergent_clusters",
    "rotating_clusters",
    "oscillation",
    "convergent_clusters",
    "interior_convergence",
]
KW = dict(n=64, t1=100.0, num_save=201, progress=False)


@pytest.fixture(scope="module")
def three_methods():
    return {
        m: sweep(CASES_A, CASES_V, 1.0, 3, method=m, rtol=1e-10, atol=1e-12, **KW)
        for m in ("particles", "watanabe_strogatz", "ott_antonsen")
    }


def test_regimes_of_the_four_cases(three_methods):
    for m, res in three_methods.items():
        assert [REGIME_NAMES[i] for i in res.regime] == EXPECTED, m
        assert not res.failed.any()
    # Case 3: rotating clusters, |d arg R2 / dt| the same from particles and WS.
    p, w = three_methods["particles"], three_methods["watanabe_strogatz"]
    assert abs(p.phase_velocity[1] - w.phase_velocity[1]) < 1e-5
    assert p.phase_velocity[1] > 1.0
    # Case 4 oscillation: a period is measured and agrees between particles and WS.
    assert np.isfinite(p.period[2]) and abs(p.period[2] - w.period[2]) < 1e-5


def test_watanabe_strogatz_equals_particles(three_methods):
    # The WS reduction is exact for finite n: R2(t) equal to solver tolerance.
    p, w = three_methods["particles"], three_methods["watanabe_strogatz"]
    err = np.max(np.abs(p.R2 - w.R2))
    assert err < 1e-7, err  # t1 = 100 at rtol 1e-10


def test_sweep_member_equals_direct_simulate(three_methods):
    # Rebuild member 2's initial tokens and solve it alone with simulate.
    p = three_methods["particles"]
    key = jax.random.key(np.uint32(3))
    k_phase, k_tok = jax.random.split(key)
    R0 = 0.1 * jnp.exp(2j * jnp.pi * jax.random.uniform(k_phase, (), dtype=jnp.float64))
    th = sw.wrapped_cauchy_angles(k_tok, 64, R0, jnp.float64)
    x0 = jnp.stack([jnp.cos(th), jnp.sin(th)], -1)
    rate = float(p.rate[2])
    f = AttentionDynamics(CASES_A[2], CASES_V[2] / rate, beta=1.0)
    tr = simulate(f, x0, t1=100.0, ts=jnp.linspace(0, 100.0, 201), rtol=1e-10, atol=1e-12)
    R2 = jnp.mean((tr.xs[..., 0] + 1j * tr.xs[..., 1]) ** 2, -1)
    assert np.max(np.abs(np.asarray(R2) - p.R2[2])) < 1e-12
    assert abs(rate - np.linalg.norm(CASES_V[2], 2)) < 1e-12


def test_compiles_once_per_shape():
    A = np.stack([I2 * (1 + 0.1 * k) for k in range(6)])
    before = sw.num_traces()
    res = sweep(
        A,
        I2,
        1.0,
        0,
        method="ott_antonsen",
        chunk_size=2,
        n=8,
        t1=20.0,
        num_save=41,
        progress=False,
    )
    assert res.chunks_computed == 3
    assert sw.num_traces() - before == 1
    # Same shape and options again: no new trace.
    sweep(
        A + 0.01,
        I2,
        1.0,
        0,
        method="ott_antonsen",
        chunk_size=2,
        n=8,
        t1=20.0,
        num_save=41,
        progress=False,
    )
    assert sw.num_traces() - before == 1


def test_cartesian_batching():
    A = np.stack([I2, 2 * I2])
    V = np.stack([I2, case4(0.3, 1.0), -I2])
    res = sweep(
        A,
        V,
        [1.0, 0.5],
        [0, 1],
        batching="cartesian",
        method="ott_antonsen",
        t1=50.0,
        num_save=101,
        progress=False,
    )
    assert res.shape == (2, 3, 2, 2)
    reg = res.reshape("regime")
    assert np.all(reg[:, 0] == 0)  # V = I, A = cI: clustering everywhere
    assert np.all(reg[:, 1] == 2)  # Case 4, v11 < v12: oscillation
    np.testing.assert_array_equal(res.reshape("V")[1, 2, 0, 1], -I2)
    np.testing.assert_array_equal(res.reshape("beta")[0, 0, :, 0], [1.0, 0.5])


def test_failing_member_is_flagged_and_others_unchanged():
    A = np.stack([I2, I2, 300 * I2, I2])
    A[1, 0, 0] = np.nan
    V = np.stack([case4(0.3, 1.0), I2, I2, I2 + J2])
    kw = dict(
        method="ott_antonsen",
        time_scale="physical",
        t1=20.0,
        num_save=41,
        max_steps=400,
        progress=False,
    )
    res = sweep(A, V, 1.0, [0, 1, 2, 3], **kw)
    assert res.failed.tolist() == [False, True, True, False]
    fails = res.failures()
    assert [f["index"] for f in fails] == [1, 2]
    assert fails[1]["reason"] == "max_steps_reached"
    assert fails[1]["A"][0][0] == 300.0
    for i in (0, 3):
        solo = sweep(A[i], V[i], 1.0, i, **kw)
        np.testing.assert_allclose(solo.R2[0], res.R2[i], rtol=0, atol=1e-13)
        assert solo.regime[0] == res.regime[i]


def test_interrupted_sweep_resumes_and_loses_nothing(tmp_path):
    A = np.stack([I2 * (1 + 0.2 * k) for k in range(5)] + [I2])
    V = np.stack([I2, I2 + J2, case4(0.3, 1.0), case4(1.0, 0.3), -I2, case4(0.5, 1.0)])
    kw = dict(method="ott_antonsen", chunk_size=2, t1=50.0, num_save=101, progress=False)
    full = sweep(A, V, 1.0, np.arange(6), **kw)

    def interrupt(c, info):
        if c == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sweep(A, V, 1.0, np.arange(6), out_dir=tmp_path, on_chunk=interrupt, **kw)
    written = sorted(f for f in os.listdir(tmp_path) if f.endswith(".npz"))
    assert written == ["chunk_00000.npz", "chunk_00001.npz"]
    summary = json.loads((tmp_path / "chunk_00001.json").read_text())
    assert summary["members"] == [2, 3] and sum(summary["regime_counts"].values()) == 2
    seen = []
    res = sweep(
        A,
        V,
        1.0,
        np.arange(6),
        out_dir=tmp_path,
        on_chunk=lambda c, info: seen.append(info["computed"]),
        **kw,
    )
    assert seen == [False, False, True]
    assert res.chunks_loaded == 2 and res.chunks_computed == 1
    for k in ("regime", "R2", "order_final", "period", "result"):
        np.testing.assert_array_equal(getattr(res, k), getattr(full, k))
    # A different sweep in the same folder is refused.
    with pytest.raises(ValueError, match="different sweep"):
        sweep(A, V, 2.0, np.arange(6), out_dir=tmp_path, **kw)


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="A must have shape"):
        sweep(np.ones((3, 2)), I2, progress=False)
    with pytest.raises(ValueError, match="d = 2 LSA reduction"):
        sweep(np.eye(3), np.eye(3), method="ott_antonsen", progress=False)
    with pytest.raises(ValueError, match="must agree"):
        sweep(np.stack([I2] * 3), np.stack([I2] * 2), progress=False)


_SHARDED = textwrap.dedent(
    """
    import json, sys, numpy as np, jax
    jax.config.update("jax_enable_x64", True)
    from jaxattn.dynamics._sweep import sweep
    I2 = np.eye(2); J2 = np.array([[0., -1.], [1., 0.]])
    A = np.stack([I2 * (1 + 0.1 * k) for k in range(6)])
    V = np.stack([I2, I2 + J2, np.array([[.3, 1.], [-1., -.3]]), -I2, I2, I2 - J2])
    r = sweep(A, V, 1.0, np.arange(6), method=sys.argv[1], n=16, t1=40.0, num_save=81,
              progress=False)
    print(json.dumps(dict(devices=len(jax.devices()), regime=r.regime.tolist(),
          R2=np.abs(r.R2[:, -1]).tolist())))
    """
)


def _run_sharded(ndev, method):
    env = dict(
        os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={ndev}", JAX_PLATFORMS="cpu"
    )
    out = subprocess.run(
        [sys.executable, "-c", _SHARDED, method],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_sharded_over_eight_host_devices():
    one = _run_sharded(1, "particles")
    eight = _run_sharded(8, "particles")
    assert one["devices"] == 1 and eight["devices"] == 8
    assert one["regime"] == eight["regime"]
    np.testing.assert_allclose(one["R2"], eight["R2"], rtol=0, atol=1e-12)
