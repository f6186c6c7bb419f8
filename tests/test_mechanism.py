"""The collapse mechanism audits (twirl, concentration, contraction) against closed forms."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxattn.plga import (
    CONFIGS,
    PLDRLLM,
    MetricLearner,
    concentration_audit,
    contraction_audit,
    density_concentration,
    row_map_spectral_norm,
    twirl_audit,
)

# the tiny architecture (d_model 128, 4 heads, dk 32, learner 64 wide, 2 units) with a small
# vocabulary and context so that the tests compile quickly
CFG = CONFIGS["tiny"].replace(vocab_size=80, context_length=32)
SEQ = 32
LENGTHS = np.array([4, 8, 16, 32])


@pytest.fixture(scope="module")
def model():
    return PLDRLLM(CFG, key=jax.random.key(0), dtype=jnp.float64)


@pytest.fixture(scope="module")
def ids():
    return jax.random.randint(jax.random.key(1), (2, SEQ), 4, CFG.vocab_size, dtype=jnp.int32)


def _constant_queries(model, b):
    """Layer 0 gets `q_s = b` (every head) at every position: zero weight, bias `b`."""
    H = CFG.num_heads
    wq = model.layers[0].attn.wq
    return eqx.tree_at(
        lambda m: (m.layers[0].attn.wq.weight, m.layers[0].attn.wq.bias),
        model,
        (jnp.zeros_like(wq.weight), jnp.tile(jnp.asarray(b, wq.bias.dtype), H)),
    )


def test_twirl_of_a_constant_query_matches_the_dirichlet_kernel(model, ids):
    """`q_s = e₀` on the first RoPE pair (angle θ₀ = 1 per position): `D_pre = S e₀e₀ᵀ` has
    residual 1/√2; after RoPE `D = ½[[S + C, Σ], [Σ, S − C]]` with `C + iΣ = Σ_{p<S} e^{2ip}`,
    so the residual is `|z|/√(S² + |z|²)`, `|z| = |sin S / sin 1|`."""
    dk = CFG.head_dim
    m = _constant_queries(model, jnp.zeros(dk).at[0].set(1.0))
    audit = twirl_audit(m, ids, lengths=LENGTHS)
    S = LENGTHS.astype(float)
    z = np.abs(np.sin(S) / np.sin(1.0))
    expected = z / np.sqrt(S**2 + z**2)
    after = np.asarray(audit.residual_after)[:, :, 0, :]  # (prompts, S, heads), layer 0
    before = np.asarray(audit.residual_before)[:, :, 0, :]
    expected = np.broadcast_to(expected[None, :, None], after.shape)
    np.testing.assert_allclose(after, expected, rtol=1e-10)
    np.testing.assert_allclose(before, 2**-0.5, rtol=1e-12)
    assert audit.residual_after.shape == (2, len(LENGTHS), CFG.num_layers, CFG.num_heads)


def test_twirl_is_zero_for_a_density_inside_the_commutant(model):
    """Layer 0's query map is solved so that prompt A (tokens 1…32) has queries e₀, e₁, e₀, …
    and prompt B (tokens 33…64) has the de-rotated queries `R(−s)e₀, R(−s)e₁, …` (first RoPE
    pair, angle 1 per position). At even lengths `D_pre` of A and `D` of B equal `(S/2)·I` on
    that pair: inside the commutant, residual 0. RoPE moves A's `D` and B's `D_pre` out of it."""
    H, dk = CFG.num_heads, CFG.head_dim
    s = np.arange(SEQ)
    ids = jnp.asarray([1 + s, 1 + SEQ + s], jnp.int32)
    targets = np.zeros((2, SEQ, dk))
    targets[0, s, s % 2] = 1.0
    c, si = np.cos(s), np.sin(s)
    targets[1, :, 0] = np.where(s % 2 == 0, c, si)  # R(−s)e₀ = (cos s, −sin s)
    targets[1, :, 1] = np.where(s % 2 == 0, -si, c)  # R(−s)e₁ = (sin s, cos s)
    u = model.embed(ids.reshape(-1))  # (2 SEQ, D): the LN'd embeddings layer 0 sees
    target = jnp.tile(jnp.asarray(targets.reshape(2 * SEQ, dk)), (1, H))
    W = jnp.linalg.lstsq(u, target)[0].T  # (H dk, D) with u Wᵀ = target
    m = eqx.tree_at(
        lambda m: (m.layers[0].attn.wq.weight, m.layers[0].attn.wq.bias),
        model,
        (W, jnp.zeros(H * dk)),
    )
    audit = twirl_audit(m, ids, lengths=LENGTHS)  # all even
    before = np.asarray(audit.residual_before)[:, :, 0]
    after = np.asarray(audit.residual_after)[:, :, 0]
    assert np.max(before[0]) < 1e-10 and np.max(after[1]) < 1e-10
    assert np.min(after[0]) > 1e-2 and np.min(before[1]) > 1e-2
    # layer 1 sees generic queries: far from the commutant before RoPE
    assert np.min(np.asarray(audit.residual_before)[:, :, 1]) > 0.1


def test_iid_rows_concentrate_at_the_lln_rate():
    """Rows i.i.d. N(0, C): `E mean_p‖D̂_p − D̄‖² = (1 − 1/P)(tr C² + (tr C)²)/S`, so the spread
    falls as S^{−1/2}: the fitted exponent's bootstrap interval holds −1/2 and each spread is
    within its sampling error of the closed form."""
    P, S_max, dk = 96, 256, 4
    key_c, key_x = jax.random.split(jax.random.key(3))
    L = jax.random.normal(key_c, (dk, dk)) / np.sqrt(dk) + jnp.eye(dk)
    C = np.asarray(L @ L.T)
    x = jax.random.normal(key_x, (P, S_max, dk)) @ L.T
    lengths = np.array([4, 16, 64, 256])
    cum = jnp.cumsum(jnp.einsum("psm,psn->psmn", x, x), axis=1)
    dens = cum[:, lengths - 1]  # (P, S, dk, dk), summed over the first S rows
    audit = density_concentration(dens, lengths, key=jax.random.key(0), num_bootstrap=400)
    lo, hi = np.asarray(audit.exponent_ci)
    assert lo < -0.5 < hi and hi - lo < 0.2
    assert abs(float(audit.exponent) + 0.5) < 0.06
    theory = np.sqrt((1 - 1 / P) * (np.trace(C @ C) + np.trace(C) ** 2) / lengths)
    theory /= np.linalg.norm(C)
    np.testing.assert_allclose(np.asarray(audit.spread), theory, rtol=0.15)
    band = np.asarray(audit.band)
    assert np.all(band[:, 0] <= np.asarray(audit.spread)) and np.all(
        np.asarray(audit.spread) <= band[:, 1]
    )


def test_density_concentration_refuses_bad_input():
    d = jnp.ones((3, 2, 4, 4))
    with pytest.raises(ValueError, match="increasing"):
        density_concentration(d, np.array([4, 4]))
    with pytest.raises(ValueError, match="at least 2 prompts"):
        density_concentration(d[:1], np.array([2, 4]))
    with pytest.raises(ValueError, match="lengths"):
        density_concentration(d, np.array([2, 4, 8]))


def test_concentration_of_constant_queries_is_exact(model, ids):
    """Constant queries make `D/S` the same for every prompt (layer 0): spread exactly 0; the
    other layer concentrates but not to 0."""
    m = _constant_queries(model, jnp.linspace(-1.0, 1.0, CFG.head_dim))
    audit = concentration_audit(m, ids, lengths=LENGTHS, num_bootstrap=20)
    spread = np.asarray(audit.spread)  # (S, layers, heads)
    assert spread.shape == (len(LENGTHS), CFG.num_layers, CFG.num_heads)
    assert np.max(spread[:, 0]) < 1e-12 and np.min(spread[:, 1]) > 1e-6
    assert np.max(np.asarray(audit.learner_input_spread)[:, 0]) < 1e-12
    assert np.all(np.isfinite(np.asarray(audit.exponent)[1]))


def test_zero_gain_learner_is_a_constant_map(model, ids):
    """The last unit's LayerNorm gain 0 makes φ constant (= its offset): every Jacobian norm
    is exactly 0, the last unit's too, while the first unit's is not."""
    m = eqx.tree_at(
        lambda m: [layer.attn.metric_learner.ln_weight for layer in m.layers],
        model,
        [layer.attn.metric_learner.ln_weight.at[-1].set(0.0) for layer in model.layers],
    )
    audit = contraction_audit(m, ids, num_iterations=20, max_rows=16)
    assert audit.norm.shape == (CFG.num_layers, 16)
    assert np.all(np.asarray(audit.norm) == 0.0)
    assert np.all(np.asarray(audit.unit_norms)[..., -1] == 0.0)
    assert np.all(np.asarray(audit.product_bound) == 0.0)
    assert np.min(np.asarray(audit.unit_norms)[..., 0]) > 0.0


def test_power_iteration_matches_the_dense_jacobian(getkey):
    """At random rows, the power-iteration norm of one unit and of the whole learner equals
    the largest singular value of the dense Jacobian (built here only), and the product of the
    unit norms bounds the learner's."""
    dk = 8
    learner = MetricLearner(dk, 16, 2, 2, key=getkey(), dtype=jnp.float64)
    learner = eqx.tree_at(  # non-trivial LayerNorm gains and offsets
        lambda m: (m.ln_weight, m.ln_bias),
        learner,
        (
            1 + 0.3 * jax.random.normal(getkey(), learner.ln_weight.shape),
            0.1 * jax.random.normal(getkey(), learner.ln_bias.shape),
        ),
    )
    rows = 2.0 * jax.random.normal(getkey(), (6, dk))
    norm, unit_norms, res = row_map_spectral_norm(learner, rows, key=getkey(), num_iterations=300)
    dense = jax.vmap(jax.jacfwd(learner))(rows)
    sigma1 = np.linalg.norm(np.asarray(dense), ord=2, axis=(1, 2))
    np.testing.assert_allclose(norm, sigma1, rtol=1e-8)
    assert np.max(np.asarray(res)) < 1e-6
    names = ("w1", "b1", "w2", "b2", "w3", "b3", "ln_weight", "ln_bias")
    first = eqx.tree_at(  # unit 0 alone, a one-unit learner
        lambda m: tuple(getattr(m, n) for n in names),
        learner,
        tuple(getattr(learner, n)[:1] for n in names),
    )
    dense0 = jax.vmap(jax.jacfwd(first))(rows)
    np.testing.assert_allclose(
        unit_norms[:, 0], np.linalg.norm(np.asarray(dense0), ord=2, axis=(1, 2)), rtol=1e-8
    )
    assert np.all(np.asarray(norm) <= np.prod(np.asarray(unit_norms), axis=1) * (1 + 1e-10))


def test_contraction_audit_on_a_model(model, ids):
    audit = contraction_audit(model, ids, num_iterations=20, max_rows=16)
    assert audit.unit_norms.shape == (CFG.num_layers, 16, CFG.num_reslayerA)
    n, pb = np.asarray(audit.norm), np.asarray(audit.product_bound)
    assert np.all(np.isfinite(n)) and np.all(n > 0) and np.all(n <= pb * (1 + 1e-8))
    s = audit.summary()
    assert len(s["contracting_fraction"]) == CFG.num_layers


def test_bad_arguments(model, ids):
    with pytest.raises(ValueError, match="lengths"):
        twirl_audit(model, ids, lengths=np.array([0, 4]))
    with pytest.raises(ValueError, match="lengths"):
        twirl_audit(model, ids, lengths=np.array([4, SEQ + 1]))
    with pytest.raises(ValueError, match="rope"):
        twirl_audit(model, ids, rope="spiral")
    with pytest.raises(ValueError, match="num_iterations"):
        contraction_audit(model, ids, num_iterations=0)
    with pytest.raises(ValueError, match="rows"):
        row_map_spectral_norm(
            model.layers[0].attn.metric_learner, jnp.ones((3, 5)), key=jax.random.key(0)
        )


def test_figures_label_axes_and_legends(tmp_path):
    """The figure helpers on hand-made audits (Agg): labelled axes, legend entries, files."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from jaxattn.plga import ConcentrationAudit, ContractionAudit, TwirlAudit
    from jaxattn.plot import (
        plot_concentration,
        plot_contraction,
        plot_mechanism_over_training,
        plot_operator_regimes,
        plot_twirl,
    )

    rng = np.random.default_rng(0)
    S = np.array([4, 8, 16, 32])
    twirl = TwirlAudit(
        jnp.asarray(S),
        rng.uniform(size=(3, 4, 2, 4)),
        rng.uniform(size=(3, 4, 2, 4)),
        "interleaved",
    )
    sp = np.exp(-0.5 * np.log(S))[:, None, None] * np.ones((4, 2, 4))
    conc = ConcentrationAudit(
        jnp.asarray(S),
        rng.uniform(size=(3, 4, 2, 4)),
        sp,
        np.stack([0.8 * sp, 1.2 * sp], axis=-1),
        -0.5 * np.ones((2, 4)),
        np.stack([-0.6 * np.ones((2, 4)), -0.4 * np.ones((2, 4))], axis=-1),
        learner_input_spread=sp,
        learner_input_exponent=-0.5 * np.ones((2, 4)),
    )
    norms = rng.uniform(0.1, 2.0, size=(2, 10, 2))
    contr = ContractionAudit(norms[..., 0], norms, norms.prod(-1), np.zeros((2, 10)), 10)
    runs = {
        "supercritical": {"steps": [0, 50], "loss": [10.0, 7.0], "contraction_norm": [0.5, 0.4]},
        "subcritical": {"steps": [0, 50], "loss": [10.0, 8.0], "concentration_exponent": [0, -1]},
    }
    regimes = {
        "checkpoints": [
            {"label": "step 0", "flows": {"heads summed": {"fractions": {"clustering": 1.0}}}},
            {"label": "step 50", "flows": {"heads summed": {"fractions": {"rotating": 0.5}}}},
        ]
    }
    figs = {
        "twirl": plot_twirl(twirl, path=tmp_path / "twirl.png"),
        "concentration": plot_concentration(conc, path=tmp_path / "concentration.png"),
        "contraction": plot_contraction(contr, path=tmp_path / "contraction.png"),
        "training": plot_mechanism_over_training(runs, path=tmp_path / "training.png"),
        "regimes": plot_operator_regimes(regimes, path=tmp_path / "regimes.png"),
    }
    for name, fig in figs.items():
        assert (tmp_path / f"{name}.png").stat().st_size > 0
        visible = [ax for ax in fig.axes if ax.get_visible()]
        assert all(ax.get_xlabel() for ax in visible), name
        assert visible[0].get_ylabel(), name
        legends = [t.get_text() for ax in visible if ax.get_legend() for t in ax.get_legend().texts]
        assert legends, name
        plt.close(fig)
    legend = figs["twirl"].axes[0].get_legend()
    assert [t.get_text() for t in legend.texts] == ["before RoPE", "after RoPE"]
    texts = [t.get_text() for t in figs["concentration"].axes[0].get_legend().texts]
    assert any("exponent -0.50 [-0.60, -0.40]" in t for t in texts) and "S^(-1/2)" in texts
    texts = [t.get_text() for t in figs["contraction"].axes[0].get_legend().texts]
    assert texts[-1] == "contraction threshold 1"
    texts = [t.get_text() for t in figs["regimes"].axes[-1].get_legend().texts]
    assert texts == ["clustering", "rotating"]


@pytest.mark.slow
def test_cli_audit_reports_the_mechanism(tmp_path, capsys):
    """`jaxattn plga audit --ckpt` prints the three stages, stores their summaries in
    audit.json and draws one figure each."""
    import json

    from jaxattn.cli import main

    micro = ["--set", "d_model=16", "--set", "num_layers=1", "--set", "num_heads=2"]
    micro += ["--set", "head_dim=8", "--set", "dff=32", "--set", "A_dff=16"]
    micro += ["--set", "num_reslayerA=2", "--set", "num_denseA=1", "--set", "context_length=32"]
    run = tmp_path / "run"
    argv = ["plga", "train", "--out", str(run), *micro, "--seq-len", "16", "--batch-size", "2"]
    argv += ["--steps", "2", "--warmup", "1", "--ckpt-every", "2", "--no-progress"]
    assert main(argv) == 0
    out = tmp_path / "audit"
    argv = ["plga", "audit", "--ckpt", str(run), "--out", str(out), "--num-prompts", "3"]
    assert main(argv + ["--seq-len", "16", "--new-tokens", "30"]) == 0
    captured = capsys.readouterr()
    text = captured.out
    # 8 prompt tokens + 30 new ones do not fit the context of 32: said, not silently cut.
    assert "cache fidelity decodes 25 new tokens, not --new-tokens 30" in captured.err
    assert "collapse mechanism (S = 16" in text and "concentration exponent" in text
    report = json.loads((out / "audit.json").read_text())["checkpoint"]["mechanism"]
    assert set(report) == {"twirl", "concentration", "contraction"}
    assert report["twirl"]["lengths"][-1] == 16
    assert len(report["contraction"]["contracting_fraction"]) == 1
    for name in ("twirl", "concentration", "contraction"):
        assert (out / f"{name}.png").stat().st_size > 1000


def test_trained_operator_reproduces_the_layer(model, ids):
    """With zero biases and RoPE at position 0, the layer's scores are `x A_h xᵀ` and its
    output is `Σ_h P_h x V_hᵀ` (plus the output bias), `P_h` the masked softmax of the scores;
    `β` is the mean squared norm of the layer's input tokens."""
    from jaxattn.plga import masked_softmax, trained_operator, trained_operator_flow

    G = jax.random.normal(jax.random.key(5), (CFG.num_heads, CFG.head_dim, CFG.head_dim))
    op = trained_operator(model, 0, ids=ids, G=G)
    x = model.embed(ids[0])
    attn = model.layers[0].attn
    out, ded = attn(x, G=G, positions=jnp.zeros(SEQ, jnp.int32))
    scores = jnp.einsum("id,hde,je->hij", x, op.A, x)
    np.testing.assert_allclose(ded.scores, scores, rtol=1e-10, atol=1e-10)
    P = masked_softmax(scores, jnp.tril(jnp.ones((SEQ, SEQ), bool))[None])
    expected = jnp.einsum("hij,jd,hed->ie", P, x, op.V) + attn.dense.bias
    np.testing.assert_allclose(out, expected, rtol=1e-10, atol=1e-10)
    r2 = np.mean(np.sum(np.asarray(jax.vmap(model.embed)(ids)) ** 2, axis=-1))
    np.testing.assert_allclose(float(op.beta), r2, rtol=1e-12)
    flow = trained_operator_flow(model, 0, G=G, head=1)
    np.testing.assert_allclose(flow.A, op.A[1])
    np.testing.assert_allclose(flow.V, op.V[1])
    assert float(flow.beta) == CFG.d_model  # without prompts: r² = D (unit-gain LayerNorm)
    assert trained_operator_flow(model, 0, G=G).A.shape == (CFG.num_heads, CFG.d_model, CFG.d_model)
    with pytest.raises(ValueError, match="layer"):
        trained_operator(model, CFG.num_layers, G=G)
    with pytest.raises(ValueError, match="ids"):
        trained_operator(model, 0)
