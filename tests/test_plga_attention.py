"""PowerLawGraphAttention, RoPE, the metric learner and the numerical guards."""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxattn.plga import (
    MetricLearner,
    PowerLawGraphAttention,
    apply_rope,
    init_params,
    masked_softmax,
    potential_power,
    rope_angles,
)

D, H, DK, SEQ = 32, 2, 16, 7


@eqx.filter_jit
def call(layer, x, **kwargs):
    return layer(x, **kwargs)


@eqx.filter_jit
def _fill(skeleton, key):
    return init_params(skeleton, key)


def build(cls, *args, key, **kwargs):
    """Construct through shapes + `init_params` (one compile instead of one per random call)."""
    return _fill(eqx.filter_eval_shape(cls, *args, key=key, **kwargs), key)


@pytest.fixture(scope="module")
def layer():
    return build(
        PowerLawGraphAttention, D, H, DK, 24, 2, 2, key=jax.random.key(0), dtype=jnp.float64
    )


@pytest.fixture(scope="module")
def x():
    return jax.random.normal(jax.random.key(1), (SEQ, D), jnp.float64)


# -- RoPE ------------------------------------------------------------------------------------------


def _rope_numpy(x, pos, base=10000.0, style="interleaved"):
    x = np.asarray(x, np.float64)
    dk = x.shape[-1]
    out = np.empty_like(x)
    for s, p in enumerate(pos):
        for i in range(dk // 2):
            th = p * base ** (-2 * i / dk)
            a, b = (2 * i, 2 * i + 1) if style == "interleaved" else (i, i + dk // 2)
            out[s, ..., a] = x[s, ..., a] * math.cos(th) - x[s, ..., b] * math.sin(th)
            out[s, ..., b] = x[s, ..., a] * math.sin(th) + x[s, ..., b] * math.cos(th)
    return out


@pytest.mark.parametrize("style", ["interleaved", "half"])
def test_rope_matches_formula(style, getkey):
    q = jax.random.normal(getkey(), (5, 3, 8), jnp.float64)
    pos = np.array([0, 1, 7, 100, 1023])
    got = jax.jit(apply_rope, static_argnames="style")(q, pos, style=style)
    np.testing.assert_allclose(got, _rope_numpy(q, pos, style=style), rtol=0, atol=1e-12)
    # rotation: norms kept; position 0 is the identity
    np.testing.assert_allclose(
        jnp.linalg.norm(got, axis=-1), jnp.linalg.norm(q, axis=-1), rtol=1e-13
    )
    np.testing.assert_allclose(got[0], q[0], atol=0)


def test_rope_styles_differ_and_are_relative(getkey):
    q = jax.random.normal(getkey(), (1, 1, 8), jnp.float64)
    k = jax.random.normal(getkey(), (1, 1, 8), jnp.float64)
    a = apply_rope(q, [5], style="interleaved")
    b = apply_rope(q, [5], style="half")
    assert float(jnp.max(jnp.abs(a - b))) > 1e-2
    # <R_p q, R_s k> depends only on p − s
    dots = [float(jnp.sum(apply_rope(q, [p]) * apply_rope(k, [p - 3]))) for p in (3, 10, 500)]
    np.testing.assert_allclose(dots, dots[0], rtol=1e-12)


def test_rope_low_precision_tables():
    pos = jnp.arange(1024)
    assert rope_angles(pos, 64, dtype=jnp.bfloat16).dtype == jnp.float32
    # bf16 features, angles at position ~1000: error is the bf16 rounding of the result only
    q = jnp.ones((1024, 1, 64), jnp.float64)
    exact = apply_rope(q, pos)
    low = apply_rope(q.astype(jnp.bfloat16), pos)
    assert low.dtype == jnp.bfloat16
    assert float(jnp.max(jnp.abs(low.astype(jnp.float64) - exact))) < 1e-2
    # angles built in bf16 would be off by whole radians
    bad = (pos.astype(jnp.bfloat16) * jnp.bfloat16(1.0)).astype(jnp.float64)
    assert float(jnp.max(jnp.abs(bad - pos))) >= 1.0


def test_rope_bad_arguments():
    with pytest.raises(ValueError, match="even"):
        rope_angles(jnp.arange(3), 7)
    with pytest.raises(ValueError, match="positions"):
        apply_rope(jnp.ones((3, 1, 4)), jnp.arange(4))
    with pytest.raises(ValueError, match="style"):
        apply_rope(jnp.ones((3, 1, 4)), jnp.arange(3), style="neox")


# -- the layer -------------------------------------------------------------------------------


def _numpy_plga(layer, x, G=None):
    """Independent float64 numpy implementation of docs/theory/plga.md, steps 1–7."""
    x = np.asarray(x)
    S = x.shape[0]
    lin = lambda y, lin_: y @ np.asarray(lin_.weight).T + np.asarray(lin_.bias)
    sp = lambda y: y.reshape(S, H, DK)
    pos = np.arange(S)
    q = _rope_numpy(sp(lin(x, layer.wq)), pos)
    k = _rope_numpy(sp(lin(x, layer.wk)), pos)
    v = sp(lin(x, layer.wv))

    def ln(y, w, b, eps=1e-6):
        m = y.mean(-1, keepdims=True)
        var = ((y - m) ** 2).mean(-1, keepdims=True)
        return (y - m) / np.sqrt(var + eps) * np.asarray(w) + np.asarray(b)

    silu = lambda u: u / (1 + np.exp(-u))
    if G is None:
        Dm = np.einsum("shm,shn->hmn", q, q)
        A = ln(Dm, layer.gram_norm.weight, layer.gram_norm.bias)
        ml = layer.metric_learner
        p = {n: np.asarray(getattr(ml, n)) for n in ("w1", "b1", "w2", "b2", "w3", "b3")}
        for r in range(ml.num_units):
            h = A
            for j in range(ml.num_blocks):
                g = silu(h @ p["w1"][r, j].T + p["b1"][r, j]) * (
                    h @ p["w2"][r, j].T + p["b2"][r, j]
                )
                h = g @ p["w3"][r, j].T + p["b3"][r, j]
            A = ln(A + h, ml.ln_weight[r], ml.ln_bias[r])
        u = np.einsum("hmn,hnk->hmk", np.asarray(layer.W), A) + np.asarray(layer.b_W)
        A_LM = u * silu(u) + 1e-9
        A_P = A_LM ** np.asarray(layer.P)
        G = np.einsum("hmn,hnk->hmk", np.asarray(layer.a), A_P) + np.asarray(layer.b_a)
    E = np.einsum("ihm,hmn,jhn->hij", q, np.asarray(G), k) / math.sqrt(DK)
    E = E - 1e9 * (np.arange(S)[None, :] > np.arange(S)[:, None])
    P = np.exp(E - E.max(-1, keepdims=True))
    P /= P.sum(-1, keepdims=True)
    out = np.einsum("hij,jhn->ihn", P, v).reshape(S, H * DK)
    return lin(out, layer.dense), G


def test_layer_matches_numpy(layer, x):
    out, ded = call(layer, x)
    ref_out, ref_G = _numpy_plga(layer, x)
    assert out.shape == (SEQ, D)
    assert ded.A.shape == ded.A_LM.shape == ded.A_P.shape == ded.G_LM.shape == (H, DK, DK)
    assert ded.scores.shape == (H, SEQ, SEQ)
    np.testing.assert_allclose(ded.G_LM, ref_G, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(out, ref_out, rtol=1e-10, atol=1e-12)
    assert bool(jnp.all(ded.A_LM > 0))


def test_G_identity_is_sdpa_and_external_G(layer, x, getkey):
    eye = jnp.eye(DK)
    out, ded = call(layer, x, G=eye)
    ref_out, _ = _numpy_plga(layer, x, G=np.broadcast_to(np.eye(DK), (H, DK, DK)))
    np.testing.assert_allclose(out, ref_out, rtol=1e-11, atol=1e-12)
    assert ded.A is None and ded.G_LM.shape == (H, DK, DK)
    Gx = jax.random.normal(getkey(), (H, DK, DK), jnp.float64)
    out2, _ = call(layer, x, G=Gx)
    np.testing.assert_allclose(out2, _numpy_plga(layer, x, G=Gx)[0], rtol=1e-10, atol=1e-12)
    # an SDPA layer with the same projections is the G = I layer
    sdpa = build(
        PowerLawGraphAttention,
        D,
        H,
        DK,
        24,
        2,
        2,
        attention="sdpa",
        key=jax.random.key(0),
        dtype=jnp.float64,
    )
    sdpa = eqx.tree_at(
        lambda m: (m.wq, m.wk, m.wv, m.dense), sdpa, (layer.wq, layer.wk, layer.wv, layer.dense)
    )
    assert sdpa.metric_learner is None
    np.testing.assert_allclose(call(sdpa, x)[0], out, rtol=1e-12, atol=1e-13)


def test_layer_plain_jit_vmap_grad_agree(layer, x):
    out, _ = call(layer, x)
    xb = jnp.stack([x, 2 * x])
    out_v, ded_v = eqx.filter_jit(jax.vmap(layer))(xb)
    np.testing.assert_allclose(out_v[0], out, rtol=1e-12, atol=1e-13)
    assert ded_v.G_LM.shape == (2, H, DK, DK)
    # gradient w.r.t. the input against a central finite difference
    f = jax.jit(lambda y: jnp.sum(jnp.sin(layer(y)[0])))
    g = jax.jit(jax.grad(f))(x)
    d = jax.random.normal(jax.random.key(3), x.shape, jnp.float64)
    h = 1e-6
    fd = (f(x + h * d) - f(x - h * d)) / (2 * h)
    np.testing.assert_allclose(jnp.sum(g * d), fd, rtol=1e-6)


def test_key_padding_and_mask(layer, x):
    pad = jnp.arange(SEQ) >= SEQ - 2
    out_p, ded_p = call(layer, x, key_padding=pad)
    full = jnp.tril(jnp.ones((SEQ, SEQ), bool)) & ~pad[None, :]
    out_m, _ = call(layer, x, mask=full)
    np.testing.assert_allclose(out_p, out_m, atol=0)
    # padded positions still enter the density operator (reference convention): changing a
    # padded input changes G_LM, but not the outputs' dependence through attention weights
    x2 = x.at[-1].add(1.0)
    _, ded2 = call(layer, x2, key_padding=pad)
    assert float(jnp.max(jnp.abs(ded2.G_LM - ded_p.G_LM))) > 0


def test_noncausal_density_and_causal_extension(x):
    kw = dict(key=jax.random.key(0), dtype=jnp.float64)
    ref_layer = build(PowerLawGraphAttention, D, H, DK, 24, 2, 2, **kw)
    causal = build(PowerLawGraphAttention, D, H, DK, 24, 2, 2, causal_density=True, **kw)
    x2 = x.at[-1].add(1.0)  # change only the last token
    a, dr = call(ref_layer, x)
    b, _ = call(ref_layer, x2)
    # reference layer: not causal (position 0 attends only to itself, so look from position 1)
    assert float(jnp.max(jnp.abs(a[1:-1] - b[1:-1]))) > 1e-6
    c, dc = call(causal, x)
    d, _ = call(causal, x2)
    np.testing.assert_allclose(c[:-1], d[:-1], rtol=0, atol=1e-13)  # extension: causal
    assert dc.G_LM.shape == (SEQ, H, DK, DK)
    # the last position sees the whole sequence: same tensors and output as the reference layer
    np.testing.assert_allclose(dc.G_LM[-1], dr.G_LM, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(c[-1], a[-1], rtol=1e-10, atol=1e-12)


def test_bad_shapes(layer, x):
    with pytest.raises(ValueError, match="`G` must have shape"):
        layer(x, G=jnp.eye(DK + 1))
    with pytest.raises(ValueError, match="`G` must have shape"):
        layer(x, G=jnp.ones((H + 1, DK, DK)))
    with pytest.raises(ValueError, match="`x` must have shape"):
        layer(x[None])
    with pytest.raises(ValueError, match="`mask`"):
        layer(x, mask=jnp.ones((SEQ, SEQ + 1), bool))
    with pytest.raises(ValueError, match="`key_padding`"):
        layer(x, key_padding=jnp.ones((SEQ + 1,), bool))
    with pytest.raises(ValueError, match="`positions`"):
        layer(x, positions=jnp.arange(SEQ + 1))
    with pytest.raises(ValueError, match="attention"):
        PowerLawGraphAttention(D, H, DK, 24, 2, 2, attention="flash", key=jax.random.key(0))


# -- numerical traps -------------------------------------------------------------------------


def test_potential_power_tiny_base_negative_exponent():
    x = jnp.array([1e-9, 1e-9 + 1e-15, 1e-3, 1.0, 30.0])
    p = jnp.array([-0.5, -2.0, 0.3, -1.0, 1.7])
    np.testing.assert_allclose(
        potential_power(x, p, 1e-9), np.asarray(x) ** np.asarray(p), rtol=1e-13
    )
    gx, gp = jax.grad(lambda x, p: jnp.sum(potential_power(x, p, 1e-9)), argnums=(0, 1))(x, p)
    np.testing.assert_allclose(gx, p * x ** (p - 1), rtol=1e-12)
    np.testing.assert_allclose(gp, x**p * jnp.log(x), rtol=1e-12)
    # a zero base (ε underflows in float16) or a huge negative power: finite, no NaN/inf
    val_grad = jax.jit(jax.value_and_grad(lambda y, q: jnp.sum(potential_power(y, q, 1e-9))))
    for dtype in (jnp.float16, jnp.float32):
        xs = jnp.array([0.0, 1e-9, 1.0], dtype)
        ps = jnp.array([-5.0, -50.0, 2.0], dtype)
        val, g = val_grad(xs, ps)
        assert bool(jnp.all(jnp.isfinite(val))) and bool(jnp.all(jnp.isfinite(g))), dtype


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float16, jnp.bfloat16])
def test_masked_softmax_no_nan(dtype):
    s = jnp.array([[1.0, 2.0, 3.0], [1e4, -1e4, 5.0], [0.0, 0.0, 0.0]], dtype)
    allowed = jnp.array([[True, True, False], [False, True, True], [False, False, False]])
    p = jax.jit(masked_softmax)(s, allowed)
    assert bool(jnp.all(jnp.isfinite(p)))
    np.testing.assert_allclose(
        np.asarray(p[0], np.float64), np.r_[jax.nn.softmax(jnp.array([1.0, 2.0])), 0], rtol=1e-2
    )
    np.testing.assert_allclose(
        np.asarray(p[1], np.float64), [0, 0, 1], atol=1e-3
    )  # masked 1e4 ignored
    np.testing.assert_array_equal(np.asarray(p[2], np.float64), 0)  # no admissible key: zeros
    g = jax.jit(
        jax.grad(lambda y: jnp.sum(masked_softmax(y, allowed) * jnp.arange(3.0, dtype=dtype)))
    )(s)
    assert bool(jnp.all(jnp.isfinite(g)))
    assert float(jnp.max(jnp.abs(g.astype(jnp.float64) * ~allowed))) == 0


def test_metric_learner_acts_on_rows(getkey):
    ml = build(MetricLearner, 8, 12, 3, 2, key=getkey(), dtype=jnp.float64)
    M = jax.random.normal(getkey(), (2, 8, 8), jnp.float64)
    out = call(ml, M)
    np.testing.assert_allclose(out[1, 3], call(ml, M[1, 3]), rtol=1e-13)
    # each unit ends with a LayerNorm of unit scale: every row has mean 0, variance ≈ 1
    np.testing.assert_allclose(out.mean(-1), 0, atol=1e-12)
    np.testing.assert_allclose(out.var(-1), 1, rtol=1e-4)
    with pytest.raises(ValueError, match="num_units"):
        MetricLearner(8, 12, 0, 2, key=getkey())


def test_masked_softmax_infinite_scores_take_their_limit():
    """A kept +inf score does not turn its row into NaN (inf − inf): the mass goes evenly to the
    +inf keys; −inf keys get 0; a masked +inf is ignored. `scale` multiplies inside the
    exponent without forming scale · scores."""
    inf = jnp.inf
    s = jnp.array(
        [[inf, 1.0, inf, 0.0], [inf, 2.0, 1.0, -inf], [-inf, 0.0, 0.0, 3.0], [-inf, -inf, 1, 1]],
        jnp.float32,
    )
    allowed = jnp.array(
        [[True] * 4, [False, True, True, True], [True] * 4, [True, True, False, False]]
    )
    p = np.asarray(jax.jit(masked_softmax)(s, allowed))
    np.testing.assert_array_equal(p[0], [0.5, 0, 0.5, 0])
    np.testing.assert_allclose(p[1], [0, *jax.nn.softmax(jnp.array([2.0, 1.0])), 0], rtol=1e-6)
    np.testing.assert_allclose(p[2], [0, *jax.nn.softmax(jnp.array([0.0, 0.0, 3.0]))], rtol=1e-6)
    np.testing.assert_array_equal(p[3], [0.5, 0.5, 0, 0])  # only −inf allowed: uniform
    # scale: softmax(2^100 · s) without overflow, = the arg-max; = softmax(2 s) for scale 2
    t = jnp.array([[1.0, 1.5, -3.0]], jnp.float32)
    ok = jnp.ones((1, 3), bool)
    np.testing.assert_array_equal(masked_softmax(t, ok, scale=2.0**100), [[0, 1, 0]])
    np.testing.assert_allclose(masked_softmax(t, ok, scale=2.0), jax.nn.softmax(2 * t), rtol=1e-6)


def test_attend_scales_huge_G_exactly(layer, getkey):
    """`attend` splits G = 2^E Ĝ: for a G of 1e30 the output equals the float64 softmax of the
    true scores, and scores below 2⁶⁴ are formed exactly as before (E = 0)."""
    q = jax.random.normal(getkey(), (3, H, DK), jnp.float64)
    k = jax.random.normal(getkey(), (H, 4, DK), jnp.float64)
    v = jax.random.normal(getkey(), (H, 4, DK), jnp.float64)
    G = jax.random.normal(getkey(), (H, DK, DK), jnp.float64)
    allowed = jnp.tril(jnp.ones((3, 4), bool), 1)
    out, scores = layer.attend(q, k, v, G, allowed)
    true = jnp.einsum("ihm,hmn,hjn->hij", q, G, k) / math.sqrt(DK)
    np.testing.assert_allclose(scores, true, rtol=1e-13, atol=1e-13)
    out_big, scores_big = layer.attend(q, k, v, 1e30 * G, allowed)
    np.testing.assert_allclose(scores_big, 1e30 * true, rtol=1e-12)
    probs = masked_softmax(1e30 * true, allowed[None])
    expect = layer.dense(jnp.einsum("hij,hjn->ihn", probs, v).reshape(3, -1))
    np.testing.assert_allclose(out_big, expect, rtol=1e-12, atol=1e-12)
