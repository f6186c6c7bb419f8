"""What does Power Law Graph Attention cost? Forward tokens/s and training-step time of PLDR-LLM
(PLGA) against an SDPA model of the same shape (`G = I`, metric learner removed), on the CPU.

Usage: `python experiments/bench_plga.py [--quick] [--out-dir DIR]`. Prints a table of ratios and
writes `bench_plga.json` to `out_dir`.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from jaxattn.plga import CONFIGS, PLDRLLM
from jaxattn.plga._train import TrainConfig, make_optimizer, make_step

# (config, batch, seq, repeats); the 110M model runs short sequences and few repeats on a CPU.
CASES = (("tiny", 8, 64, 10), ("v51-110m", 1, 32, 4))
QUICK_CASES = (("tiny", 4, 64, 2), ("v51-110m", 1, 16, 1))


def _time(fn, repeats):
    out = fn()  # compile + warm-up
    jax.block_until_ready(out)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t)
    return float(np.min(times))  # the least disturbed run: the CPU is shared


def bench_one(name, attention, batch, seq, repeats, seed):
    config = CONFIGS[name]
    model = PLDRLLM(config, key=jax.random.key(seed), attention=attention)
    rng = np.random.default_rng(seed)
    rows = jnp.asarray(rng.integers(4, config.vocab_size, (batch, seq + 1)), jnp.int32)
    inputs, targets = rows[:, :-1], rows[:, 1:]

    forward = eqx.filter_jit(lambda m, x: jax.vmap(m)(x)[0])
    fwd_s = _time(lambda: forward(model, inputs), repeats)

    tc = TrainConfig(steps=1000, batch_size=batch, seq_len=seq, warmup_steps=10)
    optimizer = make_optimizer(tc)
    params, static = eqx.partition(model, eqx.is_inexact_array)
    state = {"p": params, "o": optimizer.init(params)}
    step = make_step(optimizer, pad_id=config.pad_id)

    def one_step():
        state["p"], state["o"], metrics = step(state["p"], static, state["o"], inputs, targets)
        return metrics["loss"]

    step_s = _time(one_step, repeats)
    n_params = sum(x.size for x in jax.tree.leaves(eqx.filter(model, eqx.is_array)))
    return {
        "config": name,
        "attention": attention,
        "params": int(n_params),
        "batch": batch,
        "seq": seq,
        "forward_tokens_per_s": batch * seq / fwd_s,
        "train_step_s": step_s,
    }


def main(*, quick: bool = False, seed: int = 0, out_dir: str | pathlib.Path = "bench_out"):
    rows = []
    for name, batch, seq, repeats in QUICK_CASES if quick else CASES:
        for attention in ("plga", "sdpa"):
            r = bench_one(name, attention, batch, seq, repeats, seed)
            rows.append(r)
            print(
                f"  {name:9s} {attention}: {r['forward_tokens_per_s']:9.0f} tok/s forward, "
                f"{r['train_step_s']:8.3f} s/step",
                flush=True,
            )
    lines = [
        f"CPU ({platform.processor() or platform.machine()}, {jax.device_count()} device), "
        f"float32, jax {jax.__version__}",
        "| config | batch×seq | params PLGA / SDPA | fwd tok/s PLGA | fwd tok/s SDPA | "
        "fwd ratio SDPA/PLGA | train s/step PLGA | train s/step SDPA | step ratio PLGA/SDPA |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for i in range(0, len(rows), 2):
        p, s = rows[i], rows[i + 1]
        lines.append(
            f"| {p['config']} | {p['batch']}×{p['seq']} | {p['params'] / 1e6:.2f}M / "
            f"{s['params'] / 1e6:.2f}M | {p['forward_tokens_per_s']:.0f} | "
            f"{s['forward_tokens_per_s']:.0f} | "
            f"{s['forward_tokens_per_s'] / p['forward_tokens_per_s']:.2f}× | "
            f"{p['train_step_s']:.3f} | {s['train_step_s']:.3f} | "
            f"{p['train_step_s'] / s['train_step_s']:.2f}× |"
        )
    table = "\n".join(lines)
    print(table)
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_plga.json").write_text(json.dumps({"rows": rows, "table": table}, indent=2))
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", default="bench_out")
    a = parser.parse_args()
    main(quick=a.quick, seed=a.seed, out_dir=a.out_dir)
