"""Training checkpoints: Equinox leaf serialisation of the model and the optimiser state, with a
JSON manifest (format version, step, data position, model and training configuration, SHA-256 and
size of every file, and the path, shape and dtype of every serialised leaf).

Layout of a run directory:

    DIR/tokenizer.model              the SentencePiece model the run used (copied once)
    DIR/step_00000100/model.eqx      eqx.tree_serialise_leaves(model)
    DIR/step_00000100/opt_state.eqx  eqx.tree_serialise_leaves(optimiser state)
    DIR/step_00000100/manifest.json  written last; a step directory appears atomically (rename)

Loading checks the manifest, the file hashes and sizes, the configuration and the leaf records
before any bytes are deserialised, so a corrupt, truncated or mismatched checkpoint is refused with
a message naming what is wrong. Equinox serialises leaves in flattening order and checks only
shapes and dtypes: two fields of equal shape that a code change reorders (or renames) would load
swapped without the recorded leaf paths. `usable_checkpoint` falls back past a corrupt newest
step to the newest one that passes these checks. No pickle anywhere.
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
import jax
import numpy as np

from .._warn import warn_at_caller

__all__ = [
    "CheckpointError",
    "FORMAT",
    "FORMAT_VERSION",
    "checkpoint_dirs",
    "latest_checkpoint",
    "leaf_records",
    "load_checkpoint",
    "load_model",
    "read_manifest",
    "save_checkpoint",
    "usable_checkpoint",
]

FORMAT = "jaxattn.plga.checkpoint"
FORMAT_VERSION = 2  # 2: per-leaf records (path, shape, dtype) of both files
_READABLE_VERSIONS = (1, 2)  # version 1 has no leaf records: loaded with a warning
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


def leaf_records(tree) -> list[dict]:
    """`[{"path", "shape", "dtype"}]` for every leaf that `eqx.tree_serialise_leaves` writes
    (arrays, NumPy scalars and Python numbers), in serialisation order. `jax.ShapeDtypeStruct`
    leaves (an `eqx.filter_eval_shape` skeleton) count as arrays."""
    out = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if isinstance(leaf, (jax.Array, jax.ShapeDtypeStruct, np.ndarray, np.generic)):
            shape, dtype = list(np.shape(leaf)), np.dtype(leaf.dtype).name
        elif isinstance(leaf, (bool, int, float, complex)):
            shape, dtype = [], type(leaf).__name__
        else:
            continue  # not serialised by Equinox
        out.append({"path": jax.tree_util.keystr(path), "shape": shape, "dtype": dtype})
    return out


def _leaf_differences(saved: list, expected: list) -> list[str]:
    lines = []
    if len(saved) != len(expected):
        lines.append(f"{len(saved)} leaves on disk, {len(expected)} expected")
    for i, (a, b) in enumerate(zip(saved, expected)):
        if a != b:
            lines.append(
                f"leaf {i}: on disk {a['path']} {a['dtype']}{tuple(a['shape'])}, expected "
                f"{b['path']} {b['dtype']}{tuple(b['shape'])}"
            )
    paths_a = {r["path"] for r in saved}
    paths_b = {r["path"] for r in expected}
    lines += [f"expected leaf {p} is not on disk" for p in sorted(paths_b - paths_a)[:5]]
    lines += [f"leaf {p} on disk is not expected" for p in sorted(paths_a - paths_b)[:5]]
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
        leaves={"model.eqx": leaf_records(model), "opt_state.eqx": leaf_records(opt_state)},
    )
    body.pop("manifest_sha256", None)
    body["manifest_sha256"] = _manifest_digest(body)
    (tmp / "manifest.json").write_text(json.dumps(body, indent=2, sort_keys=True))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    if keep > 0:
        for old in checkpoint_dirs(run_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def _manifest_digest(body: dict) -> str:
    """SHA-256 (hex) of a manifest's fields other than `manifest_sha256`, as canonical JSON
    (sorted keys, no spaces): what the manifest records of itself."""
    rest = {k: v for k, v in body.items() if k != "manifest_sha256"}
    return hashlib.sha256(
        json.dumps(rest, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


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
    if manifest.get("format_version") not in _READABLE_VERSIONS:
        raise CheckpointError(
            f"checkpoint {path}: format version {manifest.get('format_version')!r}; this jaxattn "
            f"reads versions {', '.join(map(str, _READABLE_VERSIONS))}"
        )
    # Written since 2026-12-08: the manifest's own hash (configurations, step, data position).
    # An older manifest has none; its step and data position are still checked by type.
    if "manifest_sha256" in manifest and manifest["manifest_sha256"] != _manifest_digest(manifest):
        raise CheckpointError(
            f"checkpoint {path}: manifest.json was edited (its SHA-256 differs from the one it "
            "records); its configurations, step or data position can no longer be trusted"
        )
    for key in ("step", "data_position"):
        value = manifest.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise CheckpointError(
                f"checkpoint {path}: manifest.json field {key!r} must be an integer >= 0, got "
                f"{value!r}"
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


def usable_checkpoint(
    path: str | os.PathLike, *, files=("model.eqx",)
) -> tuple[pathlib.Path, str | None]:
    """The step directory to load from `path`, after checking its manifest and the SHA-256 and
    size of `files`.

    A step directory is used as given (a corrupt one is refused). For a run directory, the newest
    step that passes the checks is used: a corrupt or truncated newest step (a crash while copying,
    a full disk) falls back to the previous good one.

    **Returns:** `(step_dir, note)`; `note` is `None`, or one line saying which newer steps were
    skipped and why, and which step is used.

    **Raises:** `FileNotFoundError` for a missing path; `CheckpointError` when no step passes
    (the message gives the newest step's problem).
    """
    path = pathlib.Path(path)
    if (path / "manifest.json").exists() or _STEP_DIR.match(path.name):
        verify_files(path, read_manifest(path), files)
        return path, None
    if not path.exists():
        raise FileNotFoundError(f"checkpoint: no such directory: {path}")
    dirs = checkpoint_dirs(path)
    if not dirs:
        raise CheckpointError(f"checkpoint: {path} holds no checkpoint (no step_* directory)")
    skipped = []
    for step_dir in reversed(dirs):
        try:
            manifest = read_manifest(step_dir)
            verify_files(step_dir, manifest, files)
        except CheckpointError as err:
            skipped.append((step_dir, str(err).removeprefix(f"checkpoint {step_dir}: ")))
            continue
        if not skipped:
            return step_dir, None
        why = "; ".join(f"{d.name}: {reason}" for d, reason in skipped)
        note = f"using checkpoint {step_dir.name} (step {manifest['step']}); skipped unusable {why}"
        return step_dir, note
    newest, reason = skipped[0]
    message = f"checkpoint {newest}: {reason}"
    if len(skipped) > 1:
        earlier = "; ".join(f"{d.name}: {r}" for d, r in skipped[1:4])
        message += f" (and no earlier step is usable: {earlier})"
    raise CheckpointError(message)


def _deserialise(path: pathlib.Path, name: str, like, manifest: dict):
    saved = (manifest.get("leaves") or {}).get(name)
    if saved is None:
        warn_at_caller(
            f"checkpoint {path}: format version {manifest.get('format_version')} records no leaf "
            f"paths; {name} is loaded by leaf order and shape only"
        )
    else:
        diff = _leaf_differences(saved, leaf_records(like))
        if diff:
            raise CheckpointError(
                f"checkpoint {path}: {name} holds other leaves than expected (written by another "
                "version of the code or for another structure):\n  " + "\n  ".join(diff[:10])
            )
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
    model = _deserialise(path, "model.eqx", like_model, manifest)
    opt_state = None
    if like_opt_state is not None:
        opt_state = _deserialise(path, "opt_state.eqx", like_opt_state, manifest)
    return model, opt_state, manifest


def load_model(path: str | os.PathLike, *, dtype=None):
    """A `PLDRLLM` from a training checkpoint (a step directory, or a run directory: its newest
    usable step, see `usable_checkpoint`), with its manifest. `dtype` casts the float32 master
    weights (e.g. `jnp.float64` for audits).

    **Returns:** `(model, manifest)`; `manifest["fallback"]` is `None`, or the line saying which
    newer, unusable steps of a run directory were skipped.

    **Raises:** `CheckpointError` when no step is usable or the checkpoint does not fit.
    """
    import jax.numpy as jnp

    from ._model import PLDRLLM, PLDRLLMConfig

    step_dir, note = usable_checkpoint(path)
    manifest = read_manifest(step_dir)
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
    manifest["fallback"] = note
    if dtype is not None:
        model = jax.tree.map(lambda x: x.astype(dtype) if eqx.is_inexact_array(x) else x, model)
    return model, manifest
