r"""Training a PLDR-LLM on text: AdamW with clipping by value, linear warm-up + cosine decay, the
pad-masked cross-entropy, the optional DAG regulariser on the deductive outputs, mixed precision,
checkpoints that resume bit for bit, and a stop on a non-finite loss.

Reference settings (Gokden, PLDR-LLM, arXiv 2410.16703 / 2502.13502; docs/theory/plga.md):
AdamW with
β = (0.9, 0.95), eps 1e-5, weight decay 0.1; gradients clipped by value at 1.0; learning rate rising
linearly from 0 to the peak over the warm-up, then a cosine decay to 10 % of the peak at the last
step.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import pathlib
import time
from collections.abc import Callable
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array, Float, Int

from .._progress import progress_bar
from . import _checkpoint
from ._data import TextData, batch_indices

__all__ = [
    "NonFiniteLossError",
    "TrainConfig",
    "TrainResult",
    "dag_penalty",
    "evaluate",
    "learning_rate_schedule",
    "make_optimizer",
    "masked_cross_entropy",
    "train",
]

_DTYPES = {"float32": jnp.float32, "bf16": jnp.bfloat16, "bfloat16": jnp.bfloat16}
# TrainConfig fields that may change between a run and its resumption without changing the result.
_RESUMABLE_FIELDS = ("checkpoint_every", "eval_every", "keep_checkpoints")


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or infinite; training stopped and nothing was overwritten."""


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of a training run (all saved in every checkpoint's manifest).

    - `steps`: total optimiser steps (sets the schedule); `batch_size`; `seq_len` (tokens per row).
    - `learning_rate`: peak; `warmup_steps`: linear warm-up from 0; `final_lr_fraction`: the cosine
      ends at this fraction of the peak (0.1).
    - `b1, b2, eps, weight_decay`: AdamW (0.9, 0.95, 1e-5, 0.1); `clip_value`: gradient clip by
      value.
    - `dag_coefficients`: weights of the DAG regulariser on `(A_LM, A_P, G_LM)`; zeros switch it
      off.
    - `compute_dtype`: `"float32"` or `"bf16"` (master weights and optimiser state stay float32).
    - `seed`: model initialisation and batch order; `checkpoint_every`, `eval_every` (steps; 0 =
      only at the end); `keep_checkpoints` (keep only the newest K step directories; 0 = all).

    **Raises:** `ValueError` naming the field for a count that is not an integer ≥ 1 (`steps`,
    `batch_size`, `seq_len`) or ≥ 0 (the others), and for a real setting that is NaN, infinite or
    out of range: `learning_rate > 0`, `0 ≤ final_lr_fraction ≤ 1`, `0 ≤ b1, b2 < 1`, `eps > 0`,
    `weight_decay ≥ 0`, `clip_value > 0` (clipping by value at `c ≤ 0` would replace every
    gradient entry by `±c`), `dag_coefficients` three finite numbers ≥ 0.
    """

    steps: int = 300
    batch_size: int = 8
    seq_len: int = 64
    learning_rate: float = 1e-3
    warmup_steps: int = 30
    final_lr_fraction: float = 0.1
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-5
    weight_decay: float = 0.1
    clip_value: float = 1.0
    dag_coefficients: tuple[float, float, float] = (0.0, 0.0, 0.0)
    compute_dtype: Literal["float32", "bf16"] = "float32"
    seed: int = 0
    checkpoint_every: int = 100
    eval_every: int = 100
    keep_checkpoints: int = 0

    def __post_init__(self):
        def integer(name, low):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                if not (isinstance(value, (float, np.floating)) and float(value).is_integer()):
                    raise ValueError(f"TrainConfig.{name} must be an integer, got {value!r}")
            if int(value) < low:
                raise ValueError(f"TrainConfig.{name} must be >= {low}, got {value!r}")
            object.__setattr__(self, name, int(value))

        inf = math.inf

        def real(name, low, high, *, low_open=False, high_open=False):
            value = getattr(self, name)
            try:
                x = float(value)
            except (TypeError, ValueError):
                raise ValueError(f"TrainConfig.{name} must be a number, got {value!r}") from None
            bad = not math.isfinite(x) or x < low or x > high
            bad = bad or (low_open and x == low) or (high_open and x == high)
            if bad:
                lo, hi = "(" if low_open else "[", ")" if high_open or high == inf else "]"
                raise ValueError(
                    f"TrainConfig.{name} must be a finite number in {lo}{low}, {high}{hi}, "
                    f"got {value!r}"
                )
            object.__setattr__(self, name, x)

        for name in ("steps", "batch_size", "seq_len"):
            integer(name, 1)
        for name in ("warmup_steps", "seed", "checkpoint_every", "eval_every", "keep_checkpoints"):
            integer(name, 0)
        real("learning_rate", 0.0, inf, low_open=True)
        real("final_lr_fraction", 0.0, 1.0)
        real("b1", 0.0, 1.0, high_open=True)
        real("b2", 0.0, 1.0, high_open=True)
        real("eps", 0.0, inf, low_open=True)
        real("weight_decay", 0.0, inf)
        # clip by value at c maps every gradient entry into [-c, c]: c <= 0 (or NaN) would turn
        # every gradient into ±c or 0; "no clipping" is a very large c, not inf.
        real("clip_value", 0.0, inf, low_open=True)
        if self.compute_dtype not in _DTYPES:
            raise ValueError(
                f"TrainConfig.compute_dtype must be 'float32' or 'bf16', got {self.compute_dtype!r}"
            )
        try:
            dag = tuple(float(c) for c in self.dag_coefficients)
        except (TypeError, ValueError):
            dag = ()
        if len(dag) != 3 or any(c < 0 or not math.isfinite(c) for c in dag):
            raise ValueError(
                "TrainConfig.dag_coefficients must be three finite numbers >= 0 (A_LM, A_P, G_LM), "
                f"got {self.dag_coefficients!r}"
            )
        object.__setattr__(self, "dag_coefficients", dag)


# -- pieces ----------------------------------------------------------------------------------------


def learning_rate_schedule(
    peak: float, *, warmup_steps: int, total_steps: int, final_fraction: float = 0.1
) -> optax.Schedule:
    r"""`η(t) = peak · t / W` for `t ≤ W`, then
    `η(t) = peak · (f + (1 − f) · (1 + cos(π (t − W)/(T − W))) / 2)` up to `t = T` (and `f · peak`
    after), with `W` = `warmup_steps`, `T` = `total_steps`, `f` = `final_fraction`.

    `t` counts the updates already applied (optax's count, as torch's `LambdaLR`): update `k`
    (1-based) uses `η(k − 1)`, so with a warm-up the first update has rate 0 and the last one
    `η(T − 1)`. A warm-up `W ≥ T` is shortened to `T − 1` (`train` warns). Pinned against this
    formula at `t = 0, 1, W − 1, W, W + 1`, the middle and the end in
    `tests/test_plga_reliability.py`."""
    warmup_steps = min(int(warmup_steps), max(int(total_steps) - 1, 0))
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=peak,
        warmup_steps=warmup_steps,
        decay_steps=max(int(total_steps), warmup_steps + 1),
        end_value=final_fraction * peak,
    )


def make_optimizer(config: TrainConfig) -> optax.GradientTransformation:
    """Gradient clip by value, then AdamW on the schedule of `config`."""
    schedule = learning_rate_schedule(
        config.learning_rate,
        warmup_steps=config.warmup_steps,
        total_steps=config.steps,
        final_fraction=config.final_lr_fraction,
    )
    return optax.chain(
        optax.clip(config.clip_value),
        optax.adamw(
            schedule,
            b1=config.b1,
            b2=config.b2,
            eps=config.eps,
            weight_decay=config.weight_decay,
        ),
    )


def masked_cross_entropy(
    logits: Float[Array, "... seq vocab"], targets: Int[Array, "... seq"], *, pad_id: int
) -> tuple[Float[Array, ""], Float[Array, ""]]:
    r"""Sum over non-pad targets of `−log softmax(logits)[target]`, and the number of such targets.

    The mean loss is `sum / max(count, 1)`; computed in at least float32."""
    dtype = jnp.promote_types(logits.dtype, jnp.float32)
    logits = logits.astype(dtype)
    logz = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    keep = targets != pad_id
    nll = jnp.where(keep, logz - picked, 0.0)
    return nll.sum(), keep.sum().astype(dtype)


_TAYLOR_ORDER = 18  # truncation error < 1/19! ≈ 8e-18 relative at ‖Y‖₁ ≤ 1
_MAX_SQUARINGS = 24  # ‖X‖₁ up to 2^24; beyond, tr exp overflows float32 anyway


def _expm(X: Float[Array, "n n"]) -> Float[Array, "n n"]:
    """`exp(X)` by scaling and squaring with a Horner-form Taylor polynomial: a fixed number of
    small matrix products (cheap to compile, differentiable in reverse mode).

    Used instead of `jax.scipy.linalg.expm` inside the training step: for the gradient of the
    DAG penalty of 8 matrices of 32×32 under `vmap`, the library routine measured 0.39 s per
    call against 0.0085 s for this one on the 2-core CPU (its Padé-degree branches all run
    under `vmap`); both agree to float rounding, as `tests/test_plga_train.py` checks against
    scipy's `expm`."""
    n = X.shape[-1]
    eye = jnp.eye(n, dtype=X.dtype)
    norm = jnp.max(jnp.sum(jnp.abs(X), axis=0))
    s = jnp.clip(jnp.ceil(jnp.log2(jnp.maximum(norm, 1.0))), 0, _MAX_SQUARINGS)
    Y = X / (2.0**s)
    E = eye
    for k in range(_TAYLOR_ORDER, 0, -1):
        E = eye + (Y @ E) / k

    def square(i, E):
        return jnp.where(i < s, E @ E, E)

    return jax.lax.fori_loop(0, _MAX_SQUARINGS, square, E)


def dag_penalty(M: Float[Array, "*batch dk dk"]) -> Float[Array, "*batch"]:
    r"""NOTEARS-style acyclicity measure `|log(tr(exp(M ∘ M)) / dk)|` of each `dk × dk` matrix.

    `tr exp(M∘M) = dk + Σ_k tr((M∘M)^k)/k!` counts weighted closed walks, so the penalty is 0
    exactly when the weighted graph of `M` has no cycle (e.g. `M` strictly triangular, or 0) and
    positive otherwise. Computed in at least float32 (the matrix exponential by scaling and
    squaring)."""
    dk = M.shape[-1]
    dtype = jnp.promote_types(M.dtype, jnp.float32)
    flat = M.astype(dtype).reshape(-1, dk, dk)
    trace = jax.vmap(lambda m: jnp.trace(_expm(m * m)))(flat)
    return jnp.abs(jnp.log(trace / dk)).reshape(M.shape[:-2])


def _cast(tree, dtype):
    return jax.tree.map(
        lambda x: x.astype(dtype) if eqx.is_inexact_array(x) and x.dtype != dtype else x, tree
    )


def _loss(params, static, inputs, targets, *, pad_id, dag_coefficients, compute_dtype):
    model = eqx.combine(params, static)
    if compute_dtype is not None:
        model = _cast(model, compute_dtype)
    logits, deductive = jax.vmap(model)(inputs)
    total, count = masked_cross_entropy(logits, targets, pad_id=pad_id)
    ce = total / jnp.maximum(count, 1.0)
    reg = jnp.zeros((), ce.dtype)
    for coef, name in zip(dag_coefficients, ("A_LM", "A_P", "G_LM")):
        if coef == 0:
            continue
        tensors = [getattr(d, name) for d in deductive]
        if any(t is None for t in tensors):
            raise ValueError(f"dag_coefficients: the model computes no {name} (SDPA or fixed G)")
        penalty = jnp.mean(jnp.stack([jnp.mean(dag_penalty(t)) for t in tensors]))
        reg = reg + coef * penalty.astype(ce.dtype)
    return ce + reg, (ce, reg, count, _overflow_count(deductive))


def _overflow_count(deductive) -> Array:
    """How many (row, layer, head) flags of the deductive outputs say the PLGA score path left the
    dtype's range (`DeductiveOutputs.overflow`; outputs without the flag count 0)."""
    flags = [d.overflow for d in deductive if getattr(d, "overflow", None) is not None]
    return sum((jnp.sum(f.astype(jnp.int32)) for f in flags), jnp.zeros((), jnp.int32))


def _overflow_report(params, static, inputs, compute_dtype) -> str:
    """Where the score path overflowed on this batch (layer, head, largest |G_LM|): one forward
    pass, compiled only when an overflow or a non-finite loss is seen."""
    try:
        from ._attention import format_score_overflow, score_overflow
    except ImportError:  # a model without the PLGA overflow report
        return ""
    model = eqx.combine(params, static)
    if compute_dtype is not None:
        model = _cast(model, compute_dtype)
    try:
        _, deductive = eqx.filter_jit(lambda m, x: jax.vmap(m)(x))(model, inputs)
        return format_score_overflow(score_overflow(deductive)) or ""
    except (ValueError, TypeError, AttributeError):  # deductive outputs of another kind
        return ""


def make_step(optimizer, *, pad_id, dag_coefficients=(0.0, 0.0, 0.0), compute_dtype=None):
    """The jitted training step `(params, static, opt_state, inputs, targets) → (params, opt_state,
    metrics)`. It compiles once per shape: a second trace raises (`eqx.debug.assert_max_traces`)."""

    def step(params, static, opt_state, inputs, targets):
        grad_fn = jax.value_and_grad(_loss, has_aux=True)
        (loss, (ce, reg, count, overflow)), grads = grad_fn(
            params,
            static,
            inputs,
            targets,
            pad_id=pad_id,
            dag_coefficients=dag_coefficients,
            compute_dtype=compute_dtype,
        )
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        metrics = {"loss": loss, "cross_entropy": ce, "dag": reg, "tokens": count}
        return params, opt_state, metrics | {"score_overflow": overflow}

    return eqx.filter_jit(eqx.debug.assert_max_traces(step, max_traces=1))


def make_eval_step(*, pad_id, compute_dtype=None):
    def eval_step(params, static, inputs, targets):
        model = eqx.combine(params, static)
        if compute_dtype is not None:
            model = _cast(model, compute_dtype)
        logits, _ = jax.vmap(model)(inputs)
        return masked_cross_entropy(logits, targets, pad_id=pad_id)

    return eqx.filter_jit(eqx.debug.assert_max_traces(eval_step, max_traces=1))


@functools.lru_cache(maxsize=8)
def _cached_step(settings: TrainConfig, pad_id: int, structure):
    compute_dtype = None if settings.compute_dtype == "float32" else _DTYPES[settings.compute_dtype]
    return make_step(
        make_optimizer(settings),
        pad_id=pad_id,
        dag_coefficients=settings.dag_coefficients,
        compute_dtype=compute_dtype,
    )


@functools.lru_cache(maxsize=8)
def _cached_eval_step(compute_dtype: str, pad_id: int, structure):
    dtype = None if compute_dtype == "float32" else _DTYPES[compute_dtype]
    return make_eval_step(pad_id=pad_id, compute_dtype=dtype)


def evaluate(
    model, blocks: np.ndarray, *, batch_size: int, pad_id: int, eval_step=None, compute_dtype=None
) -> float:
    """Mean cross-entropy (nats/token) of `model` on the rows `blocks` `(n, seq_len + 1)`: inputs
    are the rows without their last token, targets the rows shifted by one; pad targets are
    ignored."""
    if eval_step is None:
        eval_step = make_eval_step(pad_id=pad_id, compute_dtype=compute_dtype)
    params, static = eqx.partition(model, eqx.is_inexact_array)
    total, count = 0.0, 0.0
    for start in range(0, len(blocks), batch_size):
        rows = blocks[start : start + batch_size]
        if len(rows) < batch_size:  # fixed shape: pad with all-pad rows (masked)
            fill = np.full((batch_size - len(rows), rows.shape[1]), pad_id, rows.dtype)
            rows = np.concatenate([rows, fill])
        s, c = eval_step(params, static, jnp.asarray(rows[:, :-1]), jnp.asarray(rows[:, 1:]))
        total += float(s)
        count += float(c)
    return total / max(count, 1.0)


# -- the loop --------------------------------------------------------------------------------------


@dataclasses.dataclass
class TrainResult:
    """What a run produced: the final model, optimiser state and step, the loss history
    `[(step, loss)]`, validation history `[(step, val_loss)]`, and the last checkpoint directory."""

    model: eqx.Module
    opt_state: object
    step: int
    history: list
    val_history: list
    checkpoint: pathlib.Path | None
    seconds: float


def _run_manifest(model, config: TrainConfig, extra, data: TextData | None = None):
    body = {
        "model_config": _checkpoint.config_dict(getattr(model, "config", None)),
        "train_config": _checkpoint.config_dict(config),
        "attention": getattr(model, "attention", None),
    }
    body.update(extra or {})
    if data is not None:
        body["data_sha256"] = data_fingerprint(data)
    return body


def _drop_partial_record(path: pathlib.Path, say) -> None:
    """Mend an unterminated last line of `metrics.jsonl` before appending, or the next record
    would be glued onto it and both lost: a line that is not a record (a write cut short by a
    crash or a kill; its steps are after the last checkpoint, so the resumed run writes them
    again) is cut off, and said; a whole record merely missing its newline (an editor or a
    sync tool stripped it) gets the newline back."""
    if not path.is_file():
        return
    blob = path.read_bytes()
    if not blob or blob.endswith(b"\n"):
        return
    keep = blob.rfind(b"\n") + 1
    try:
        whole = isinstance(json.loads(blob[keep:]), dict)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        whole = False
    if whole:
        with open(path, "ab") as f:
            f.write(b"\n")
        return
    with open(path, "r+b") as f:
        f.truncate(keep)
    say(f"{path}: dropped an unfinished last record ({len(blob) - keep} bytes, cut off mid-write)")


def data_fingerprint(data: TextData) -> str:
    """SHA-256 (hex) of the token rows a run trains and validates on (`data.train`,
    `data.val`, as int32, with their shapes): it changes with the corpus, the tokenizer,
    the validation split and `seq_len`. Recorded in every checkpoint's manifest and
    compared on resume (the saved data position indexes these rows)."""
    h = hashlib.sha256()
    for rows in (data.train, data.val):
        rows = np.ascontiguousarray(np.asarray(rows), dtype=np.int32)
        h.update(repr(rows.shape).encode())
        h.update(rows.tobytes())
    return h.hexdigest()


def _check_same_data(existing, saved: dict, run: dict, allow_changed: bool, say) -> None:
    """Refuse a resume on other data than the checkpoint's (`data_sha256`), unless
    `allow_changed` (then say so); a different tokenizer (`tokenizer_sha256`, recorded by
    the command line) is refused always: its ids name other pieces, so the run's
    embeddings and its saved tokenizer would no longer match. Checkpoints written before
    the data fingerprint was recorded are not compared."""
    tok_then, tok_now = saved.get("tokenizer_sha256"), run.get("tokenizer_sha256")
    if isinstance(tok_then, str) and isinstance(tok_now, str) and tok_then != tok_now:
        raise _checkpoint.CheckpointError(
            f"checkpoint {existing} was trained with another tokenizer (SHA-256 "
            f"{tok_then[:12]}..., now {tok_now[:12]}...): its ids name other pieces, so the "
            "model cannot continue on this one. Resume with the run's own tokenizer (omit "
            "--tokenizer: the run folder keeps a copy as tokenizer.model), or start a new run "
            "in another folder."
        )
    then, now = saved.get("data_sha256"), run.get("data_sha256")
    if not then or then == now:
        return
    what = (
        "other training data (a different corpus, validation split or seq_len: the saved "
        "data position would index other text)"
    )
    if allow_changed:
        say(f"resuming on {what}")
        return
    raise _checkpoint.CheckpointError(
        f"checkpoint {existing} was written on {what}. Resume with the same --text, "
        "--val-fraction and --seq-len, or pass --allow-changed-settings "
        "(train(..., allow_changed_settings=True)) to continue it on these data anyway."
    )


def train(
    model: eqx.Module,
    data: TextData,
    config: TrainConfig,
    *,
    out_dir,
    resume: bool = False,
    stop_after: int | None = None,
    progress: bool = True,
    manifest: dict | None = None,
    log: Callable[[str], None] | None = print,
    allow_changed_settings: bool = False,
) -> TrainResult:
    r"""Train `model` (a freshly initialised one: on `resume` it only gives the structure) on
    `data.train`, evaluating on `data.val`, writing checkpoints to `out_dir`.

    **Arguments:**

    - `model`: an Equinox module mapping ids `(seq,)` to `(logits (seq, vocab), per-layer deductive
      outputs)`, e.g. `PLDRLLM`; its floating leaves are the master weights. Leaves narrower than
      float32 (a model stored in float16 or bfloat16) are trained as float32 master copies with
      float32 optimiser state (Adam's second moments underflow in float16 and updates grow to
      hundreds of times the learning rate); the returned model is then float32. Computation
      runs in `config.compute_dtype`.
    - `data`: a `TextData` (rows of `config.seq_len + 1` tokens).
    - `config`: a `TrainConfig`.
    - `out_dir`: the run directory (see `_checkpoint`).
    - `resume`: continue from the latest checkpoint in `out_dir`, bit for bit as if never stopped
      (a corrupt or truncated newest step falls back to the previous good one, and `log` says
      which). Without it, an `out_dir` that already holds checkpoints is refused (nothing is
      overwritten). A warm-up not shorter than `config.steps` is reported through `log`.
    - `stop_after`: stop (and checkpoint) after this many steps of this call — the schedule still
      runs to `config.steps`; resume later to finish.
    - `allow_changed_settings`: on `resume`, accept training settings that differ from the
      checkpoint's
      (e.g. a lower learning rate after a NaN stop); the run is then no longer the same run.
    - `progress`: show a tqdm bar (loss, tokens/s, ETA); `manifest`: extra JSON for every
      checkpoint;
      `log`: where messages go (`None`: silent).

    **Returns:** a `TrainResult`.

    **Raises:** `ValueError` for data that does not match the config, an existing run without
    `resume`, a refused checkpoint (`CheckpointError`); `NonFiniteLossError` when the loss becomes
    NaN
    or infinite (training stops; checkpoints already written are kept untouched, and the message
    names the step and the last good checkpoint).
    """
    say = log or (lambda _msg: None)
    out_dir = pathlib.Path(out_dir)
    if data.seq_len != config.seq_len or data.train.shape[1] != config.seq_len + 1:
        raise ValueError(
            f"data rows have seq_len {data.seq_len}, TrainConfig.seq_len is {config.seq_len}"
        )
    pad_id = int(data.pad_id)
    if config.warmup_steps >= config.steps and config.steps == 1:
        say(
            f"warning: the warm-up ({config.warmup_steps} steps) is dropped in a run of one "
            "step: its one update uses the peak learning rate"
        )
    elif config.warmup_steps >= config.steps:
        say(
            f"warning: the warm-up ({config.warmup_steps} steps) is not shorter than the run "
            f"({config.steps} steps): the learning rate rises linearly over "
            f"{max(config.steps - 1, 0)} steps, reaches the peak only at the last step and "
            "never decays; use a warm-up well below --steps"
        )

    model, narrow = _float32_master(model)
    if narrow:
        say(
            f"model parameters are {', '.join(narrow)}: training float32 master weights and "
            f"optimiser state (compute dtype {config.compute_dtype}); narrower Adam moments "
            "underflow"
        )
    optimizer = make_optimizer(config)
    params, static = eqx.partition(model, eqx.is_inexact_array)
    opt_state = optimizer.init(params)
    run_manifest = _run_manifest(model, config, manifest, data)

    step, position = 0, 0
    existing = _checkpoint.latest_checkpoint(out_dir)
    if resume:
        if existing is None:
            raise ValueError(f"--resume: {out_dir} holds no checkpoint to resume from")
        existing, note = _checkpoint.usable_checkpoint(out_dir, files=_checkpoint._FILES)
        if note:
            say(note)
        saved_manifest = _checkpoint.read_manifest(existing)
        _check_same_data(existing, saved_manifest, run_manifest, allow_changed_settings, say)
        saved_train = saved_manifest.get("train_config") or {}
        changed = _checkpoint.config_differences(
            saved_train, run_manifest["train_config"], ignore=_RESUMABLE_FIELDS
        )
        if changed and allow_changed_settings:
            say("resuming with changed training settings:\n  " + "\n  ".join(changed))
        elif changed:
            raise _checkpoint.CheckpointError(
                f"checkpoint {existing} was written with other training settings (resuming would "
                "not continue the same run):\n  " + "\n  ".join(changed) + "\nTo continue it "
                "with these settings anyway, pass --allow-changed-settings "
                "(train(..., allow_changed_settings=True))."
            )
        model, opt_state, saved = _checkpoint.load_checkpoint(
            existing,
            like_model=model,
            like_opt_state=opt_state,
            model_config=run_manifest["model_config"],
            train_config=run_manifest["train_config"],
            ignore_train_fields=_RESUMABLE_FIELDS
            + (tuple(saved_train) if allow_changed_settings else ()),
        )
        params, static = eqx.partition(model, eqx.is_inexact_array)
        step, position = int(saved["step"]), int(saved["data_position"])
        say(f"resumed from {existing} (step {step})")
    elif existing is not None:
        raise ValueError(
            f"{out_dir} already holds checkpoints (latest {existing.name}); pass --resume to "
            "continue that run or choose another directory"
        )

    # One compiled step per (settings, model structure, batch shape) in this process: a second
    # train() call of the same run (resume, another seed) reuses it instead of compiling again.
    structure = (
        jax.tree.structure(params),
        tuple((x.shape, str(x.dtype)) for x in jax.tree.leaves(params)),
        (config.batch_size, config.seq_len),
    )
    settings = dataclasses.replace(
        config, seed=0, checkpoint_every=0, eval_every=0, keep_checkpoints=0
    )
    train_step = _cached_step(settings, pad_id, structure)
    eval_step = _cached_eval_step(config.compute_dtype, pad_id, structure)
    log_path = out_dir / "metrics.jsonl"
    out_dir.mkdir(parents=True, exist_ok=True)
    _drop_partial_record(log_path, say)

    def record(entry):
        with open(log_path, "a") as f:
            f.write(json.dumps(entry) + "\n")

    history, val_history = [], []
    last_ckpt = existing if resume else None
    end = config.steps if stop_after is None else min(config.steps, step + int(stop_after))

    def save(metrics=None):
        finite = all(bool(jnp.isfinite(x).all()) for x in jax.tree.leaves(params))
        if not finite:
            raise NonFiniteLossError(
                f"parameters are not finite after step {step}; training stopped and nothing was "
                f"overwritten (last checkpoint: {last_ckpt})"
            )
        m = dict(run_manifest)
        m["metrics"] = metrics or {}
        return _checkpoint.save_checkpoint(
            out_dir,
            step=step,
            data_position=position,
            model=eqx.combine(params, static),
            opt_state=opt_state,
            manifest=m,
            keep=config.keep_checkpoints,
        )

    def validate():
        if len(data.val) == 0:
            return None
        val = evaluate(
            eqx.combine(params, static),
            data.val,
            batch_size=config.batch_size,
            pad_id=pad_id,
            eval_step=eval_step,
        )
        val_history.append((step, val))
        record({"step": step, "val_loss": val, "val_perplexity": math.exp(min(val, 700.0))})
        return val

    bar = None
    if progress:
        bar = progress_bar(
            total=config.steps, initial=step, unit="step", dynamic_ncols=True, leave=True
        )
    t0 = time.perf_counter()
    tokens_seen, last_loss = 0.0, float("nan")
    overflow_steps = 0
    compute_dtype = None if config.compute_dtype == "float32" else _DTYPES[config.compute_dtype]
    try:
        while step < end:
            idx = batch_indices(len(data.train), config.batch_size, position, config.seed)
            rows = data.train[idx]
            inputs, targets = jnp.asarray(rows[:, :-1]), jnp.asarray(rows[:, 1:])
            new_params, new_opt_state, metrics = train_step(
                params, static, opt_state, inputs, targets
            )
            loss = float(metrics["loss"])
            overflow = int(metrics["score_overflow"])
            report = ""
            if overflow and (overflow_steps == 0 or not math.isfinite(loss)):
                report = (
                    f"the PLGA score path overflowed in {overflow} (row, layer, head) of the "
                    f"batch of step {step + 1}. "
                    + _overflow_report(params, static, inputs, compute_dtype)
                ).rstrip()
                if math.isfinite(loss):
                    say(f"warning: {report} (steps with an overflow are counted in "
                        "metrics.jsonl, score_overflow)")  # fmt: skip
            overflow_steps += bool(overflow)
            if not math.isfinite(loss):
                where = (
                    f"the last good checkpoint is {last_ckpt} (step {_step_of(last_ckpt)})"
                    if last_ckpt is not None
                    else "no checkpoint had been written yet"
                )
                raise NonFiniteLossError(
                    f"training loss is {loss} at step {step + 1} (computed from the parameters "
                    f"after step {step}); training stopped and nothing was overwritten: {where}. "
                    "Lower the learning rate or lengthen the warm-up, then resume "
                    "(--allow-changed-settings)." + (f" Why: {report}" if report else "")
                )
            params, opt_state = new_params, new_opt_state
            step += 1
            position += config.batch_size
            tokens_seen += float(metrics["tokens"])
            last_loss = loss
            history.append((step, loss))
            record(
                {
                    "step": step,
                    "loss": loss,
                    "cross_entropy": float(metrics["cross_entropy"]),
                    "dag": float(metrics["dag"]),
                    "score_overflow": overflow,
                }
            )
            if bar is not None:
                elapsed = max(time.perf_counter() - t0, 1e-9)
                # shown by the update's redraw, at the bar's pace (a log's too)
                bar.set_postfix(
                    loss=f"{loss:.3f}", tok_s=f"{tokens_seen / elapsed:.0f}", refresh=False
                )
                bar.update(1)
            done = step == end
            if config.eval_every and step % config.eval_every == 0 and not done:
                val = validate()
                if val is not None:
                    say(f"step {step}: validation loss {val:.4f} (perplexity {math.exp(val):.1f})")
            if config.checkpoint_every and step % config.checkpoint_every == 0 and not done:
                last_ckpt = save({"loss": loss})
    except KeyboardInterrupt:
        if bar is not None:
            bar.close()
        last_ckpt = save({"loss": last_loss, "interrupted": True})
        say(f"interrupted at step {step}: saved {last_ckpt}; continue with --resume")
        raise
    finally:
        if bar is not None:
            bar.close()

    if overflow_steps:
        say(
            f"warning: the PLGA score path overflowed in {overflow_steps} of the steps of this "
            "call (metrics.jsonl: score_overflow)"
        )
    val = validate() if step == end else None
    metrics = {"loss": last_loss}
    if val is not None:
        metrics.update(val_loss=val, val_perplexity=math.exp(min(val, 700.0)))
        say(f"step {step}: validation loss {val:.4f} (perplexity {math.exp(val):.1f})")
    if last_ckpt is None or _step_of(last_ckpt) != step:
        last_ckpt = save(metrics)
    seconds = time.perf_counter() - t0
    say(f"saved {last_ckpt}")
    return TrainResult(
        model=eqx.combine(params, static),
        opt_state=opt_state,
        step=step,
        history=history,
        val_history=val_history,
        checkpoint=last_ckpt,
        seconds=seconds,
    )


def _float32_master(model):
    """`(model, names)`: floating leaves narrower than float32 (float16, bfloat16) cast to float32
    master copies, and the names of the dtypes that were cast (empty: unchanged)."""
    narrow = sorted(
        {
            jnp.dtype(x.dtype).name
            for x in jax.tree.leaves(model)
            if eqx.is_inexact_array(x) and jnp.finfo(x.dtype).bits < 32
        }
    )
    if narrow:
        model = jax.tree.map(
            lambda x: (
                x.astype(jnp.float32)
                if eqx.is_inexact_array(x) and jnp.finfo(x.dtype).bits < 32
                else x
            ),
            model,
        )
    return model, narrow


def _step_of(path) -> int:
    return int(pathlib.Path(path).name.split("_")[-1])
