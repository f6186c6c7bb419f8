"""The open regime instrument: composable sweeps of any flow, regime maps of any family with
basin fractions, reloading a sweep or a map from its folder, the rotating family against
its closed form, and frame independence of the Ott–Antonsen regimes."""

import json
import os
import shutil

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxattn._json import with_summary_sha256
from jaxattn.dynamics import (
    FAILED,
    NOT_RUN,
    REGIME_NAMES,
    Integration,
    Judge,
    Members,
    RegimeMap,
    Runner,
    SweepResult,
    classify_order_parameter,
    classify_tokens,
    regime_map,
    simulate,
    solve_ott_antonsen,
    sweep,
)
from jaxattn.dynamics import _sweep as sw
from jaxattn.sphere import project_tangent

I2 = np.eye(2)
J2 = np.array([[0.0, -1.0], [1.0, 0.0]])
CODE = {name: i for i, name in enumerate(REGIME_NAMES)}


class LinearDrift(eqx.Module):
    """A user's own flow: every token follows dx/dt = P⊥_x(M x) (no interaction)."""

    M: jax.Array

    def __call__(self, t, x, args=None):
        return project_tangent(x, x @ self.M.T)


def test_a_users_flow_runs_through_sweep_and_compiles_once():
    # Symmetric M with a simple top eigenvalue: every token goes to ±(top eigenvector),
    # i.e. one antipodal pair of clusters at rest.
    Ms = jnp.stack([jnp.diag(jnp.array([1.0, 0.2 * k, -0.5])) for k in range(4)])
    members = Members(eqx.filter_vmap(LinearDrift)(Ms), seeds=np.arange(4), n=12, d=3)
    integ = Integration(40.0, 81, rtol=1e-10, atol=1e-12)
    runner = Runner(chunk_size=2, progress=False)
    before = sw.num_traces()
    res = sweep(members, integration=integ, runner=runner)
    assert sw.num_traces() - before == 1  # two chunks, one compilation
    assert list(res.regime_names) == ["clustering"] * 4
    np.testing.assert_array_equal(res.evidence["antipodal_pairs"], 1)
    assert sorted(res.params) == ["M"] and res.params["M"].shape == (4, 3, 3)
    # Member 1 equals its hand-made run (physical time: the flow has no natural rate).
    from jaxattn.sphere import sample_uniform

    key = jax.random.key(np.uint32(1))
    _, k_tok = jax.random.split(key)
    x0 = sample_uniform(k_tok, 12, 3, dtype=jnp.float64)
    ts = jnp.linspace(0.0, 40.0, 81)
    tr = simulate(LinearDrift(Ms[1]), x0, t1=40.0, ts=ts, rtol=1e-10, atol=1e-12)
    regime, ev = classify_tokens(ts, tr.xs)
    assert res.regime[1] == int(regime._value)
    assert abs(float(ev.final_order) - res.evidence["final_order"][1]) < 1e-12
    # Same shapes again: no new trace.
    sweep(
        Members(eqx.filter_vmap(LinearDrift)(Ms + 0.01), seeds=np.arange(4), n=12, d=3),
        integration=integ,
        runner=runner,
    )
    assert sw.num_traces() - before == 1


def test_members_refuse_bad_input_by_name():
    with pytest.raises(ValueError, match="leading batch axis"):
        Members(LinearDrift(jnp.asarray(1.0)), seeds=[0, 1], d=3)
    with pytest.raises(ValueError, match="seeds for a batch"):
        Members(eqx.filter_vmap(LinearDrift)(jnp.stack([jnp.eye(3)] * 3)), seeds=[0, 1])
    with pytest.raises(ValueError, match="d = 2 LSA reduction"):
        Members(LinearDrift(jnp.eye(3)), batched=False, method="ott_antonsen", d=3)
    with pytest.raises(ValueError, match="eqx.Module"):
        Members(lambda t, x, a: x, batched=False, d=2)
    with pytest.raises(ValueError, match="pass settings through"):
        sweep(Members(LinearDrift(jnp.eye(3)), batched=False, d=3), n=5)
    with pytest.raises(ValueError, match="unknown option"):
        sweep(I2, I2, 1.0, 0, horizon=5.0)
    with pytest.raises(ValueError, match="lyapunov"):
        Judge(lyapunov=-1)


def test_rotating_family_closed_form_and_rotation_sign():
    # OA: d|R|²/dt = aβ (1 − |R|²)|R|² (logistic), d arg R/dt = (bβ/2)(|R|² + 3).
    a, b, beta = 0.7, 0.9, 1.3
    R0 = 0.2 * np.exp(0.4j)
    ts = jnp.linspace(0.0, 6.0, 61)
    sol = solve_ott_antonsen(
        I2, a * I2 + b * J2, R0, beta=beta, t1=6.0, ts=ts, rtol=1e-12, atol=1e-14
    )
    r2 = 1 / (1 + (1 / abs(R0) ** 2 - 1) * np.exp(-a * beta * np.asarray(ts)))
    np.testing.assert_allclose(np.abs(np.asarray(sol.R)) ** 2, r2, rtol=1e-9)
    phase = np.unwrap(np.angle(np.asarray(sol.R)))
    integral = np.concatenate([[0], np.cumsum(np.diff(np.asarray(ts)) * 0.5 * (r2[1:] + r2[:-1]))])
    expect = np.angle(R0) + 0.5 * b * beta * (integral + 3 * np.asarray(ts))
    np.testing.assert_allclose(phase, expect, atol=1e-4)  # trapezoid on a 0.1 grid
    # Particles: with b > 0 the clusters turn counter-clockwise, arg R₂ at 2bβ.
    res = sweep(
        I2,
        a * I2 + b * J2,
        beta,
        0,
        n=32,
        t1=40.0,
        num_save=161,
        rtol=1e-10,
        atol=1e-12,
        time_scale="physical",
        progress=False,
    )
    assert res.regime_names[0] == "rotating"
    drift = res.evidence["drift_rate"][0]
    assert drift > 0 and abs(drift - 2 * b * beta) < 1e-3 * 2 * b * beta
    neg = sweep(
        I2,
        a * I2 - b * J2,
        beta,
        0,
        n=32,
        t1=40.0,
        num_save=161,
        rtol=1e-10,
        atol=1e-12,
        time_scale="physical",
        progress=False,
    )
    assert neg.evidence["drift_rate"][0] < 0


def test_ott_antonsen_regimes_do_not_depend_on_the_frame():
    # A rigid rotation Q of (A, V) with R₂(0) turned by e^{2iα} is the same flow seen in a
    # rotated frame: the regime cannot change (saved states are clipped to the disc).
    rng = np.random.default_rng(3)
    A = rng.standard_normal((24, 2, 2))
    V = rng.standard_normal((24, 2, 2))
    A[:4], V[:4] = np.diag([2.0, 1.0]), I2 + J2  # rotating clusters on the circle
    R0 = 0.3 * np.exp(2j * np.pi * rng.random(24))
    alpha = 0.83
    Q = np.array([[np.cos(alpha), -np.sin(alpha)], [np.sin(alpha), np.cos(alpha)]])
    ts = jnp.linspace(0.0, 150.0, 301)

    @jax.vmap
    def regime(a, v, r0):
        sol = solve_ott_antonsen(a, v, r0, t1=150.0, ts=ts, throw=False)
        return classify_order_parameter(ts, sol.R)[0]._value, jnp.max(jnp.abs(sol.R))

    r1, m1 = regime(A, V, R0)
    r2, m2 = regime(Q @ A @ Q.T, Q @ V @ Q.T, R0 * np.exp(2j * alpha))
    assert np.all(np.asarray(m1) <= 1 + 1e-15) and np.all(np.asarray(m2) <= 1 + 1e-15)
    np.testing.assert_array_equal(np.asarray(r1), np.asarray(r2))
    assert np.all(np.asarray(r1[:4]) == CODE["rotating"])


@pytest.fixture(scope="module")
def rotating_map(tmp_path_factory):
    out = tmp_path_factory.mktemp("map")
    m = regime_map(
        "rotating",
        {"a": np.linspace(-1, 1, 6), "b": np.array([-0.5, 0.5, 1.0])},
        method="ott_antonsen",
        inits=3,
        t1=60.0,
        num_save=121,
        out_dir=out,
        progress=False,
    )
    return m, out


def test_regime_map_fractions_theory_and_reload(rotating_map):
    m, out = rotating_map
    assert m.cells == (6, 3) and m.regime.shape == (6, 3, 3)
    np.testing.assert_allclose(m.fractions.sum(-1) + m.failed_fraction, 1.0)
    # a > 0 rotates (b ≠ 0), a < 0 spreads out: the stated law, cell by cell.
    a = m.axes[0][1]
    assert np.all(m.predicted[a > 0] == CODE["rotating"])
    assert np.all(m.predicted[a < 0] == CODE["interior"])
    assert np.all(m.dominant[a > 0] == CODE["rotating"])
    assert np.all(m.dominant[a < -0.5] == CODE["interior"])
    assert not m.disagreements().any()
    # The stated boundary is the line a = 0.
    assert len(m.boundaries) == 1
    np.testing.assert_allclose(m.boundaries[0]["x"], 0.0, atol=0.02)
    # Reloaded from its folder alone: the map and its sweep.
    back = RegimeMap.load(out)
    for k in ("regime", "fractions", "dominant", "multistable", "predicted"):
        np.testing.assert_array_equal(getattr(back, k), getattr(m, k))
    assert back.axes[0][0] == "a" and back.fixed == {"beta": 1.0}
    again = SweepResult.load(os.path.join(out, "sweep"))
    np.testing.assert_array_equal(again.regime, m.sweep.regime)
    np.testing.assert_array_equal(again.R2, m.sweep.R2)
    assert again.completed.all()
    # Rerunning resumes from the folder: nothing recomputed, same map.
    m2 = regime_map(
        "rotating",
        {"a": np.linspace(-1, 1, 6), "b": np.array([-0.5, 0.5, 1.0])},
        method="ott_antonsen",
        inits=3,
        t1=60.0,
        num_save=121,
        out_dir=out,
        progress=False,
    )
    assert m2.sweep.chunks_computed == 0
    np.testing.assert_array_equal(m2.regime, m.regime)


def test_loading_refuses_damaged_or_foreign_folders(rotating_map, tmp_path):
    _, out = rotating_map
    with pytest.raises(ValueError, match="holds no regime map"):
        RegimeMap.load(tmp_path)
    with pytest.raises(ValueError, match="holds no sweep"):
        SweepResult.load(tmp_path)
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in ("regime_map.json", "regime_map.npz"):
        (bad / f).write_bytes((out / f).read_bytes())
    (bad / "regime_map.npz").write_bytes(b"not an npz")
    with pytest.raises(ValueError, match="regime_map.npz is damaged") as e:
        RegimeMap.load(bad)
    # Named for what it is, not as NumPy's "pickled data" (whose advice is to unpickle).
    assert "not a NumPy .npz archive" in str(e.value) and "pickle" not in str(e.value)
    # A cut archive is named damaged by what is wrong with it, before its hash is checked.
    (bad / "regime_map.npz").write_bytes((out / "regime_map.npz").read_bytes()[:100])
    with pytest.raises(ValueError, match="regime_map.npz is damaged") as e:
        RegimeMap.load(bad)
    assert "altered" not in str(e.value)
    # A valid archive edited after it was written: its SHA-256 is not the recorded one.
    with np.load(out / "regime_map.npz") as z:
        arrays = {k: z[k] for k in z.files}
    np.savez(bad / "regime_map.npz", **{**arrays, "axis_0": 100 * arrays["axis_0"]})
    with pytest.raises(ValueError, match="regime_map.npz is damaged .*altered after it was"):
        RegimeMap.load(bad)
    # Without a recorded hash (a map saved before hashes were), cut or edited arrays are
    # still refused: the per-cell summaries and failure flags must be those of the saved
    # regimes, on the saved grid.
    meta = json.loads((out / "regime_map.json").read_text())
    del meta["npz_sha256"], meta["summary_sha256"]
    (bad / "regime_map.json").write_text(json.dumps(meta))
    edits = {
        "fractions has shape": dict(fractions=arrays["fractions"][..., :1]),
        "regime has shape": dict(regime=arrays["regime"][:1]),
        "failed does not match": dict(failed=~arrays["failed"]),
        "dominant does not follow": dict(dominant=(arrays["dominant"] + 1) % 3),
        "fractions does not follow": dict(fractions=arrays["fractions"] + 0.25),
    }
    for message, edit in edits.items():
        np.savez(bad / "regime_map.npz", **{**arrays, **edit})
        with pytest.raises(ValueError, match=f"regime_map.npz is damaged .*{message}"):
            RegimeMap.load(bad)
    np.savez(bad / "regime_map.npz")  # an empty archive: the first missing array named
    with pytest.raises(ValueError, match="damaged .*MissingArray: .* no array 'axis_0'"):
        RegimeMap.load(bad)
    np.savez(bad / "regime_map.npz", **arrays)  # the saved arrays themselves load
    np.testing.assert_array_equal(RegimeMap.load(bad).fractions, arrays["fractions"])
    assert RegimeMap.load(out).regime.shape == arrays["regime"].shape  # hash checked, equal
    # A recorded hash set to null is an edit, not a map from before hashes were recorded.
    meta = json.loads((out / "regime_map.json").read_text())
    (bad / "regime_map.json").write_text(json.dumps({**meta, "npz_sha256": None}))
    with pytest.raises(ValueError, match="regime_map.json records npz_sha256 = None, not a"):
        RegimeMap.load(bad)
    meta["regime_names"] = ["clustering", "other"]
    (bad / "regime_map.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="damaged or foreign"):
        RegimeMap.load(bad)
    # Every setting is read before the map is built: an edited summary names itself.
    meta = json.loads((out / "regime_map.json").read_text())
    # Nothing is coerced: a value of the wrong type is refused by its field's name.
    edits = {
        "it has no 'boundaries'": {k: v for k, v in meta.items() if k != "boundaries"},
        "'boundaries' is a JSON null, not an array": {**meta, "boundaries": None},
        "boundaries\\[0\\] 'x' is not a list of finite numbers": {
            **meta,
            "boundaries": [{"label": "b", "x": ["a"], "y": None}],
        },
        "it has no 'family'": {k: v for k, v in meta.items() if k != "family"},
        "'family' is not a string: null": {**meta, "family": None},
        "'method' is 'nosuch', not one of": {**meta, "method": "nosuch"},
        "'fixed' is a JSON array, not an object": {**meta, "fixed": [["beta", 1.0]]},
        "'seconds' is not a finite number: \"x\"": {**meta, "seconds": "x"},
        "it has no 'inits'": {k: v for k, v in meta.items() if k != "inits"},
        "'inits' is not an integer: 2.7": {**meta, "inits": 2.7},
        "'inits' is not an integer: Infinity": {**meta, "inits": 1e999},
        "'inits' is 0, below 1": {**meta, "inits": 0},
        "'axes' is not a list of one or two names": {**meta, "axes": ["a", "b", "c"]},
        "it holds a JSON array, not an object": [meta],
        "64 lower-case hex": {**meta, "npz_sha256": meta["npz_sha256"].upper()},
    }
    for message, edited in edits.items():
        (bad / "regime_map.json").write_text(json.dumps(edited))
        with pytest.raises(
            ValueError, match=f"regime_map.json is damaged or foreign \\(.*{message}"
        ):
            RegimeMap.load(bad)
    (bad / "regime_map.json").write_text("[" * 100_000)
    with pytest.raises(ValueError, match="regime_map.json is damaged .*nested too deeply"):
        RegimeMap.load(bad)
    # A summary that hashes itself (this version's) without its archive's hash: refused.
    unhashed = {k: v for k, v in meta.items() if k not in ("summary_sha256", "npz_sha256")}
    (bad / "regime_map.json").write_text(json.dumps(with_summary_sha256(unhashed)))
    with pytest.raises(ValueError, match="regime_map.json is damaged .*records no npz_sha256"):
        RegimeMap.load(bad)
    # An edit of the right type: the summary's SHA-256 of its own contents differs.
    for edited in ({**meta, "seconds": 1.5}, {**meta, "fixed": {"beta": 2.0}}):
        (bad / "regime_map.json").write_text(json.dumps(edited, indent=2))
        with pytest.raises(ValueError, match="regime_map.json differ from the SHA-256 it rec"):
            RegimeMap.load(bad)
    # Without that hash (a map written before 2026-12-07), the archive is still the one
    # written (its SHA-256 is the recorded one), so a summary whose inits or axes do not fit
    # it is the file blamed.
    del meta["summary_sha256"]
    for edited in ({**meta, "inits": meta["inits"] + 1}, {**meta, "axes": ["a"]}):
        (bad / "regime_map.json").write_text(json.dumps(edited))
        with pytest.raises(
            ValueError, match="regime_map.json is damaged or foreign: it does not fit"
        ):
            RegimeMap.load(bad)
    # An old archive (no hashes) is checked for the kinds and ranges save writes.
    del meta["npz_sha256"]
    (bad / "regime_map.json").write_text(json.dumps(meta))
    edits = {
        "axis 'a' is not strictly increasing": dict(axis_0=arrays["axis_0"][::-1]),
        "arrays save never writes: \\['axis_2'\\]": dict(axis_2=arrays["axis_0"]),
        "regime is an array of float64": dict(regime=arrays["regime"].astype(float)),
        "regime holds codes outside": dict(regime=arrays["regime"] + 99),
        "axis 'a' is not a 1-D array of finite": dict(axis_0=np.full(6, np.nan)),
        "predicted holds codes outside": dict(predicted=arrays["predicted"] + 99),
    }
    for message, edit in edits.items():
        np.savez(bad / "regime_map.npz", **{**arrays, **edit})
        with pytest.raises(ValueError, match=f"regime_map.npz is damaged .*{message}"):
            RegimeMap.load(bad)


def test_a_map_whose_sweep_folder_is_unreadable_loads_without_it(rotating_map, tmp_path):
    _, out = rotating_map
    folder = tmp_path / "map"
    shutil.copytree(out, folder)
    (folder / "sweep" / "manifest.json").write_text("[")
    with pytest.warns(UserWarning, match=r"read without its sweep .*manifest.json is damaged") as w:
        back = RegimeMap.load(folder)
    assert [x.filename for x in w] == [__file__] and back.sweep is None
    np.testing.assert_array_equal(back.regime, RegimeMap.load(out).regime)


def test_a_sweep_manifest_is_read_field_by_field(rotating_map, tmp_path):
    """SweepResult.load refuses an edited manifest by the field's name (nothing coerced,
    no OverflowError or TypeError from inside), and RegimeMap.load keeps the map."""
    _, out = rotating_map
    folder = tmp_path / "map"
    shutil.copytree(out, folder)
    path = folder / "sweep" / "manifest.json"
    good = json.loads(path.read_text())
    B = good["num_members"]
    assert B == 6 * 3 * 3 and good["config"]["num_save"] == 121
    edits = {
        "'num_members' is not an integer: Infinity": dict(num_members=1e999),
        "'num_members' is not an integer: 18.5": dict(num_members=18.5),
        f"chunk_sizes add up to {B}, not num_members = 17": dict(num_members=17),
        "'shape' is not a list of sizes: None": dict(shape=None),
        "'shape' \\[7\\] does not hold num_members": dict(shape=[7]),
        "'fingerprint' is not a string: 5": dict(fingerprint=5),
        "config 'num_save' is not an integer: Infinity": dict(
            config={**good["config"], "num_save": 1e999}
        ),
        "config 'num_save' is -3, below 2": dict(config={**good["config"], "num_save": -3}),
        "config 't1' is not a finite number: null": dict(config={**good["config"], "t1": None}),
        # what near_boundary and decision_margins read later is checked on loading
        "config 'window' is not a finite number: \"zz\"": dict(
            config={**good["config"], "window": "zz"}
        ),
        "config 'd' is not an integer: 2.5": dict(config={**good["config"], "d": 2.5}),
        "config 'method' is 'euler'": dict(config={**good["config"], "method": "euler"}),
        "config 'rest_tol' is not a finite number: \"1\"": dict(
            config={**good["config"], "rest_tol": "1"}
        ),
        "its config has no 'd'": dict(config={k: v for k, v in good["config"].items() if k != "d"}),
    }
    manifests = {message: {**good, **edit} for message, edit in edits.items()}
    manifests["it has no 'config'"] = {k: v for k, v in good.items() if k != "config"}
    for message, man in manifests.items():
        path.write_text(json.dumps(man))
        with pytest.raises(ValueError, match=f"manifest.json is damaged \\(.*{message}"):
            SweepResult.load(folder / "sweep")
    # An edit of the right type: the manifest's SHA-256 of its own contents differs.
    path.write_text(json.dumps({**good, "config": {**good["config"], "t1": 400.0}}))
    with pytest.raises(ValueError, match="manifest.json differ from the SHA-256 it records"):
        SweepResult.load(folder / "sweep")
    # Without that hash (written before 2026-12-07), a num_save that is not the chunks'
    # makes every chunk unreadable, and the map is kept without its sweep.
    old = {k: v for k, v in good.items() if k not in ("summary_sha256", "members_sha256")}
    path.write_text(json.dumps({**old, "config": {**old["config"], "num_save": 61}}))
    with pytest.warns(UserWarning, match=r"'order' holds \(121,\) values per member, not \(61,"):
        with pytest.raises(ValueError, match="no readable finished chunk"):
            SweepResult.load(folder / "sweep")
    with pytest.warns(UserWarning) as w:
        back = RegimeMap.load(folder)
    assert [x.filename for x in w] == [__file__] * len(w) and back.sweep is None
    assert "read without its sweep" in str(w[-1].message)
    np.testing.assert_array_equal(back.regime, RegimeMap.load(out).regime)
    # The members file: its recorded SHA-256, and without one (old), its arrays' kinds.
    members = dict(np.load(out / "sweep" / "members.npz"))
    path.write_text(json.dumps(good))
    np.savez(folder / "sweep" / "members.npz", **{**members, "seeds": members["seeds"] + 1})
    with pytest.raises(ValueError, match="members.npz is missing or damaged .*altered after"):
        SweepResult.load(folder / "sweep")
    path.write_text(json.dumps(old))
    for message, edit in {
        "'perm' is not an order": dict(perm=np.zeros(B, int)),
        "'seeds' are float64, not integers": dict(seeds=members["seeds"] + 0.7),
        "parameter 'A' is <U1": dict(**{"param:A": np.full(members["param:A"].shape, "x")}),
        f"parameter 'V' has shape \\({B}, 1, 2\\), not \\({B}, ..., 2, 2\\)": dict(
            **{"param:V": members["param:V"][:, :1]}
        ),
    }.items():
        np.savez(folder / "sweep" / "members.npz", **{**members, **edit})
        with pytest.raises(ValueError, match=f"members.npz is missing or damaged .*{message}"):
            SweepResult.load(folder / "sweep")
    np.savez(folder / "sweep" / "members.npz", **members)
    assert SweepResult.load(folder / "sweep").completed.all()  # the old folder reads
    # A chunk summary edited (its own hash), or an old chunk of the wrong kinds: skipped
    # (this sweep's only chunk, so nothing is left to load).
    chunk = folder / "sweep" / "chunk_00000.npz"
    assert not (folder / "sweep" / "chunk_00001.npz").exists()
    info = json.loads(chunk.with_suffix(".json").read_text())
    chunk.with_suffix(".json").write_text(json.dumps({**info, "useful_steps": "123"}))
    with pytest.warns(UserWarning, match="skipping .*chunk_00000.json differ from the SHA-256"):
        with pytest.raises(ValueError, match="no readable finished chunk \\(1 damaged chunk"):
            SweepResult.load(folder / "sweep")
    arrays = dict(np.load(out / "sweep" / "chunk_00000.npz"))
    legacy = {k: v for k, v in info.items() if k not in ("summary_sha256", "npz_sha256")}
    chunk.with_suffix(".json").write_text(json.dumps(legacy))
    np.savez(chunk, **{**arrays, "rate": arrays["rate"].astype(str)})
    with pytest.warns(
        UserWarning, match="skipping .*chunk_00000.npz: its 'rate' is an array of <U"
    ):
        with pytest.raises(ValueError, match="no readable finished chunk"):
            SweepResult.load(folder / "sweep")
    # A sweep whose regimes are not the map's (an old chunk edited): the map is kept alone.
    np.savez(chunk, **{**arrays, "regime": (arrays["regime"] + 1) % 4})
    with pytest.warns(UserWarning, match="regimes of .*sweep differ from the map's"):
        assert RegimeMap.load(folder).sweep is None
    for message, edit in {
        "'failed' does not match": dict(failed=~arrays["failed"]),
        "'rate' holds values that are not positive": dict(rate=0 * arrays["rate"]),
    }.items():
        np.savez(chunk, **{**arrays, **edit})
        with pytest.warns(UserWarning, match=f"skipping .*chunk_00000.npz: its {message}"):
            with pytest.raises(ValueError, match="no readable finished chunk"):
                SweepResult.load(folder / "sweep")
    np.savez(chunk, **arrays)
    assert RegimeMap.load(folder).sweep is not None
    # Under a manifest that hashes itself (this version's), a chunk summary without its
    # hashes is an edit, not an old file; so is such a manifest without members_sha256.
    path.write_text(json.dumps(good))
    shutil.copy(out / "sweep" / "members.npz", folder / "sweep" / "members.npz")
    with pytest.warns(UserWarning, match="records no SHA-256, which every chunk of this sweep"):
        with pytest.raises(ValueError, match="no readable finished chunk"):
            SweepResult.load(folder / "sweep")
    unhashed = {k: v for k, v in good.items() if k not in ("summary_sha256", "members_sha256")}
    path.write_text(json.dumps(with_summary_sha256(unhashed)))
    with pytest.raises(ValueError, match="records no members_sha256, which every manifest"):
        SweepResult.load(folder / "sweep")
    # The map records its sweep's fingerprint: another sweep in its place is refused.
    shutil.rmtree(folder / "sweep")
    shutil.copytree(out / "sweep", folder / "sweep")
    other = {k: v for k, v in good.items() if k != "summary_sha256"}
    path.write_text(json.dumps(with_summary_sha256({**other, "fingerprint": "0" * 64})))
    with pytest.warns(UserWarning, match="sweep is not the sweep this map recorded"):
        assert RegimeMap.load(folder).sweep is None
    shutil.copy(out / "sweep" / "manifest.json", path)
    assert RegimeMap.load(folder).sweep is not None
    # Its only readable chunks damaged: one warning each, and the error says so.
    chunks = sorted((folder / "sweep").glob("chunk_*.npz"))
    for c in chunks:
        c.write_bytes(b"damaged")
    with pytest.warns(UserWarning, match="skipping") as w:
        with pytest.raises(
            ValueError, match=f"no readable finished chunk \\({len(chunks)} damaged"
        ):
            SweepResult.load(folder / "sweep")
    assert len(w) == len(chunks)
    # A `sweep` that links to nothing.
    shutil.rmtree(folder / "sweep")
    os.symlink(folder / "nowhere", folder / "sweep")
    with pytest.warns(UserWarning, match="sweep is a link to nothing"):
        assert RegimeMap.load(folder).sweep is None
    os.remove(folder / "sweep")
    # A `sweep` that is a file, not a folder: the map loads, and a warning says so.
    (folder / "sweep").write_text("not a folder")
    with pytest.warns(UserWarning, match="sweep is a file, not a sweep folder"):
        assert RegimeMap.load(folder).sweep is None


def test_interrupted_sweep_reloads_with_members_not_run(tmp_path):
    A = np.stack([I2 * (1 + 0.2 * k) for k in range(6)])
    kw = dict(method="ott_antonsen", chunk_size=2, t1=40.0, num_save=81, progress=False)

    def interrupt(c, info):
        if c == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sweep(A, I2, 1.0, np.arange(6), out_dir=tmp_path, on_chunk=interrupt, **kw)
    part = SweepResult.load(tmp_path)
    assert part.completed.tolist() == [True] * 4 + [False] * 2
    assert list(part.regime_names) == ["clustering"] * 4 + ["not run"] * 2
    assert np.all(part.regime[4:] == NOT_RUN) and np.isnan(part.R2[4:]).all()
    assert part.counts()["not run"] == 2
    # A chunk of another sweep in the folder is refused by name.
    other = tmp_path / "other"
    sweep(A, -I2, 1.0, np.arange(6), out_dir=other, **kw)
    os.replace(other / "chunk_00000.npz", tmp_path / "chunk_00002.npz")
    with pytest.raises(ValueError, match="different sweep"):
        SweepResult.load(tmp_path)
    (tmp_path / "members.npz").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="members.npz is missing or damaged"):
        SweepResult.load(tmp_path)


def test_failed_members_are_never_a_regime():
    # One cell of three whose members all fail (non-finite V), one that fails for one init.
    def family(s):
        V = I2 if s < 1.5 else np.full((2, 2), np.nan)
        return I2, V, 1.0

    m = regime_map(
        family,
        {"s": np.array([0.0, 1.0, 2.0])},
        method="ott_antonsen",
        inits=2,
        t1=30.0,
        num_save=61,
        progress=False,
    )
    assert m.failed[2].all() and not m.failed[:2].any()
    assert np.all(m.regime[2] == FAILED)
    assert m.dominant.tolist() == [CODE["clustering"], CODE["clustering"], -1]
    assert m.failed_fraction.tolist() == [0.0, 0.0, 1.0]
    assert m.fractions[2].sum() == 0 and not m.multistable[2]
    assert m.predicted is None and m.boundaries == []
    with pytest.raises(ValueError, match="unknown parameter"):
        regime_map("case4", {"v13": [0.0, 1.0]}, method="ott_antonsen", progress=False)
    with pytest.raises(ValueError, match="unknown family"):
        regime_map("case5", {"v11": [0.0]}, progress=False)
    with pytest.raises(ValueError, match="strictly increasing"):
        regime_map("case4", {"v11": [1.0, 0.0]}, progress=False)


def test_auto_chunks_report_lockstep_efficiency():
    rng = np.random.default_rng(0)
    A = rng.standard_normal((48, 2, 2))
    V = rng.standard_normal((48, 2, 2))
    res = sweep(
        A,
        V,
        1.0,
        0,
        method="ott_antonsen",
        t1=30.0,
        num_save=61,
        time_scale="physical",
        strategy="lockstep",  # auto chunks are lockstep's (OA members compact on CPU)
        progress=False,
    )
    plan = res.plan
    assert plan["group"] == "stiffness" and sum(plan["chunk_sizes"]) >= 48
    assert 0 < res.lockstep_efficiency <= 1
    assert res.environment["backend"] == jax.default_backend()
    assert res.environment["dtype"] == "float64"
    # Chunking changes no member: one whole-batch chunk gives the same numbers.
    whole = sweep(
        A,
        V,
        1.0,
        0,
        method="ott_antonsen",
        t1=30.0,
        num_save=61,
        time_scale="physical",
        strategy="lockstep",
        chunk_size=None,
        progress=False,
    )
    np.testing.assert_allclose(res.R2, whole.R2, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(res.regime, whole.regime)


def test_chaos_label_from_lyapunov_exponents():
    # Case 4 oscillation: closed orbits, λ₁ ≈ 0, never chaotic. Case 2 with V = diag(1, 0.3):
    # clusters on V's top eigenvector, an isolated sink, λ₁ < 0 (with V = I every point of
    # the circle is an equilibrium and λ₁ = 0).
    res = sweep(
        np.stack([I2, I2]),
        np.stack([np.array([[0.3, 1.0], [-1.0, -0.3]]), np.diag([1.0, 0.3])]),
        1.0,
        0,
        method="ott_antonsen",
        t1=60.0,
        num_save=121,
        lyapunov=2,
        progress=False,
    )
    assert "chaotic" not in set(res.regime_names)
    lam, sig = res.evidence["lyapunov_max"], res.evidence["lyapunov_uncertainty"]
    assert abs(lam[0]) < max(3 * sig[0], 1e-2)
    assert lam[1] < -0.1 and sig[1] < 0.01


def test_auto_chunks_on_an_accelerator_are_as_large_as_the_memory_allows():
    # A GPU step costs about the same for 10^5 members as for 10^3 (H200: Ott–Antonsen
    # 10^5 members in one chunk ran 21x the members/s of chunks of 1024), so the auto plan
    # there takes the largest chunks; the CPU keeps its efficiency-driven power-of-two plan.
    auto = Runner(progress=False)
    for B, ndev, cap, want in (
        (100_000, 1, 10**9, [100_000]),
        (1_000_000, 1, 10**9, [131072] * 8),
        (1_000_000, 1, 1 << 15, [32768] * 31),  # the memory's cap
        (300_001, 2, 10**9, [262144, 65536]),  # 131072 per device; the rest in a quarter
        (5, 2, 10**9, [6]),
    ):
        perm = np.arange(B)
        cost = np.linspace(1.0, 50.0, B)
        got = sw._chunk_plan(cost, perm, ndev, auto, cap, on_cpu=False)
        assert got == want
        assert got == sw._compact_plan(B, ndev, cap, sw.ACCELERATOR_CHUNK)
        assert sum(got) >= B and all(c % ndev == 0 for c in got)
        cpu = sw._chunk_plan(cost, perm, ndev, auto, cap)
        assert max(cpu) <= sw.CPU_CHUNK and sum(cpu) >= B
    # CPU plans split over any device count (the 1024 cap is no multiple of 3, 5, 6, 7:
    # a sweep of 1024 members on 3 devices failed deep inside JAX with IndivisibleError).
    for ndev in (1, 2, 3, 5, 6, 7):
        for B in (1, 5, 1023, 1024, 5000):
            cost = np.linspace(1.0, 50.0, B)
            plan = sw._chunk_plan(cost, np.arange(B), ndev, auto, 10**9)
            assert sum(plan) >= B and all(c % ndev == 0 and c > 0 for c in plan), (ndev, B)
            assert len(set(plan)) <= 4
    # Fixed sizes and None mean the same everywhere.
    fixed = Runner(chunk_size=1000, progress=False)
    perm = np.arange(2500)
    assert sw._chunk_plan(np.ones(2500), perm, 1, fixed, 10**9, on_cpu=False) == [1000] * 3
    # Every method has a default pool on both kinds of device.
    assert (
        set(sw.ACCELERATOR_SLOTS)
        == set(sw.CPU_SLOTS)
        == {"particles", "watanabe_strogatz", "ott_antonsen"}
    )


def test_chunk_plan_does_not_follow_small_moves_of_the_memory_and_resume_keeps_its_plan(tmp_path):
    members = sw.attention_members(np.stack([I2, 2 * I2] * 4), I2, 1.0, 0, method="ott_antonsen")
    integ = Integration(10.0, 21)
    per = sw.member_memory(members, integ)
    run = lambda budget, **kw: sweep(  # noqa: E731
        members, integration=integ, runner=Runner(memory_budget=budget, progress=False, **kw)
    )
    # Budgets of 4.2 and 7.9 members (free memory moving between calls): one plan of
    # power-of-two chunks, compiled once.
    first = run(4.2 * per)
    before = sw.num_traces()
    second = run(7.9 * per)
    assert first.plan["chunk_sizes"] == second.plan["chunk_sizes"] == [4, 4]
    assert sw.num_traces() == before
    np.testing.assert_array_equal(first.R2, second.R2)
    # A folder written under one budget resumes under a smaller one with its own chunks.
    run(4.2 * per, out_dir=str(tmp_path))
    again = run(2.5 * per, out_dir=str(tmp_path))
    assert again.plan["chunk_sizes"] == [4, 4]
    assert again.chunks_loaded == 2 and again.chunks_computed == 0
    np.testing.assert_array_equal(again.R2, first.R2)
    # A manifest whose plan was edited is named as damaged, not met deep inside.
    path = tmp_path / "manifest.json"
    good = json.loads(path.read_text())
    for key, value in (("chunk_sizes", "abc"), ("chunk_sizes", [1.5]), ("config", "abc")):
        path.write_text(json.dumps(dict(good, **{key: value})))
        with pytest.raises(ValueError, match=f"is damaged \\(its '{key}' is not"):
            run(2.5 * per, out_dir=str(tmp_path))
    # Loading reads the manifest with the same checks (it used to take int() of each size).
    path.write_text(json.dumps(dict(good, chunk_sizes=[-4, 12])))
    with pytest.raises(ValueError, match="SweepResult.load: .* is damaged .*'chunk_sizes'"):
        sw.SweepResult.load(str(tmp_path))
    # A plan that does not fit this batch: refused as an edit (the manifest's SHA-256 of
    # its contents), or, in a manifest without one, as another plan; in a short message.
    path.write_text(json.dumps(dict(good, chunk_sizes=[4] * 200_000)))
    with pytest.raises(ValueError, match="damaged .*edited after it was written") as err:
        run(2.5 * per, out_dir=str(tmp_path))
    assert len(str(err.value)) < 1000
    del good["summary_sha256"]
    path.write_text(json.dumps(dict(good, chunk_sizes=[4] * 200_000)))
    with pytest.raises(ValueError, match="different sweep") as err:
        run(2.5 * per, out_dir=str(tmp_path))
    assert len(str(err.value)) < 1000
    # Without resuming, the smaller budget's plan is used.
    assert run(2.5 * per, out_dir=str(tmp_path), resume=False).plan["chunk_sizes"] == [2] * 4

    # Watanabe–Strogatz members hold 3 real numbers per save and O(n) constants: no
    # per-save term grows with n.
    def ws(n, num_save):
        m = sw.attention_members(I2, I2, 1.0, 0, n=n, method="watanabe_strogatz")
        return sw.member_memory(m, Integration(10.0, num_save))

    assert ws(2000, 401) - ws(1000, 401) == ws(2000, 101) - ws(1000, 101) < 1000 * 400


def test_chunks_respect_a_memory_budget_and_huge_members_are_refused():
    members = sw.attention_members(np.stack([I2] * 6), I2, 1.0, 0, kernel="usa", n=8)
    integ = Integration(10.0, 21)
    per = sw.member_memory(members, integ)
    # USA builds (n, n) scores: they are part of the estimate.
    assert per >= 4 * 8 * 8 * 8
    res = sweep(members, integration=integ, runner=Runner(memory_budget=2.5 * per, progress=False))
    assert max(res.plan["chunk_sizes"]) <= 2 and res.plan["memory_per_member"] == per
    assert not res.failed.any()
    # 50 000 tokens with softmax scores: refused before anything is compiled.
    big = sw.attention_members(I2, I2, 1.0, 0, kernel="sa", n=50_000)
    with pytest.raises(ValueError, match="GiB"):
        sweep(big, integration=Integration(10.0, 1000), runner=Runner(progress=False))
