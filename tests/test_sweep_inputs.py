"""Bad input to `sweep` fails early, with a `ValueError` that names the problem, before
anything is compiled or solved: a user's flow checked on member 0 as `simulate` checks it,
`score_shift`, β, the host memory of huge batches; chunks on disk carry their lockstep
efficiency and a SHA-256; the float64 → float32 narrowing warning of the keyword form.

Tiny Ott–Antonsen members (one compiled chunk shape, reused by every test that solves)."""

import gc
import hashlib
import json
import shutil
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxattn.dynamics import AttentionDynamics
from jaxattn.dynamics import _sweep as sw
from jaxattn.dynamics._solve import RESULTS
from jaxattn.dynamics._sweep import Integration, Judge, Members, Runner, SweepResult, sweep
from jaxattn.sphere import project_tangent

I2 = np.eye(2)
I3 = np.eye(3)
J2 = np.array([[0.0, -1.0], [1.0, 0.0]])
# Four OA members in two chunks of 2: every solving test below reuses this one chunk shape.
A4 = np.stack([I2, 2 * I2, I2, -I2 + 0.2 * J2])
V4 = np.stack([I2, I2 + J2, np.array([[0.3, 1.0], [-1.0, -0.3]]), I2])
OA = dict(method="ott_antonsen", chunk_size=2, t1=5.0, num_save=21, progress=False)
INTEG = Integration(t1=1.0, num_save=21)
RUNNER = Runner(progress=False)


# ------------------------------------------------------------------ a user's flows


class Rotation(eqx.Module):
    """Tangent: dx/dt = P⊥_x(W x)."""

    W: jax.Array

    def __call__(self, t, x, args=None):
        return project_tangent(x, x @ self.W.T)


class Radial(eqx.Module):
    """Not tangent: dx/dt = W x (W = I points straight off the sphere)."""

    W: jax.Array

    def __call__(self, t, x, args=None):
        return x @ self.W.T


class WrongShape(eqx.Module):
    W: jax.Array

    def __call__(self, t, x, args=None):
        return (x @ self.W.T)[:, 0]


class Untraceable(eqx.Module):
    W: jax.Array

    def __call__(self, t, x, args=None):
        if float(x[0, 0]) > 0:  # Python control flow on a value
            return project_tangent(x, x @ self.W.T)
        return jnp.zeros_like(x)


def batch(cls, W, size=3):
    return eqx.filter_vmap(cls)(jnp.stack([jnp.asarray(W)] * size))


@pytest.mark.parametrize(
    "flow, d, message",
    [
        (
            batch(Radial, I3),
            3,
            r"member 0 \(of 3; n = 4 tokens, d = 3\): the flow Radial leaves "
            r"the tangent space of the sphere",
        ),
        (
            batch(WrongShape, I3),
            3,
            r"member 0 \(of 3; n = 4 tokens, d = 3\): the flow WrongShape "
            r"must return dx/dt of the tokens' shape \(4, 3\)",
        ),
        (
            batch(Untraceable, I3),
            3,
            r"member 0 \(of 3; n = 4 tokens, d = 3\): the flow "
            r"Untraceable cannot be traced by JAX",
        ),
        # Members(d=2) for a flow of 3-d tokens: named as such, not a raw dot_general error.
        (
            batch(Rotation, I3),
            2,
            r"member 0 \(of 3; n = 4 tokens, d = 2\): the flow Rotation "
            r"cannot be traced.*Is d = 2 the flow's token dimension \(Members\(d=...\)\)\?",
        ),
    ],
    ids=["not_tangent", "wrong_shape", "untraceable", "members_d"],
)
def test_users_flow_is_checked_on_member_0_before_compiling(flow, d, message):
    before = sw.num_traces()
    with pytest.raises(ValueError, match=message):
        sweep(Members(flow, seeds=[0, 1, 2], n=4, d=d), integration=INTEG, runner=RUNNER)
    assert sw.num_traces() == before  # nothing was compiled


def test_members_name_a_single_flow_and_a_wrong_d():
    # One unbatched flow with 4 seeds: W's leading axis (3) is not a batch of 3 flows.
    with pytest.raises(
        ValueError,
        match=r"4 seeds for a batch of 3 flows \(batched=True reads the leading axis of the "
        r"flow's array leaves, shapes \[\(3, 3\)\].*pass batched=False",
    ):
        Members(Rotation(jnp.eye(3)), seeds=[0, 1, 2, 3], n=4, d=3)
    with pytest.raises(ValueError, match=r"d=3 does not match the flow's token dimension 2"):
        sw.attention_members(I2, I2, 1.0, 0, n=4, d=3)
    # A good flow passes, and a member whose velocity is NaN is left to its own status
    # (the sweep's policy for bad input), not refused for the batch.
    cfg = sw._Config(
        method="particles",
        n=4,
        d=3,
        t1=1.0,
        num_save=21,
        natural=True,
        r0=0.1,
        init="wrapped_cauchy",
        rtol=1e-7,
        atol=1e-9,
        max_steps=100,
        window=0.5,
        cluster_tol=1e-3,
        gap_floor=None,
        rest_tol=None,
    )
    good = Members(Rotation(jnp.eye(3)), seeds=[0, 1, 2, 3], n=4, d=3, batched=False)
    sw._check_first_member(good, good.flow, cfg, np.float64)
    nan_first = batch(Rotation, I3).W.at[0, 0, 0].set(jnp.nan)
    members = Members(Rotation(nan_first), seeds=[0, 1, 2], n=4, d=3)
    sw._check_first_member(members, members.flow, cfg, np.float64)


# ------------------------------------------------------------- score_shift, dt0, β


@pytest.mark.parametrize("shift", [float("nan"), float("inf"), -float("inf")])
def test_nonfinite_score_shift_is_named(shift):
    with pytest.raises(ValueError, match=r"score_shift must be a finite number or 'auto', got"):
        sweep(
            I2,
            I2,
            1.0,
            [0, 1],
            kernel="usa",
            score_shift=shift,
            n=4,
            t1=1.0,
            num_save=21,
            progress=False,
        )
    # A batch of AttentionDynamics built by hand: refused when every member has it.
    flows = eqx.filter_vmap(
        lambda s: AttentionDynamics(jnp.eye(2), jnp.eye(2), kernel="usa", score_shift=s)
    )(jnp.full(2, shift))
    with pytest.raises(ValueError, match=r"score_shift must be finite; it is .* for all 2 members"):
        sweep(Members(flows, seeds=[0, 1], n=4), integration=INTEG, runner=RUNNER)


def test_there_is_no_dt0_option():
    # The sweep path has no dt0 (the PID controller picks the first step): it is refused by
    # name, not passed on.
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['dt0'\]"):
        sweep(I2, I2, 1.0, 0, dt0=0.0, progress=False)
    with pytest.raises(TypeError, match="dt0"):
        Integration(dt0=0.1)


def test_keyword_options_beside_a_part_object_are_refused_not_dropped():
    # t1 beside integration=..., window beside judge=..., out_dir beside runner=... used to
    # be dropped without a word (a sweep "resumable" from out_dir wrote nothing).
    for part, obj, opt in (
        ("integration", Integration(10.0, 41), dict(t1=50.0)),
        ("judge", Judge(), dict(window=0.3)),
        ("runner", Runner(progress=False), dict(out_dir="/nonexistent/x")),
        ("integration", Integration(10.0, 41), dict(dtype=np.dtype("float32"))),  # falsy
    ):
        with pytest.raises(ValueError, match=rf"{part}= is given, so the option\(s\) \['"):
            sweep(I2, I2, 1.0, 0, n=4, **{part: obj}, **opt)
    for bad in ("big", 2.7, True):
        with pytest.raises(ValueError, match="chunk_size must be an integer >= 1"):
            Runner(chunk_size=bad)


@pytest.mark.parametrize(
    "beta, message",
    [
        (-1.0, r"beta is an inverse temperature and must be > 0; beta = -1 for all 4 members"),
        (0.0, r"beta = 0 for all 4 members"),
        ([0.0, -1.0, -2.0, -0.5], r"beta <= 0 for all 4 members \(from -2 to 0\)"),
        (float("nan"), r"must be a finite number > 0; beta = nan for all 4 members"),
        (float("inf"), r"must be a finite number > 0; beta = inf for all 4 members"),
        ([np.nan, -1.0, np.inf, 0.0], r"not finite or <= 0 for all 4 members \(2 not finite\)"),
    ],
    ids=["negative", "zero", "per_member", "nan", "inf", "mixed"],
)
def test_beta_that_fails_every_member_is_refused_up_front(beta, message):
    before = sw.num_traces()
    with pytest.raises(ValueError, match=message):
        sweep(A4, V4, beta, [0, 1, 2, 3], **OA)
    assert sw.num_traces() == before


def test_beta_that_fails_some_members_still_runs():
    res = sweep(A4, V4, [1.0, -1.0, 1.0, 0.0], [0, 1, 2, 3], **OA)
    assert res.failed.tolist() == [False, True, False, True]
    assert np.all(res.result[[1, 3]] == RESULTS.nonpositive_beta._value)
    assert np.all(np.isfinite(res.R2[[0, 2]]))
    res = sweep(A4, V4, [1.0, np.nan, 1.0, np.inf], [0, 1, 2, 3], **OA)
    assert res.failed.tolist() == [False, True, False, True]
    assert np.all(res.result[[1, 3]] == RESULTS.nonfinite_argument._value)
    assert np.all(np.isfinite(res.R2[[0, 2]]))


# ------------------------------------------------------------------ host memory


def test_huge_batch_is_refused_before_it_is_built(monkeypatch):
    monkeypatch.setattr(sw, "_host_memory_available", lambda: 8 * 2**30)
    # 10⁸ members of a cartesian grid: refused before the index grids (3 GB) exist.
    with pytest.raises(
        ValueError,
        match=r"sweep: 100000000 members need about [0-9.e+]+ GiB of host memory \(their "
        r"broadcast parameters and results\), more than the 8 GiB available",
    ):
        sweep(I2, I2, np.linspace(0.1, 1.0, 1000), np.arange(100_000), batching="cartesian", **OA)
    # The composable form: the results of 1000 members against 1 MB.
    monkeypatch.setattr(sw, "_host_memory_available", lambda: 2**20)
    members = Members(
        AttentionDynamics(I2, I2), seeds=np.arange(1000), n=4, method="ott_antonsen", batched=False
    )
    need = 1000 * sw._results_memory(21, np.float64)
    with pytest.raises(
        ValueError,
        match=rf"sweep: 1000 members need about {need / 2**30:.3g} GiB of host memory \(their "
        r"results\), more than the 0.000977 GiB available",
    ):
        sweep(members, integration=INTEG, runner=RUNNER)


# ------------------------------------------------------ chunks on disk: efficiency, hash


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep")
    res = sweep(A4, V4, 1.0, [0, 1, 2, 3], out_dir=out, **OA)
    assert res.chunks_computed == 2
    return out, res


def _copy_of(out, folder):
    """A copy of the written sweep's folder, to damage."""
    shutil.copytree(out, folder)
    return folder


def _alter_chunk(path, **change):
    """Rewrite the chunk archive at `path` as a valid `.npz` with `change[k](array)` for
    the named arrays (the values altered, the archive itself sound)."""
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    for k, f in change.items():
        arrays[k] = f(arrays[k])
    np.savez(path, **arrays)


def test_a_loaded_sweep_reports_the_efficiency_of_its_run(written, tmp_path):
    out, clean = written
    eff = clean.lockstep_efficiency
    assert 0 < eff <= 1
    # By hand: Σ steps / Σ (chunk size × the chunk's largest step count).
    steps = clean.num_steps[np.asarray([0, 1, 2, 3])]
    perm = np.load(out / "members.npz")["perm"]
    by_chunk = steps[perm].reshape(2, 2)
    assert eff == pytest.approx(by_chunk.sum() / (2 * by_chunk.max(1)).sum(), rel=1e-15)
    before = sw.num_traces()
    resumed = sweep(A4, V4, 1.0, [0, 1, 2, 3], out_dir=out, **OA)
    assert resumed.chunks_loaded == 2 and resumed.chunks_computed == 0
    assert resumed.lockstep_efficiency == eff
    assert SweepResult.load(out).lockstep_efficiency == eff
    assert sw.num_traces() == before
    # Chunk summaries written before the step counts were recorded: unknown (NaN).
    old = tmp_path / "old"
    shutil.copytree(out, old)
    for c in (0, 1):
        info = json.loads((old / f"chunk_0000{c}.json").read_text())
        for key in ("useful_steps", "spent_steps", "npz_sha256", "summary_sha256"):
            info.pop(key)
        (old / f"chunk_0000{c}.json").write_text(json.dumps(info))
    man = json.loads((old / "manifest.json").read_text())
    for key in ("summary_sha256", "members_sha256"):  # an old folder hashes nothing
        man.pop(key)
    (old / "manifest.json").write_text(json.dumps(man))
    assert np.isnan(SweepResult.load(old).lockstep_efficiency)


def test_a_loaded_compacted_sweep_reports_its_efficiency(tmp_path):
    # Compaction: Σ steps / (slots × the pool's loop iterations), as the run recorded it.
    kw = dict(OA, strategy="compact", segment_steps=8)
    res = sweep(A4, V4, 1.0, [0, 1, 2, 3], out_dir=tmp_path, **kw)
    assert res.chunks_computed == 2 and 0 < res.lockstep_efficiency <= 1
    spent = sum(
        json.loads((tmp_path / f"chunk_0000{c}.json").read_text())["spent_steps"] for c in (0, 1)
    )
    assert res.lockstep_efficiency == pytest.approx(res.num_steps.sum() / spent, rel=1e-15)
    assert SweepResult.load(tmp_path).lockstep_efficiency == res.lockstep_efficiency
    resumed = sweep(A4, V4, 1.0, [0, 1, 2, 3], out_dir=tmp_path, **kw)
    assert resumed.chunks_loaded == 2 and resumed.lockstep_efficiency == res.lockstep_efficiency


def test_an_altered_chunk_is_refused_by_load_and_recomputed_on_resume(written, tmp_path):
    out, clean = written
    folder = _copy_of(out, tmp_path / "altered")
    path = folder / "chunk_00001.npz"
    info = json.loads((folder / "chunk_00001.json").read_text())
    with open(path, "rb") as f:
        assert info["npz_sha256"] == hashlib.sha256(f.read()).hexdigest()
    # A valid archive with altered values (its zip CRCs are right).
    _alter_chunk(path, R2=lambda v: v * 0.5, regime=lambda v: v * 0 + 3)
    with pytest.raises(
        ValueError,
        match=r"SweepResult.load: .*chunk_00001.npz is refused: its SHA-256 differs from the "
        r"one recorded in .*chunk_00001.json: it was altered after it was written",
    ):
        SweepResult.load(folder)
    before = sw.num_traces()
    with pytest.warns(UserWarning, match=r"sweep: recomputing .*chunk_00001.npz: its SHA-256"):
        again = sweep(A4, V4, 1.0, [0, 1, 2, 3], out_dir=folder, **OA)
    assert sw.num_traces() == before  # the chunk shape compiled once, reused
    assert again.chunks_loaded == 1 and again.chunks_computed == 1
    for k in ("regime", "R2", "result", "num_steps", "order"):
        np.testing.assert_array_equal(getattr(again, k), getattr(clean, k))
    reloaded = SweepResult.load(folder)
    np.testing.assert_array_equal(reloaded.R2, clean.R2)
    np.testing.assert_array_equal(reloaded.regime, clean.regime)


def test_a_damaged_chunk_leaves_no_open_file(written, tmp_path):
    out, _ = written
    folder = _copy_of(out, tmp_path / "damaged")
    path = folder / "chunk_00000.npz"
    path.write_bytes(path.read_bytes()[:100])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = SweepResult.load(folder)
        gc.collect()
    messages = [str(w.message) for w in caught]
    assert any("skipping" in m and "chunk_00000.npz: it cannot be read" in m for m in messages)
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)], messages
    assert (~res.completed).sum() == 2
    # A garbage chunk is named for what it is, not as NumPy's "pickled data".
    path.write_bytes(b"garbage")
    with pytest.warns(UserWarning, match=r"chunk_00000.npz: it cannot be read .*not a NumPy"):
        SweepResult.load(folder)
    # A chunk removed while its summary stays: its members not run, and said so.
    path.unlink()
    with pytest.warns(UserWarning, match=r"chunk_00000.npz is missing beside its summary"):
        res = SweepResult.load(folder)
    assert (~res.completed).sum() == 2 and res.completed.sum() == 2


def test_an_emptied_chunk_or_a_nulled_hash_is_named(written, tmp_path):
    out, clean = written
    folder = _copy_of(out, tmp_path / "nulled")
    # A summary whose recorded hash was set to null is not one written before hashes
    # were recorded: it is refused, not read unchecked.
    summary = folder / "chunk_00001.json"
    info = json.loads(summary.read_text())
    summary.write_text(json.dumps({**info, "npz_sha256": None}))
    with pytest.raises(
        ValueError,
        match=r"chunk_00001.npz is refused: .*chunk_00001.json records npz_sha256 = None, "
        r"not a SHA-256",
    ):
        SweepResult.load(folder)
    # An empty archive in a chunk's place: the missing array is named.
    (folder / "chunk_00000.npz").write_bytes((out / "chunk_00000.npz").read_bytes())
    summary.write_text(json.dumps(info))
    np.savez(folder / "chunk_00000.npz")
    with pytest.warns(
        UserWarning,
        match=r"skipping .*chunk_00000.npz: it cannot be read \(MissingArray: the archive "
        r"holds no array 'fingerprint'\)",
    ) as caught:
        res = SweepResult.load(folder)
    assert res.completed.sum() == 2
    with pytest.warns(UserWarning, match=r"recomputing .*chunk_00000.npz: .*no array") as rerun:
        again = sweep(A4, V4, 1.0, [0, 1, 2, 3], out_dir=folder, **OA)
    # Both warnings point at the caller's line, not into the package.
    for w in [*caught, *rerun]:
        if "chunk_00000" in str(w.message):
            assert w.filename == __file__
    assert again.chunks_loaded == 1 and again.chunks_computed == 1
    np.testing.assert_array_equal(again.R2, clean.R2)


def test_a_strategy_change_is_refused_before_the_pilot(written, tmp_path, monkeypatch):
    out, res = written
    folder = _copy_of(out, tmp_path / "strategy")
    # Whichever strategy wrote the folder (Ott–Antonsen members run lockstep by default).
    old = res.plan["strategy"]
    new = {"compact": "lockstep", "lockstep": "compact"}[old]

    def no_pilot(*args, **kwargs):
        raise AssertionError("the pilot ran before the manifest was checked")

    monkeypatch.setattr(sw, "_predicted_cost", no_pilot)
    with pytest.raises(
        ValueError,
        match=rf"holds a different sweep \(strategy '{old}' -> '{new}'\)",
    ):
        sweep(A4, V4, 1.0, [0, 1, 2, 3], out_dir=folder, strategy=new, group="pilot", **OA)


# ------------------------------------------------------- float64 inputs, 64-bit floats off


def test_keyword_form_warns_when_float64_inputs_narrow(monkeypatch):
    # Stop at the solve: what is checked is what `sweep` builds from the inputs.
    monkeypatch.setattr(sw, "_run", lambda members, *parts: members)
    A = np.eye(2) + 1e-9  # 1e-9 and 1 + 1e-9 are not float32s; V = I is exact
    with jax.enable_x64(False):
        with pytest.warns(UserWarning) as caught:
            members = sweep(A, I2, 1.0, 0, n=4, progress=False)
        assert members.flow.A.dtype == np.float32
        (w,) = [w for w in caught if "cast to" in str(w.message)]
        assert str(w.message).startswith(
            "sweep: the members' A (4 of 4) entries changed when cast to float32, JAX's "
            "default float (64-bit floats are disabled)."
        )
        assert "pass dtype=..." in str(w.message) and w.filename == __file__
        # A dtype asked for is cast silently.
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            sweep(A, I2, 1.0, 0, n=4, dtype=np.float32, progress=False)
        # The same check behind AttentionDynamics' own warning.
        with pytest.warns(
            UserWarning,
            match=r"AttentionDynamics: A was given as float64 and "
            r"cast to float32 .*: 4 of 4 entries changed",
        ) as caught:
            AttentionDynamics(A, I2)
        # Attributed to this line, not to equinox's module machinery that runs __init__.
        assert [w.filename for w in caught] == [__file__]


def test_compaction_efficiency_counts_the_loop_iterations_the_pool_ran():
    # A pool runs, per segment, as many solver-loop iterations as its busiest slot takes
    # (the others are masked): with every member in one pool and one segment that is the
    # lockstep count B × max steps; with one slot nothing is ever masked.
    kw = dict(method="ott_antonsen", t1=5.0, num_save=21, progress=False, strategy="compact")
    one_pool = sweep(A4, V4, 1.0, 0, slots=4, segment_steps=4096, **kw)
    steps = one_pool.num_steps.astype(float)
    assert one_pool.plan["segment_steps"] == [4096] and steps.max() > steps.min()
    assert one_pool.lockstep_efficiency == pytest.approx(steps.sum() / (4 * steps.max()), rel=1e-15)
    alone = sweep(A4, V4, 1.0, 0, slots=1, **kw)
    assert alone.plan["segment_steps"] == [alone.config["max_steps"]]  # runs whole
    assert alone.lockstep_efficiency == 1.0
    np.testing.assert_array_equal(alone.num_steps, one_pool.num_steps)
    np.testing.assert_array_equal(alone.regime, one_pool.regime)
    # A compacting sweep on one device keeps the input order (group "none"): no cost is
    # predicted, so no efficiency either (it read 1.0).
    assert alone.plan["group"] == "none" and alone.plan["predicted_efficiency"] is None
    # The Ott–Antonsen pilot of Ott–Antonsen members predicts their step counts exactly,
    # so the efficiency it predicts for lockstep chunks is the one they then run at.
    piloted = sweep(
        A4,
        V4,
        1.0,
        0,
        strategy="lockstep",
        group="pilot",
        chunk_size=2,
        **{k: v for k, v in kw.items() if k != "strategy"},
    )
    np.testing.assert_array_equal(piloted.num_steps, alone.num_steps)
    assert piloted.plan["predicted_efficiency"] == pytest.approx(
        piloted.lockstep_efficiency, rel=1e-12
    )
    assert piloted.lockstep_efficiency < 1.0


def test_a_chunk_without_its_summary_is_recomputed(written, tmp_path):
    # The summary holds the archive's SHA-256: without it an altered archive would pass.
    out, clean = written
    folder = _copy_of(out, tmp_path / "no_summary")
    _alter_chunk(folder / "chunk_00000.npz", R2=lambda v: v + 1.5)
    (folder / "chunk_00000.json").unlink()
    with pytest.warns(UserWarning, match=r"recomputing .*chunk_00000.npz: its summary .* missing"):
        again = sweep(A4, V4, 1.0, [0, 1, 2, 3], out_dir=folder, **OA)
    assert again.chunks_loaded == 1 and again.chunks_computed == 1
    np.testing.assert_array_equal(again.R2, clean.R2)


class _Scaled(eqx.Module):
    M: jax.Array  # shape (2,): does not fit tokens (n, 3)

    def __call__(self, t, x, args=None):
        return project_tangent(x, x @ self.M.T)


def test_a_flow_whose_arrays_do_not_fit_the_tokens_is_named():
    with pytest.raises(ValueError, match=r"_Scaled cannot be traced by JAX on tokens of shape"):
        sweep(
            Members(_Scaled(jnp.ones(2)), n=8, d=3, batched=False),
            integration=Integration(5.0, num_save=21),
            runner=Runner(progress=False),
        )


def test_a_sweep_whose_every_member_fails_warns_why():
    A = np.where(np.eye(2, dtype=bool), np.nan, A4)  # NaN on every member's diagonal
    with pytest.warns(UserWarning, match=r"every one of the 4 members failed \(nonfinite_argument"):
        res = sweep(A, V4, 1.0, 0, **OA)
    assert res.failed.all()


def test_a_sweep_whose_every_member_is_undetermined_names_the_horizon():
    # At t1 = 5 no member's late window shows a regime; at t1 = 100 the four members are
    # the four regimes clustering, rotating, oscillation, interior (REGIMES' order).
    A = A4.copy()
    A[0, 0, 0] = np.nan  # a failed member is not counted as undetermined
    with pytest.warns(
        UserWarning,
        match=r"every one of the 3 members that ran is undetermined at t1 = 5 natural time "
        r"units \(no regime is established over the late 50% of the run\)\. A longer "
        r"horizon",
    ) as caught:
        short = sweep(A, V4, 1.0, 0, **OA)
    assert [w.filename for w in caught if "undetermined" in str(w.message)] == [__file__]
    assert short.failed.tolist() == [True, False, False, False]
    assert (short.regime[1:] == sw.UNDETERMINED).all()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        long = sweep(A4, V4, 1.0, 0, **{**OA, "t1": 100.0, "num_save": 201})
    assert long.regime.tolist() == [0, 1, 2, 3]


def test_an_out_dir_that_is_a_file_is_named(tmp_path):
    path = tmp_path / "taken"
    path.write_text("not a folder")
    with pytest.raises(ValueError, match=r"out_dir=.*taken' is a file, not a folder"):
        sweep(A4, V4, 1.0, 0, out_dir=path, **OA)
    assert path.read_text() == "not a folder"


def test_a_reduced_method_names_a_users_flow_as_a_flow():
    class Mine(eqx.Module):
        def __call__(self, t, x, args=None):
            return jnp.zeros_like(x)

    with pytest.raises(
        ValueError, match=r"got d = 2, the flow Mine \(not AttentionDynamics\)\. Use method='part"
    ):
        Members(Mine(), n=8, d=2, method="ott_antonsen", batched=False)


def test_a_binary_manifest_is_named_in_one_short_line(tmp_path):
    (tmp_path / "manifest.json").write_bytes(bytes(range(128, 256)) * 8)
    with pytest.raises(ValueError, match=r"manifest.json is damaged .*not UTF-8 text") as e:
        SweepResult.load(tmp_path)
    assert len(str(e.value)) < 300


@pytest.mark.parametrize("n", ["16", "abc", b"16", 16.5, True])
def test_a_token_count_that_is_not_an_integer_is_refused_by_name(n):
    # A string was read as a number ("16" ran as 16 tokens; "abc" failed in float()).
    from jaxattn.dynamics import attention_members

    with pytest.raises(ValueError, match=r"n must be an integer number of tokens"):
        attention_members(np.eye(2)[None], np.eye(2)[None], 1.0, seeds=[0], n=n)


@pytest.mark.parametrize("value", ["4", b"4"])
def test_counts_given_as_strings_are_refused(value):
    with pytest.raises(ValueError, match="chunk_size must be an integer >= 1"):
        sw.Runner(chunk_size=value)


def test_one_token_is_warned_and_undetermined():
    # As `classify_regime` warns for n = 1: one token is no cluster, its gap is zero.
    with pytest.warns(UserWarning, match=r"sweep: n = 1 token is a degenerate configuration") as w:
        res = sweep(A4[:2], V4[:2], 1.0, 0, n=1, t1=2.0, num_save=21, progress=False)
    assert list(res.regime_names) == ["undetermined"] * 2
    # Said once: the horizon is no cause here (no all-undetermined warning besides).
    assert len(w) == 1 and w[0].filename == __file__
    assert res.completed.all() and not res.failed.any()


def test_segments_divide_max_steps_and_short_ones_are_warned():
    # The longest segment of at most the asked length that divides max_steps.
    assert [sw.segment_length(k, m) for k, m in ((32, 16384), (128, 100), (32, 100))] == [
        32,
        100,
        25,
    ]
    assert sw.segment_length(32, 4099) == 1 and sw.segment_length(128, 96) == 96
    # A pool of several slots at its default segment length and a prime max_steps: said.
    kw = dict(method="ott_antonsen", strategy="compact", t1=2.0, num_save=21, progress=False)
    on_cpu = jax.default_backend() == "cpu"
    K = sw.CPU_SEGMENT_STEPS["ott_antonsen"] if on_cpu else sw.SEGMENT_STEPS
    match = rf"max_steps=4099 has no divisor near the pool's segment length {K}; segments of 1 "
    with pytest.warns(UserWarning, match=match):
        res = sweep(A4, V4, 1.0, 0, max_steps=4099, **kw)
    assert res.plan["segment_steps"] == [1] and res.completed.all()
    # One segment holding the whole solve is no slow pool: nothing to say (t1 = 2 leaves
    # every member undetermined, which is said, and is not what this checks).
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message="sweep: every one of .* undetermined")
        whole = sweep(A4, V4, 1.0, 0, max_steps=K // 2 - 1, **kw)
    assert whole.plan["segment_steps"] == [K // 2 - 1]


def test_the_parts_name_themselves_and_judge_refuses_a_window_past_one():
    """Integration, Judge, Runner and Members are built by users directly: their errors name
    the part (they said "sweep:"). A window above 1 was accepted by Judge and refused only
    when a sweep started."""
    with pytest.raises(ValueError, match="Integration: t1 must be a finite positive"):
        Integration(-1.0)
    with pytest.raises(ValueError, match=r"Judge: window must be in \(0, 1\].* got 2.0"):
        Judge(window=2.0)
    assert Judge(window=1.0).window == 1.0
    with pytest.raises(ValueError, match="Runner: chunk_size must be an integer >= 1"):
        Runner(chunk_size=0)
    flow = AttentionDynamics(jnp.eye(2), jnp.eye(2))
    with pytest.raises(ValueError, match="Members: method must be one of"):
        Members(flow, method="nope", batched=False)


def test_bfloat16_flows_are_cast_and_hashed_like_float16():
    """A bfloat16 flow stayed bfloat16 in the sweep (NumPy does not call bfloat16 floating)
    and failed in the initial law, and its fingerprint failed ("cannot include dtype 'E' in
    a buffer"); the keyword form called bfloat16 A "not a real matrix". Now it is cast to
    the sweep's dtype like float16, and hashed by its bytes (float64 digests unchanged)."""
    import hashlib

    A = jnp.array([[1.0, 0.2], [0.1, 0.5]], jnp.bfloat16)
    flow = AttentionDynamics(A, A.T)
    cast = sw._cast_flow(flow, np.float64)
    assert cast.A.dtype == np.float64
    np.testing.assert_array_equal(cast.A, np.asarray(A.astype(jnp.float64)))
    assert sw._as_stack(A, "A").shape == (1, 2, 2)
    h = hashlib.sha256()
    sw._hash_array(h, np.asarray(A))
    assert h.hexdigest() == hashlib.sha256(np.asarray(A).view(np.uint16).tobytes()).hexdigest()
    x = np.arange(12.0).reshape(3, 4)
    h = hashlib.sha256()
    sw._hash_array(h, x[:, ::2])  # not contiguous: hashed by blocks of rows
    assert h.hexdigest() == hashlib.sha256(np.ascontiguousarray(x[:, ::2]).tobytes()).hexdigest()
