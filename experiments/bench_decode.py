"""Decode speed of PLDR-LLM v51-110M on CPU: no cache, KV, KV+G, collapsed (frozen G), and an
SDPA model of the same shape.

Question: what does collapse-based inference buy? Random weights (float32) of the released
110M configuration are timed — the cost does not depend on the values. Variants:

- `plga none`: every step recomputes the whole (fixed-size) sequence, density operator and
  metric learner included;
- `plga kv`: KV cache, `A` frozen, `A_LM … G_LM` recomputed from it every step;
- `plga kvg`: KV + G cache;
- `collapsed`: `collapse(model, G, fold="never")`, metric learner removed, `q' = q̃ G`;
- `collapsed (folded)`: `G` folded into `W_q` (exact only when `G` is in the RoPE commutant;
  here timed only — it is SDPA arithmetic with other weights);
- `sdpa`: `PLDRLLM(..., attention="sdpa")` with a KV cache.

Prefill tokens/s is timed on the prompt. Steps of the variants are interleaved round by round so
that load from other processes hits all of them alike; the median over rounds is reported, as
process CPU time (XLA single-threaded; robust to other load on a shared machine) and wall time.

Run: `python experiments/bench_decode.py [--quick]`; prints a table, writes `bench_decode.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

# Single-threaded XLA on CPU, so that the process CPU time per token measures the work of a
# variant even when other processes share the cores (wall time is reported too).
os.environ.setdefault(
    "XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
)

import numpy as np


def main(
    *,
    quick: bool = False,
    seed: int = 0,
    out_dir="experiments/out/bench_decode",
    config: str = "v51-110m",
    prompt_len: int = 64,
    new_tokens: int = 16,
    rounds: int = 5,
):
    """Time prefill and decode of every variant; print and save the table."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    from jaxattn.plga._cache import decode_step, prefill
    from jaxattn.plga._collapse import collapse
    from jaxattn.plga._model import CONFIGS, PLDRLLM

    if quick:
        config, prompt_len, new_tokens, rounds = "tiny", 16, 4, 2
    cfg = CONFIGS[config]
    key = jax.random.key(seed)
    build = eqx_jit_build(PLDRLLM)
    plga = build(cfg, key, "plga")
    sdpa = build(cfg, key, "sdpa")
    ids = jax.random.randint(jax.random.fold_in(key, 1), (prompt_len,), 4, cfg.vocab_size)
    G = jnp.stack([d.G_LM for d in eqx.filter_jit(lambda m, i: m(i)[1])(plga, ids)])
    collapsed = collapse(plga, G, fold="never")
    folded = collapse(plga, G, fold="always")
    max_len = prompt_len + new_tokens * rounds + 1

    variants = {
        "plga none": (plga, dict(cache="none")),
        "plga kv": (plga, dict(cache="kv")),
        "plga kvg": (plga, dict(cache="kvg")),
        "collapsed": (collapsed.model, dict(cache="kv", G=collapsed._G())),
        "collapsed (folded)": (folded.model, dict(cache="kv", G=folded._G())),
        "sdpa": (sdpa, dict(cache="kv")),
    }
    state, prefill_s, compile_s = {}, {name: [] for name in variants}, {}
    for name, (model, kw) in variants.items():
        t0 = time.perf_counter()
        logits, cache = prefill(model, ids, max_len=max_len, **kw)
        logits, cache = decode_step(model, cache, jnp.argmax(logits[-1]))
        jax.block_until_ready(logits)
        compile_s[name] = time.perf_counter() - t0
        state[name] = (cache, jnp.argmax(logits))
        print(f"compiled {name}: {compile_s[name]:.1f} s", flush=True)
    decode_ms = {name: [] for name in variants}
    decode_wall_ms = {name: [] for name in variants}
    for _ in range(rounds):
        for name, (model, kw) in variants.items():
            t0 = time.process_time()
            logits, _ = prefill(model, ids, max_len=max_len, **kw)
            jax.block_until_ready(logits)
            prefill_s[name].append(time.process_time() - t0)
            cache, tok = state[name]
            t0, w0 = time.process_time(), time.perf_counter()
            for _ in range(new_tokens):
                logits, cache = decode_step(model, cache, tok)
                tok = jnp.argmax(logits)
            jax.block_until_ready(tok)
            decode_ms[name].append(1e3 * (time.process_time() - t0) / new_tokens)
            decode_wall_ms[name].append(1e3 * (time.perf_counter() - w0) / new_tokens)
            state[name] = (cache, tok)
    rows = {}
    base = float(np.median(decode_ms["sdpa"]))
    none = float(np.median(decode_ms["plga none"]))
    for name in variants:
        ms = float(np.median(decode_ms[name]))
        rows[name] = {
            "decode_ms_per_token": ms,
            "decode_ms_all_rounds": decode_ms[name],
            "decode_wall_ms_per_token": float(np.median(decode_wall_ms[name])),
            "prefill_tokens_per_s": prompt_len / float(np.median(prefill_s[name])),
            "vs_sdpa": ms / base,
            "speedup_vs_no_cache": none / ms,
            "compile_s": compile_s[name],
        }
    print(
        f"\n{config} (random float32 weights, CPU, XLA single-threaded), prompt {prompt_len}, "
        f"{new_tokens} tokens × {rounds} rounds (median); CPU time unless said"
    )
    print(
        f"{'variant':<20} | {'decode ms/token':>15} | {'× SDPA':>7} | "
        f"{'× faster than no cache':>22} | {'prefill tok/s':>13} | {'wall ms/token':>13}"
    )
    for name, r in rows.items():
        print(
            f"{name:<20} | {r['decode_ms_per_token']:>15.2f} | {r['vs_sdpa']:>7.2f} | "
            f"{r['speedup_vs_no_cache']:>22.2f} | {r['prefill_tokens_per_s']:>13.0f} | "
            f"{r['decode_wall_ms_per_token']:>13.1f}"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "config": config,
        "prompt_len": prompt_len,
        "new_tokens": new_tokens,
        "rounds": rounds,
        "dtype": "float32",
    }
    (out / "bench_decode.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return rows


def eqx_jit_build(cls):
    """A compiled constructor `(config, key, attention) → model` (one compilation, not one per
    parameter draw)."""
    import equinox as eqx

    @eqx.filter_jit
    def build(cfg, key, attention):
        return cls(cfg, key=key, attention=attention)

    return lambda cfg, key, attention: build(cfg, key, attention)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out-dir", default="experiments/out/bench_decode")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=64)
    args = parser.parse_args()
    main(
        quick=args.quick,
        out_dir=args.out_dir,
        rounds=args.rounds,
        new_tokens=args.new_tokens,
        prompt_len=args.prompt_len,
    )
