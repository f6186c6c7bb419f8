"""Array-only collapse audits: order parameter, rank-one, Perron–Frobenius, RoPE commutant."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxattn.plga._audits import (
    RANK_RTOL,
    energy_curvature_audit,
    head_spread,
    invariance_order_parameter,
    perron_frobenius_audit,
    rank_one_audit,
    rope_commutant_projection,
    rope_commutant_residual,
    rope_rotation,
    summarise,
)

G_LM_FILE = Path(__file__).resolve().parents[1] / "jaxattn" / "data" / "pldr_v51_110m_1_G_LM.npz"


def _all_finite(tree):
    return all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(tree))


# ------------------------------------------------------------------ order parameter


def test_order_parameter_values_and_bound(getkey):
    one = jnp.ones((3, 4, 4))
    op = invariance_order_parameter(one, -one)  # rms diff 2, mean |x| 1, rms 1
    assert float(op.by_mean_abs) == pytest.approx(2.0, abs=1e-15)
    assert float(op.by_rms) == pytest.approx(2.0, abs=1e-15)
    op = invariance_order_parameter(one, 2 * one)
    assert float(op.by_mean_abs) == pytest.approx(1 / 1.5, rel=1e-14)
    # identical runs and two zero tensors: collapsed (0), not NaN
    assert float(invariance_order_parameter(one, one).by_rms) == 0.0
    z = invariance_order_parameter(jnp.zeros(5), jnp.zeros(5))
    assert float(z.by_rms) == 0.0 and float(z.by_mean_abs) == 0.0
    # against numpy for random pairs; the rms variant is bounded by 2
    x = jax.random.normal(getkey(), (50, 2, 8, 8))
    y = jax.random.normal(getkey(), (50, 2, 8, 8)) * 3 + 1
    ops = jax.vmap(invariance_order_parameter)(x, y)
    xn, yn = np.asarray(x), np.asarray(y)
    d = np.sqrt(np.mean((xn - yn) ** 2, axis=(1, 2, 3)))
    ref_mean = d / (0.5 * (np.abs(xn).mean((1, 2, 3)) + np.abs(yn).mean((1, 2, 3))))
    ref_rms = d / (0.5 * (np.sqrt((xn**2).mean((1, 2, 3))) + np.sqrt((yn**2).mean((1, 2, 3)))))
    np.testing.assert_allclose(ops.by_mean_abs, ref_mean, rtol=1e-13)
    np.testing.assert_allclose(ops.by_rms, ref_rms, rtol=1e-13)
    assert float(jnp.max(ops.by_rms)) <= 2.0


def test_order_parameter_extreme_scale_and_grad(getkey):
    x = jax.random.normal(getkey(), (16,))
    y = jax.random.normal(getkey(), (16,))
    base = invariance_order_parameter(x, y)
    for scale in (1e-300, 1e300):
        op = invariance_order_parameter(scale * x, scale * y)
        assert float(op.by_rms) == pytest.approx(float(base.by_rms), rel=1e-12)
    for a, b in ((x, x), (jnp.zeros(16), jnp.zeros(16)), (x, y)):
        g = jax.grad(
            lambda a, b: (
                invariance_order_parameter(a, b).by_rms
                + invariance_order_parameter(a, b).by_mean_abs
            )
        )(a, b)
        assert _all_finite(g)
    # gradient against central finite differences at a generic point
    f = lambda a: invariance_order_parameter(a, y).by_rms
    g = jax.grad(f)(x)
    e = jnp.zeros(16).at[3].set(1e-6)
    fd = (f(x + e) - f(x - e)) / 2e-6
    assert float(g[3]) == pytest.approx(float(fd), rel=1e-6)


def test_order_parameter_shape_error():
    with pytest.raises(ValueError, match="same shape"):
        invariance_order_parameter(jnp.ones(3), jnp.ones(4))


# ------------------------------------------------------------------ rank-one audit


def test_rank_one_audit_matches_numpy(getkey):
    m = jax.random.normal(getkey(), (3, 5, 6, 6))
    audit = jax.jit(rank_one_audit)(m)
    s = np.linalg.svd(np.asarray(m), compute_uv=False)
    np.testing.assert_allclose(audit.singular_values, s, rtol=1e-12)
    np.testing.assert_allclose(audit.s2_over_s1, s[..., 1] / s[..., 0], rtol=1e-12)
    np.testing.assert_allclose(
        audit.rank_one_deficit, (s[..., 1:] ** 2).sum(-1) / (s**2).sum(-1), rtol=1e-12
    )
    assert np.all(np.asarray(audit.numerical_rank) == 6)
    assert not bool(jnp.any(audit.collapsed))
    # the same under vmap
    v = jax.vmap(rank_one_audit)(m)
    np.testing.assert_allclose(v.singular_values, audit.singular_values, rtol=1e-13)


def test_rank_one_audit_degenerate_matrices(getkey):
    zero = rank_one_audit(jnp.zeros((4, 4)))
    assert int(zero.numerical_rank) == 0 and bool(zero.collapsed)
    assert (
        float(zero.s2_over_s1) == 0.0
        and float(zero.rank_one_deficit) == 0.0
        and float(zero.row_spread) == 0.0
    )
    const = rank_one_audit(jnp.full((5, 5), -3.7))
    assert int(const.numerical_rank) == 1 and bool(const.collapsed)
    assert float(const.s2_over_s1) < 1e-15 and float(const.row_spread) < 1e-15
    assert float(const.singular_values[0]) == pytest.approx(5 * 3.7, rel=1e-14)
    u = jax.random.normal(getkey(), (6,))
    v = jax.random.normal(getkey(), (6,))
    r1 = rank_one_audit(jnp.outer(u, v))  # rank one but rows differ (multiples of v)
    assert int(r1.numerical_rank) == 1 and bool(r1.collapsed) and float(r1.row_spread) > 0.1
    eye = rank_one_audit(jnp.eye(4))  # four repeated singular values
    assert int(eye.numerical_rank) == 4 and float(eye.s2_over_s1) == pytest.approx(1.0, abs=1e-15)
    assert float(eye.rank_one_deficit) == pytest.approx(0.75, abs=1e-15)
    # graded spectrum around the published threshold 64·eps_f32 ≈ 7.6e-6
    graded = rank_one_audit(jnp.diag(jnp.array([1.0, 1e-3, 2e-5, 5e-6, 1e-9])))
    assert int(graded.numerical_rank) == 3
    assert RANK_RTOL == pytest.approx(64 * 2.0**-23)


@pytest.mark.parametrize("scale", [1e-300, 1e-150, 1e150, 1e300])
def test_rank_one_audit_extreme_scales(scale):
    m = jnp.diag(jnp.array([2.0, 1.0, 0.5])) * scale
    a = rank_one_audit(m)
    np.testing.assert_allclose(a.singular_values / scale, [2.0, 1.0, 0.5], rtol=1e-13)
    assert int(a.numerical_rank) == 3 and float(a.s2_over_s1) == pytest.approx(0.5, rel=1e-13)
    assert float(a.rank_one_deficit) == pytest.approx((1 + 0.25) / (4 + 1 + 0.25), rel=1e-13)


def test_rank_one_audit_float32_path():
    with jax.enable_x64(False):
        m = jnp.diag(jnp.array([1e30, 1e24, 0.0], dtype=jnp.float32))
        a = rank_one_audit(m)
        assert a.singular_values.dtype == jnp.float32
        assert int(a.numerical_rank) == 1 and bool(a.collapsed)
        assert float(a.s2_over_s1) == pytest.approx(1e-6, rel=1e-5)


def test_rank_one_audit_float32_gradient_at_tiny_scale():
    """σ₁ ≈ 1e-20 in float32 (σ₁² underflows): the gradients stay finite and, the audit being
    scale-invariant (f(c·M) = f(M)), equal ∇f(M)/c with ∇f(M) computed in float64 at scale 1."""
    m = np.random.default_rng(3).normal(size=(4, 4))
    m[3] = 0.5 * m[0] + 0.25 * m[1]  # a zero singular value as well

    def loss(m):
        a = rank_one_audit(m)
        return a.rank_one_deficit + a.s2_over_s1 + a.row_spread

    truth = np.asarray(jax.grad(loss)(jnp.asarray(m, jnp.float64)))
    with jax.enable_x64(False):
        c = 1e-20
        g = np.asarray(jax.grad(loss)(jnp.asarray(m * c, jnp.float32)))
        a = rank_one_audit(jnp.asarray(m * c, jnp.float32))
        assert float(a.singular_values[0]) == pytest.approx(np.linalg.svd(m)[1][0] * c, rel=1e-5)
        assert int(a.numerical_rank) == 3
    assert g.dtype == np.float32 and np.isfinite(g).all()
    np.testing.assert_allclose(g * c, truth, rtol=2e-3, atol=2e-4 * np.abs(truth).max())


@pytest.mark.parametrize("which", ["zero", "identity", "constant", "rank_one"])
def test_rank_one_audit_gradients_finite(which, getkey):
    mats = {
        "zero": jnp.zeros((5, 5)),
        "identity": jnp.eye(5),
        "constant": jnp.ones((5, 5)),
        "rank_one": jnp.outer(jnp.arange(1.0, 6.0), jnp.ones(5)),
    }
    m = mats[which]

    def loss(m):
        a = rank_one_audit(m)
        return a.rank_one_deficit + a.s2_over_s1 + a.row_spread + jnp.sum(a.singular_values)

    g = jax.grad(loss)(m)
    assert _all_finite(g)
    assert _all_finite(jax.grad(lambda m: head_spread(jnp.stack([m, m, m])))(m))


def test_rank_one_deficit_gradient_matches_finite_differences(getkey):
    m = jax.random.normal(getkey(), (4, 4))
    f = lambda m: rank_one_audit(m).rank_one_deficit
    g = jax.grad(f)(m)
    e = jnp.zeros((4, 4)).at[1, 2].set(1e-6)
    fd = (f(m + e) - f(m - e)) / 2e-6
    assert float(g[1, 2]) == pytest.approx(float(fd), rel=1e-6)


def test_head_spread(getkey):
    m = jax.random.normal(getkey(), (4, 4))
    assert float(head_spread(jnp.stack([m] * 3))) < 1e-15
    assert float(head_spread(jnp.zeros((3, 4, 4)))) == 0.0
    a, b = jnp.eye(2), -jnp.eye(2)  # mean zero: spread 1
    assert float(head_spread(jnp.stack([a, b]))) == pytest.approx(1.0, abs=1e-15)
    with pytest.raises(ValueError, match="heads"):
        head_spread(jnp.ones((4, 4)))


# ------------------------------------------------------------------ Perron–Frobenius


def test_perron_frobenius_positive_matrix(getkey):
    p = jnp.exp(jax.random.normal(getkey(), (3, 6, 6)))
    a = perron_frobenius_audit(p)
    for b in range(3):
        lam, vec = np.linalg.eig(np.asarray(p[b]))
        order = np.argsort(-np.abs(lam))
        lam, vec = lam[order], vec[:, order]
        assert float(a.dominant_eigenvalue[b]) == pytest.approx(lam[0].real, rel=1e-12)
        v = vec[:, 0].real / vec[np.argmax(np.abs(vec[:, 0])), 0].real
        np.testing.assert_allclose(a.perron_vector[b], v, rtol=1e-10)
        # Perron vector: p v = λ₁ v
        np.testing.assert_allclose(np.asarray(p[b]) @ v, lam[0].real * v, rtol=1e-10)
        assert float(a.spectral_gap[b]) == pytest.approx(1 - abs(lam[1]) / abs(lam[0]), rel=1e-10)
    assert bool(jnp.all(a.entrywise_positive & a.dominant_real_positive & a.perron_vector_positive))
    assert bool(jnp.all(a.spectral_gap > 0)) and bool(jnp.all(a.positive_fraction == 1))


def test_perron_frobenius_where_it_fails(getkey):
    p = jnp.exp(jax.random.normal(getkey(), (5, 5)))
    neg = perron_frobenius_audit(-p)  # dominant eigenvalue negative
    assert not bool(neg.entrywise_positive) and not bool(neg.dominant_real_positive)
    assert float(neg.positive_fraction) == 0.0
    cyc = perron_frobenius_audit(jnp.roll(jnp.eye(3), 1, axis=1))  # nonnegative, not primitive
    assert float(cyc.spectral_gap) == pytest.approx(0.0, abs=1e-12) and not bool(
        cyc.entrywise_positive
    )
    zero = perron_frobenius_audit(jnp.zeros((4, 4)))
    assert float(zero.spectral_gap) == 0.0 and not bool(zero.dominant_real_positive)
    assert _all_finite(zero)
    with pytest.raises(ValueError, match="square"):
        perron_frobenius_audit(jnp.ones((3, 4)))


# ------------------------------------------------------------------ RoPE commutant


def test_rope_rotation_convention():
    dk, p, base = 8, 3.0, 10000.0
    r = rope_rotation(p, dk, base=base)
    x = np.arange(1.0, dk + 1)
    theta = p * base ** (-2 * np.arange(dk // 2) / dk)
    ref = np.empty(dk)
    ref[0::2] = x[0::2] * np.cos(theta) - x[1::2] * np.sin(theta)
    ref[1::2] = x[0::2] * np.sin(theta) + x[1::2] * np.cos(theta)
    np.testing.assert_allclose(r @ x, ref, rtol=1e-14)
    np.testing.assert_allclose(r.T @ r, np.eye(dk), atol=1e-15)
    h = rope_rotation(p, dk, base=base, rope="half")
    ref_h = np.concatenate(
        [
            x[:4] * np.cos(theta) - x[4:] * np.sin(theta),
            x[:4] * np.sin(theta) + x[4:] * np.cos(theta),
        ]
    )
    np.testing.assert_allclose(h @ x, ref_h, rtol=1e-14)


@pytest.mark.parametrize("rope", ["interleaved", "half"])
def test_commutant_projection_commutes_with_every_rotation(rope, getkey):
    dk = 16
    g = jax.random.normal(getkey(), (dk, dk))
    pg = rope_commutant_projection(g, rope=rope)
    np.testing.assert_allclose(
        rope_commutant_projection(pg, rope=rope), pg, atol=1e-15
    )  # idempotent
    for p in (1.0, 2.0, 7.0, 123.0, 1023.0, 0.37, -5.0):
        r = rope_rotation(p, dk, rope=rope)
        np.testing.assert_allclose(r @ pg, pg @ r, atol=1e-13)
        assert float(jnp.max(jnp.abs(r @ g - g @ r))) > 1e-2  # a generic G does not commute
    # orthogonal projection: the residual is orthogonal to the commutant
    c = rope_commutant_projection(jax.random.normal(getkey(), (dk, dk)), rope=rope)
    assert abs(float(jnp.sum((g - pg) * c))) < 1e-12
    assert float(rope_commutant_residual(pg, rope=rope)) < 1e-15
    ref = np.linalg.norm(g - pg) / np.linalg.norm(g)
    assert float(rope_commutant_residual(g, rope=rope)) == pytest.approx(ref, rel=1e-13)
    assert float(rope_commutant_residual(jnp.zeros((dk, dk)))) == 0.0


def test_commutant_is_exactly_the_derived_set():
    """The null space of X ↦ R(p)X − XR(p) for p = 1, 2 has dimension dk and equals the range of
    the projection: the block-diagonal [[a, −b], [b, a]] family is the whole commutant."""
    dk = 8
    rows = []
    for p in (1.0, 2.0):
        r = np.asarray(rope_rotation(p, dk))
        rows.append(np.kron(r, np.eye(dk)) - np.kron(np.eye(dk), r.T))  # vec(RX − XR), row-major
    _, s, vt = np.linalg.svd(np.concatenate(rows))
    null = vt[np.sum(s > 1e-10 * s[0]) :]
    assert null.shape[0] == dk
    for v in null:
        x = v.reshape(dk, dk)
        np.testing.assert_allclose(rope_commutant_projection(x), x, atol=1e-12)


def test_rank_one_g_cannot_be_folded(getkey):
    """A rank-one G = u vᵀ keeps at most half its energy in the commutant: residual ≥ 1/√2."""
    for _ in range(5):
        u = jax.random.normal(getkey(), (64,))
        v = jax.random.normal(getkey(), (64,))
        assert float(rope_commutant_residual(jnp.outer(u, v))) >= 2**-0.5
    e = jnp.zeros(64).at[0].set(1.0)
    assert float(rope_commutant_residual(jnp.outer(e, e))) == pytest.approx(2**-0.5, rel=1e-14)


# ------------------------------------------------------------------ the real v51 G_LM, summaries


def test_energy_curvature_audit_on_v51():
    with np.load(G_LM_FILE) as f:
        g = f["G_LM"]
    report = energy_curvature_audit(g)
    assert report["singular_values"].shape == (5, 14, 64)
    med = np.median(report["s2_over_s1"], axis=1)
    assert np.all(med[:2] < 1e-3) and np.all(med[2:] > 0.5)  # the NOTICE's orientation
    assert np.all(report["numerical_rank"] >= 2)  # not one head is numerically rank one
    pf = report["perron_frobenius"]
    assert not np.any(pf["entrywise_positive"])  # G_LM has negative entries: PF does not apply
    # a near rank-one G has a single-signed right factor: rows ∝ a positive vector
    near = report["s2_over_s1"] < 1e-3
    assert np.mean(report["right_sign_definiteness"][near] == 1.0) > 0.9
    assert np.all(report["commutant_residual"] > 0.3)


def test_commutant_residual_and_energy_curvature_audit_name_bad_input():
    with pytest.raises(ValueError, match=r"rope_commutant_residual: `g` must have at least 2"):
        rope_commutant_residual(np.ones(4))
    with pytest.raises(ValueError, match=r"rope_commutant_residual: `g` must be square"):
        rope_commutant_residual(np.ones((4, 6)))
    g = np.zeros((1, 2, 4, 4))
    g[0, 1, 2, 3] = np.nan
    with pytest.raises(ValueError, match=r"1 non-finite entries .* index \[0, 1, 2, 3\]"):
        energy_curvature_audit(g)
    with pytest.raises(ValueError, match=r"`g` must be real, got complex128 entries"):
        energy_curvature_audit(np.zeros((1, 2, 4, 4)) * 1j)


def test_summarise():
    s = summarise([1.0, 2.0, 3.0, np.nan])
    assert s["n"] == 3 and s["nan"] == 1 and s["median"] == 2.0 and s["max"] == 3.0
    assert summarise([])["n"] == 0


def test_cli_audit_g_lm(tmp_path, capsys):
    """`jaxattn plga audit --g-lm` (the shipped v51 tensor) writes JSON with the rank audit."""
    import json

    from jaxattn.cli import main

    g = np.load(G_LM_FILE)["G_LM"][:2, :3]  # a small slice keeps the test quick
    np.savez(tmp_path / "g.npz", G_LM=g)
    assert (
        main(["plga", "audit", "--g-lm", str(tmp_path / "g.npz"), "--out", str(tmp_path / "out")])
        == 0
    )
    report = json.loads((tmp_path / "out" / "audit.json").read_text())["g_lm"]
    assert np.asarray(report["numerical_rank"]).shape == (2, 3)
    ref = np.linalg.svd(g.astype(np.float64), compute_uv=False)
    np.testing.assert_allclose(report["s2_over_s1"], ref[..., 1] / ref[..., 0], rtol=1e-10)
    assert (tmp_path / "out" / "g_lm_singular_spectra.png").stat().st_size > 1000
    assert "commutant residual" in capsys.readouterr().out
    assert main(["plga", "audit", "--out", str(tmp_path / "none")]) == 2  # neither input given
    assert "--ckpt DIR" in capsys.readouterr().err


def test_cli_audit_g_lm_bad_files(tmp_path, capsys):
    """Bad --g-lm files are one-line errors naming the problem (never a hint to unpickle)."""
    from jaxattn.cli import main

    np.save(tmp_path / "nan.npy", np.full((1, 2, 4, 4), np.nan))
    np.save(tmp_path / "empty.npy", np.zeros((1, 1, 0, 0)))
    (tmp_path / "junk.npz").write_bytes(b"\xaa\x01 not an array file")
    # A zip archive cut short (zipfile's BadZipFile, once a traceback) and one without G_LM.
    np.savez(tmp_path / "whole.npz", G_LM=np.eye(4)[None, None])
    (tmp_path / "cut.npz").write_bytes((tmp_path / "whole.npz").read_bytes()[:80])
    np.savez(tmp_path / "other.npz", A=np.eye(4))
    cases = {
        "nan.npy": "non-finite",
        "empty.npy": "non-empty shape",
        "junk.npz": "not a readable",
        "cut.npz": "not a readable",
        "other.npz": "has no array 'G_LM' (keys: A)",
    }
    for name, message in cases.items():
        rc = main(["plga", "audit", "--g-lm", str(tmp_path / name), "--out", str(tmp_path / "o")])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and message in err[0], (name, err)
        assert "pickle" not in err[0] or "refused" in err[0]
