"""Reliability of the particle half (issue 14): no silent wrong result, no misleading message.

Each test pins one failure that used to pass silently: a stalled float32 clock, an adjoint
that cannot follow the projection, a lossy float64 → float32 cast, the O(n²) memory of the
softmax kernels, β ≤ 0, the USA overflow advice, degenerate token counts and the
environment a result was computed in."""

import math
import subprocess
import sys
import warnings

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxattn.dynamics import REGIMES, AttentionDynamics, classify_regime, simulate
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
    assert simulate(field, x0, t0=1e7, t1=1e7 + 1, **kw).result == RESULTS.time_stalled
    early = simulate(field, x0, t0=0.0, t1=10.0, **kw)
    assert early.successful


def test_the_reduced_solvers_report_a_stalled_clock_and_an_overflow_as_simulate_does():
    """The standalone Ott–Antonsen, Watanabe–Strogatz and homogenised OA solvers step with
    simulate's stall guard (`pid_controller(stall_guard=True)`): a float32 clock near
    t = 1e5 and a field that overflows (A and V of 1e200: their products are inf) used to
    run to max_steps ('Try increasing max_steps'); the same runs from t0 = 0 / with sane
    weights succeed."""
    from jaxattn.dynamics import (
        MultiHeadDynamics,
        solve_homogenised_ott_antonsen,
        solve_ott_antonsen,
        solve_watanabe_strogatz,
    )

    f32 = jnp.float32
    A, V = jnp.array(ROT, f32) + jnp.eye(2, dtype=f32), jnp.array([[0.2, 1.0], [-1.0, -0.2]], f32)
    theta = jnp.array([0.1, 0.9, 2.0, -1.3, 2.9], f32)
    kw = dict(rtol=1e-6, atol=1e-8, max_steps=4096, num_save=11, throw=False)
    solvers = {
        "OA": lambda a, v, **k: solve_ott_antonsen(a, v, 0.3 + 0.1j, **k),
        "WS": lambda a, v, **k: solve_watanabe_strogatz(a, v, theta.astype(a.dtype), **k),
        "homogenised OA": lambda a, v, **k: solve_homogenised_ott_antonsen(
            MultiHeadDynamics(a[None], v[None]), 0.3 + 0.1j, **k
        ),
    }
    for name, solve in solvers.items():
        late = solve(A, V, t0=1e5, t1=1e5 + 10, **kw)
        assert late.result == RESULTS.time_stalled, name
        assert int(late.num_steps) < 200, name
        # Near t = 1e7 (float32 spacing 1) the default save grid's rounding went backwards,
        # which diffrax refused with a traceback from inside (even with throw=False).
        assert solve(A, V, t0=1e7, t1=1e7 + 1, **kw).result == RESULTS.time_stalled, name
        assert solve(A, V, t0=0.0, t1=10.0, **kw).result == RESULTS.successful, name
        big = solve(1e200 * A.astype(jnp.float64), 1e200 * V.astype(jnp.float64), t1=1.0, **kw)
        assert big.result == RESULTS.nonfinite_flow, name
    with pytest.raises(
        RuntimeError, match="solve_ott_antonsen: the solve did not succeed: .*coarse in this dtype"
    ):
        solve_ott_antonsen(A, V, 0.3 + 0.1j, t0=1e5, t1=1e5 + 10, num_save=11)


def test_a_stiff_field_at_max_steps_is_told_from_a_short_budget():
    """An eager max_steps failure says how far the solve got. A huge but finite field
    (beta 1e200: every step is rejected, the clock still advances in float64, so the stall
    guard cannot see it) is told apart: more max_steps cannot help; a solve that merely ran
    out of steps gets a lower bound on the steps the horizon needs."""
    from jaxattn.dynamics import solve_ott_antonsen

    A = jnp.eye(2)
    V = jnp.array([[0.2, 1.0], [-1.0, 0.2]])
    x0 = sample_uniform(jax.random.key(0), 8, 2)
    with pytest.raises(RuntimeError, match="0 accepted.*more max_steps cannot help.*stiff"):
        simulate(AttentionDynamics(A, V, beta=1e200), x0, t1=5.0, num_save=11, max_steps=60)
    with pytest.raises(RuntimeError, match="more max_steps cannot help") as e:
        solve_ott_antonsen(1e100 * A, 1e100 * V, 0.3 + 0.1j, t1=5.0, num_save=11, max_steps=60)
    assert "solve_ott_antonsen" in str(e.value)
    with pytest.raises(RuntimeError, match="needs at least") as e:
        solve_ott_antonsen(A, V, 0.3 + 0.1j, t1=50.0, num_save=11, max_steps=4)
    need = float(str(e.value).split("needs at least ")[1].split(" steps")[0])
    assert "cannot help" not in str(e.value)
    # A lower bound indeed: the whole solve takes at least that many steps.
    sol = solve_ott_antonsen(A, V, 0.3 + 0.1j, t1=50.0, num_save=11)
    assert sol.result == RESULTS.successful and int(sol.num_steps) >= need
    # Save times that start after t0 (helper-27: the bound took ts[0] for t0 and called a
    # healthy field stiff): the horizon is t1 - t0, and the bound stays below the truth.
    late = dict(t1=10.0, ts=jnp.array([9.0, 9.5, 10.0]))
    full = solve_ott_antonsen(A, V, 0.3 + 0.1j, **late)
    with pytest.raises(RuntimeError, match="needs at least") as e:
        solve_ott_antonsen(A, V, 0.3 + 0.1j, max_steps=int(full.num_steps) // 2, **late)
    assert "cannot help" not in str(e.value) and "(the first is t = 9; t1 = 10)" in str(e.value)
    need = float(str(e.value).split("needs at least ")[1].split(" steps")[0])
    assert need <= int(full.num_steps)
    # Saves too sparse to bound anything are said to be, not turned into a useless bound.
    with pytest.raises(RuntimeError, match="save times are too sparse") as e:
        solve_ott_antonsen(A, V, 0.3 + 0.1j, t1=10.0, ts=jnp.array([0.0, 10.0]), max_steps=5)


@pytest.mark.slow
def test_backsolve_adjoint_refused_under_projection_and_exact_to_rtol_without():
    """BacksolveAdjoint used to crash with a TypeError about WrapTerm under the default
    projection; it is refused with the reason. Without projection it is the continuous
    adjoint: equal to the discrete (checkpointed) gradient to O(rtol)."""
    A = jnp.array(ROT)
    x0 = _x0()
    with pytest.raises(ValueError, match="BacksolveAdjoint cannot be used with project=True"):
        simulate(AttentionDynamics(A, jnp.eye(2)), x0, t1=1.0, adjoint=diffrax.BacksolveAdjoint())

    def loss(V, adjoint):
        tr = simulate(
            AttentionDynamics(A, V),
            x0,
            t1=5.0,
            num_save=3,
            rtol=1e-9,
            atol=1e-11,
            adjoint=adjoint,
            project=False,
        )
        return jnp.sum(tr.xs[-1, :, 0] ** 2)

    V = jnp.array([[0.3, 0.8], [-0.6, -0.2]])
    g_ref = jax.grad(loss)(V, diffrax.RecursiveCheckpointAdjoint())
    g_back = jax.grad(loss)(V, diffrax.BacksolveAdjoint())
    rel = float(jnp.linalg.norm(g_back - g_ref) / jnp.linalg.norm(g_ref))
    assert rel < 1e-7 and float(jnp.linalg.norm(g_ref)) > 1e-2


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


def test_nonpositive_beta_is_refused_concrete_and_reported_traced():
    for beta in (0.0, -1.0):
        with pytest.raises(ValueError, match="beta is an inverse temperature and must be > 0"):
            AttentionDynamics(jnp.eye(2), jnp.eye(2), beta=beta)

    def run(b):
        f = AttentionDynamics(jnp.eye(2), jnp.eye(2), beta=b)
        return simulate(f, _x0(), t1=1.0, num_save=3, throw=False)

    # a swept β (traced) cannot be refused at construction: the member is reported
    out = jax.vmap(run)(jnp.array([1.0, 0.0, -1.0]))
    codes = np.asarray(out.result._value)
    assert codes[0] == RESULTS.successful._value
    assert np.all(codes[1:] == RESULTS.nonpositive_beta._value)
    assert np.all(np.isnan(out.xs[1:]))


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


def test_trajectory_carries_its_environment_through_jit_vmap_and_grad():
    """A Trajectory used to record nothing of where it was computed; it carries
    `environment` (a static field: the pytree's leaves are unchanged, so jit, vmap and grad
    of simulate work as before)."""
    import json

    field = AttentionDynamics(jnp.array(ROT), jnp.eye(2))
    traj = simulate(field, _x0(), t1=1.0, num_save=3)
    env = traj.environment
    assert env["backend"] == jax.default_backend()
    assert env["device_count"] == jax.device_count()
    assert env["matmul_precision"] == jax.config.jax_default_matmul_precision
    assert env["dtype"] == "float64" and env["x64"] is True
    assert dict(env) == dict(environment_record(), dtype="float64", devices=env["devices"])
    json.dumps(dict(env))  # JSON-ready
    assert len(jax.tree.leaves(traj)) == 8  # ts, xs, result, 3 step counts, 2 deviations
    f32 = jnp.float32
    field32 = AttentionDynamics(jnp.array(ROT, f32), jnp.eye(2, dtype=f32))
    assert simulate(field32, _x0(dtype=f32), t1=1.0, num_save=3).environment["dtype"] == "float32"
    with jax.default_matmul_precision("highest"):
        precise = simulate(field, _x0(), t1=1.0, num_save=3)
    assert precise.environment["matmul_precision"] == "highest"

    def run(beta):
        f = AttentionDynamics(jnp.array(ROT), jnp.eye(2), beta=beta)
        return simulate(f, _x0(), t1=1.0, num_save=3, throw=False)

    batch = jax.jit(jax.vmap(run))(jnp.array([1.0, 2.0]))
    assert batch.environment == env and batch.xs.shape == (2, 3, 8, 2)
    np.testing.assert_allclose(batch.xs[0], traj.xs, rtol=0, atol=1e-12)
    grad = jax.grad(lambda b: run(b).xs[-1, 0, 0])(1.0)
    eps = 1e-6
    fd = (run(1.0 + eps).xs[-1, 0, 0] - run(1.0 - eps).xs[-1, 0, 0]) / (2 * eps)
    np.testing.assert_allclose(grad, fd, rtol=1e-5)


# ----------------------------------------------------------------------- lyapunov_spectrum


def test_lyapunov_spectrum_refuses_usa_overflow_naming_score_shift():
    """lyapunov_spectrum lacked simulate's USA overflow check: β σ_max(A) = 100 in float32
    ran into max_steps_reached with NaN exponents. It now refuses with simulate's message
    (the smallest score_shift that fits); traced, the member reports usa_overflow."""
    from jaxattn.dynamics import lyapunov_spectrum

    f32 = jnp.float32
    A, eye = 100.0 * jnp.eye(2, dtype=f32), jnp.eye(2, dtype=f32)
    kw = dict(t1=1.0, k=1, num_renorm=16, transient=0.0)
    with pytest.raises(ValueError, match=r"lyapunov_spectrum: USA .*score_shift=55\.6386"):
        lyapunov_spectrum(AttentionDynamics(A, eye, kernel="usa"), _x0(dtype=f32), **kw)

    def run(beta):
        return lyapunov_spectrum(
            AttentionDynamics(eye, eye, beta=beta, kernel="usa"), _x0(dtype=f32), **kw
        )

    out = jax.vmap(run)(jnp.array([1.0, 200.0], f32))
    codes = np.asarray(out.result._value)
    assert codes.tolist() == [RESULTS.successful._value, RESULTS.usa_overflow._value]
    assert np.isfinite(out.exponents[0]).all() and np.isnan(out.exponents[1]).all()


def test_lyapunov_spectrum_reports_a_stalled_float32_clock():
    """The float32 clock at t0 = 1e5 (spacing 0.0078) used to retry the same step until
    max_steps_reached (512 steps, 510 rejected); the stall guard of simulate now ends it
    at once with RESULTS.time_stalled. The same spectrum from t0 = 0 succeeds."""
    from jaxattn.dynamics import lyapunov_spectrum

    f32 = jnp.float32
    field = AttentionDynamics(jnp.array(ROT, f32), jnp.eye(2, dtype=f32))
    kw = dict(k=1, num_renorm=16, transient=0.0, rtol=1e-8, atol=1e-10, max_steps=512)
    late = lyapunov_spectrum(field, _x0(dtype=f32), t0=1e5, t1=1e5 + 16, **kw)
    assert late.result == RESULTS.time_stalled
    assert int(late.num_steps) < 100 and np.isnan(late.exponents).all()
    early = lyapunov_spectrum(field, _x0(dtype=f32), t0=0.0, t1=16.0, **kw)
    assert early.successful and np.isfinite(early.exponents).all()


# ----------------------------------------------------------------------------- search


def test_search_refuses_tolerances_whose_gradient_is_wrong():
    from jaxattn.dynamics._search import MAX_GRADIENT_TOL, regime_score, regime_search

    assert MAX_GRADIENT_TOL == 1e-4
    with pytest.raises(ValueError, match=r"rtol = 0.01 is above MAX_GRADIENT_TOL"):
        regime_score(jnp.eye(2), jnp.eye(2), rtol=1e-2)
    with pytest.raises(ValueError, match=r"atol = 0.001 is above MAX_GRADIENT_TOL"):
        regime_search(jnp.zeros(2), lambda p: (jnp.eye(2), jnp.diag(p)), atol=1e-3)


def test_search_stops_on_nonfinite_scores_with_the_last_good_parameters():
    from jaxattn.dynamics._search import regime_search

    def build(p):
        # the flow is undefined (NaN) once max(p) > -0.45: the solve fails, the score is
        # NaN (the search climbs max(p), the Case-2 clustering boundary is max(p) = 0)
        V = jnp.diag(p)
        return jnp.eye(2), jnp.where(jnp.max(p) > -0.45, jnp.nan, V)

    kw = dict(target="clustering", learning_rate=0.1, max_iters=5, t1=2.0, num_save=9)
    start = jnp.array([-1.0, -0.5])
    res = regime_search(start, build, **kw)
    assert res.status == "nonfinite_score" and not res.reached
    np.testing.assert_array_equal(np.asarray(res.params), np.asarray(start))  # last good
    assert np.all(np.isfinite(res.history["score"])) and len(res.history["score"]) == 1


@pytest.mark.slow
def test_search_started_at_a_nonfinite_score_stops_at_once():
    from jaxattn.dynamics._search import regime_search

    def build(p):
        return jnp.eye(2), jnp.where(jnp.max(p) > -0.45, jnp.nan, jnp.diag(p))

    bad = regime_search(jnp.array([-1.0, -0.3]), build, max_iters=5, t1=2.0, num_save=9)
    assert bad.status == "nonfinite_start" and bad.steps == 1 and not bad.reached
    assert len(bad.history["score"]) == 0
    np.testing.assert_array_equal(np.asarray(bad.params), [-1.0, -0.3])


# ----------------------------------------------------------------------------- degenerate n


def test_single_token_is_degenerate_not_clustering():
    from jaxattn.dynamics import REGIMES, classify_tokens

    ts = jnp.linspace(0.0, 10.0, 41)
    xs = jnp.stack([jnp.cos(0.1 * ts), jnp.sin(0.1 * ts)], -1)[:, None, :]  # one token
    with pytest.warns(UserWarning, match="n = 1 token is a degenerate configuration") as w:
        regime, ev = jax.jit(classify_tokens)(ts, xs)
    assert [x.filename for x in w] == [__file__]  # this line, through jit
    assert regime == REGIMES.undetermined  # used to be clustering with order 1
    assert float(ev.final_order) == pytest.approx(1.0)


@pytest.mark.parametrize(
    "call, match",
    [
        (
            lambda: __import__("jaxattn.dynamics", fromlist=["x"]).clustering_gap(
                jnp.zeros((0, 3))
            ),
            "n >= 1 tokens.*n = 0",
        ),
        (
            lambda: __import__("jaxattn.dynamics", fromlist=["x"]).cluster_structure(
                jnp.zeros((0, 3))
            ),
            "n = 0 tokens",
        ),
        (
            lambda: __import__("jaxattn.dynamics", fromlist=["x"]).order_parameter(
                jnp.zeros((5, 0))
            ),
            r"n >= 1 angles.*\(n = 0\)",
        ),
    ],
)
def test_no_tokens_is_refused_by_name(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_find_transitions_skips_failed_members():
    from jaxattn.dynamics import find_transitions

    p = [0.0, 1.0, 2.0, 3.0, 4.0]
    labels = ["clustering", "clustering", "undetermined", "clustering", "rotating"]
    failed = [False, False, True, False, False]
    # without the mask the failure reads as two regime changes
    assert len(find_transitions(p, labels)) == 3
    assert find_transitions(p, labels, failed=failed) == [(3.0, 4.0, "clustering", "rotating")]
    # a change across a failed member is bracketed by the nearest good ones
    labels2 = ["clustering", "clustering", "undetermined", "rotating", "rotating"]
    assert find_transitions(p, labels2, failed=failed) == [(1.0, 3.0, "clustering", "rotating")]
    with pytest.raises(ValueError, match="failed has 2 entries for 5"):
        find_transitions(p, labels, failed=[True, False])


# ----------------------------------------------------------------------------- atlas figures


def test_atlas_figure_failure_is_recorded_not_raised(tmp_path, monkeypatch, capsys):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from jaxattn.dynamics import _atlas

    def plot_demo(data, path):
        fig, ax = plt.subplots()
        ax.plot(data)
        fig.savefig(path)
        plt.close(fig)
        return path

    blocked = tmp_path / "blocked.png"
    blocked.mkdir()  # a directory where the PNG should go
    _atlas._FIGURE_ERRORS.clear()
    ok = _atlas._figure(plot_demo, [1, 2], str(tmp_path / "fine.png"))
    assert ok == str(tmp_path / "fine.png") and (tmp_path / "fine.png").stat().st_size > 0
    assert _atlas._figure(plot_demo, [1, 2], str(blocked)) == str(blocked)
    (err,) = _atlas._FIGURE_ERRORS
    assert err["figure"] == str(blocked) and err["plot"] == "plot_demo"
    assert "IsADirectoryError" in err["error"]

    # the command keeps the report and says so with exit code 3
    from jaxattn.cli import main

    def fake_run_atlas(**kw):
        return dict(markdown=str(tmp_path / "atlas.md"), figure_errors=[err])

    monkeypatch.setattr(_atlas, "run_atlas", fake_run_atlas)
    assert main(["atlas", "--quick", "--out", str(tmp_path)]) == 3
    assert f"figure not drawn: {blocked}" in capsys.readouterr().err


def test_fresh_user_bad_inputs_are_refused_by_name():
    """Found by a fresh-user trial: a typo'd map size filled host memory (OOM kill), and
    `causal="yes"` / `Integration(dtype="foo")` / `near_boundary_mask("a")` were accepted or
    failed inside NumPy."""
    import jaxattn.dynamics as jd
    from jaxattn.dynamics._regime_map import parse_axis

    with pytest.raises(ValueError, match="at most 1000000 per axis"):
        parse_axis("v11=-2:2:1000000000")
    big = (("v11", np.arange(10.0**6)), ("v12", np.arange(10.0**4)))
    with pytest.raises(ValueError, match="10000000000 cells x 8 inits need about"):
        jd.regime_map("case4", big, inits=8)
    with pytest.raises(ValueError, match="causal must be True or False"):
        jd.AttentionDynamics(np.eye(2), np.eye(2), beta=1.0, causal="yes")
    with pytest.raises(ValueError, match="'foo' is not a NumPy dtype"):
        jd.Integration(dtype="foo")
    with pytest.raises(ValueError, match="dtype must be float32 or float64, got float16"):
        jd.Integration(dtype=np.float16)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: AttentionDynamics(np.eye(2) * (1 + 1j), np.eye(2)), r"A must hold real numbers"),
        (lambda: AttentionDynamics(np.eye(2), [["a", "b"], ["c", "d"]]), r"V is not an array"),
        (lambda: AttentionDynamics(np.eye(2), np.eye(2), beta="1"), r"beta is not an array"),
        (lambda: AttentionDynamics(np.eye(2), [[1.0, 2.0], [3.0]]), r"V is not an array"),
    ],
)
def test_complex_and_non_numeric_weights_are_refused_by_name(call, match):
    """Complex weights ran before (a complex 'flow' off the sphere) and strings failed
    inside JAX; both name the argument now."""
    with pytest.raises(ValueError, match=match):
        call()


def test_watanabe_strogatz_names_a_complex_A_not_theta0():
    from jaxattn.dynamics._watanabe_strogatz import solve_watanabe_strogatz

    theta0 = np.linspace(0, 3, 8)
    with pytest.raises(ValueError, match=r"solve_watanabe_strogatz: A must hold real numbers"):
        solve_watanabe_strogatz(np.eye(2) * 1j, np.eye(2), theta0, t1=1.0)
    with pytest.raises(ValueError, match=r"theta0 must hold real numbers"):
        solve_watanabe_strogatz(np.eye(2), np.eye(2), theta0 * 1j, t1=1.0)


def test_classifying_a_failed_solve_warns_and_a_traced_one_stays_silent():
    # A solve out of steps is classified from the saves it reached; said so (the evidence,
    # such as a final order of 0.0, describes only those), with the solver's own message.
    field = AttentionDynamics(jnp.array(ROT), jnp.eye(2))
    short = simulate(field, _x0(), t1=10.0, num_save=21, max_steps=3, throw=False)
    assert short.result == RESULTS.max_steps_reached
    with pytest.warns(
        UserWarning, match=r"did not succeed \(The maximum number of solver steps"
    ) as w:
        regime, _ = classify_regime(short)
    assert [x.filename for x in w] == [__file__]
    assert regime == REGIMES.undetermined
    whole = simulate(field, _x0(), t1=10.0, num_save=21)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a successful solve, and a traced one: no warning
        classify_regime(whole)
        jax.jit(lambda tr: classify_regime(tr)[1].final_order)(short)


def test_tokens_far_off_the_sphere_are_rescaled_exactly_not_zeroed():
    """Tokens of 1e300 used to square to inf when normalised: the solve returned all-zero
    tokens marked successful. Rows are now scaled by a power of 2 first (exact), so the
    run is that of the unit tokens; the deviation reported is that of the tokens given."""
    field = AttentionDynamics(jnp.array(ROT), jnp.eye(2))
    x0 = np.asarray(_x0())
    unit = simulate(field, x0, t1=5.0, num_save=6)
    for scale, deviation in ((1e300, 1e300), (1e-300, 1.0), (1e-310, 1.0)):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            far = simulate(field, scale * x0, t1=5.0, num_save=6)
        # one warning, ours, at this line: no NumPy overflow from inside the package
        assert [str(x.message)[:45] for x in w] == ["simulate: initial tokens are off the unit sph"]
        assert w[0].filename == __file__
        assert far.successful
        np.testing.assert_allclose(far.xs, unit.xs, rtol=0, atol=1e-12)
        np.testing.assert_allclose(float(far.initial_deviation), deviation, rtol=1e-6)
    # Without 64-bit JAX, float64 tokens of 1e300 would overflow in the cast to float32:
    # they are scaled on the host first.
    with jax.enable_x64(False):
        f32 = AttentionDynamics(jnp.array(ROT, jnp.float32), jnp.eye(2, dtype=jnp.float32))
        with pytest.warns(UserWarning, match="off the unit sphere") as w:
            far = simulate(f32, 1e300 * x0, t1=5.0, num_save=6)
        assert len(w) == 1 and far.successful and far.xs.dtype == jnp.float32
        assert float(far.initial_deviation) == np.inf  # 1e300 is beyond float32
        np.testing.assert_allclose(far.xs, unit.xs, rtol=0, atol=1e-5)


class _BreaksAtHalf(eqx.Module):
    """A rotation that returns NaN from t = 0.5 on."""

    def __call__(self, t, x, args=None):
        v = jnp.stack([-x[:, 1], x[:, 0]], axis=1)
        return jnp.where(t > 0.5, jnp.nan, 1.0) * v


def test_a_flow_that_turns_nonfinite_is_named_not_a_stalled_clock():
    """NaN velocities reject every step until the step stalls: this used to be reported as
    time_stalled, whose advice (float64, start at t0 = 0, looser rtol) cannot help."""
    nan_flow = simulate(_BreaksAtHalf(), _x0(4), t1=1.0, num_save=3, throw=False)
    assert nan_flow.result == RESULTS.nonfinite_flow
    assert "non-finite values" in RESULTS[RESULTS.nonfinite_flow]
    overflow = AttentionDynamics(jnp.full((2, 2), 1e308), jnp.eye(2))
    assert simulate(overflow, _x0(4), t1=1.0, num_save=3, throw=False).result == (
        RESULTS.nonfinite_flow
    )
    # the float32 clock stall of the test above keeps its own code: no value was NaN; a
    # finite-time blow-up (finite values, ever faster) stalls the clock too, and says so
    assert "blows up in finite time" in RESULTS[RESULTS.time_stalled]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(kernel="usa", score_shift=float("nan")), "score_shift must be a finite number"),
        (dict(kernel="usa", score_shift=float("inf")), "score_shift must be a finite number"),
        (dict(kernel="lsa", score_shift=3.0), "score_shift applies to the USA kernel only"),
        (dict(kernel="sa", score_shift=1.0), "score_shift applies to the USA kernel only"),
        (dict(kernel="usa", score_shift=[1.0, 2.0]), "score_shift must be a scalar"),
    ],
)
def test_a_bad_score_shift_is_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AttentionDynamics(jnp.eye(2), jnp.eye(2), **kwargs)


def test_a_relative_tolerance_of_one_or_more_is_refused():
    from jaxattn.dynamics import Integration

    field = AttentionDynamics(jnp.eye(2), jnp.eye(2))
    with pytest.raises(ValueError, match="simulate: rtol must be below 1 .* got 10.0"):
        simulate(field, _x0(4), t1=1.0, rtol=10.0)
    with pytest.raises(ValueError, match="Integration: rtol must be below 1"):
        Integration(rtol=1.0)
    with pytest.raises(ValueError, match="simulate: rtol must be a number, got '1e-3'"):
        simulate(field, _x0(4), t1=1.0, rtol="1e-3")


def test_fixed_points_refuse_nonfinite_weights():
    from jaxattn.dynamics import fixed_points

    with pytest.raises(ValueError, match="fixed_points: A has non-finite entries"):
        fixed_points([[1.0, np.nan], [0.0, 1.0]], np.eye(2))


def test_a_sweep_says_why_its_members_failed():
    from jaxattn.dynamics import sweep

    A = np.stack([np.eye(2), np.full((2, 2), np.nan), np.eye(2)])
    res = sweep(A, np.eye(2), 1.0, 0, method="ott_antonsen", t1=5.0, progress=False)
    assert res.failed.tolist() == [False, True, False]
    assert res.failure_reasons() == [("nonfinite_argument", 1)]


def test_classifying_a_series_without_a_finite_value_warns():
    from jaxattn.dynamics import classify_order_parameter, classify_tokens

    ts = jnp.linspace(0.0, 10.0, 41)
    with pytest.warns(UserWarning, match="every value of R2 is NaN or inf") as w:
        regime, _ = classify_order_parameter(ts, jnp.full(41, jnp.nan + 0j))
    assert regime == REGIMES.undetermined and w[0].filename == __file__
    with pytest.warns(UserWarning, match="every value of xs is NaN or inf"):
        regime, _ = classify_tokens(ts, jnp.full((41, 4, 2), jnp.nan))
    assert regime == REGIMES.undetermined
