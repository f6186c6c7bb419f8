"""Decode speed of PLDR-LLM on the CPU: a forward pass over a 512-token prompt, and decoding per
token with no cache, a KV cache, a KV+G cache, collapsed (frozen G) and SDPA (G = I), measured
side by side in one run, as ratios.

Question: what does each cache buy, does collapse-based inference cost what SDPA costs, and how
does cached decoding compare with the reference PyTorch implementation? Random weights (float32)
are timed — the cost does not depend on the values. Rows:

- `forward`: uncached forward pass of the prompt (logits at every position), s per prompt;
- `none`: every step recomputes the whole (fixed-size) sequence, density operator and metric
  learner included;
- `kv`: KV cache, `A` frozen, `A_LM … G_LM` recomputed from it every step;
- `kvg`: KV + G cache;
- `collapsed`: `collapse(model, G, fold="never")` — metric learner removed, the prompt's `G_LM`
  frozen (KV cache);
- `collapsed (folded)`: `G` folded into `W_q` (exact only when `G` is in the RoPE commutant;
  timed only: SDPA arithmetic with other weights);
- `sdpa`: `PLDRLLM(..., attention="sdpa")` with a KV cache (`G = I`).

Goals (issue 11): KV and KV+G ≤ 1.0× the reference per token, collapsed ≤ 1.1× SDPA, forward
≤ 1.0× the reference.

`--reference DIR` also times the reference implementation (Gokden, `PLDR-LLM-with-KVG-cache`,
model v510, Apache-2.0): `DIR` is the folder of a checkout holding `pldr_model_v510.py` and
`power_law_attention_layer_v510.py` (it needs `torch` and `torchtune`). The same weights are
copied in (`to_reference`), its logits are compared with ours, and it runs single-threaded like
XLA here. Without torch (or the folder) the mode is skipped with a one-line message.

Steps of the variants are interleaved round by round so that load from other processes hits all
of them alike; medians over rounds are reported, as process CPU time (XLA single-threaded; robust
to other load on a shared machine) and wall time.

Run: `python experiments/bench_decode.py [--quick] [--config v51-110m] [--reference DIR]`;
prints the table and writes `bench_decode.json` to `--out-dir`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

# Single-threaded XLA on CPU, so that the process CPU time per token measures the work of a
# variant even when other processes share the cores (wall time is reported too).
os.environ.setdefault(
    "XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
)

import numpy as np


def _clock():
    return time.process_time(), time.perf_counter()


def _since(t0):
    c, w = _clock()
    return c - t0[0], w - t0[1]


def main(
    *,
    quick: bool = False,
    seed: int = 0,
    out_dir="experiments/out/bench_decode",
    config: str = "tiny",
    prompt_len: int = 512,
    new_tokens: int = 8,
    none_tokens: int = 2,
    rounds: int = 3,
    reference: str | None = None,
):
    """Time the forward pass and every decode variant (and the reference when asked); print the
    table and save it. Returns the rows (a dict per variant)."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    from jaxattn.plga import CONFIGS, PLDRLLM, collapse, decode_step, prefill

    if quick:
        prompt_len, new_tokens, none_tokens, rounds = 64, 4, 1, 2
    base = CONFIGS[config]
    max_len = prompt_len + (new_tokens + none_tokens) * rounds + 2
    # The prompt must fit: RoPE has no length limit, the config's context only bounds inputs.
    cfg = base.replace(context_length=max(base.context_length, max_len))
    key = jax.random.key(seed)
    build = eqx.filter_jit(lambda c, k, attention: PLDRLLM(c, key=k, attention=attention))
    plga = build(cfg, key, "plga")
    sdpa = build(cfg, key, "sdpa")
    ids = jax.random.randint(jax.random.fold_in(key, 1), (prompt_len,), 4, cfg.vocab_size)
    forward = eqx.filter_jit(lambda m, i: m(i))
    logits, ded = forward(plga, ids)
    G = jnp.stack([d.G_LM for d in ded])
    collapsed = collapse(plga, G, fold="never")
    folded = collapse(plga, G, fold="always")

    variants = {
        "none": (plga, dict(cache="none"), none_tokens),
        "kv": (plga, dict(cache="kv"), new_tokens),
        "kvg": (plga, dict(cache="kvg"), new_tokens),
        "collapsed": (collapsed.model, dict(cache="kv", G=collapsed._G()), new_tokens),
        "collapsed (folded)": (folded.model, dict(cache="kv", G=folded._G()), new_tokens),
        "sdpa": (sdpa, dict(cache="kv"), new_tokens),
    }
    state, compile_s = {}, {}
    for name, (model, kw, _) in variants.items():
        t0 = time.perf_counter()
        lg, cache = prefill(model, ids, max_len=max_len, **kw)
        lg, cache = decode_step(model, cache, jnp.argmax(lg[-1]))
        jax.block_until_ready(lg)
        compile_s[name] = time.perf_counter() - t0
        state[name] = (cache, jnp.argmax(lg))
        print(f"compiled {name}: {compile_s[name]:.1f} s", flush=True)
    cpu = {name: [] for name in ["forward", *variants]}
    wall = {name: [] for name in cpu}
    for _ in range(rounds):
        t0 = _clock()
        jax.block_until_ready(forward(plga, ids)[0])
        c, w = _since(t0)
        cpu["forward"].append(c)
        wall["forward"].append(w)
        for name, (model, _, n) in variants.items():
            cache, tok = state[name]
            t0 = _clock()
            for _ in range(n):
                lg, cache = decode_step(model, cache, tok)
                tok = jnp.argmax(lg)
            jax.block_until_ready(tok)
            c, w = _since(t0)
            cpu[name].append(c / n)
            wall[name].append(w / n)
            state[name] = (cache, tok)
    med = {name: float(np.median(v)) for name, v in cpu.items()}
    rows = {
        name: {
            "cpu_s": med[name],
            "wall_s": float(np.median(wall[name])),
            "cpu_s_all_rounds": cpu[name],
            "x_sdpa": med[name] / med["sdpa"] if name != "forward" else None,
            "compile_s": compile_s.get(name),
        }
        for name in cpu
    }
    ref = None
    if reference is not None:
        ref = reference_timings(
            plga,
            ids,
            logits,
            path=reference,
            rounds=rounds,
            new_tokens=new_tokens,
            none_tokens=none_tokens,
            max_len=max_len,
        )
        if ref is not None:
            for name, value in ref["cpu_s"].items():
                rows[name]["reference_cpu_s"] = value
                rows[name]["x_reference"] = med[name] / value
    print(
        f"\n{config} (random float32 weights, CPU, single-threaded), prompt {prompt_len}; "
        f"decode: {new_tokens} tokens ({none_tokens} without cache) × {rounds} rounds, median "
        "process CPU time (wall in the last column)"
    )
    head = f"{'':<25} | {'CPU s':>9} | {'× SDPA':>7}"
    if ref is not None:
        head += f" | {'reference s':>11} | {'× reference':>11}"
    print(head + f" | {'wall s':>9}")
    for name, r in rows.items():
        label = "forward (prompt)" if name == "forward" else f"decode {name}"
        line = f"{label:<25} | {r['cpu_s']:>9.4f} | "
        line += f"{r['x_sdpa']:>7.2f}" if r["x_sdpa"] is not None else f"{'':>7}"
        if ref is not None:
            if "x_reference" in r:
                line += f" | {r['reference_cpu_s']:>11.4f} | {r['x_reference']:>11.2f}"
            else:
                line += f" | {'':>11} | {'':>11}"
        print(line + f" | {r['wall_s']:>9.4f}")
    print(
        f"collapsed / SDPA = {rows['collapsed']['x_sdpa']:.2f} (goal ≤ 1.1); "
        f"KV / SDPA = {rows['kv']['x_sdpa']:.2f}; no cache / KV = "
        f"{med['none'] / med['kv']:.1f}"
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "config": config,
        "prompt_len": prompt_len,
        "new_tokens": new_tokens,
        "none_tokens": none_tokens,
        "rounds": rounds,
        "dtype": "float32",
        "backend": jax.default_backend(),
        "jax": jax.__version__,
        "reference": None if ref is None else ref["meta"],
    }
    (out / "bench_decode.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return rows


def reference_timings(model, ids, logits, *, path, rounds, new_tokens, none_tokens, max_len):
    """Time the reference PyTorch implementation at `path` with `model`'s weights: forward over
    the prompt and per-token decoding without cache, with its KV cache and KV+G cache. `None`
    (after one line saying why) when torch or the reference code is not available."""
    try:
        import torch
    except ImportError:
        print("reference: skipped (torch is not installed)")
        return None
    folder = Path(path)
    if not (folder / "pldr_model_v510.py").is_file():
        print(f"reference: skipped ({folder / 'pldr_model_v510.py'} not found)")
        return None
    sys.path.insert(0, str(folder))
    try:
        import pldr_model_v510 as ref
    except ImportError as e:
        print(f"reference: skipped (cannot import the reference model: {e})")
        return None
    from jaxattn.plga import to_reference

    c = model.config
    torch.set_num_threads(1)
    net = ref.PLDR_Model(
        num_layers=c.num_layers,
        d_model=c.d_model,
        num_heads=c.num_heads,
        dff=c.dff,
        input_vocab_size=c.vocab_size,
        A_dff=c.A_dff,
        num_reslayerA=c.num_reslayerA,
        num_denseA=c.num_denseA,
        max_seq_len=max_len,
        device="cpu",
    )
    weights = {k: torch.from_numpy(np.array(v, np.float32)) for k, v in to_reference(model).items()}
    missing, unexpected = net.load_state_dict(weights, strict=False)
    if unexpected or any(not k.endswith("cache") for k in missing):
        print(f"reference: skipped (state dict mismatch: {missing[:3]} {unexpected[:3]})")
        return None
    net.eval()
    prompt = torch.from_numpy(np.asarray(ids, np.int64))[None]

    def run(x, **kw):
        S = x.shape[1]
        mask = None if "kvcachelst" in kw else torch.triu(torch.ones(S, S), 1)[None, None]
        out = net([x, mask], **kw)
        return out[0], out[2], out[3]

    cpu = {"forward": [], "none": [], "kv": [], "kvg": []}
    with torch.inference_mode():
        lg, att, kv0 = run(prompt)
        err = float((lg[0].numpy() - np.asarray(logits)).__abs__().max())
        scale = float(np.abs(np.asarray(logits)).max())
        print(f"reference: logits agree with ours to {err / scale:.1e} (max-normalised)")
        G0 = [[a[0], a[4]] for a in att]
        tok0 = lg[0, -1].argmax().reshape(1, 1)
        seqs = {"none": prompt, "kv": None, "kvg": None}
        caches = {"kv": (kv0, None), "kvg": (kv0, G0)}
        toks = {k: tok0 for k in ("none", "kv", "kvg")}
        for _ in range(rounds):
            t0 = _clock()
            run(prompt)
            cpu["forward"].append(_since(t0)[0])
            t0 = _clock()
            for _ in range(none_tokens):
                seqs["none"] = torch.cat([seqs["none"], toks["none"]], dim=1)
                lg, _, _ = run(seqs["none"])
                toks["none"] = lg[0, -1].argmax().reshape(1, 1)
            cpu["none"].append(_since(t0)[0] / none_tokens)
            for name in ("kv", "kvg"):
                kv, Gc = caches[name]
                t0 = _clock()
                for _ in range(new_tokens):
                    lg, _, kv = run(toks[name], kvcachelst=kv, Gcachelst=Gc)
                    toks[name] = lg[0, -1].argmax().reshape(1, 1)
                cpu[name].append(_since(t0)[0] / new_tokens)
                caches[name] = (kv, Gc)
    meta = {"path": str(folder), "torch": torch.__version__, "max_norm_logit_error": err / scale}
    return {"cpu_s": {k: float(np.median(v)) for k, v in cpu.items()}, "meta": meta}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short prompt, few tokens")
    parser.add_argument("--config", default="tiny", help="a name of CONFIGS (tiny, v51-110m)")
    parser.add_argument("--out-dir", default="experiments/out/bench_decode")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--none-tokens", type=int, default=2, help="tokens timed without cache")
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument(
        "--reference",
        metavar="DIR",
        help="folder with the reference pldr_model_v510.py (needs torch, torchtune)",
    )
    args = parser.parse_args()
    main(
        quick=args.quick,
        config=args.config,
        out_dir=args.out_dir,
        rounds=args.rounds,
        new_tokens=args.new_tokens,
        none_tokens=args.none_tokens,
        prompt_len=args.prompt_len,
        reference=args.reference,
    )
