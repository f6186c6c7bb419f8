"""Does PLGA collapse during training? Order parameter, rank of A and cache fidelity over the
checkpoints of tiny PLDR-LLMs trained on real text at several learning-rate / warm-up settings.

Each setting trains the `tiny` config with the `jaxattn plga train` machinery (`_train.train`,
packaged corpus, 32k SentencePiece tokenizer), writing a checkpoint every `ckpt_every` steps.
Every checkpoint is then audited in float64 on held-out text:

- the invariance order parameter of A, A_LM, A_P, G_LM per layer (median over prompt pairs),
- the rank-one audit of A (numerical rank, s₂/s₁, identity of rows and heads),
- cache fidelity (KV+G against full recomputation, greedy, teacher-forced).

Run: `python experiments/collapse_training.py [--quick] [--out-dir DIR]`; prints a table per run
and writes `collapse_training.json` and `order_parameter_over_training.png`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

SETTINGS = ((1e-3, 30), (3e-3, 150))
"""(peak learning rate, warm-up steps) of each run."""


def train_run(
    out_dir: Path, *, lr: float, warmup: int, steps: int, ckpt_every: int, seed: int, seq_len: int
):
    """Train one tiny model (skipped when `out_dir` already holds its last checkpoint)."""
    import jax

    from jaxattn.plga._checkpoint import checkpoint_dirs
    from jaxattn.plga._data import Tokenizer, load_text_data
    from jaxattn.plga._model import CONFIGS, PLDRLLM
    from jaxattn.plga._train import TrainConfig, train

    tok = Tokenizer()
    data = load_text_data(tok, None, seq_len=seq_len)
    dirs = checkpoint_dirs(out_dir)
    if dirs and dirs[-1].name == f"step_{steps:08d}":
        return data
    config = CONFIGS["tiny"].replace(vocab_size=tok.vocab_size, pad_id=tok.pad_id)
    tc = TrainConfig(
        steps=steps,
        batch_size=8,
        seq_len=seq_len,
        learning_rate=lr,
        warmup_steps=warmup,
        seed=seed,
        checkpoint_every=ckpt_every,
        eval_every=0,
    )
    model = PLDRLLM(config, key=jax.random.key(seed))
    res = train(model, data, tc, out_dir=out_dir, progress=False, log=None, resume=bool(dirs))
    print(f"  trained {steps} steps in {res.seconds:.0f} s; last loss {res.history[-1][1]:.3f}")
    return data


def audit_checkpoint(path: Path, prompts: np.ndarray, *, new_tokens: int) -> dict:
    """Float64 audits of one checkpoint on held-out prompts `(n, seq)`."""
    import jax
    import jax.numpy as jnp

    from jaxattn.plga._audits import cache_fidelity, head_spread, invariance_audit, rank_one_audit
    from jaxattn.plga._checkpoint import load_model

    with jax.enable_x64(True):
        model, manifest = load_model(path, dtype=jnp.float64)
        inv = invariance_audit(model, prompts)
        med = {
            n: np.median(np.asarray(inv.by_rms)[:, :, i], axis=0).tolist()
            for i, n in enumerate(inv.tensors)
        }
        med_mean = {
            n: np.median(np.asarray(inv.by_mean_abs)[:, :, i], axis=0).tolist()
            for i, n in enumerate(inv.tensors)
        }
        A = model(jnp.asarray(prompts[0]))[1]
        A = jnp.stack([d.A for d in A])  # (layers, heads, dk, dk)
        r1 = rank_one_audit(A)
        fid = cache_fidelity(
            model, prompts[0, : prompts.shape[1] // 2], max_new_tokens=new_tokens, caches=("kvg",)
        )
        return {
            "step": int(manifest["step"]),
            "loss": manifest.get("metrics", {}).get("loss"),
            "order_parameter_by_rms": med,
            "order_parameter_by_mean_abs": med_mean,
            "A_numerical_rank_median": np.median(np.asarray(r1.numerical_rank), axis=1).tolist(),
            "A_s2_over_s1_median": np.median(np.asarray(r1.s2_over_s1), axis=1).tolist(),
            "A_row_spread_median": np.median(np.asarray(r1.row_spread), axis=1).tolist(),
            "A_head_spread": [float(head_spread(a)) for a in A],
            "kvg_max_rel_dlogit": max(fid["kvg"]["rel_dlogit"]),
            "kvg_argmax_agreement": fid["kvg"]["argmax_agreement"],
            "kvg_max_rel_dG": float(np.max(fid["kvg"]["rel_dG"])),
        }


def table(label: str, rows: list[dict]) -> str:
    head = (
        f"{'step':>5} {'loss':>6} | {'δ_rms A':>16} {'δ_rms A_LM':>16} {'δ_rms G_LM':>16} | "
        f"{'rank A':>9} {'s2/s1 A':>16} {'rows A':>16} | "
        f"{'KV+G rel|Δlogit|':>16} {'argmax':>6} {'‖ΔG‖':>8}"
    )
    lines = [f"run {label}", head]
    f2 = lambda v: "/".join(f"{x:.1e}" for x in v)
    for r in rows:
        loss = "" if r["loss"] is None else f"{r['loss']:6.3f}"
        op = r["order_parameter_by_rms"]
        rank = "/".join(f"{x:g}" for x in r["A_numerical_rank_median"])
        lines.append(
            f"{r['step']:>5} {loss:>6} | "
            f"{f2(op['A']):>16} {f2(op['A_LM']):>16} {f2(op['G_LM']):>16} | "
            f"{rank:>9} {f2(r['A_s2_over_s1_median']):>16} {f2(r['A_row_spread_median']):>16} | "
            f"{r['kvg_max_rel_dlogit']:>16.2e} {r['kvg_argmax_agreement']:>6.2f} "
            f"{r['kvg_max_rel_dG']:>8.1e}"
        )
    lines.append("(per-layer values separated by '/'; δ = median over prompt pairs)")
    return "\n".join(lines)


def main(
    *,
    quick: bool = False,
    seed: int = 0,
    out_dir="experiments/out/collapse_training",
    settings=SETTINGS,
    steps: int = 400,
    ckpt_every: int = 50,
    seq_len: int = 64,
    num_prompts: int = 6,
    new_tokens: int = 8,
    plot: bool = True,
):
    """Train each (lr, warm-up) setting, audit every checkpoint, print tables, save JSON/figure."""
    if quick:
        steps, ckpt_every, num_prompts, new_tokens = 20, 10, 3, 3
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    from jaxattn.plga._checkpoint import checkpoint_dirs

    results = {}
    for lr, warmup in settings:
        label = f"lr{lr:g}_warmup{warmup}"
        run_dir = out / label
        t0 = time.perf_counter()
        print(f"training {label}: {steps} steps, checkpoint every {ckpt_every}")
        data = train_run(
            run_dir,
            lr=lr,
            warmup=warmup,
            steps=steps,
            ckpt_every=ckpt_every,
            seed=seed,
            seq_len=seq_len,
        )
        prompts = np.asarray(data.val[:num_prompts, :seq_len])
        rows = [
            audit_checkpoint(p, prompts, new_tokens=new_tokens) for p in checkpoint_dirs(run_dir)
        ]
        results[label] = {
            "lr": lr,
            "warmup": warmup,
            "checkpoints": rows,
            "seconds": time.perf_counter() - t0,
        }
        print(table(label, rows))
        (out / "collapse_training.json").write_text(json.dumps(results, indent=1))
    if plot:
        from jaxattn.plot._audits import plot_order_parameter_over_training

        runs = {
            label: {
                "steps": [r["step"] for r in res["checkpoints"]],
                **{
                    t: np.array([r["order_parameter_by_rms"][t] for r in res["checkpoints"]])
                    for t in ("A", "A_LM", "A_P", "G_LM")
                },
            }
            for label, res in results.items()
        }
        plot_order_parameter_over_training(
            None,
            runs,
            title="tiny PLDR-LLM: invariance order parameter",
            path=out / "order_parameter_over_training.png",
        )
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out-dir", default="experiments/out/collapse_training")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--ckpt-every", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    main(
        quick=args.quick,
        out_dir=args.out_dir,
        steps=args.steps,
        ckpt_every=args.ckpt_every,
        seed=args.seed,
    )
