"""Training checkpoints: Equinox leaf serialisation of the model and the optimiser state, with a
JSON manifest (format version, step, data position, model and training configuration, SHA-256 and
size of every file).

Layout of a run directory:

    DIR/tokenizer.model              the SentencePiece model the run used (copied once)
    DIR/step_00000100/model.eqx      eqx.tree_serialise_leaves(model)
    DIR/step_00000100/opt_state.eqx  eqx.tree_serialise_leaves(optimiser state)
    DIR/step_00000100/manifest.json  written last; a step directory appears atomically (rename)

Loading checks the manifest, the file hashes and sizes, and the configuration before any bytes are
deserialised, so a corrupt, truncated or mismatched checkpoint is refused with a message naming
what is
wrong. No pickle anywhere.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import re
import shutil
import time
from typing import Any

import equinox as eqx

__all__ = [
    "CheckpointError",
    "FORMAT",
    "FORMAT_VERSION",
    "checkpoint_dirs",
    "latest_checkpoint",
    "load_checkpoint",
    "load_model",
    "read_manifest",
    "save_checkpoint",
]

FORMAT = "jaxattn.plga.checkpoint"
FORMAT_VERSION = 1
_STEP_DIR = re.compile(r"^step_(\d{8,})$")
_FILES = ("model.eqx", "opt_state.eqx")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: missing, corrupt, truncated, or written for another
    configuration."""


def _sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def config_dict(config) -> dict | None:
    """A JSON-able dict of a dataclass configuration (None stays None)."""
    if config is None:
        return None
    if dataclasses.is_dataclass(config):
        config = dataclasses.asdict(config)
    return json.loads(json.dumps(config))


def config_differences(saved: dict | None, current: dict | None, *, ignore=()) -> list[str]:
    """Human-readable `field: saved → current` lines for the fields that differ."""
    saved, current = saved or {}, current or {}
    lines = []
    for name in sorted(set(saved) | set(current)):
        if name in ignore:
            continue
        a, b = saved.get(name, "<absent>"), current.get(name, "<absent>")
        if a != b:
            lines.append(f"{name}: checkpoint {a!r}, this run {b!r}")
    return lines


def checkpoint_dirs(run_dir: str | os.PathLike) -> list[pathlib.Path]:
    """The step directories of a run, oldest first (incomplete temporary directories excluded)."""
    run_dir = pathlib.Path(run_dir)
    if not run_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in run_dir.iterdir() if (m := _STEP_DIR.match(p.name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(run_dir: str | os.PathLike) -> pathlib.Path | None:
    dirs = checkpoint_dirs(run_dir)
    return dirs[-1] if dirs else None


def resolve(path: str | os.PathLike) -> pathlib.Path:
    """A step directory from either a step directory or a run directory (its latest step)."""
    path = pathlib.Path(path)
    if (path / "manifest.json").exists() or _STEP_DIR.match(path.name):
        return path
    if not path.exists():
        raise FileNotFoundError(f"checkpoint: no such directory: {path}")
    latest = latest_checkpoint(path)
    if latest is None:
        raise CheckpointError(f"checkpoint: {path} holds no checkpoint (no step_* directory)")
    return latest


def save_checkpoint(
    run_dir: str | os.PathLike,
    *,
    step: int,
    data_position: int,
    model,
    opt_state,
    manifest: dict[str, Any] | None = None,
    keep: int = 0,
) -> pathlib.Path:
    """Write `run_dir/step_{step:08d}` atomically and return it. `manifest` holds extra JSON fields
    (configurations, metrics). `keep > 0` removes all but the newest `keep` step directories."""
    run_dir = pathlib.Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    final = run_dir / f"step_{int(step):08d}"
    tmp = run_dir / f".{final.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    eqx.tree_serialise_leaves(tmp / "model.eqx", model)
    eqx.tree_serialise_leaves(tmp / "opt_state.eqx", opt_state)
    body = dict(manifest or {})
    body.update(
        format=FORMAT,
        format_version=FORMAT_VERSION,
        step=int(step),
        data_position=int(data_position),
        created_unix=time.time(),
        files={
            name: {"sha256": _sha256(tmp / name), "bytes": (tmp / name).stat().st_size}
            for name in _FILES
        },
    )
    (tmp / "manifest.json").write_text(json.dumps(body, indent=2, sort_keys=True))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    if keep > 0:
        for old in checkpoint_dirs(run_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def read_manifest(path: str | os.PathLike) -> dict:
    """The manifest of a step directory (or of the latest step of a run directory), checked for
    format
    and version. **Raises:** `CheckpointError` for a missing or unreadable manifest."""
    path = resolve(path)
    mpath = path / "manifest.json"
    if not mpath.is_file():
        raise CheckpointError(
            f"checkpoint {path}: no manifest.json (incomplete or not a checkpoint)"
        )
    try:
        manifest = json.loads(mpath.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"checkpoint {path}: manifest.json is corrupt ({err})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path}: manifest.json is not a {FORMAT} manifest")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {path}: format version {manifest.get('format_version')!r}; this jaxattn "
            f"reads version {FORMAT_VERSION}"
        )
    manifest["path"] = str(path)
    return manifest


def verify_files(path: pathlib.Path, manifest: dict, names=_FILES) -> None:
    """Check size and SHA-256 of the named files against the manifest."""
    files = manifest.get("files", {})
    for name in names:
        f = path / name
        if name not in files:
            raise CheckpointError(f"checkpoint {path}: manifest lists no {name}")
        if not f.is_file():
            raise CheckpointError(f"checkpoint {path}: {name} is missing")
        size = f.stat().st_size
        if size != files[name]["bytes"]:
            raise CheckpointError(
                f"checkpoint {path}: {name} is truncated or altered ({size} bytes, manifest says "
                f"{files[name]['bytes']})"
            )
        if _sha256(f) != files[name]["sha256"]:
            raise CheckpointError(
                f"checkpoint {path}: {name} is corrupt (SHA-256 differs from the manifest)"
            )


def _deserialise(path: pathlib.Path, name: str, like):
    try:
        return eqx.tree_deserialise_leaves(path / name, like)
    except Exception as err:  # shapes/dtypes of another structure
        raise CheckpointError(
            f"checkpoint {path}: {name} does not fit the expected structure ({type(err).__name__}: "
            f"{err})"
        ) from None


def load_checkpoint(
    path: str | os.PathLike,
    *,
    like_model,
    like_opt_state=None,
    model_config: dict | None = None,
    train_config: dict | None = None,
    ignore_train_fields=(),
):
    """Load model (and optimiser state, when `like_opt_state` is given) from a step directory or the
    latest step of a run directory.

    `model_config` / `train_config`, when given, must equal the manifest's (fields named in
    `ignore_train_fields` may differ); otherwise the checkpoint is refused, naming the fields.

    **Returns:** `(model, opt_state or None, manifest)`.

    **Raises:** `CheckpointError` (a `ValueError`) for anything unusable.
    """
    manifest = read_manifest(path)
    path = pathlib.Path(manifest["path"])
    if model_config is not None:
        diff = config_differences(manifest.get("model_config"), model_config)
        if diff:
            raise CheckpointError(
                f"checkpoint {path} was written for another model configuration:\n  "
                + "\n  ".join(diff)
            )
    if train_config is not None:
        diff = config_differences(
            manifest.get("train_config"), train_config, ignore=ignore_train_fields
        )
        if diff:
            raise CheckpointError(
                f"checkpoint {path} was written with other training settings (resuming would not "
                "continue the same run):\n  " + "\n  ".join(diff)
            )
    names = _FILES if like_opt_state is not None else ("model.eqx",)
    verify_files(path, manifest, names)
    model = _deserialise(path, "model.eqx", like_model)
    opt_state = None
    if like_opt_state is not None:
        opt_state = _deserialise(path, "opt_state.eqx", like_opt_state)
    return model, opt_state, manifest


def load_model(path: str | os.PathLike, *, dtype=None):
    """A `PLDRLLM` from a training checkpoint (step directory, or run directory = latest step),
    with its
    manifest. `dtype` casts the float32 master weights (e.g. `jnp.float64` for audits).

    **Returns:** `(model, manifest)`.
    """
    import jax
    import jax.numpy as jnp

    from ._model import PLDRLLM, PLDRLLMConfig

    manifest = read_manifest(path)
    cfg = manifest.get("model_config")
    if not cfg:
        raise CheckpointError(f"checkpoint {manifest['path']}: manifest has no model_config")
    try:
        config = PLDRLLMConfig(**cfg)
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"checkpoint {manifest['path']}: bad model_config ({err})") from None
    attention = manifest.get("attention") or "plga"
    like = eqx.filter_eval_shape(
        lambda: PLDRLLM(config, key=jax.random.key(0), dtype=jnp.float32, attention=attention)
    )
    model, _, manifest = load_checkpoint(manifest["path"], like_model=like)
    if dtype is not None:
        model = jax.tree.map(lambda x: x.astype(dtype) if eqx.is_inexact_array(x) else x, model)
    return model, manifest
