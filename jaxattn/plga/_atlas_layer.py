"""The shipped trained PLGA layer: the last layer of a tiny PLDR-LLM trained on the packaged
corpus by `experiments/train_atlas_model.py`, reduced to what its particle flows need.

File format (`jaxattn/data/atlas_tiny_plga.npz`, read with `allow_pickle=False`):

- `meta`: a JSON string: `format`, `version`, `layer` (index in the model), `layer_config`
  (the `PowerLawGraphAttention` sizes and constants) and `provenance` (how it was made);
- `attn<path>`: every array leaf of the layer's `PowerLawGraphAttention` under its
  `jax.tree_util.keystr` path (`attn.wq.weight`, `attn.metric_learner.w1`, …), float32 as
  trained;
- `G` `(heads, dk, dk)`: the collapsed energy-curvature tensor (mean `G_LM` over held-out
  prompts); `beta` `()`: `r²`, the mean squared norm of the layer's input tokens there;
- `x_probe` `(16, D)`: the layer's input tokens on the first held-out prompt;
- `input_ln_weight`, `input_ln_bias` `(D,)`: the LayerNorm that produced the layer's input
  (the previous layer's `ln2`), whose gain sets the scale `r` and hence `β`.

`jaxattn/data/atlas_tiny_plga.json` beside it repeats the provenance and adds the file's
SHA-256 (see `jaxattn/data/NOTICE.md`).
"""

from __future__ import annotations

import json
import os
import pathlib
import zipfile
from importlib import resources

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._npz import load_npz
from ._attention import PowerLawGraphAttention
from ._operator_flow import TrainedOperator, operator_of_attention

__all__ = ["AtlasLayerError", "TrainedLayer", "load_atlas_layer", "save_atlas_layer"]

FORMAT = "jaxattn.plga.atlas_layer"
FORMAT_VERSION = 1
DEFAULT_FILE = "atlas_tiny_plga.npz"
_LAYER_CONFIG = (
    "d_model",
    "num_heads",
    "head_dim",
    "A_dff",
    "num_reslayerA",
    "num_denseA",
    "rope_base",
    "rope",
    "layer_norm_eps",
    "epsilon",
    "causal_density",
)


class AtlasLayerError(ValueError):
    """A trained-layer file that cannot be used (corrupt, truncated, wrong shapes, non-finite)."""


class TrainedLayer(eqx.Module):
    r"""One trained PLGA layer and what its flows need (`load_atlas_layer`).

    **Fields:** `attn` (the `PowerLawGraphAttention`), `G` `(heads, dk, dk)` (collapsed
    `G_LM`), `beta` (`r²`), `x_probe` `(probe, D)` (real input tokens of the layer),
    `input_ln_weight`, `input_ln_bias` `(D,)`; static `layer` (its index in the model) and
    `meta` (the file's JSON metadata, a string; `info` parses it).

    - `operator()`: the `TrainedOperator` `A_h = W_{q,h}ᵀ G_h W_{k,h}/√dk`,
      `V_h = W_{o,h} W_{v,h}`, `β = r²` (see `trained_operator`);
    - `plga_flow(...)`: `PLGAFlow.from_layer(attn, ...)`, the flow whose bilinear form the
      layer's metric learner regenerates from the tokens' own density operator.
    """

    attn: PowerLawGraphAttention
    G: Float[Array, "heads dk dk"]
    beta: Float[Array, ""]
    x_probe: Float[Array, "probe D"]
    input_ln_weight: Float[Array, " D"]
    input_ln_bias: Float[Array, " D"]
    layer: int = eqx.field(static=True)
    meta: str = eqx.field(static=True)

    @property
    def info(self) -> dict:
        """The file's metadata: `format`, `version`, `layer`, `layer_config`, `provenance`."""
        return json.loads(self.meta)

    def operator(self) -> TrainedOperator:
        """The layer's attention as particle-flow matrices (see `trained_operator`)."""
        return operator_of_attention(self.attn, self.G, beta=self.beta, layer=self.layer)

    def plga_flow(self, *, heads=None, V=None, beta=None, causal=False, normalisation="post_ln"):
        """`jaxattn.dynamics.PLGAFlow.from_layer(self.attn, ...)` (tokens in `S^{dk−1}`;
        `V` defaults to the identity, `beta` to `1/√dk`)."""
        from ..dynamics import PLGAFlow

        return PLGAFlow.from_layer(
            self.attn, heads=heads, V=V, beta=beta, causal=causal, normalisation=normalisation
        )


def _skeleton(cfg: dict) -> PowerLawGraphAttention:
    c = {k: cfg[k] for k in _LAYER_CONFIG}
    return eqx.filter_eval_shape(
        lambda: PowerLawGraphAttention(
            c["d_model"],
            c["num_heads"],
            c["head_dim"],
            c["A_dff"],
            c["num_reslayerA"],
            c["num_denseA"],
            rope_base=c["rope_base"],
            rope=c["rope"],
            layer_norm_eps=c["layer_norm_eps"],
            epsilon=c["epsilon"],
            causal_density=c["causal_density"],
            key=jax.random.key(0),
            dtype=jnp.float32,
        )
    )


def _layer_config(attn: PowerLawGraphAttention) -> dict:
    D = attn.wq.weight.shape[1]
    A_dff = attn.metric_learner.w1.shape[-2]
    units, blocks = attn.metric_learner.w1.shape[:2]
    return dict(
        d_model=int(D),
        num_heads=attn.num_heads,
        head_dim=attn.head_dim,
        A_dff=int(A_dff),
        num_reslayerA=int(units),
        num_denseA=int(blocks),
        rope_base=attn.rope_base,
        rope=attn.rope,
        layer_norm_eps=float(attn.gram_norm.eps),
        epsilon=attn.epsilon,
        causal_density=attn.causal_density,
    )


def _leaves(tree, prefix="attn"):
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return [
        (prefix + jax.tree_util.keystr(path), leaf)
        for path, leaf in flat
        if isinstance(leaf, (jax.Array, jax.ShapeDtypeStruct, np.ndarray))
    ]


def save_atlas_layer(
    path, *, attn, G, beta, x_probe, input_ln, provenance: dict, layer: int | None = None
) -> pathlib.Path:
    """Write a trained PLGA layer in the format above and the provenance JSON beside it
    (`path` with suffix `.json`, with the `.npz`'s SHA-256 added). `layer` defaults to
    `provenance["layer"]`. Returns the `.npz` path."""
    from ._data import sha256_file

    if attn.attention != "plga":
        raise ValueError("save_atlas_layer: the layer must be a PLGA layer (not SDPA).")
    path = pathlib.Path(path)
    layer = int(provenance["layer"] if layer is None else layer)
    meta = dict(
        format=FORMAT,
        version=FORMAT_VERSION,
        layer=layer,
        layer_config=_layer_config(attn),
        provenance=provenance,
    )
    arrays = {name: np.asarray(leaf) for name, leaf in _leaves(attn)}
    arrays.update(
        G=np.asarray(G, np.float64),
        beta=np.asarray(beta, np.float64),
        x_probe=np.asarray(x_probe, np.float64),
        input_ln_weight=np.asarray(input_ln[0]),
        input_ln_bias=np.asarray(input_ln[1]),
        meta=np.asarray(json.dumps(meta, sort_keys=True)),
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez_compressed(tmp, **arrays)
    os.replace(tmp, path)
    record = dict(provenance, sha256=sha256_file(path), bytes=path.stat().st_size)
    path.with_suffix(".json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return path


def _fail(path, why: str):
    raise AtlasLayerError(f"trained PLGA layer {path}: {why}")


def load_atlas_layer(path: str | os.PathLike | None = None, *, dtype=None) -> TrainedLayer:
    """Load the trained PLGA layer shipped for the atlas (or another file of the same
    format, see the module docstring): the last layer of a tiny PLDR-LLM (4 heads, dk = 32,
    D = 128) trained on the packaged corpus by `experiments/train_atlas_model.py`.

    **Arguments:** `path` (default `jaxattn/data/atlas_tiny_plga.npz`); `dtype` of the
    returned arrays (default JAX's default float: float64 under `jax_enable_x64`).

    **Returns:** a `TrainedLayer` (`.operator()`, `.plga_flow()`, `.info`).

    **Raises:** `FileNotFoundError` (one line naming the file) for a missing file;
    `AtlasLayerError` (a `ValueError`, one line naming the file) for a file that is not a
    readable `.npz` of this format, misses an array, holds an array of the wrong shape
    (checked against the layer rebuilt from its own `layer_config`) or a non-finite entry,
    or a `beta ≤ 0`.

    Source: the layer is PLGA (Gokden, *Power law graph attention*, 2026; PLDR-LLM, arXiv
    2410.16703); the flows: Geshkovski et al., arXiv 2312.10794.
    """
    if path is None:
        ref = resources.files("jaxattn.data") / DEFAULT_FILE
        with resources.as_file(ref) as p:
            return load_atlas_layer(p, dtype=dtype)
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"trained PLGA layer {path}: no such file")
    try:
        arrays = load_npz(path)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as err:
        _fail(path, f"not a readable .npz ({type(err).__name__}: {str(err).splitlines()[0]})")
    try:
        meta = json.loads(str(arrays["meta"]))
        cfg = meta["layer_config"]
        layer = int(meta["layer"])
    except (KeyError, TypeError, ValueError) as err:
        _fail(path, f"no usable `meta` record ({type(err).__name__}: {err})")
    if meta.get("format") != FORMAT or meta.get("version") != FORMAT_VERSION:
        _fail(path, f"format {meta.get('format')!r} v{meta.get('version')}, expected {FORMAT} "
              f"v{FORMAT_VERSION}")  # fmt: skip
    try:
        like = _skeleton(cfg)
    except (KeyError, TypeError, ValueError) as err:
        _fail(path, f"bad layer_config ({type(err).__name__}: {err})")
    H, dk, D = cfg["num_heads"], cfg["head_dim"], cfg["d_model"]
    expected = {name: tuple(leaf.shape) for name, leaf in _leaves(like)}
    expected.update(G=(H, dk, dk), beta=(), input_ln_weight=(D,), input_ln_bias=(D,))
    for name, shape in expected.items():
        if name not in arrays:
            _fail(path, f"array {name!r} is missing")
        if arrays[name].shape != shape:
            _fail(path, f"array {name!r} has shape {arrays[name].shape}, expected {shape}")
    if "x_probe" not in arrays or arrays["x_probe"].ndim != 2 or arrays["x_probe"].shape[1] != D:
        _fail(path, f"array 'x_probe' missing or not of shape (probe, {D})")
    for name in [*expected, "x_probe"]:
        a = arrays[name]
        if not np.issubdtype(a.dtype, np.floating):
            _fail(path, f"array {name!r} has dtype {a.dtype}, expected a float")
        if not np.all(np.isfinite(a)):
            _fail(path, f"array {name!r} has {int(np.sum(~np.isfinite(a)))} non-finite entries")
    if not float(arrays["beta"]) > 0:
        _fail(path, f"beta must be > 0, got {float(arrays['beta'])}")
    dtype = jnp.result_type(float) if dtype is None else dtype
    cast = lambda a: jnp.asarray(a, dtype)
    attn = jax.tree_util.tree_map_with_path(
        lambda p, leaf: (
            cast(arrays["attn" + jax.tree_util.keystr(p)])
            if isinstance(leaf, jax.ShapeDtypeStruct)
            else leaf
        ),
        like,
    )
    return TrainedLayer(
        attn=attn,
        G=cast(arrays["G"]),
        beta=cast(arrays["beta"]),
        x_probe=cast(arrays["x_probe"]),
        input_ln_weight=cast(arrays["input_ln_weight"]),
        input_ln_bias=cast(arrays["input_ln_bias"]),
        layer=layer,
        meta=json.dumps(meta, sort_keys=True),
    )
