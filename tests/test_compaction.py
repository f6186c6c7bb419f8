"""Tests of jaxattn.dynamics._segments: a solve resumed in segments of K steps equals the
whole solve (saves to 1e-12 in float64, identical step counts and result codes), for the
particle, Ott–Antonsen and Watanabe–Strogatz problems, including members that reach
max_steps or are invalid; and of the compacting sweep that is built on it."""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxattn.dynamics import AttentionDynamics, sample_wrapped_cauchy
from jaxattn.dynamics._ott_antonsen import finish_ott_antonsen, prepare_ott_antonsen
from jaxattn.dynamics._segments import (
    advance_segments,
    segments_solution,
    solve_problem,
    start_segments,
)
from jaxattn.dynamics._solve import RESULTS, finish_particles, prepare_particles
from jaxattn.dynamics._watanabe_strogatz import (
    finish_watanabe_strogatz,
    prepare_watanabe_strogatz,
    watanabe_strogatz_constants,
)

I2 = np.eye(2)
J2 = np.array([[0.0, -1.0], [1.0, 0.0]])
T1 = 30.0
TS = jnp.linspace(0.0, T1, 31)
TOL = dict(rtol=1e-8, atol=1e-10)


def _whole(problem, max_steps):
    return solve_problem(
        problem, 0.0, T1, None, TS, diffrax.RecursiveCheckpointAdjoint(), max_steps
    )


@eqx.filter_jit
def _advance(problem, state, K, max_steps, dense=False):
    # The problem is an argument (not a constant of the program): one compilation per
    # (problem structure, K, max_steps) serves every member of the same kind.
    return advance_segments(problem, state, T1, TS, steps=K, max_steps=max_steps, dense_saves=dense)


def _segmented(problem, K, max_steps, dense=False):
    state = start_segments(problem, 0.0, jnp.asarray(T1), None, TS.shape[0])
    # Strong dtypes from the start (start_segments returns a weakly typed time and step
    # size, the advanced state does not): otherwise the second call compiles again.
    state = jax.tree.map(lambda x: jnp.asarray(x, x.dtype) if eqx.is_array(x) else x, state)
    for _ in range(max_steps // K + 2):
        state = _advance(problem, state, K, max_steps, dense)
        if bool(state.done):
            break
    assert bool(state.done)
    return segments_solution(state)


def _same(whole, seg):
    np.testing.assert_allclose(
        np.asarray(seg.ys), np.asarray(whole.ys), rtol=0, atol=1e-12, equal_nan=True
    )
    for k in ("num_steps", "num_accepted_steps", "num_rejected_steps"):
        assert int(seg.stats[k]) == int(whole.stats[k]), k
    assert int(seg.result._value) == int(whole.result._value)


def _oa(A, V, R0):
    return prepare_ott_antonsen(
        jnp.asarray(A),
        jnp.asarray(V),
        jnp.asarray(1.0),
        jnp.asarray(R0),
        jnp.float64,
        diffrax.Tsit5(),
        **TOL,
    )


# Ott–Antonsen members: clustering, rotating, oscillating; one hits max_steps (a stiff
# member), one is invalid (NaN in A).
OA_CASES = [
    (I2, I2, 0.1 + 0.05j, 4096),
    (np.diag([2.0, 1.0]), I2 + J2, 0.2j, 4096),
    (I2, np.array([[0.3, 1.0], [-1.0, -0.3]]), 0.1, 4096),
    (300 * I2, I2, 0.1, 64),
    (np.where(I2 > 0, np.nan, 0.0), I2, 0.1, 4096),
]


@pytest.mark.parametrize("case", range(len(OA_CASES)))
def test_segmented_ott_antonsen_equals_whole(case):
    A, V, R0, max_steps = OA_CASES[case]
    problem, checks = _oa(A, V, R0)
    whole = _whole(problem, max_steps)
    for K, dense in ((1, False), (7, False), (16, False), (1, True), (16, True)):
        if max_steps % K and whole.result == diffrax.RESULTS.max_steps_reached:
            continue  # max_steps must be a multiple of K (the sweep makes it one)
        seg = _segmented(problem, K, max_steps, dense)
        _same(whole, seg)
        a, b = finish_ott_antonsen(checks, whole, TS), finish_ott_antonsen(checks, seg, TS)
        np.testing.assert_allclose(np.asarray(b.R), np.asarray(a.R), atol=1e-12, equal_nan=True)
        assert int(a.result._value) == int(b.result._value)
    if case == 3:
        assert whole.result == diffrax.RESULTS.max_steps_reached
    if case == 4:
        assert int(a.result._value) == int(RESULTS.nonfinite_argument._value)


def test_segmented_particles_equal_whole(getkey):
    n = 16
    theta = sample_wrapped_cauchy(getkey(), n, 0.2 + 0.1j, dtype=jnp.float64)
    x0 = jnp.stack([jnp.cos(theta), jnp.sin(theta)], axis=-1)
    for A, V, x_start, max_steps in (
        (I2 * 1.5, I2 + J2, x0, 4096),
        (I2, np.array([[0.3, 1.0], [-1.0, -0.3]]), x0, 4096),
        (I2, I2, x0.at[3, 0].set(jnp.nan), 4096),  # invalid member
        (40 * I2, I2 + J2, x0, 32),  # runs out of steps
    ):
        field = AttentionDynamics(jnp.asarray(A), jnp.asarray(V), beta=1.0)
        problem, checks = prepare_particles(field, x_start, diffrax.Tsit5(), project=True, **TOL)
        whole = _whole(problem, max_steps)
        for K in (1, 5, 32):
            if max_steps % K:
                continue
            seg = _segmented(problem, K, max_steps)
            _same(whole, seg)
            a, b = finish_particles(checks, whole, TS), finish_particles(checks, seg, TS)
            np.testing.assert_allclose(
                np.asarray(b.xs), np.asarray(a.xs), atol=1e-12, equal_nan=True
            )
            assert int(a.result._value) == int(b.result._value)
            assert float(a.sphere_deviation) == pytest.approx(
                float(b.sphere_deviation), abs=1e-15, nan_ok=True
            )


def test_segmented_watanabe_strogatz_equals_whole(getkey):
    theta = sample_wrapped_cauchy(getkey(), 32, 0.3, dtype=jnp.float64)
    consts = watanabe_strogatz_constants(theta)
    # (Case 4 with v11 > v12 is left out: its transient amplifies the rounding of two
    # differently compiled programs to ~1e-11 however the solve is segmented.)
    cases = ((I2, I2), (np.diag([2.0, 1.0]), I2 + J2), (I2, np.array([[0.3, 1.0], [-1.0, -0.3]])))
    for A, V in cases:
        problem, checks = prepare_watanabe_strogatz(
            jnp.asarray(A),
            jnp.asarray(V),
            jnp.asarray(1.0),
            consts,
            jnp.float64,
            diffrax.Tsit5(),
            **TOL,
        )
        whole = _whole(problem, 4096)
        first = {}
        # In-loop saves, and saves interpolated afterwards from each segment's dense output
        # (`dense_saves`, what a compacting WS sweep uses).
        for K, dense in ((1, False), (3, False), (16, False), (1, True), (3, True), (16, True)):
            seg = _segmented(problem, K, 4096, dense)
            _same(whole, seg)
            first.setdefault(dense, seg)
            # The segment length changes nothing: bit for bit.
            np.testing.assert_array_equal(np.asarray(seg.ys), np.asarray(first[dense].ys))
            # The same interpolation of the same steps, compiled differently: to an ulp.
            np.testing.assert_allclose(
                np.asarray(seg.ys), np.asarray(first[False].ys), rtol=0, atol=1e-15
            )
            a, b = (finish_watanabe_strogatz(checks, s, TS) for s in (whole, seg))
            np.testing.assert_allclose(np.asarray(b.points()), np.asarray(a.points()), atol=1e-12)


def test_dense_saves_take_no_save_functions():
    problem, _ = _oa(I2, I2, 0.1)
    state = start_segments(problem, 0.0, jnp.asarray(T1), None, (31,), (jnp.abs,))
    with pytest.raises(ValueError, match="dense_saves saves the state itself"):
        advance_segments(
            problem, state, T1, (TS,), steps=4, max_steps=64, save_fns=(jnp.abs,), dense_saves=True
        )


def test_batched_segments_with_a_finished_member_keep_it_unchanged():
    # Under vmap a member that is done takes no more steps while the others go on.
    problems = [_oa(A, V, R0)[0] for A, V, R0, _ in OA_CASES[:3]]
    parts = [eqx.partition(p, eqx.is_array) for p in problems]
    batch = jax.tree.map(lambda *x: jnp.stack(x), *[d for d, _ in parts])
    static = parts[0][1]
    wholes = [_whole(p, 4096) for p in problems]
    state = jax.vmap(
        lambda d: start_segments(eqx.combine(d, static), 0.0, jnp.asarray(T1), None, 31)
    )(batch)
    step = jax.jit(
        jax.vmap(
            lambda d, s: advance_segments(
                eqx.combine(d, static), s, T1, TS, steps=8, max_steps=4096
            )
        )
    )
    while not bool(jnp.all(state.done)):
        state = step(batch, state)
    for i, whole in enumerate(wholes):
        seg = segments_solution(jax.tree.map(lambda x: x[i], state))
        _same(whole, seg)


# ---------------------------------------------------------------------------------------
# The compacting sweep
# ---------------------------------------------------------------------------------------


def _case4(v11, v12):
    return np.array([[v11, v12], [-v12, -v11]])


# Clustering, rotating, oscillating, a stiff member that runs out of steps, a NaN member.
SWEEP_A = np.stack([I2, np.diag([2.0, 1.0]), I2, 60 * I2, I2, I2 * 0.5])
SWEEP_A[4, 0, 1] = np.nan
SWEEP_V = np.stack([I2, I2 + J2, _case4(0.3, 1.0), I2 + J2, I2, _case4(1.0, 0.3)])
SWEEP_KW = dict(n=16, t1=30.0, num_save=61, time_scale="physical", max_steps=256)


@pytest.mark.parametrize("method", ["particles", "ott_antonsen", "watanabe_strogatz"])
def test_compacted_members_equal_their_solo_runs(method, monkeypatch):
    from jaxattn.dynamics import _sweep as sw
    from jaxattn.dynamics._sweep import sweep

    # Prepared and classified 4 at a time (`lax.map`: a block of 4 and the rest, 2), as a
    # CPU pool does 16 at a time.
    monkeypatch.setattr(sw, "CPU_BLOCK", 4)
    kw = dict(SWEEP_KW, method=method, progress=False)
    seeds = np.arange(6)
    # Two slots for six members: every slot is refilled, a failed member retires early.
    # One slot (`_one_slot`, each member solved on its own, here in segments of 8 steps).
    runs = {
        slots: sweep(
            SWEEP_A, SWEEP_V, 1.0, seeds, strategy="compact", slots=slots, segment_steps=8, **kw
        )
        for slots in (2, 1)
    }
    if method == "particles":
        # One slot in one segment (the CPU default): the whole state saved in the loop at
        # every save time and split after the solve (`_whole_particle_saves`).
        runs[1] = sweep(SWEEP_A, SWEEP_V, 1.0, seeds, strategy="compact", slots=1, **kw)
        assert runs[1].plan["segment_steps"] == [256]
    for slots, comp in runs.items():
        assert comp.plan["strategy"] == "compact"
        assert comp.plan["slots_per_device"] == [slots]
        assert 0 < comp.lockstep_efficiency <= 1
        assert comp.failed[3] and comp.failed[4] and not comp.failed[0]
        assert RESULTS.max_steps_reached._value == comp.result[3]
        assert comp.num_steps[3] == 256
    # One slot steps no member in lockstep with another: no masked iterations.
    assert runs[1].lockstep_efficiency == 1
    for k in ("regime", "result", "num_steps"):
        np.testing.assert_array_equal(getattr(runs[1], k), getattr(runs[2], k), err_msg=k)
    # A vmapped solve and a solve on its own compile differently: rounding apart (1e-13
    # here, grown along a rotating Ott–Antonsen member).
    np.testing.assert_allclose(runs[1].R2, runs[2].R2, rtol=0, atol=1e-12, equal_nan=True)
    comp = runs[2]
    # Each member alone (the lockstep path: the public solvers, one member per chunk).
    for i in range(6):
        solo = sweep(SWEEP_A[i], SWEEP_V[i], 1.0, seeds[i], strategy="lockstep", **kw)
        assert solo.regime[0] == comp.regime[i], i
        assert solo.result[0] == comp.result[i], i
        assert solo.num_steps[0] == comp.num_steps[i], i
        np.testing.assert_allclose(comp.R2[i], solo.R2[0], rtol=0, atol=1e-12, equal_nan=True)
        np.testing.assert_allclose(comp.order[i], solo.order[0], rtol=0, atol=1e-12, equal_nan=True)
        for k in ("final_order", "final_gap", "num_clusters"):
            np.testing.assert_allclose(
                comp.evidence[k][i], solo.evidence[k][0], rtol=0, atol=1e-12, equal_nan=True
            )


def test_ott_antonsen_pool_at_its_defaults_equals_lockstep():
    import jax

    from jaxattn.dynamics import _sweep as sw
    from jaxattn.dynamics._sweep import sweep

    kw = dict(SWEEP_KW, method="ott_antonsen", progress=False)
    # Lockstep by default (the pool compiles longer than it saves on small batches).
    lock = sweep(SWEEP_A, SWEEP_V, 1.0, np.arange(6), **kw)
    assert lock.plan["strategy"] == "lockstep"
    pool = sweep(SWEEP_A, SWEEP_V, 1.0, np.arange(6), strategy="compact", **kw)
    if jax.default_backend() == "cpu":
        # A pool of 32 slots (here all six members) stepped 128 steps a segment.
        assert sw.CPU_SLOTS["ott_antonsen"] == 32 and sw.CPU_SEGMENT_STEPS["ott_antonsen"] == 128
        assert pool.plan["slots_per_device"] == [6] and pool.plan["segment_steps"] == [128]
    for k in ("regime", "result", "num_steps", "failed"):
        np.testing.assert_array_equal(getattr(pool, k), getattr(lock, k), err_msg=k)
    np.testing.assert_allclose(pool.R2, lock.R2, rtol=0, atol=1e-12, equal_nan=True)
    assert pool.failed[3] and pool.failed[4] and pool.num_steps[3] == 256


@pytest.mark.parametrize("d", [2, 3])
def test_whole_particle_saves_equal_the_two_save_grids(getkey, d, monkeypatch):
    # A one-slot particle member saves its whole state at every save time and takes the
    # moment series and late tokens from it after the solve; with the buffer limit at 0 it
    # saves them on two grids in the loop instead. Same steps, regimes and evidence, R₂
    # to rounding.
    from jaxattn.dynamics import _sweep as sw
    from jaxattn.dynamics._sweep import sweep

    A = jax.random.normal(getkey(), (4, d, d))
    V = jax.random.normal(getkey(), (4, d, d))
    kw = dict(SWEEP_KW, method="particles", progress=False, strategy="compact", slots=1)
    whole = sweep(A, V, 1.0, np.arange(4), **kw)
    monkeypatch.setattr(sw, "WHOLE_SAVE_BYTES", 0)
    grids = sweep(A, V, 1.0, np.arange(4), **kw)
    for k in ("regime", "result", "num_steps"):
        np.testing.assert_array_equal(getattr(whole, k), getattr(grids, k), err_msg=k)
    np.testing.assert_allclose(whole.R2, grids.R2, rtol=0, atol=1e-13, equal_nan=True)
    np.testing.assert_allclose(whole.order, grids.order, rtol=0, atol=1e-13)
    for k, v in whole.evidence.items():
        np.testing.assert_allclose(v, grids.evidence[k], rtol=1e-12, atol=1e-13, err_msg=k)


def test_a_members_result_does_not_depend_on_the_members_beside_it():
    # Same program (chunk of six, two slots), members queued in another order: each one
    # shares the pool with other members, which start at other times. Bitwise the same
    # results: a member starting beside another one used to make it re-evaluate its
    # first Runge–Kutta stage at the projected state (diffrax decides that stage for the
    # whole batch), so a member's steps depended on its companions.
    from jaxattn.dynamics._sweep import sweep

    kw = dict(SWEEP_KW, method="particles", progress=False, strategy="compact", slots=2)
    seeds = np.arange(6)
    order = np.array([5, 2, 0, 4, 1, 3])
    ref = sweep(SWEEP_A, SWEEP_V, 1.0, seeds, segment_steps=8, **kw)
    mixed = sweep(SWEEP_A[order], SWEEP_V[order], 1.0, seeds[order], segment_steps=8, **kw)
    for k in ("num_steps", "regime", "result"):
        np.testing.assert_array_equal(getattr(mixed, k), getattr(ref, k)[order])
    np.testing.assert_array_equal(mixed.R2, ref.R2[order])


def test_compacted_sweep_resumes_from_out_dir(tmp_path):
    from jaxattn.dynamics._sweep import SweepResult, sweep

    kw = dict(SWEEP_KW, method="ott_antonsen", chunk_size=2, progress=False)
    compact = dict(kw, strategy="compact")
    seeds = np.arange(6)
    full = sweep(SWEEP_A, SWEEP_V, 1.0, seeds, **compact)
    assert full.plan["strategy"] == "compact"

    def interrupt(c, info):
        if c == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sweep(SWEEP_A, SWEEP_V, 1.0, seeds, out_dir=tmp_path, on_chunk=interrupt, **compact)
    part = SweepResult.load(tmp_path)
    assert part.completed.sum() == 4
    seen = []
    res = sweep(
        SWEEP_A,
        SWEEP_V,
        1.0,
        seeds,
        out_dir=tmp_path,
        on_chunk=lambda c, info: seen.append(info["computed"]),
        **compact,
    )
    assert seen == [False, False, True]
    for k in ("regime", "R2", "result", "num_steps"):
        np.testing.assert_array_equal(getattr(res, k), getattr(full, k))
    again = SweepResult.load(tmp_path)
    np.testing.assert_array_equal(again.regime, full.regime)
    # A lockstep sweep of the same members is another sweep for the folder.
    with pytest.raises(ValueError, match="different sweep.*strategy 'compact' -> 'lockstep'"):
        sweep(SWEEP_A, SWEEP_V, 1.0, seeds, out_dir=tmp_path, strategy="lockstep", **kw)
