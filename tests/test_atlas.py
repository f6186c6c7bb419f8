"""The regime atlas: sections produce the numbers they claim; the `jaxattn atlas --quick`
command writes a complete report (slow).

The quick atlas (several minutes on 2 CPU cores) runs once, in one test: the command's report
is checked as a whole and then section by section (`_check_*`) from its atlas.json, atlas.md
and figures. One test rather than one per section sharing a fixture, because under
`pytest -n 2` the section tests could land on both workers and each worker would run the
atlas again (pytest-xdist's `--dist loadgroup` does not group tests under pytest 9)."""

import json
import os
import subprocess
import sys
import traceback

import numpy as np
import pytest

from jaxattn.dynamics import REGIMES
from jaxattn.dynamics._atlas import load_g_lm
from jaxattn.dynamics._sweep import REGIME_NAMES


def test_regime_codes_match_the_regimes_enumeration():
    names = ("clustering", "rotating", "oscillation", "interior", "chaotic", "undetermined")
    for i, name in enumerate(names):
        assert int(REGIMES._name_to_item[name]._value) == i
    assert REGIME_NAMES == names


def test_g_lm_ships_with_the_package():
    G = load_g_lm()
    assert G.shape == (5, 14, 64, 64) and G.dtype == np.float32
    assert 70 < np.abs(G).max() < 100


def test_import_changes_no_jax_setting():
    code = (
        "import jax; import jaxattn, jaxattn.dynamics, jaxattn.dynamics._cli_atlas; "
        "print(jax.config.jax_enable_x64)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ, JAX_ENABLE_X64="0"),
    )
    assert out.stdout.strip() == "False"


@pytest.mark.slow
def test_atlas_quick_command_writes_the_report(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "jaxattn.cli",
            "atlas",
            "--quick",
            "--out",
            str(tmp_path),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "jaxattn atlas: wrote" in out.stdout and "quick mode" in out.stdout
    rep = json.loads((tmp_path / "atlas.json").read_text())
    md = (tmp_path / "atlas.md").read_text()
    # Every check runs, and all failures are reported together (one atlas run per test run).
    checks = (
        _check_whole_report,
        _check_bifurcation_and_hamiltonian_sections,
        _check_flow_families_section,
        _check_plga_flow_fractions_are_reproduced_by_one_member,
        _check_trained_operator_section,
    )
    failures = []
    for check in checks:
        try:
            check(rep, md, tmp_path)
        except Exception as e:  # reported below, with the others
            frames = traceback.extract_tb(e.__traceback__)
            lines = [f.lineno for f in frames if f.filename == __file__]
            failures.append(f"{check.__name__} (line {lines[-1]}): {type(e).__name__}: {e}")
    assert not failures, "\n\n".join(failures)


def _check_whole_report(rep, md, out_dir):
    sections = ("cases", "maps", "bifurcation", "hamiltonian", "high_d", "search")
    sections += ("flow_families", "trained_operator")
    for section in sections + ("multistability", "chaos"):
        assert section in rep
        assert os.path.exists(rep[section]["figure"])
        assert os.path.basename(rep[section]["figure"]) in md
    for row in rep["cases"]["rows"]:
        for m in ("particles", "watanabe_strogatz", "ott_antonsen"):
            assert row[m]["regime"] == row["expected"], (row["case"], m)
        if row["expected"] in ("clustering", "rotating"):  # two antipodal clusters
            for m in ("particles", "watanabe_strogatz"):
                assert (row[m]["num_clusters"], row[m]["antipodal_pairs"]) == (2, 1), row["case"]
    for v in rep["maps"]["maps"].values():
        assert v["disagreement_rate"] < 0.05
    assert rep["search"]["reached"] and rep["search"]["end_lambda_max"] >= 0
    assert len(rep["trained_operator"]["checkpoints"]) == 2
    assert "Flow families" in md and "trained operator" in md
    assert all(r["regime"] != "undetermined" for r in rep["high_d"]["rows"])
    # Basin fractions split on the multistability slice: clustering on the circle beside a
    # periodic orbit inside the disc, for some initial states of the same cell.
    ms = rep["multistability"]
    assert ms["multistable_cells"] > 0 and ms["failed_members"] == 0
    assert "clustering + oscillation" in ms["coexisting"]
    # The three-token candidate: its exponents sum to the mean divergence (< 0, dissipative);
    # the verdict is the package's rule applied to the measured spectrum.
    ch = rep["chaos"]
    for lam, sig, chaotic in zip(ch["exponents"], ch["uncertainty"], ch["chaotic"]):
        assert lam[0] >= lam[1] >= lam[2] and sum(lam) < 0
        assert chaotic == (lam[0] > max(3 * sig[0], 1e-3))
    assert "Chaos in three tokens" in md and "Multistability" in md
    assert rep["seconds"] > 0 and "Timings" in md


def _check_bifurcation_and_hamiltonian_sections(rep, md, out_dir):
    folds = rep["bifurcation"]["saddle_nodes"]
    assert [round(f["expected"]) for f in folds] == [-1, 1]
    assert all(f["error"] < 1e-8 and f["bracket"][1] - f["bracket"][0] <= 1e-8 for f in folds)
    osc = rep["hamiltonian"]["orbits"]["v11=0.2,v12=1.0"]
    assert max(osc["H_relative_drift"]) < 1e-8
    assert all(3.0 < p < 5.0 for p in osc["periods"])
    assert all(r > 1 - 1e-6 for r in rep["hamiltonian"]["orbits"]["v11=1.0,v12=0.2"]["final_abs_R"])
    assert rep["hamiltonian"]["case3_rotation"]["relative_error"] < 1e-5
    for f in ("bifurcation_case4.png", "case4_phase_portrait.png"):
        assert os.path.getsize(out_dir / "figures" / f) > 10_000


def test_decay_fits_recovers_exact_laws():
    from jaxattn.dynamics import decay_fits

    t = np.linspace(0.5, 40.0, 400)
    f = decay_fits(t, 3.0 * np.exp(-2.0 * t))
    assert f["law"] == "exponential" and abs(f["exp_rate"] - 2.0) < 1e-10
    f = decay_fits(t, 1e-3 * t**-2.0)
    assert f["law"] == "algebraic" and abs(f["power_exponent"] - 2.0) < 1e-10
    assert decay_fits(t, np.ones_like(t)) == dict(points=0)
    # a constant spread inside the window decays by no law (it was called "algebraic",
    # with R² of -1.35 from rounding)
    f = decay_fits(t, np.full_like(t, 1e-4))
    assert f["points"] == 400 and f["law"] == "no_decay"
    # growth is no decay either (it was reported as exponential decay with rate -2)
    f = decay_fits(t, 1e-12 * np.exp(0.3 * t))
    assert f["law"] == "no_decay" and abs(f["exp_rate"] + 0.3) < 1e-10
    with pytest.raises(ValueError, match="decay_fits: ts must be strictly increasing"):
        decay_fits(t[::-1], 3.0 * np.exp(-2.0 * t))


def test_direction_spread_is_sin_squared_down_to_tiny_angles():
    from jaxattn.dynamics import direction_spread

    # two tokens at angles ±φ (any radii): mean direction (cos φ, 0), V = sin²φ exactly,
    # resolved far below rounding of 1 − |mean|²; exact consensus gives 0, never < 0
    phi = np.array([0.3, 1e-4, 1e-9, 1e-12, 0.0])
    xs = np.stack(
        [np.stack([np.cos(phi), np.sin(phi)], -1), 7.0 * np.stack([np.cos(phi), -np.sin(phi)], -1)],
        axis=1,
    )
    V = direction_spread(xs)
    np.testing.assert_allclose(V[:-1], np.sin(phi[:-1]) ** 2, rtol=1e-12)
    assert V[-1] == 0.0
    rng = np.random.default_rng(0)
    theta = rng.normal(size=(3, 50, 4))
    theta /= np.linalg.norm(theta, axis=-1, keepdims=True)
    V = direction_spread(theta * rng.uniform(0.5, 2.0, size=(3, 50, 1)))
    np.testing.assert_allclose(V, 1 - np.sum(theta.mean(1) ** 2, -1), rtol=1e-13)
    # any finite nonzero radius (no overflow of the norm); no direction is refused by name
    e = np.array([[[1.0, 0.0], [0.0, 1.0]]])
    for r in (1e-300, 1e155, 1e300):
        np.testing.assert_allclose(direction_spread(r * e), [0.5], rtol=1e-15)
    with pytest.raises(ValueError, match="token 1 at save 0 is zero"):
        direction_spread(e * np.array([1.0, 0.0])[:, None])
    # a save with a non-finite token (a failed solve's tail) reads NaN, the others stay
    V = direction_spread(np.concatenate([e, np.array([[[np.inf, 0.0], [0.0, np.nan]]])]))
    assert V[0] == 0.5 and np.isnan(V[1])
    with pytest.raises(ValueError, match="n >= 1"):
        direction_spread(np.zeros((2, 0, 2)))
    with pytest.raises(ValueError, match="real numbers"):
        direction_spread(e.astype(complex))


def _check_flow_families_section(rep, md, out_dir):
    ff = {r["flow"]: r for r in rep["flow_families"]["rows"]}
    for x in ff["Post-LN"]["seeds"] + ff["nGPT"]["seeds"]:
        # near one cluster of softmax A = V = I the deviations decay like e^{-t}: V ~ e^{-2t}
        assert x["fit"]["law"] == "exponential" and abs(x["fit"]["exp_rate"] - 2.0) < 0.05
        assert x["regime"] == "clustering" and x["num_clusters"] == 1
    for x in ff["Pre-LN"]["seeds"]:
        # the radius grows like t, the angular speed falls like 1/t: V ~ t^{-2}
        assert x["fit"]["law"] == "algebraic" and abs(x["fit"]["power_exponent"] - 2.0) < 0.3
        assert x["radius_end"] > 100
    for x in ff["Post-LN, causal"]["seeds"]:
        # token 1 attends only to itself (at rest); every token converges to it
        assert x["first_token_displacement"] < 1e-12
        assert x["consensus_to_token1"] < 1e-6 and x["num_clusters"] == 1
    for x in ff["Post-LN"]["seeds"]:  # without the mask the consensus is elsewhere
        assert x["consensus_to_token1"] > 1e-3
    assert os.path.getsize(rep["flow_families"]["figure"]) > 10_000


def _check_plga_flow_fractions_are_reproduced_by_one_member(rep, md, out_dir):
    import jax
    import jax.numpy as jnp

    from jaxattn.dynamics import classify_tokens, default_gap_floor, regime_name, simulate
    from jaxattn.plga import load_atlas_layer
    from jaxattn.sphere import sample_uniform

    pg = rep["flow_families"]["plga"]
    assert len(pg["rows"]) == 4
    for r in pg["rows"]:
        assert abs(sum(r["fractions"].values()) - 1.0) < 1e-12 and r["failed"] == 0
        assert len(r["regimes"]) == pg["inits"]
    row = next(r for r in pg["rows"] if r["flow"].startswith("trained") and r["law"] == "uniform")
    # member 1, rebuilt by hand: the sweep draws its tokens from the second half of the
    # split key and runs in natural time (rate Σ_h ‖V_h‖ = heads, V = I)
    seed, rate = row["seeds"][1], row["rate"][1]
    assert rate == pg["heads"]
    flow = load_atlas_layer().plga_flow()
    k_tok = jax.random.split(jax.random.key(np.uint32(seed)))[1]
    x0 = sample_uniform(k_tok, pg["n"], pg["dk"], dtype=jnp.float64)
    ts = jnp.linspace(0.0, pg["t1_natural"], 201)
    tr = simulate(flow, x0, t1=float(ts[-1]) / rate, ts=ts / rate, rtol=1e-7, atol=1e-9)
    floor = max(float(default_gap_floor(jnp.float64)), 10 * 1e-7)  # the sweep's default
    regime, ev = classify_tokens(ts, tr.xs, gap_floor=floor)
    assert regime_name(regime) == row["regimes"][1]
    assert int(ev.num_clusters) == row["num_clusters"][1]


def _check_trained_operator_section(rep, md, out_dir):
    import equinox as eqx
    import jax.numpy as jnp

    from jaxattn.plga import load_atlas_layer

    op = rep["trained_operator"]
    labels = [cp["label"] for cp in op["checkpoints"]]
    assert labels == ["step 0 (random init)", "step 1000 (trained)"]
    assert op["D"] == 128 and op["beta"]["step 0 (random init)"] == 128.0
    for cp in op["checkpoints"]:
        assert list(cp["flows"]) == ["heads summed"] + [f"head {h}" for h in range(op["heads"])]
        for f in cp["flows"].values():
            assert len(f["regimes"]) == op["inits"]
            total = sum(f["fractions"].values()) + f["failed"] / op["inits"]
            assert abs(total - 1.0) < 1e-12
    # The operator's A_h reproduce the shipped layer's scores (biases off, RoPE at position
    # 0), and its norms are the report's.
    layer = load_atlas_layer()
    o = layer.operator()
    attn = layer.attn
    for lin in ("wq", "wk", "wv"):
        attn = eqx.tree_at(
            lambda a: getattr(a, lin).bias, attn, jnp.zeros_like(getattr(attn, lin).bias)
        )
    x = layer.x_probe
    _, ded = attn(x, G=layer.G, positions=jnp.zeros(x.shape[0], jnp.int32))
    scores = jnp.einsum("id,hde,je->hij", x, o.A, x)
    np.testing.assert_allclose(ded.scores, scores, rtol=1e-9, atol=1e-9)
    late = op["checkpoints"][1]["flows"]
    np.testing.assert_allclose(late["head 0"]["A_norm"], float(jnp.linalg.norm(o.A[0], 2)))
    np.testing.assert_allclose(
        late["heads summed"]["V_norm"], float(jnp.linalg.norm(o.V.sum(0), 2))
    )
    assert os.path.getsize(op["figure"]) > 10_000
