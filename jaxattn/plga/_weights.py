"""Import/export of PLDR-LLM weights in the reference (PyTorch state-dict) layout.

Formats: `.npz` (read with `allow_pickle=False`) and `.safetensors`, or any mapping from key to
array. Never pickle. Keys and layouts are those of the reference v510 implementation
(`burcgokden/PLDR-LLM-with-KVG-cache`), listed in tests/fixtures/README.md.
"""

import dataclasses
import json
import os
import re
from collections.abc import Callable, Mapping

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._npz import load_npz
from ._model import PLDRLLM, PLDRLLMConfig, check_float_dtype

_CONFIG_FIELDS = tuple(f.name for f in dataclasses.fields(PLDRLLMConfig))
_METADATA_KEY = "jaxattn_config"
_DEFAULT_CONTEXT = 1024  # PLDR-LLM v51; not recoverable from the weights


def _entries(config: PLDRLLMConfig, attention: str) -> list[tuple[Callable, object]]:
    """`(getter(model) -> leaf, keys)` pairs; `keys` is a key, or a nested list of keys that is
    stacked into the leaf (metric-learner parameters are stacked over units and blocks)."""
    c = config
    out: list[tuple[Callable, object]] = [
        (lambda m: m.embedding, "decoder.embedding.weight"),
        (lambda m: m.emb_norm.weight, "decoder.layernorm1.weight"),
        (lambda m: m.emb_norm.bias, "decoder.layernorm1.bias"),
    ]
    for li in range(c.num_layers):
        p = f"decoder.dec_layers.{li}."
        L = lambda m, li=li: m.layers[li]
        for ours, theirs in (("wq", "wq"), ("wk", "wk"), ("wv", "wv"), ("dense", "dense")):
            for wb in ("weight", "bias"):
                out.append(
                    (
                        lambda m, L=L, o=ours, wb=wb: getattr(getattr(L(m).attn, o), wb),
                        f"{p}mha1.{theirs}.{wb}",
                    )
                )
        if attention == "plga":
            for wb in ("weight", "bias"):
                out.append(
                    (
                        lambda m, L=L, wb=wb: getattr(L(m).attn.gram_norm, wb),
                        f"{p}mha1.layernorm1.{wb}",
                    )
                )
            U, B = range(c.num_reslayerA), range(c.num_denseA)
            for n in (1, 2, 3):
                for wb, short in (("weight", "w"), ("bias", "b")):
                    keys = [
                        [f"{p}mha1.reslayerAs.{r}.denseAs.{j}.gluw{n}.{wb}" for j in B] for r in U
                    ]
                    out.append(
                        (lambda m, L=L, f=f"{short}{n}": getattr(L(m).attn.metric_learner, f), keys)
                    )
            for wb in ("weight", "bias"):
                keys = [f"{p}mha1.reslayerAs.{r}.layernormA.{wb}" for r in U]
                out.append(
                    (lambda m, L=L, wb=wb: getattr(L(m).attn.metric_learner, f"ln_{wb}"), keys)
                )
            for ours, theirs in (
                ("W", "Wlst"),
                ("b_W", "blst"),
                ("P", "pwlst"),
                ("a", "alst"),
                ("b_a", "balst"),
            ):
                out.append(
                    (lambda m, L=L, o=ours: getattr(L(m).attn, o), f"{p}mha1.plgatt_layer.{theirs}")
                )
        for n in (1, 2, 3):
            for wb in ("weight", "bias"):
                out.append(
                    (
                        lambda m, L=L, n=n, wb=wb: getattr(getattr(L(m).ffn, f"w{n}"), wb),
                        f"{p}ffn.gluw{n}.{wb}",
                    )
                )
        for n in (1, 2):
            for wb in ("weight", "bias"):
                out.append(
                    (
                        lambda m, L=L, n=n, wb=wb: getattr(getattr(L(m), f"ln{n}"), wb),
                        f"{p}layernorm{n}.{wb}",
                    )
                )
    out += [
        (lambda m: m.final_layer.weight, "final_layer.weight"),
        (lambda m: m.final_layer.bias, "final_layer.bias"),
    ]
    return out


def _flat_keys(keys) -> list[str]:
    if isinstance(keys, str):
        return [keys]
    return [k for sub in keys for k in _flat_keys(sub)]


def _stack(keys, weights: Mapping[str, np.ndarray]) -> np.ndarray:
    if isinstance(keys, str):
        return np.asarray(weights[keys])
    return np.stack([_stack(k, weights) for k in keys])


def _read(source) -> tuple[dict[str, np.ndarray], dict]:
    """Return (weights, config hints) from a path or a mapping."""
    hints: dict = {}
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if not path.endswith((".safetensors", ".npz")):
            raise ValueError(f"Weights file {path!r} must end in .safetensors or .npz.")
        if not os.path.exists(path):
            raise FileNotFoundError(f"No weights file at {path!r}.")
        if path.endswith(".safetensors"):
            from safetensors import safe_open

            raw = {}
            try:
                with safe_open(path, framework="np") as f:
                    meta = f.metadata() or {}
                    for k in f.keys():
                        raw[k] = f.get_tensor(k)
            except Exception as err:  # safetensors raises its own error types
                raise ValueError(f"{path!r} is not a readable safetensors file: {err}") from err
            if _METADATA_KEY in meta:
                hints.update(json.loads(meta[_METADATA_KEY]))
        elif path.endswith(".npz"):
            try:
                raw = load_npz(path)
            except Exception as err:
                raise ValueError(
                    f"{path!r} is not a readable npz file (pickle is never used): {err}"
                ) from err
    elif isinstance(source, Mapping):
        raw = {str(k): np.asarray(v) for k, v in source.items()}
    else:
        raise ValueError(
            "`source` must be a path (.npz/.safetensors) or a mapping, got "
            f"{type(source).__name__}."
        )
    if "keys" in raw and raw["keys"].dtype.kind == "U":
        # The fixture convention: `keys` lists the state-dict entries; everything else (inputs,
        # outputs, config scalars) is not a weight.
        names = [str(k) for k in raw["keys"]]
        missing = [k for k in names if k not in raw]
        if missing:
            raise ValueError(f"Weights listed in `keys` but absent: {missing[:10]}.")
        weights = {k: raw[k] for k in names}
        others = {k: v for k, v in raw.items() if k not in weights}
    else:
        weights = {k: v for k, v in raw.items() if k not in _CONFIG_FIELDS}
        others = {k: v for k, v in raw.items() if k in _CONFIG_FIELDS}
    for name in _CONFIG_FIELDS:
        if name in others and np.ndim(others[name]) == 0:
            hints.setdefault(name, others[name].item())
    return weights, hints


def infer_config(weights: Mapping[str, np.ndarray], **hints) -> PLDRLLMConfig:
    """Infer a `PLDRLLMConfig` from reference-layout weight shapes (`hints` fill the constants
    that shapes cannot give: `context_length` defaults to 1024, the others to the config
    defaults). Raises `ValueError` naming a missing key needed for the inference."""

    def shape(key):
        if key not in weights:
            raise ValueError(f"Cannot infer the config: weight {key!r} is missing.")
        return np.shape(weights[key])

    vocab, D = shape("decoder.embedding.weight")
    layers = {
        int(m.group(1)) for k in weights if (m := re.match(r"decoder\.dec_layers\.(\d+)\.", k))
    }
    if not layers:
        raise ValueError("Cannot infer the config: no 'decoder.dec_layers.{l}.' weights.")
    H, dk, _ = shape("decoder.dec_layers.0.mha1.plgatt_layer.Wlst")
    dff = shape("decoder.dec_layers.0.ffn.gluw1.weight")[0]
    A_dff = shape("decoder.dec_layers.0.mha1.reslayerAs.0.denseAs.0.gluw1.weight")[0]
    units = {
        int(m.group(1))
        for k in weights
        if (m := re.match(r"decoder\.dec_layers\.0\.mha1\.reslayerAs\.(\d+)\.", k))
    }
    blocks = {
        int(m.group(1))
        for k in weights
        if (m := re.match(r"decoder\.dec_layers\.0\.mha1\.reslayerAs\.0\.denseAs\.(\d+)\.", k))
    }
    kwargs = dict(
        vocab_size=vocab,
        d_model=D,
        num_layers=max(layers) + 1,
        num_heads=H,
        head_dim=dk,
        dff=dff,
        A_dff=A_dff,
        num_reslayerA=max(units) + 1,
        num_denseA=max(blocks) + 1,
        context_length=_DEFAULT_CONTEXT,
    )
    clash = [
        f"{name}={hints[name]!r} (the shapes give {kwargs[name]})"
        for name in kwargs
        if name != "context_length" and name in hints and hints[name] != kwargs[name]
    ]
    if clash:
        raise ValueError(
            "The stored configuration contradicts the weights' shapes: "
            + ", ".join(clash)
            + "; the file is inconsistent (pass `config` to choose one explicitly)."
        )
    for name in (
        "context_length",
        "rope_base",
        "layer_norm_eps",
        "epsilon",
        "pad_id",
        "rope",
        "causal_density",
    ):
        if name in hints:
            kwargs[name] = hints[name]
    return PLDRLLMConfig(**kwargs)


def from_reference(
    source, config: PLDRLLMConfig | None = None, *, dtype=None, attention="plga"
) -> PLDRLLM:
    r"""Build a `PLDRLLM` from weights in the reference PyTorch state-dict layout.

    **Arguments:**

    - `source`: a `.npz` or `.safetensors` path, or a mapping key → array, keyed as the reference
      `state_dict` (e.g. `decoder.dec_layers.0.mha1.plgatt_layer.Wlst`; Linear weights `[out, in]`).
      If the source has a string array `keys` (the fixture convention), only the entries it lists
      are weights; 0-d entries named like config fields (and the safetensors metadata written by
      `save_reference`) are read as configuration.
    - `config`: the configuration; inferred from the shapes when `None`.
    - `dtype`: parameter dtype; default the stored dtype (as canonicalised by JAX).
    - `attention`: `"plga"`, or `"sdpa"` to load only the SDPA part (PLGA keys ignored).

    **Returns:** the model.

    **Raises:** `ValueError` naming missing, unexpected or mis-shaped keys, keys holding NaN or
    infinite entries (or entries that overflow `dtype`), complex ones or strings, a stored
    configuration that contradicts the weights' shapes, a `dtype` that is not a
    real float type (or, without `dtype`, integer weights), an unreadable file or an unknown
    suffix;
    `FileNotFoundError` for a missing path.
    """
    if dtype is not None:
        dtype = check_float_dtype(dtype, "from_reference")
    weights, hints = _read(source)
    if config is None:
        config = infer_config(weights, **hints)
    entries = _entries(config, attention)
    expected = {k for _, keys in entries for k in _flat_keys(keys)}
    missing = sorted(expected - set(weights))
    extra = set(weights) - expected
    if attention == "sdpa":
        extra = {
            k for k in extra if not re.search(r"\.mha1\.(plgatt_layer|reslayerAs|layernorm1)\.", k)
        }
    extra = sorted(extra)
    skeleton = eqx.filter_eval_shape(
        lambda: PLDRLLM(
            config,
            key=jax.random.key(0),
            attention=attention,
            dtype=jnp.float32 if dtype is None else dtype,
        )
    )
    misshaped = []
    for getter, keys in entries:
        target = getter(skeleton).shape
        inner = target
        k = keys
        while not isinstance(k, str):
            inner = inner[1:]
            k = k[0]
        for key in _flat_keys(keys):
            if key in weights and tuple(np.shape(weights[key])) != tuple(inner):
                misshaped.append(
                    f"{key}: got {tuple(np.shape(weights[key]))}, expected {tuple(inner)}"
                )
    problems = []
    if missing:
        problems.append(f"missing keys ({len(missing)}): {missing[:10]}")
    if extra:
        problems.append(f"unexpected keys ({len(extra)}): {extra[:10]}")
    if misshaped:
        problems.append(f"mis-shaped keys ({len(misshaped)}): {misshaped[:10]}")
    if problems:
        raise ValueError(
            "Weights do not match the reference layout for this config: " + "; ".join(problems)
        )
    for key in sorted(expected):
        kind = np.asarray(weights[key]).dtype
        if kind.kind in "USO":
            raise ValueError(
                f"Weights must be numbers: {key!r} holds {kind.name} entries (strings or "
                "objects), not an array of floats."
            )
        if kind.kind == "c":
            raise ValueError(
                f"Weights must be real: {key!r} holds {kind.name} entries (cast them to "
                "a real float dtype; the imaginary part has no meaning in the model)."
            )
    _check_finite(weights, expected)
    if dtype is None:
        dtype = jnp.asarray(weights["decoder.embedding.weight"][:1]).dtype
        if not jnp.issubdtype(dtype, jnp.floating):
            raise ValueError(
                f"from_reference: the stored weights are {jnp.dtype(dtype).name} "
                "('decoder.embedding.weight'); pass a float `dtype` to load them."
            )
    with np.errstate(over="ignore"):  # an overflowing cast is reported below, by key
        values = [jnp.asarray(_stack(keys, weights), dtype) for _, keys in entries]
    for (_, keys), value in zip(entries, values):
        if not bool(jnp.isfinite(value).all()):
            raise ValueError(
                f"Weights overflow {jnp.dtype(dtype).name}: {_flat_keys(keys)[0]!r} (or a key "
                f"stacked with it) has entries beyond its range; load in a wider `dtype`."
            )
    getters = [g for g, _ in entries]
    model = eqx.filter_eval_shape(
        lambda: PLDRLLM(config, key=jax.random.key(0), attention=attention, dtype=dtype)
    )
    return eqx.tree_at(lambda m: [g(m) for g in getters], model, values)


def _check_finite(weights: Mapping[str, np.ndarray], keys) -> None:
    """Refuse NaN or infinite weights, naming the keys (a single one makes every logit NaN)."""
    bad = []
    for key in sorted(keys):
        w = np.asarray(weights[key])
        if w.dtype.kind not in "fc":  # ints/bools are finite; ml_dtypes (bf16) have kind 'V'
            if w.dtype.kind in "iub":
                continue
            w = w.astype(np.float32)
        finite = np.isfinite(w)
        if not finite.all():
            where = tuple(int(i) for i in np.argwhere(~finite)[0])
            bad.append(f"{key} ({int((~finite).sum())} entries, first {w[where]} at {where})")
    if bad:
        raise ValueError(
            f"Weights are not finite (NaN or inf) in {len(bad)} key(s): " + "; ".join(bad[:10])
        )


def _unstack(keys, value: np.ndarray, out: dict) -> None:
    if isinstance(keys, str):
        out[keys] = np.ascontiguousarray(value)
    else:
        for k, v in zip(keys, value):
            _unstack(k, v, out)


def reference_keys(config: PLDRLLMConfig, attention: str = "plga") -> list[str]:
    """The reference state-dict keys for `config`, in the reference's `state_dict()` order."""
    c = config
    keys = ["decoder.embedding.weight"]
    wb = ("weight", "bias")
    for li in range(c.num_layers):
        p = f"decoder.dec_layers.{li}."
        keys += [f"{p}mha1.{n}.{x}" for n in ("wq", "wk", "wv") for x in wb]
        if attention == "plga":
            keys += [
                f"{p}mha1.plgatt_layer.{n}" for n in ("Wlst", "blst", "pwlst", "alst", "balst")
            ]
        keys += [f"{p}mha1.dense.{x}" for x in wb]
        if attention == "plga":
            for r in range(c.num_reslayerA):
                for j in range(c.num_denseA):
                    keys += [
                        f"{p}mha1.reslayerAs.{r}.denseAs.{j}.gluw{n}.{x}"
                        for n in (1, 2, 3)
                        for x in wb
                    ]
                keys += [f"{p}mha1.reslayerAs.{r}.layernormA.{x}" for x in wb]
            keys += [f"{p}mha1.layernorm1.{x}" for x in wb]
        keys += [f"{p}ffn.gluw{n}.{x}" for n in (1, 2, 3) for x in wb]
        keys += [f"{p}layernorm{n}.{x}" for n in (1, 2) for x in wb]
    keys += [f"decoder.layernorm1.{x}" for x in wb] + [f"final_layer.{x}" for x in wb]
    return keys


def to_reference(model: PLDRLLM) -> dict[str, np.ndarray]:
    """The model's weights as a reference-layout state dict `{key: numpy array}`, in the
    reference's `state_dict()` order; the inverse of `from_reference`."""
    out: dict[str, np.ndarray] = {}
    for getter, keys in _entries(model.config, model.attention):
        _unstack(keys, np.asarray(getter(model)), out)
    order = reference_keys(model.config, model.attention)
    assert set(order) == set(out)
    return {k: out[k] for k in order}


def save_reference(model: PLDRLLM, path) -> None:
    """Write the weights in the reference layout to `path` (`.safetensors` or `.npz`), with the
    config (safetensors metadata / 0-d npz entries plus the `keys` list), so that
    `PLDRLLM.from_reference(path)` rebuilds the same model.

    **Raises:** `ValueError` for another suffix, or for weights holding NaN or infinite entries
    (naming the keys; `from_reference` would refuse the file), before anything is written."""
    path = os.fspath(path)
    if not (path.endswith(".safetensors") or path.endswith(".npz")):
        raise ValueError(f"`path` must end in .safetensors or .npz, got {path!r}.")
    weights = to_reference(model)
    try:
        _check_finite(weights, weights)
    except ValueError as err:
        raise ValueError(f"save_reference: {err}; nothing written to {path!r}.") from None
    cfg = dataclasses.asdict(model.config)
    if path.endswith(".safetensors"):
        from safetensors.numpy import save_file

        save_file(weights, path, metadata={_METADATA_KEY: json.dumps(cfg)})
    else:  # .npz (the suffix was checked first)
        extra = {k: np.asarray(v) for k, v in cfg.items()}
        np.savez(path, keys=np.asarray(list(weights)), **weights, **extra)
