"""Building blocks of PLGA and the PLDR-LLM decoder: biased linear maps, LayerNorm, the
SiLU-gated GLU ("SwiGLU") and the residual SwiGLU metric learner.

Source: Gokden, *Power law graph attention* (2026); PLDR-LLM (arXiv 2410.16703, 2502.13502),
v51 decoder. All modules act on the last axis, so they map rows; leading axes are free.
"""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray


def xavier_uniform(key: PRNGKeyArray, shape: tuple[int, ...], dtype) -> Array:
    """Glorot/Xavier-uniform init on the last two axes `(fan_out, fan_in)` (PyTorch's)."""
    fan_out, fan_in = shape[-2], shape[-1]
    limit = math.sqrt(6.0 / (fan_in + fan_out))
    return jax.random.uniform(key, shape, dtype, -limit, limit)


class Linear(eqx.Module):
    r"""Biased affine map `y = x Wᵀ + b` on the last axis (PyTorch layout: `weight` is `[out, in]`).

    **Arguments (call):** `x` of shape `(..., in)`. **Returns:** `(..., out)`.
    """

    weight: Float[Array, "out in"]
    bias: Float[Array, " out"]

    def __init__(
        self, in_features: int, out_features: int, *, key: PRNGKeyArray, dtype=jnp.float32
    ):
        self.weight = xavier_uniform(key, (out_features, in_features), dtype)
        self.bias = jnp.zeros((out_features,), dtype)

    def __call__(self, x: Float[Array, "... in"]) -> Float[Array, "... out"]:
        return linear(x, self.weight, self.bias)


def linear(x: Float[Array, "... in"], weight: Float[Array, "out in"], bias=None) -> Array:
    """`x Wᵀ + b` for a PyTorch-layout weight `[out, in]`, contracting `x`'s last axis with the
    weight's input axis directly (`einsum "...i,oi->...o"`, one `dot_general`).

    Written as `x @ W.T`, the transpose was materialised as a copy of the whole weight on every
    call by XLA on the CPU (the 32000 × D LM head in every decoded token); the contraction on
    axis 1 reads the weight in place.
    """
    y = jnp.einsum("...i,oi->...o", x, weight)
    return y if bias is None else y + bias


class LayerNorm(eqx.Module):
    r"""LayerNorm over the last axis: `(x − mean)/√(var + eps) · weight + bias` (biased variance).

    **Arguments (call):** `x` of shape `(..., d)`. **Returns:** `(..., d)`.
    """

    weight: Float[Array, " d"]
    bias: Float[Array, " d"]
    eps: float = eqx.field(static=True)

    def __init__(self, d: int, *, eps: float = 1e-6, dtype=jnp.float32):
        self.weight = jnp.ones((d,), dtype)
        self.bias = jnp.zeros((d,), dtype)
        self.eps = eps

    def __call__(self, x: Float[Array, "... d"]) -> Float[Array, "... d"]:
        return layer_norm(x, self.weight, self.bias, self.eps)


def layer_norm(x, weight, bias, eps):
    """LayerNorm statistics in float32 or better (bf16 variances are too coarse); the result
    has `x`'s dtype."""
    dtype = x.dtype
    xf = x.astype(jnp.promote_types(dtype, jnp.float32))
    mean = jnp.mean(xf, axis=-1, keepdims=True)
    xc = xf - mean
    var = jnp.mean(xc * xc, axis=-1, keepdims=True)
    y = xc * jax.lax.rsqrt(var + jnp.asarray(eps, xf.dtype)) * weight + bias
    return y.astype(dtype)


def swiglu(x, w1, b1, w2, b2, w3, b3):
    """`W₃(silu(W₁x + b₁) ⊙ (W₂x + b₂)) + b₃` with PyTorch-layout weights."""
    return linear(jax.nn.silu(linear(x, w1, b1)) * linear(x, w2, b2), w3, b3)


class SwiGLU(eqx.Module):
    r"""SiLU-gated GLU with biases, `d → hidden → d`:
    `W₃(silu(W₁x + b₁) ⊙ (W₂x + b₂)) + b₃` (the PLDR-LLM feed-forward network).

    **Arguments (call):** `x` of shape `(..., d)`. **Returns:** `(..., d)`.
    """

    w1: Linear
    w2: Linear
    w3: Linear

    def __init__(self, d: int, hidden: int, *, key: PRNGKeyArray, dtype=jnp.float32):
        k1, k2, k3 = jax.random.split(key, 3)
        self.w1 = Linear(d, hidden, key=k1, dtype=dtype)
        self.w2 = Linear(d, hidden, key=k2, dtype=dtype)
        self.w3 = Linear(hidden, d, key=k3, dtype=dtype)

    def __call__(self, x: Float[Array, "... d"]) -> Float[Array, "... d"]:
        return swiglu(
            x,
            self.w1.weight,
            self.w1.bias,
            self.w2.weight,
            self.w2.bias,
            self.w3.weight,
            self.w3.bias,
        )


class MetricLearner(eqx.Module):
    r"""The residual SwiGLU metric learner Φ of PLGA, a map `R^{dk} → R^{dk}` applied to every
    row of its input (step 3 of docs/theory/plga.md):

    `num_units` residual units in sequence; unit `r` maps `x ↦ LN_r(x + g_{r,B}(…g_{r,1}(x)))`
    where each `g_{r,j}(y) = W₃(silu(W₁y + b₁) ⊙ (W₂y + b₂)) + b₃` is a GLU block
    `dk → hidden → dk` (post-LN residual, LayerNorm eps `eps`).

    Parameters are stacked over units and blocks (`w1[r, j]` is unit r, block j, `[hidden, dk]`),
    and the units run in a `lax.scan`, so depth does not multiply compile time.

    **Arguments (init):** `dk`, `hidden` (`A_dff`), `num_units` (`num_reslayerA`),
    `num_blocks` (`num_denseA`), `eps`, `key`, `dtype`.

    **Arguments (call):** `x` of shape `(..., dk)` (e.g. the row-normalised Gram,
    `(heads, dk, dk)`).

    **Returns:** `A`, same shape.

    Source: Gokden, PLDR-LLM (arXiv 2410.16703, Sec. 3; 2502.13502), reference v51 `reslayerAs`.
    """

    w1: Float[Array, "units blocks hidden dk"]
    b1: Float[Array, "units blocks hidden"]
    w2: Float[Array, "units blocks hidden dk"]
    b2: Float[Array, "units blocks hidden"]
    w3: Float[Array, "units blocks dk hidden"]
    b3: Float[Array, "units blocks dk"]
    ln_weight: Float[Array, "units dk"]
    ln_bias: Float[Array, "units dk"]
    eps: float = eqx.field(static=True)

    def __init__(
        self,
        dk: int,
        hidden: int,
        num_units: int,
        num_blocks: int,
        *,
        eps: float = 1e-6,
        key: PRNGKeyArray,
        dtype=jnp.float32,
    ):
        if min(dk, hidden, num_units, num_blocks) < 1:
            raise ValueError(
                "MetricLearner needs dk, hidden, num_units, num_blocks ≥ 1, got "
                f"{(dk, hidden, num_units, num_blocks)}."
            )
        k1, k2, k3 = jax.random.split(key, 3)
        ub = (num_units, num_blocks)
        self.w1 = xavier_uniform(k1, ub + (hidden, dk), dtype)
        self.w2 = xavier_uniform(k2, ub + (hidden, dk), dtype)
        self.w3 = xavier_uniform(k3, ub + (dk, hidden), dtype)
        self.b1 = jnp.zeros(ub + (hidden,), dtype)
        self.b2 = jnp.zeros(ub + (hidden,), dtype)
        self.b3 = jnp.zeros(ub + (dk,), dtype)
        self.ln_weight = jnp.ones((num_units, dk), dtype)
        self.ln_bias = jnp.zeros((num_units, dk), dtype)
        self.eps = eps

    @property
    def num_units(self) -> int:
        return self.w1.shape[0]

    @property
    def num_blocks(self) -> int:
        return self.w1.shape[1]

    def __call__(self, x: Float[Array, "... dk"]) -> Float[Array, "... dk"]:
        def unit(h, p):
            w1, b1, w2, b2, w3, b3, lw, lb = p
            r = h
            for j in range(w1.shape[0]):
                r = swiglu(r, w1[j], b1[j], w2[j], b2[j], w3[j], b3[j])
            return layer_norm(h + r, lw, lb, self.eps), None

        params = (
            self.w1,
            self.b1,
            self.w2,
            self.b2,
            self.w3,
            self.b3,
            self.ln_weight,
            self.ln_bias,
        )
        out, _ = jax.lax.scan(unit, x, params)
        return out


_ZERO_NAMES = frozenset({"bias", "b1", "b2", "b3", "b_W", "b_a", "ln_bias"})
_ONE_NAMES = frozenset({"ln_weight"})


def init_params(tree, key: PRNGKeyArray):
    r"""Fill every array of a PLGA/PLDR-LLM module (or a shape-only skeleton from
    `eqx.filter_eval_shape`) with its initial value, using just two random draws.

    Rules (the same distributions as the module constructors): LayerNorm scales 1 and offsets 0;
    biases (`bias`, `b1…b3`, `b_W`, `b_a`) 0; `embedding` N(0, 1); PLGA exponents `P` N(0, 0.1²);
    every other matrix (Linear weights, GLU weights, `W`, `a`) Xavier-uniform on its last two axes.

    One `uniform` and one `normal` call over the concatenated sizes compile in about a second,
    whereas one random call per parameter makes XLA compile for minutes on a small CPU.
    """

    def fix_ln(m):
        if isinstance(m, LayerNorm):
            w, b = m.weight, m.bias
            return eqx.tree_at(
                lambda n: (n.weight, n.bias),
                m,
                (jnp.ones(w.shape, w.dtype), jnp.zeros(b.shape, b.dtype)),
            )
        return m

    tree = jax.tree.map(fix_ln, tree, is_leaf=lambda m: isinstance(m, LayerNorm))
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    plan = []  # (kind, shape, dtype, scale)
    n_uniform = n_normal = 0
    for path, leaf in flat:
        if not isinstance(leaf, jax.ShapeDtypeStruct) and not eqx.is_array(leaf):
            plan.append(None)
            continue
        if eqx.is_array(leaf) and isinstance(leaf, jax.Array) and _is_initialised_ln(path, tree):
            plan.append(None)
            continue
        name = _leaf_name(path)
        shape, dtype = tuple(leaf.shape), leaf.dtype
        size = math.prod(shape)
        if name in _ZERO_NAMES:
            plan.append(("zeros", shape, dtype, 0.0))
        elif name in _ONE_NAMES:
            plan.append(("ones", shape, dtype, 0.0))
        elif name == "embedding":
            plan.append(("normal", shape, dtype, 1.0))
            n_normal += size
        elif name == "P":
            plan.append(("normal", shape, dtype, 0.1))
            n_normal += size
        else:
            fan_out, fan_in = shape[-2], shape[-1]
            plan.append(("uniform", shape, dtype, math.sqrt(6.0 / (fan_in + fan_out))))
            n_uniform += size
    ku, kn = jax.random.split(key)
    uniform = jax.random.uniform(ku, (n_uniform,), jnp.float32, -1.0, 1.0)
    normal = jax.random.normal(kn, (n_normal,), jnp.float32)
    iu = inormal = 0
    out = []
    for (path, leaf), p in zip(flat, plan):
        if p is None:
            out.append(leaf)
            continue
        kind, shape, dtype, scale = p
        size = math.prod(shape)
        if kind == "zeros":
            out.append(jnp.zeros(shape, dtype))
        elif kind == "ones":
            out.append(jnp.ones(shape, dtype))
        elif kind == "uniform":
            out.append((scale * uniform[iu : iu + size]).reshape(shape).astype(dtype))
            iu += size
        else:
            out.append((scale * normal[inormal : inormal + size]).reshape(shape).astype(dtype))
            inormal += size
    return jax.tree_util.tree_unflatten(treedef, out)


def _leaf_name(path) -> str:
    for p in reversed(path):
        if isinstance(p, jax.tree_util.GetAttrKey):
            return p.name
        if isinstance(p, jax.tree_util.DictKey):
            return str(p.key)
    return ""


def _is_initialised_ln(path, tree) -> bool:
    """True for the arrays of LayerNorms (already set to ones/zeros by `fix_ln`)."""
    node = tree
    for p in path[:-1]:
        if isinstance(p, jax.tree_util.GetAttrKey):
            node = getattr(node, p.name)
        elif isinstance(p, jax.tree_util.SequenceKey):
            node = node[p.idx]
        elif isinstance(p, jax.tree_util.DictKey):
            node = node[p.key]
        else:
            return False
    return isinstance(node, LayerNorm)
