"""A trained PLGA layer's attention as a particle flow in its own residual-stream dimension.

Per head `h` of layer `l` (weights in the PyTorch layout `[out, in]`, head `h` owning rows
`h·dk … (h+1)·dk − 1` of the query, key and value maps and the same columns of the output map):

- `A_h = W_{q,h}ᵀ G_h W_{k,h} / √dk` (`D × D`): the score `q̃ G k̃ᵀ/√dk` of two residual-stream
  tokens `x_i, x_j` is `x_iᵀ A_h x_j` once the biases and RoPE are dropped;
- `V_h = W_{o,h} W_{v,h}` (`D × D`): the head's block of the output map times its value map;
- `β = r²`, with `r` the RMS norm of the layer's input tokens on the given prompts (the flow's
  tokens are unit vectors `θ = x/r`, so `x_iᵀ A x_j = r² θ_iᵀ A θ_j`); `r = √D` without prompts
  (a LayerNorm with unit gain).

Dropped, exactly: the query/key/value/output biases; RoPE (for a `G_h` in the RoPE commutant it
folds into the query map and only adds a position-dependent rotation, otherwise it is simply
left out); the causal mask (every token attends to every other); the LayerNorm gains and
offsets around the layer (post-LN is modelled by the projection onto the sphere); the
feed-forward network and the other layers. `G_h` is the collapsed energy-curvature tensor:
the mean of `G_LM` over the prompts, or one you pass.

The heads of a layer are summed (`MultiHeadDynamics`, Karagodin et al., arXiv 2510.22026) or
taken one at a time (`AttentionDynamics`, softmax kernel; Geshkovski et al., arXiv
2312.10794, eq. (1.1)).
"""

from __future__ import annotations

import math
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Int

__all__ = [
    "TrainedOperator",
    "operator_of_attention",
    "trained_operator",
    "trained_operator_flow",
    "operator_regimes",
]


class TrainedOperator(eqx.Module):
    """The particle-flow matrices of one trained PLGA layer (see the module docstring).

    - `A` `(heads, D, D)`: `W_{q,h}ᵀ G_h W_{k,h}/√dk`;
    - `V` `(heads, D, D)`: `W_{o,h} W_{v,h}`;
    - `G` `(heads, dk, dk)`: the `G_h` used;
    - `beta`: `r²` (scalar);
    - `layer` (static).
    """

    A: Float[Array, "heads D D"]
    V: Float[Array, "heads D D"]
    G: Float[Array, "heads dk dk"]
    beta: Float[Array, ""]
    layer: int = eqx.field(static=True)

    def flow(
        self,
        *,
        head: int | None = None,
        kernel: str = "sa",
        beta=None,
        causal: bool = False,
        normalisation: str = "post_ln",
    ):
        """The operator as a flow on `S^{D−1}`: all heads summed (`MultiHeadDynamics`,
        `head=None`) or head `head` alone (`AttentionDynamics`); `beta` defaults to `r²`.

        **Raises:** `ValueError` for a head out of range.
        """
        b = self.beta if beta is None else beta
        kw = dict(beta=b, kernel=kernel, causal=causal, normalisation=normalisation)
        if head is None:
            from ..dynamics import MultiHeadDynamics

            return MultiHeadDynamics(self.A, self.V, **kw)
        from ..dynamics import AttentionDynamics

        H = self.A.shape[0]
        if not 0 <= int(head) < H:
            raise ValueError(f"trained_operator_flow: `head` must be in [0, {H}), got {head}.")
        return AttentionDynamics(self.A[int(head)], self.V[int(head)], **kw)


def operator_of_attention(attn, G, *, beta, layer: int = 0) -> TrainedOperator:
    """The flow matrices of one `PowerLawGraphAttention` layer with a given collapsed `G`
    `(heads, dk, dk)` and `β` (module docstring): `A_h = W_{q,h}ᵀ G_h W_{k,h}/√dk`,
    `V_h = W_{o,h} W_{v,h}`, in the wider of the weights' and `G`'s dtypes (at least the
    default float).

    **Raises:** `ValueError` for a `G` of the wrong shape.
    """
    H, dk = attn.num_heads, attn.head_dim
    D = attn.wq.weight.shape[1]
    G = jnp.asarray(G)
    if G.shape != (H, dk, dk):
        raise ValueError(f"trained_operator: `G` must have shape {(H, dk, dk)}, got {G.shape}.")
    dtype = jnp.result_type(attn.wq.weight.dtype, G.dtype, float)
    Wq = attn.wq.weight.astype(dtype).reshape(H, dk, D)
    Wk = attn.wk.weight.astype(dtype).reshape(H, dk, D)
    Wv = attn.wv.weight.astype(dtype).reshape(H, dk, D)
    Wo = jnp.moveaxis(attn.dense.weight.astype(dtype).reshape(D, H, dk), 1, 0)  # (H, D, dk)
    A = jnp.einsum("hmi,hmn,hnj->hij", Wq, G.astype(dtype), Wk) / math.sqrt(dk)
    V = jnp.einsum("hik,hkj->hij", Wo, Wv)
    return TrainedOperator(
        A=A, V=V, G=G.astype(dtype), beta=jnp.asarray(beta, dtype), layer=int(layer)
    )


@eqx.filter_jit
def _layer_input_and_G(model, ids, layer):
    """The input tokens of `layer` (all prompts, `(prompts, seq, D)`) and its `G_LM` per
    prompt `(prompts, heads, dk, dk)` (the last position's with a causal density operator)."""

    def one(i):
        seq = i.shape[0]
        allowed = jnp.tril(jnp.ones((seq, seq), bool)) & (i != model.config.pad_id)[None]
        head = eqx.tree_at(lambda m: m.layers, model, model.layers[:layer])
        x = model.embed(i)
        if layer:
            x, _, _ = head.run_layers(
                x, allowed=allowed, positions=jnp.arange(seq), G=[None] * layer
            )
        one_layer = eqx.tree_at(lambda m: m.layers, model, [model.layers[layer]])
        _, ded, _ = one_layer.run_layers(x, allowed=allowed, positions=jnp.arange(seq), G=[None])
        g = ded[0].G_LM
        if g is None:  # an SDPA layer
            return x, None
        return x, g[-1] if g.ndim == 4 else g

    return jax.vmap(one)(ids)


def trained_operator(
    model,
    layer: int,
    *,
    ids: Int[ArrayLike, "prompts seq"] | None = None,
    G: Float[ArrayLike, "heads dk dk"] | None = None,
) -> TrainedOperator:
    """The flow matrices `A_h, V_h, β` of one layer of a PLDR-LLM (module docstring).

    **Arguments:** `model` (a `PLDRLLM`); `layer` index; `ids` `(prompts, seq)`: prompts whose
    mean `G_LM` is used as the collapsed `G_h` and whose layer-input RMS norm sets `β`; `G`
    `(heads, dk, dk)`: use this `G_h` instead (then `ids`, if given, only sets `β`). One of
    `ids` and `G` is needed for a PLGA layer; an SDPA layer uses `G = I`.

    **Returns:** a `TrainedOperator`.

    **Raises:** `ValueError` for a layer out of range, a wrongly shaped `G` or `ids`, or a PLGA
    layer with neither `ids` nor `G`.

    Source: Gokden, PLGA (2026) (the layer); the flow: Geshkovski et al., arXiv 2312.10794.
    """
    from ._audits import _check_batch_ids

    L = model.config.num_layers
    if not 0 <= int(layer) < L:
        raise ValueError(f"trained_operator: `layer` must be in [0, {L}), got {layer}.")
    layer = int(layer)
    attn = model.layers[layer].attn
    H, dk = attn.num_heads, attn.head_dim
    D = attn.wq.weight.shape[1]
    r2 = None
    if ids is not None:
        ids = _check_batch_ids(model, ids, "trained_operator")
        x, g = _layer_input_and_G(model, ids, layer)
        r2 = jnp.mean(jnp.sum(jnp.square(x.astype(jnp.result_type(float))), axis=-1))
        if G is None and g is not None:
            G = jnp.mean(g, axis=0)
    if G is None:
        if attn.attention == "sdpa":
            G = jnp.broadcast_to(jnp.eye(dk), (H, dk, dk))
        else:
            raise ValueError("trained_operator: give `ids` (prompts) or `G` for a PLGA layer.")
    return operator_of_attention(attn, G, beta=D if r2 is None else r2, layer=layer)


def trained_operator_flow(
    model,
    layer: int,
    *,
    ids=None,
    G=None,
    head: int | None = None,
    kernel: str = "sa",
    beta=None,
):
    """The trained layer's attention as a flow on `S^{D−1}`: all heads summed
    (`MultiHeadDynamics`, `head=None`) or head `head` alone (`AttentionDynamics`).

    **Arguments:** as `trained_operator`; `head`; `kernel` (`"sa"`: the model's softmax);
    `beta` (default the operator's `r²`).

    **Returns:** a flow module (the flow protocol of `jaxattn.dynamics.simulate`).

    **Raises:** `ValueError` as `trained_operator`, or for a head out of range.
    """
    return trained_operator(model, layer, ids=ids, G=G).flow(head=head, kernel=kernel, beta=beta)


def operator_regimes(
    models: dict,
    layer: int,
    *,
    ids: Int[ArrayLike, "prompts seq"] | None = None,
    inits: int = 8,
    n: int = 32,
    t1: float = 50.0,
    num_save: int = 101,
    heads: bool = True,
    kernel: str = "sa",
    rtol: float = 1e-6,
    atol: float = 1e-8,
    max_steps: int = 16384,
) -> dict:
    """Regimes of trained operators' flows over random initial tokens, e.g. early vs late in
    training: for each model, the summed-heads flow and (with `heads`) every head alone are
    run from `inits` sets of `n` tokens uniform on `S^{D−1}` (seeds `0 … inits−1`) to
    `t1` in the flow's natural time, and classified (`jaxattn.dynamics.sweep`).

    **Arguments:** `models` `{label: PLDRLLM or TrainedOperator}` (checkpoints, or operators
    already built, e.g. `jaxattn.plga.load_atlas_layer().operator()`); `layer` (of the
    models; a `TrainedOperator` keeps its own); `ids` the prompts that give `G_h` and `β`
    (needed for a `PLDRLLM`); `inits`, `n`, `t1`, `num_save`; `heads`; `kernel`; solver
    `rtol`, `atol`, `max_steps`.

    **Returns:** `{"layer", "n", "inits", "t1", "checkpoints": [{"label", "beta", "flows":
    {name: {"regimes": [REGIME_NAMES or "failed"], "fractions": {name: fraction},
    "failed": int, "num_clusters_median", "final_gap_median", "final_motion_median" (the
    classifier's evidence, median over the inits), "A_norm": ‖A‖₂, "V_norm": ‖V‖₂}}}]}` with
    flow names `"heads summed"`
    (norms of `Σ_h A_h`, `Σ_h V_h`), `"head 0"`, … (plain Python, for JSON and
    `jaxattn.plot.plot_operator_regimes`). `regimes` are `REGIME_NAMES` entries, `"failed"`
    for a member the solver could not finish (not counted in `fractions`).

    **Raises:** `ValueError` for a `PLDRLLM` without `ids` (see `trained_operator`).
    """
    from ..dynamics import REGIME_NAMES, Integration, Judge, Members, Runner, sweep

    out = {
        "layer": int(layer),
        "n": int(n),
        "inits": int(inits),
        "t1": float(t1),
        "checkpoints": [],
    }
    seeds = np.arange(int(inits))
    for label, model in models.items():
        if isinstance(model, TrainedOperator):
            op = model
        else:
            if ids is None:
                raise ValueError(
                    f"operator_regimes: model {label!r} is not a TrainedOperator; give `ids` "
                    "(the prompts that set its G and β)."
                )
            op = trained_operator(model, layer, ids=ids)
        flows = {"heads summed": op.flow(kernel=kernel)}
        if heads:
            for h in range(op.A.shape[0]):
                flows[f"head {h}"] = op.flow(head=h, kernel=kernel)
        entry = {"label": str(label), "beta": float(op.beta), "flows": {}}
        for name, flow in flows.items():
            with warnings.catch_warnings():
                # Its table reports the undetermined fraction itself.
                warnings.filterwarnings("ignore", message="sweep: every one of .* undetermined")
                res = sweep(
                    Members(flow, seeds=seeds, n=int(n), init="uniform", batched=False),
                    integration=Integration(
                        float(t1), int(num_save), rtol=rtol, atol=atol, max_steps=int(max_steps)
                    ),
                    judge=Judge(),
                    runner=Runner(chunk_size=None, progress=False),
                )
            names = [
                REGIME_NAMES[c] if 0 <= c < len(REGIME_NAMES) else "failed"
                for c in np.asarray(res.regime).tolist()
            ]
            ok = [r for r, f in zip(names, np.asarray(res.failed)) if not f]
            fractions = {r: ok.count(r) / max(len(names), 1) for r in dict.fromkeys(ok)}
            A = op.A.sum(0) if name == "heads summed" else op.A[int(name.split()[1])]
            V = op.V.sum(0) if name == "heads summed" else op.V[int(name.split()[1])]
            ev = {k: np.asarray(v, dtype=float) for k, v in res.evidence.items()}
            med = lambda k: float(np.nanmedian(ev[k])) if np.any(np.isfinite(ev[k])) else None
            entry["flows"][name] = {
                "regimes": names,
                "fractions": fractions,
                "failed": int(np.sum(res.failed)),
                "num_clusters_median": med("num_clusters"),
                "final_gap_median": med("final_gap"),
                "final_motion_median": med("final_motion"),
                "A_norm": float(jnp.linalg.norm(A, ord=2)),
                "V_norm": float(jnp.linalg.norm(V, ord=2)),
            }
        out["checkpoints"].append(entry)
    return out
