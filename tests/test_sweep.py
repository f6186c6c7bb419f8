"""Tests of jaxattn.dynamics.sweep: reductions against particles, compile-once, failures,
resumption after an interruption, sharding over 8 forced host devices."""

import json
import os
import subprocess
import sys
import textwrap

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxattn.dynamics import (
    AttentionDynamics,
    Members,
    classify_order_parameter,
    classify_regime,
    classify_tokens,
    regime_name,
    sample_wrapped_cauchy,
    simulate,
    solve_ott_antonsen,
    solve_watanabe_strogatz,
)
from jaxattn.dynamics import _sweep as sw
from jaxattn.dynamics._sweep import REGIME_NAMES, sweep

I2 = np.eye(2)
J2 = np.array([[0.0, -1.0], [1.0, 0.0]])


def case4(v11, v12):
    return np.array([[v11, v12], [-v12, -v11]])


# The paper's four behaviours (docs/theory): Case 1 clustering, Case 3 rotating clusters,
# Case 4 oscillation and clustering, and Case 1 with negative-definite sym(A).
CASES_A = np.stack([I2, np.diag([2.0, 1.0]), I2, I2, -I2 + 0.2 * J2])
CASES_V = np.stack([I2, I2 + J2, case4(0.3, 1.0), case4(1.0, 0.3), I2])
EXPECTED = ["clustering", "rotating", "oscillation", "clustering", "interior"]
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
        assert list(res.regime_names) == EXPECTED
        assert not res.failed.any()
    p, w, oa = (three_methods[m] for m in ("particles", "watanabe_strogatz", "ott_antonsen"))
    # Case 3: rotating clusters; d arg R2 / dt equal from particles and WS, and twice the
    # tokens' own angular speed (two rigid antipodal clusters).
    drift_p, drift_w = p.evidence["drift_rate"][1], w.evidence["drift_rate"][1]
    assert abs(drift_p - drift_w) < 1e-6 and abs(drift_p) > 1.0
    assert abs(abs(drift_p) - 2 * p.evidence["rotation_rate"][1]) < 1e-3 * abs(drift_p)
    # Case 4 oscillation: a period is measured and agrees between particles and WS, and
    # with the Ott–Antonsen orbit of the same R2(0) to within the finite-n wobble.
    per_p, per_w, per_oa = (r.evidence["period"][2] for r in (p, w, oa))
    assert np.isfinite(per_p) and abs(per_p - per_w) < 1e-6
    assert abs(per_p - per_oa) < 0.05 * per_oa
    # The token classifier sees the cluster structure the R2 series cannot: two antipodal
    # clusters for the clustering and rotating cases, a spread configuration otherwise.
    for r in (p, w):
        np.testing.assert_array_equal(r.evidence["num_clusters"][[0, 1, 3]], 2)
        np.testing.assert_array_equal(r.evidence["antipodal_pairs"][[0, 1, 3]], 1)
        assert np.all(r.evidence["num_clusters"][[2, 4]] > 10)
    assert np.all(oa.evidence["num_clusters"] == -1)


def test_watanabe_strogatz_equals_particles(three_methods):
    # The WS reduction is exact for finite n: R2(t) equal to solver tolerance.
    p, w = three_methods["particles"], three_methods["watanabe_strogatz"]
    err = np.max(np.abs(p.R2 - w.R2))
    assert err < 1e-7, err  # t1 = 100 at rtol 1e-10


def _member_tokens(seed, n):
    key = jax.random.key(np.uint32(seed))
    k_phase, k_tok = jax.random.split(key)
    R0 = 0.1 * jnp.exp(2j * jnp.pi * jax.random.uniform(k_phase, (), dtype=jnp.float64))
    return R0, sample_wrapped_cauchy(k_tok, n, R0, dtype=jnp.float64)


def test_sweep_member_equals_its_hand_made_run(three_methods):
    # Rebuild member 2's initial state, solve it alone with the public solvers and
    # classifiers: the sweep runs exactly these, member by member.
    R0, th = _member_tokens(3, 64)
    # the public accessor draws the same state (every member has seed 3 here): the tokens
    # of the sampled angles, built from e^{2iθ} without trigonometry (to rounding)
    flows = eqx.filter_vmap(lambda a, v: AttentionDynamics(a, v))(CASES_A, CASES_V)
    members = Members(flows, seeds=3, n=64)
    x0 = members.initial_state(2)
    np.testing.assert_allclose(x0, jnp.stack([jnp.cos(th), jnp.sin(th)], -1), rtol=0, atol=1e-15)
    # a float32 flow is swept in JAX's default float (float64 here), and drawn in it
    flows32 = jax.tree_util.tree_map(
        lambda a: a.astype(jnp.float32) if eqx.is_array(a) else a, flows
    )
    x0_32 = Members(flows32, seeds=3, n=64).initial_state(2)
    assert x0_32.dtype == jnp.float64 and np.array_equal(x0_32, x0)
    oa_members = Members(flows, seeds=3, n=64, method="ott_antonsen")
    assert oa_members.initial_state(4) == R0
    with pytest.raises(ValueError, match=r"member 5 is not in \[0, 5\)"):
        members.initial_state(5)
    with pytest.raises(ValueError, match="must be an int"):
        members.initial_state(True)
    with pytest.raises(ValueError, match="must be float32 or float64, got int32"):
        members.initial_state(0, dtype=jnp.int32)
    with pytest.raises(ValueError, match="must be float32 or float64, got float16"):
        members.initial_state(0, dtype=jnp.float16)
    p = three_methods["particles"]
    rate = float(p.rate[2])
    assert abs(rate - np.linalg.norm(CASES_V[2], 2)) < 1e-12
    ts = jnp.linspace(0, 100.0, 201)
    kw = dict(t1=100.0, ts=ts, rtol=1e-10, atol=1e-12)
    A, Vs = CASES_A[2], CASES_V[2] / rate
    tr = simulate(AttentionDynamics(A, Vs, beta=1.0), x0, **kw)
    R2 = jnp.mean((tr.xs[..., 0] + 1j * tr.xs[..., 1]) ** 2, -1)
    assert np.max(np.abs(np.asarray(R2) - p.R2[2])) < 1e-12
    regime, ev = classify_regime(tr)
    assert regime_name(regime) == p.regime_names[2] == "oscillation"
    assert abs(float(ev.period) / rate - p.evidence["period"][2]) < 1e-12
    ws = solve_watanabe_strogatz(A, Vs, th, points=x0, **kw)
    w = three_methods["watanabe_strogatz"]
    np.testing.assert_allclose(np.asarray(ws.order_parameter()), w.R2[2], rtol=0, atol=1e-12)
    oa = solve_ott_antonsen(A, Vs, R0, **kw)
    regime, _ = classify_order_parameter(ts, oa.R)
    np.testing.assert_allclose(np.asarray(oa.R), three_methods["ott_antonsen"].R2[2], atol=1e-12)
    assert regime_name(regime) == three_methods["ott_antonsen"].regime_names[2]


def test_one_cluster_is_told_from_an_antipodal_pair():
    # USA with A = V = I gathers all tokens into one cluster, LSA into an antipodal pair
    # (docs/theory); both have |R2| -> 1, which alone cannot tell them apart.
    kw = dict(n=24, t1=60.0, num_save=121, progress=False, init="uniform")
    usa = sweep(I2, I2, 1.0, 5, kernel="usa", **kw)
    lsa = sweep(I2, I2, 1.0, 5, kernel="lsa", **kw)
    for r in (usa, lsa):
        assert r.regime_names[0] == "clustering"
        assert abs(r.order[0, -1] - 1) < 1e-8
    assert (usa.evidence["num_clusters"][0], usa.evidence["antipodal_pairs"][0]) == (1, 0)
    assert (lsa.evidence["num_clusters"][0], lsa.evidence["antipodal_pairs"][0]) == (2, 1)


def test_compiles_once_per_shape():
    A = np.stack([I2 * (1 + 0.1 * k) for k in range(6)])
    kw = dict(method="ott_antonsen", chunk_size=2, n=8, t1=20.0, num_save=41, progress=False)
    before = sw.num_traces()
    res = sweep(A, I2, 1.0, 0, **kw)
    assert res.chunks_computed == 3
    assert sw.num_traces() - before == 1
    # Same shape and options again: no new trace.
    sweep(A + 0.01, I2, 1.0, 0, **kw)
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
    # How far each got: the refused member took no step and saved nothing; the other ran
    # its 400 steps and its last finite save is where the partial order parameter ends.
    assert (fails[0]["num_steps"], fails[0]["last_save"]) == (int(res.num_steps[1]), None)
    finite = np.flatnonzero(np.isfinite(res.order[2]))
    assert fails[1]["num_steps"] == 400 and 0 < finite.size < 41
    assert fails[1]["last_save"] == res.ts[2][finite[-1]] < 20.0
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
    written = sorted(f for f in os.listdir(tmp_path) if f.startswith("chunk_"))
    written = [f for f in written if f.endswith(".npz")]
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
    for k in ("regime", "R2", "result"):
        np.testing.assert_array_equal(getattr(res, k), getattr(full, k))
    for k in ("final_order", "period", "num_clusters"):
        np.testing.assert_array_equal(res.evidence[k], full.evidence[k])
    # A different sweep in the same folder is refused.
    with pytest.raises(ValueError, match="different sweep .same settings, other members"):
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


def test_resume_refuses_chunks_of_another_sweep_and_damaged_files(tmp_path):
    kw = dict(method="ott_antonsen", chunk_size=2, t1=40.0, num_save=81, progress=False)
    A = np.stack([I2, 2 * I2])
    first = sweep(A, I2, 1.0, [0, 1], out_dir=tmp_path, **kw)
    assert list(first.regime_names) == ["clustering", "clustering"]
    # Without its manifest, a folder's chunks still carry the sweep's fingerprint.
    os.remove(tmp_path / "manifest.json")
    with pytest.warns(UserWarning, match="different sweep"):
        other = sweep(A, -I2, 1.0, [0, 1], out_dir=tmp_path, **kw)
    assert other.chunks_computed == 1 and list(other.regime_names) == ["interior", "interior"]
    # Each result names its sweep by the fingerprint its folder is resumed by.
    assert len(first.fingerprint) == 64 and other.fingerprint != first.fingerprint
    # A truncated chunk is recomputed with a warning; a damaged manifest is named.
    path = tmp_path / "chunk_00000.npz"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.warns(UserWarning, match="cannot be read"):
        again = sweep(A, -I2, 1.0, [0, 1], out_dir=tmp_path, **kw)
    np.testing.assert_array_equal(again.R2, other.R2)
    (tmp_path / "manifest.json").write_text("[1, 2")
    with pytest.raises(ValueError, match="manifest.json is damaged.*pass resume=False"):
        sweep(A, -I2, 1.0, [0, 1], out_dir=tmp_path, **kw)
    # What the message advises works: resume=False overwrites the folder (its chunks too).
    fresh = sweep(A, -I2, 1.0, [0, 1], out_dir=tmp_path, resume=False, **kw)
    assert fresh.chunks_computed == 1
    np.testing.assert_array_equal(fresh.R2, other.R2)
    loaded = sw.SweepResult.load(tmp_path)
    np.testing.assert_array_equal(loaded.R2, other.R2)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert loaded.fingerprint == fresh.fingerprint == other.fingerprint == manifest["fingerprint"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(chunk_size=0), "chunk_size"),
        (dict(init="foo"), "init"),
        (dict(n=2.7), "integer number of tokens"),
        (dict(seeds=-1), "seeds must be integers"),
        (dict(seeds=1.5), "seeds must be integers"),
        (dict(t1=-5.0), "t1 must be a finite positive"),
        (dict(rtol=0.0), "rtol must be a finite positive"),
        (dict(gap_floor=-1.0), "gap_floor"),
        (dict(cluster_tol=float("nan")), "cluster_tol"),
        (dict(dtype=np.int32), "dtype must be float32 or float64, got int32"),
        # Half precision was taken and failed deep inside JAX (complex arithmetic, LAPACK).
        (dict(dtype="float16"), "dtype must be float32 or float64, got float16"),
        (dict(dtype=jnp.bfloat16), "dtype must be float32 or float64, got bfloat16"),
        (dict(dtype="float16", method="watanabe_strogatz"), "got float16"),
        (dict(dtype="no such dtype"), "is not a NumPy dtype"),
        (dict(score_shift="foo"), "score_shift"),
        (dict(A=np.eye(2) * (1 + 1j)), "real matrix"),
        (dict(A=np.zeros((0, 2, 2))), "empty batch"),
        (dict(r0=1.0), "r0"),
        (dict(num_save=10), "late window"),
    ],
)
def test_bad_sweep_arguments_are_named(kwargs, message):
    args = dict(A=I2, V=I2, seeds=0, progress=False)
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        sweep(args.pop("A"), args.pop("V"), 1.0, args.pop("seeds"), **args)


def test_failed_member_has_no_evidence():
    A = np.stack([I2, I2])
    A[1, 0, 0] = np.nan
    res = sweep(A, I2, 1.0, 0, method="ott_antonsen", t1=20.0, num_save=41, progress=False)
    assert res.failed.tolist() == [False, True]
    assert np.isnan(res.evidence["final_order"][1]) and res.evidence["num_clusters"][1] == -1
    assert res.evidence["final_order"][0] > 0.99


def test_classifiers_refuse_bad_times():
    ts = jnp.linspace(0.0, 1.0, 20)
    R = jnp.full(20, 0.5 + 0j)
    with pytest.raises(ValueError, match="strictly increasing"):
        classify_order_parameter(ts[::-1], R)
    xs = jnp.ones((20, 4, 1))
    with pytest.raises(ValueError, match="d >= 2"):
        classify_tokens(ts, xs)


def test_float64_members_cast_to_the_default_float32_are_named():
    """With 64-bit floats off, the sweep's default dtype is float32: a float64 `A` whose
    entries change in the cast is named in a warning (how many changed); exactly
    representable entries, or a dtype the user asked for, cast silently."""
    A = np.stack([np.eye(2) + 1e-9, np.eye(2)])  # 1e-9 and 1 + 1e-9 are not float32s
    V = np.stack([np.eye(2), np.eye(2)])  # exact in float32
    flow = sw.attention_members(A, V, 1.0, 0, n=4).flow
    with pytest.warns(UserWarning, match=r"\.A \(4 of 8\).*float32"):
        cast = sw._cast_flow(flow, np.float32, warn_narrowing=True)
    assert cast.A.dtype == np.float32 and np.array_equal(cast.V, V)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sw._cast_flow(flow, np.float32, warn_narrowing=False)  # asked for: no warning
        exact = sw.attention_members(V, V, 1.0, 0, n=4).flow
        sw._cast_flow(exact, np.float32, warn_narrowing=True)


def test_float64_sweep_without_64_bit_floats_warns_and_records_float32():
    """With 64-bit floats off (JAX's default), `dtype=float64` runs in float32: it used to
    record float64; now it warns and the result records what was computed."""
    code = textwrap.dedent(
        """
        import warnings
        import numpy as np
        import jaxattn.dynamics as jd
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            r = jd.sweep(np.eye(2), np.eye(2), 1.0, 0, method="ott_antonsen", t1=1.0,
                         num_save=21, dtype=np.float64, progress=False)
        print("warned:", [str(w.message) for w in caught if "64-bit" in str(w.message)])
        print("recorded:", r.environment["dtype"], r.R2.dtype)
        """
    )
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("JAX_ENABLE_X64", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert "sweep: dtype float64 needs 64-bit floats" in out.stdout, out.stderr[-2000:]
    assert "recorded: float32 complex64" in out.stdout, out.stdout
