"""`jaxattn plga train` and `jaxattn plga generate` (and `plga audit`, registered by its own
module).

Heavy imports (JAX, the model) happen only when a sub-command runs."""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import shutil
import sys

from .._cli_args import check_out_folder, seed

TRAIN_EPILOG = """\
examples:
  jaxattn plga train --out runs/tiny                       # tiny config on the packaged corpus
  jaxattn plga train --out runs/mine --text a.txt b.txt --steps 2000 --lr 1e-3 --warmup 200
  jaxattn plga train --out runs/tiny --resume              # continue the latest checkpoint
  jaxattn plga train --out runs/x --set d_model=64 --set num_layers=1 --steps 20

Text files are UTF-8; blank lines separate documents. Each document gets EOS appended (no BOS);
documents are packed into rows of seq_len + 1 tokens. The last --val-fraction of the rows is
held out and reported as validation loss / perplexity. A checkpoint is written every --ckpt-every
steps and at the end (its size is printed; --keep-last K keeps only the newest K); a NaN loss
stops the run and keeps the checkpoints already written; Ctrl-C saves a checkpoint and exits
with status 130. The run directory gets metrics.jsonl and loss_curve.png (loss against step).
--resume continues from the newest usable checkpoint (a corrupt newest one falls back to the
previous good step, and says so).

exit status: 0 done; 1 stopped on a non-finite loss (checkpoints kept); 2 bad input or a refused
checkpoint; 3 results written but a figure could not be drawn; 130 interrupted (checkpoint saved).
"""

GENERATE_EPILOG = """\
examples:
  jaxattn plga generate --ckpt runs/tiny --prompt "I was born in" --max-new-tokens 40
  jaxattn plga generate --ckpt runs/tiny --prompt "I was born in" --cache auto
  jaxattn plga generate --ckpt runs/tiny/step_00000300 --prompt "The school" \\
      --sampling top_p --top-p 0.9 --temperature 0.8 --cache kvg --seed 1

caches: the default, none, recomputes the whole sequence at every step (exact). kv and kvg
freeze the metric learner's A (and with it A_LM, A_P, G_LM) at the prompt's value: faster, but
for a model whose deductive outputs have not collapsed the text drifts from the exact one after
a few tokens. auto measures this on the prompt (the first min(N, 8) greedy tokens, KV+G against
exact recomputation), prints the measurement, and uses kvg only where every token and every
logit agree (relative difference <= 1e-4), else none. A run directory means its newest usable
checkpoint (a corrupt newest step falls back to the previous one, and says so).
"""


def _sampling_number(problem: str):
    """argparse type of a sampling option: a number that `generate`'s check `problem`
    (`top_p_problem`, `temperature_problem` of `jaxattn.plga._cache`) accepts."""

    def parse(text: str) -> float:
        from . import _cache

        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        why = getattr(_cache, problem)(value)
        if why is not None:
            raise argparse.ArgumentTypeError(why)
        return value

    return parse


_top_p = _sampling_number("top_p_problem")
_temperature = _sampling_number("temperature_problem")


def _add_train(sub):
    p = sub.add_parser(
        "train",
        help="train a PLDR-LLM on text (AdamW, warm-up + cosine, checkpoints, resume)",
        description="Train a PLDR-LLM (Power Law Graph Attention decoder) on real text.",
        epilog=TRAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", required=True, metavar="DIR", help="run directory for checkpoints")
    p.add_argument("--config", default="tiny", help="named model config: tiny, small, v51-110m")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a model config field (repeatable), e.g. --set num_layers=1",
    )
    p.add_argument("--text", nargs="+", metavar="FILE", help="UTF-8 text files (default: Botchan)")
    p.add_argument("--tokenizer", metavar="MODEL", help="SentencePiece model (default: PLDR 32k)")
    p.add_argument("--seq-len", type=int, help="tokens per training row (default: context_length)")
    p.add_argument("--val-fraction", type=float, default=0.1, help="held-out share of rows (0.1)")
    p.add_argument("--steps", type=int, default=300, help="total optimiser steps (300)")
    p.add_argument("--batch-size", type=int, default=8, help="rows per step (8)")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (1e-3)")
    p.add_argument("--warmup", type=int, default=30, help="linear warm-up steps (30)")
    p.add_argument("--final-lr-fraction", type=float, default=0.1, help="cosine end / peak (0.1)")
    p.add_argument("--weight-decay", type=float, default=0.1, help="AdamW weight decay (0.1)")
    p.add_argument("--clip", type=float, default=1.0, help="clip gradients by value (1.0)")
    p.add_argument(
        "--dag",
        type=float,
        nargs=3,
        default=(0.0, 0.0, 0.0),
        metavar=("C_A_LM", "C_A_P", "C_G_LM"),
        help="DAG regulariser coefficients on A_LM, A_P, G_LM (0 0 0 = off)",
    )
    p.add_argument("--dtype", choices=("float32", "bf16"), default="float32", help="compute dtype")
    p.add_argument(
        "--seed", type=seed, default=0, help="initialisation and batch order, 0 to 2**32 - 1 (0)"
    )
    p.add_argument("--ckpt-every", type=int, default=100, help="checkpoint period in steps (100)")
    p.add_argument("--eval-every", type=int, default=100, help="validation period in steps (100)")
    p.add_argument(
        "--keep-last",
        "--keep",
        dest="keep",
        type=int,
        default=0,
        metavar="K",
        help="keep only the newest K checkpoints (0 = all; each holds the model and the Adam "
        "moments: about 12 bytes per parameter)",
    )
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    p.add_argument(
        "--allow-changed-settings",
        action="store_true",
        help="with --resume: accept training settings that differ from the checkpoint's "
        "(e.g. a lower --lr after a NaN stop; no longer bit-for-bit the same run)",
    )
    p.add_argument("--stop-after", type=int, metavar="N", help="stop after N steps of this call")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=run_train)
    return p


def _add_generate(sub):
    p = sub.add_parser(
        "generate",
        help="generate text from a training checkpoint (greedy / top-p; no, KV or KV+G cache)",
        description="Continue a prompt with a trained PLDR-LLM checkpoint.",
        epilog=GENERATE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--ckpt", required=True, metavar="DIR", help="run directory or step directory")
    p.add_argument("--prompt", required=True, help="text to continue")
    p.add_argument("--max-new-tokens", type=int, default=50, help="tokens to generate (50)")
    p.add_argument("--sampling", choices=("greedy", "top_p"), default="greedy")
    p.add_argument(
        "--top-p",
        type=_top_p,
        default=None,
        help="nucleus mass in (0, 1] for --sampling top_p (0.9)",
    )
    p.add_argument(
        "--temperature",
        type=_temperature,
        default=None,
        help="softmax temperature > 0 for --sampling top_p (1.0; a tiny one is the argmax)",
    )
    p.add_argument(
        "--cache",
        choices=("none", "auto", "kv", "kvg"),
        default="none",
        help="none (default): exact recomputation; kv / kvg: KV (+G) cache, A and G_LM frozen "
        "from the prompt (approximate unless collapsed); auto: measure on this prompt, use kvg "
        "only where it agrees with exact",
    )
    p.add_argument(
        "--seed", type=seed, default=None, help="PRNG seed for --sampling top_p, 0 to 2**32 - 1 (0)"
    )
    p.add_argument("--tokenizer", metavar="MODEL", help="default: the run's tokenizer.model")
    p.add_argument("--ids", action="store_true", help="also print the generated token ids")
    p.set_defaults(run=run_generate)
    return p


def register(subparsers) -> None:
    """Add the `plga` command group (train, generate; audit if its module is installed)."""
    plga = subparsers.add_parser(
        "plga",
        help="Power Law Graph Attention / PLDR-LLM: train, generate, audit",
        description="PLDR-LLM with Power Law Graph Attention.",
    )
    plga_subparsers = plga.add_subparsers(dest="plga_command", metavar="SUBCOMMAND")
    _add_train(plga_subparsers)
    _add_generate(plga_subparsers)
    try:
        from ._cli_audit import register as register_audit
    except ModuleNotFoundError as err:
        if err.name != f"{__package__}._cli_audit":
            raise
    else:
        register_audit(plga_subparsers)
    plga.set_defaults(run=None)


# -- train -----------------------------------------------------------------------------------------


def _apply_overrides(config, items):
    changes = {}
    fields = {f.name: f for f in dataclasses.fields(config)}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--set expects FIELD=VALUE, got {item!r}")
        name, value = item.split("=", 1)
        name = name.strip()
        if name not in fields:
            raise ValueError(
                f"--set: {config.__class__.__name__} has no field {name!r}; fields: "
                + ", ".join(fields)
            )
        current = getattr(config, name)
        try:
            if isinstance(current, bool):
                if value.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(value)
                changes[name] = value.lower() in ("true", "1")
            elif isinstance(current, int):
                changes[name] = int(value)
            elif isinstance(current, float):
                changes[name] = float(value)
            else:
                changes[name] = value
        except ValueError:
            raise ValueError(
                f"--set {name}: {value!r} is not a valid {type(current).__name__}"
            ) from None
    if not changes:
        return config
    try:
        return config.replace(**changes)
    except ValueError as err:  # the config's own check, named as the flag that set it
        given = " ".join(f"{k}={v}" for k, v in changes.items())
        raise ValueError(f"--set {given}: {err}") from None


def run_train(args) -> int:
    import jax

    from . import _checkpoint
    from ._data import Tokenizer, load_text_data
    from ._model import CONFIGS, PLDRLLM
    from ._train import NonFiniteLossError, TrainConfig, train

    check_out_folder("--out", args.out)
    out = pathlib.Path(args.out)
    if args.config not in CONFIGS:
        raise ValueError(f"--config: unknown {args.config!r}; choose from {', '.join(CONFIGS)}")
    tok_path = args.tokenizer
    if tok_path is None and args.resume and (out / "tokenizer.model").is_file():
        tok_path = out / "tokenizer.model"
    tokenizer = Tokenizer(tok_path)
    config = _apply_overrides(CONFIGS[args.config], args.set)
    if config.vocab_size != tokenizer.vocab_size:
        print(
            f"note: vocab_size set to the tokenizer's {tokenizer.vocab_size} "
            f"(config had {config.vocab_size})",
            file=sys.stderr,
        )
        config = config.replace(vocab_size=tokenizer.vocab_size)
    if tokenizer.pad_id >= 0 and tokenizer.pad_id != config.pad_id:
        config = config.replace(pad_id=tokenizer.pad_id)
    seq_len = config.context_length if args.seq_len is None else args.seq_len
    if not 1 <= seq_len <= config.context_length:
        raise ValueError(
            f"--seq-len {seq_len} must be between 1 and the context length {config.context_length}"
        )
    tc = _train_config(TrainConfig, args, seq_len)
    data = load_text_data(
        tokenizer, args.text, seq_len=seq_len, val_fraction=args.val_fraction, pad_id=config.pad_id
    )
    print(
        f"data: {data.num_documents} documents, {data.num_tokens} tokens, "
        f"{len(data.train)} training / {len(data.val)} validation rows of {seq_len + 1}; "
        f"unigram entropy {data.unigram_entropy:.4f} nats/token",
        file=sys.stderr,
    )
    model = PLDRLLM(config, key=jax.random.key(args.seed))
    n_params = sum(x.size for x in jax.tree.leaves(model) if hasattr(x, "size"))
    n_ckpt = _checkpoints_written(tc)
    print(
        f"model: {args.config} ({n_params:,} parameters); each checkpoint ≈ "
        f"{_megabytes(12 * n_params)} (float32 weights + Adam moments), {n_ckpt} checkpoint"
        f"{'s' if n_ckpt != 1 else ''} over the run"
        + (f", the newest {tc.keep_checkpoints} kept" if tc.keep_checkpoints else "")
        + " (--keep-last K keeps K)",
        file=sys.stderr,
    )
    out.mkdir(parents=True, exist_ok=True)
    if not (out / "tokenizer.model").exists():
        shutil.copyfile(tokenizer.path, out / "tokenizer.model")
    manifest = {
        "tokenizer_sha256": tokenizer.sha256,
        "text": [str(p) for p in args.text] if args.text else ["<packaged corpus: botchan.txt>"],
        "val_fraction": args.val_fraction,
        "unigram_entropy": data.unigram_entropy,
        "num_tokens": data.num_tokens,
    }
    try:
        result = train(
            model,
            data,
            tc,
            out_dir=out,
            resume=args.resume,
            stop_after=args.stop_after,
            progress=not args.no_progress,
            manifest=manifest,
            log=lambda msg: print(msg, file=sys.stderr),
            allow_changed_settings=args.allow_changed_settings,
        )
    except NonFiniteLossError as err:
        print(f"jaxattn plga train: stopped: {err}", file=sys.stderr)
        _loss_figure(out, data.unigram_entropy)
        return 1
    except _checkpoint.CheckpointError as err:
        print(f"jaxattn plga train: refused checkpoint: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # train() has saved a checkpoint and said so in one line (or nothing had started).
        if not _checkpoint.checkpoint_dirs(out):
            print("jaxattn plga train: interrupted before the first step", file=sys.stderr)
        elif (out / "metrics.jsonl").is_file():
            _loss_figure(out, data.unigram_entropy)  # the curve up to the interruption
        return 130
    val = ""
    if result.val_history:
        val = f"validation loss {result.val_history[-1][1]:.4f} nats/token "
        val += f"(unigram entropy {data.unigram_entropy:.4f}), "
    if result.step < tc.steps:
        print(f"stopped at step {result.step} of {tc.steps}: {val}continue with --resume")
    else:
        print(f"final: step {result.step}, {val}{result.seconds / 60:.1f} min")
    print(_run_size(out), file=sys.stderr)
    return 0 if _loss_figure(out, data.unigram_entropy) else 3  # as simulate and atlas


_TRAIN_FLAGS = {
    "steps": "--steps", "batch_size": "--batch-size", "seq_len": "--seq-len",
    "learning_rate": "--lr", "warmup_steps": "--warmup", "final_lr_fraction": "--final-lr-fraction",
    "weight_decay": "--weight-decay", "clip_value": "--clip", "dag_coefficients": "--dag",
    "seed": "--seed", "checkpoint_every": "--ckpt-every", "eval_every": "--eval-every",
    "keep_checkpoints": "--keep-last",
}  # fmt: skip


def _train_config(TrainConfig, args, seq_len):
    """The `TrainConfig` of the command line; a refused value names its flag."""
    try:
        return _make_train_config(TrainConfig, args, seq_len)
    except ValueError as err:
        field = str(err).removeprefix("TrainConfig.").split(" ", 1)[0]
        flag = _TRAIN_FLAGS.get(field)
        raise ValueError(f"{flag}: {err}" if flag else str(err)) from None


def _make_train_config(TrainConfig, args, seq_len):
    return TrainConfig(
        steps=args.steps,
        batch_size=args.batch_size,
        seq_len=seq_len,
        learning_rate=args.lr,
        warmup_steps=args.warmup,
        final_lr_fraction=args.final_lr_fraction,
        weight_decay=args.weight_decay,
        clip_value=args.clip,
        dag_coefficients=tuple(args.dag),
        compute_dtype=args.dtype,
        seed=args.seed,
        checkpoint_every=args.ckpt_every,
        eval_every=args.eval_every,
        keep_checkpoints=args.keep,
    )


def _megabytes(n: float) -> str:
    return f"{n / 1e6:.1f} MB" if n < 1e9 else f"{n / 1e9:.2f} GB"


def _checkpoints_written(tc) -> int:
    """Checkpoints a whole run writes (the periodic ones and the last)."""
    periodic = (tc.steps - 1) // tc.checkpoint_every if tc.checkpoint_every else 0
    return periodic + 1


def _run_size(out: pathlib.Path) -> str:
    """One line: the newest checkpoint's size, and the run directory's size and step count."""
    from ._checkpoint import checkpoint_dirs

    dirs = checkpoint_dirs(out)
    total = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    newest = sum(f.stat().st_size for f in dirs[-1].iterdir() if f.is_file()) if dirs else 0
    return (
        f"run directory {out}: {_megabytes(total)} in all, {len(dirs)} checkpoint"
        f"{'s' if len(dirs) != 1 else ''} of {_megabytes(newest)} each "
        "(--keep-last K keeps only the newest K)"
    )


def _loss_figure(out: pathlib.Path, unigram_entropy: float) -> bool:
    """Draw `out/loss_curve.png` from `out/metrics.jsonl` (written during training, so the
    results are kept whatever happens here). A figure that cannot be written is reported in one
    line; returns whether it was written."""
    target = out / "loss_curve.png"
    try:
        from ..plot._training import plot_loss_curve

        plot_loss_curve(out, unigram_entropy=unigram_entropy, path=target)
    except Exception as err:  # any plotting failure: label it, keep the results
        print(
            f"jaxattn plga train: figure {target} not written ({type(err).__name__}: {err}); "
            f"results kept in {out} (checkpoints, metrics.jsonl)",
            file=sys.stderr,
        )
        return False
    print(f"wrote {target}", file=sys.stderr)
    return True


# -- generate --------------------------------------------------------------------------------------


def run_generate(args) -> int:
    import jax
    import numpy as np

    from ._cache import generate
    from ._checkpoint import load_model
    from ._data import Tokenizer

    _check_sampling_options(args)
    model, manifest = load_model(args.ckpt)
    step_dir = pathlib.Path(manifest["path"])
    if manifest.get("fallback"):
        print(manifest["fallback"], file=sys.stderr)
    tok_path = args.tokenizer
    if tok_path is None:
        candidate = step_dir.parent / "tokenizer.model"
        tok_path = candidate if candidate.is_file() else None
    tokenizer = Tokenizer(tok_path)
    if tokenizer.vocab_size != model.config.vocab_size:
        raise ValueError(
            f"tokenizer {tokenizer.path} has {tokenizer.vocab_size} pieces, the model "
            f"{model.config.vocab_size}"
        )
    prompt = tokenizer.encode(args.prompt)
    if not prompt:
        raise ValueError("--prompt is empty after tokenisation")
    room = model.config.context_length - max(int(args.max_new_tokens), 1) + 1
    if len(prompt) > room:
        raise ValueError(
            f"--prompt is {len(prompt)} tokens; with --max-new-tokens {args.max_new_tokens} "
            f"the model's context of {model.config.context_length} tokens leaves room for "
            f"{max(room, 0)}: shorten the prompt or ask for fewer new tokens"
        )
    cache = args.cache
    if cache == "auto":
        cache, line = choose_cache(model, prompt, max_new_tokens=args.max_new_tokens)
        print(line, file=sys.stderr)
    elif cache in ("kv", "kvg"):
        print(
            f"cache={cache} freezes A and G_LM from the prompt: an approximation unless the model "
            "has collapsed (--cache auto measures it on this prompt)",
            file=sys.stderr,
        )
    new = generate(
        model,
        np.asarray(prompt, np.int32),
        max_new_tokens=args.max_new_tokens,
        cache=cache,
        sampling=args.sampling,
        top_p=args.top_p,
        temperature=args.temperature,
        key=jax.random.key(args.seed),
        eos_id=tokenizer.eos_id,
    )
    new = [int(t) for t in np.asarray(new)]
    if tokenizer.eos_id in new:
        new = new[: new.index(tokenizer.eos_id)]
    print(tokenizer.decode(prompt + new))
    if args.ids:
        print("ids:", " ".join(map(str, new)))
    print(
        f"[checkpoint {step_dir} (step {manifest['step']}), {args.sampling}, cache={cache}"
        + (" (auto)]" if args.cache == "auto" else "]"),
        file=sys.stderr,
    )
    return 0


def _check_sampling_options(args) -> None:
    """Refuse `--top-p`, `--temperature` and `--seed` under `--sampling greedy` (they would be
    ignored), then fill in their defaults."""
    if args.sampling == "greedy":
        for flag, value in (
            ("--top-p", args.top_p),
            ("--temperature", args.temperature),
            ("--seed", args.seed),
        ):
            if value is not None:
                raise ValueError(
                    f"{flag} has no effect with --sampling greedy (the argmax); give "
                    f"--sampling top_p to use it, or leave out {flag}"
                )
    args.top_p = 0.9 if args.top_p is None else args.top_p
    args.temperature = 1.0 if args.temperature is None else args.temperature
    args.seed = 0 if args.seed is None else args.seed


AUTO_CACHE_RTOL = 1e-4
"""`--cache auto` uses the KV+G cache only where its logits agree with exact recomputation to this
relative difference (of the largest |logit|) at every measured step."""
AUTO_CACHE_TOKENS = 8


def choose_cache(model, prompt, *, max_new_tokens: int) -> tuple[str, str]:
    """`--cache auto`: measure the KV+G cache against exact recomputation on `prompt` (greedy,
    the first `min(max_new_tokens, 8)` tokens, `cache_fidelity`) and choose `"kvg"` only where
    every teacher-forced argmax and every free-running token agree and the logits agree to
    `AUTO_CACHE_RTOL`, else `"none"`.

    **Returns:** `(cache, line)`: the choice and one line stating the measurement."""
    import numpy as np

    from ._audits import cache_fidelity

    n = max(1, min(int(max_new_tokens), AUTO_CACHE_TOKENS))
    fid = cache_fidelity(model, np.asarray(prompt, np.int32), max_new_tokens=n, caches=("kvg",))
    f = fid["kvg"]
    rel = max(f["rel_dlogit"])
    exact = f["argmax_agreement"] == 1.0 and f["token_agreement"] == 1.0 and rel <= AUTO_CACHE_RTOL
    cache = "kvg" if exact else "none"
    why = (
        f"agrees (rel |Δlogit| <= {AUTO_CACHE_RTOL:g})"
        if exact
        else f"first differs at token {f['first_divergence']}"
        if f["first_divergence"] < n
        else f"logits differ beyond rel {AUTO_CACHE_RTOL:g}"
    )
    line = (
        f"cache auto: KV+G vs exact recomputation on this prompt, {n} greedy token"
        f"{'s' if n != 1 else ''}: max rel |Δlogit| {rel:.1e}, tokens agree "
        f"{f['token_agreement']:.2f}, {why} -> cache={cache}"
    )
    return cache, line
