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
model v510, Apache-2.0): `DIR` is a folder holding its `pldr_model_v510.py` and
`power_law_attention_layer_v510.py` (from `src/pldr_model_v510/` and
`src/ablation/pldr_model_v510Gi/`; kept outside this project). It needs `torch` and `torchtune`
(for `RotaryPositionalEmbeddings`; torchtune 0.6 imports `torchao`, which must be a version
that still has `torchao.dtypes.nf4tensor`, e.g. 0.10). The same weights are copied in
(`to_reference`), it runs single-threaded like XLA here, its rounds are interleaved with ours,
and its logits are compared with ours: on the timed weights in float32 and float64, and on a
well-conditioned copy of them (prompt, one KV and one KV+G step) in float32, where they must
agree (`_Reference._agreement` says why float32 alone says little on random weights).
Without torch (or the folder) the mode is skipped with a one-line message.

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

import numpy as np  # noqa: E402

# A user's own XLA_FLAGS is kept, and then XLA may use several threads: the header says so.
_SINGLE_THREADED = "--xla_cpu_multi_thread_eigen=false" in os.environ["XLA_FLAGS"]


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
    ref = None
    if reference is not None:
        ref = load_reference(plga, ids, logits, path=reference, max_len=max_len)
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
        if ref is not None:  # in the same round, so that load hits both alike
            ref.round(new_tokens=new_tokens, none_tokens=none_tokens)
    # On the CPU the ratios come from process CPU time (XLA single-threaded, robust to
    # load); on an accelerator the host's CPU time says little, so they come from wall time.
    on_cpu = jax.default_backend() == "cpu"
    med = {name: float(np.median(v)) for name, v in (cpu if on_cpu else wall).items()}
    rows = {
        name: {
            "cpu_s": float(np.median(cpu[name])),
            "wall_s": float(np.median(wall[name])),
            "cpu_s_all_rounds": cpu[name],
            "x_sdpa": med[name] / med["sdpa"] if name != "forward" else None,
            "compile_s": compile_s.get(name),
        }
        for name in cpu
    }
    if ref is not None:
        for name, (c, w) in ref.medians().items():
            rows[name]["reference_cpu_s"] = c
            rows[name]["reference_wall_s"] = w
            rows[name]["x_reference"] = med[name] / (c if on_cpu else w)
    threads = "single-threaded" if _SINGLE_THREADED else "threads as XLA_FLAGS says"
    where = f"CPU, {threads}" if on_cpu else jax.devices()[0].device_kind
    measure = (
        "process CPU time (wall in the last column)"
        if on_cpu
        else "wall time (the ratios; process CPU time in the first column)"
    )
    print(
        f"\n{config} (random float32 weights, {where}), prompt {prompt_len}; "
        f"decode: {new_tokens} tokens ({none_tokens} without cache) × {rounds} rounds, median "
        f"{measure}"
    )
    head = f"{'':<25} | {'CPU s':>9} | {'× SDPA':>7}"
    if ref is not None:
        head += f" | {'reference s':>11} | {'× reference':>11}"
    head += f" | {'wall s':>9}"
    if ref is not None:
        head += f" | {'ref. wall s':>11}"
    print(head)
    for name, r in rows.items():
        label = "forward (prompt)" if name == "forward" else f"decode {name}"
        line = f"{label:<25} | {r['cpu_s']:>9.4f} | "
        line += f"{r['x_sdpa']:>7.2f}" if r["x_sdpa"] is not None else f"{'':>7}"
        if ref is not None:
            if "x_reference" in r:
                line += f" | {r['reference_cpu_s']:>11.4f} | {r['x_reference']:>11.2f}"
            else:
                line += f" | {'':>11} | {'':>11}"
        line += f" | {r['wall_s']:>9.4f}"
        if "reference_wall_s" in r:
            line += f" | {r['reference_wall_s']:>11.4f}"
        print(line)
    print(
        f"collapsed / SDPA = {rows['collapsed']['x_sdpa']:.2f} (goal ≤ 1.1); "
        f"KV / SDPA = {rows['kv']['x_sdpa']:.2f}; no cache / KV = "
        f"{med['none'] / med['kv']:.1f}"
    )
    if ref is not None:
        goals = {
            "forward": rows["forward"]["x_reference"],
            "kv": rows["kv"]["x_reference"],
            "kvg": rows["kvg"]["x_reference"],
        }
        print("× reference (goal ≤ 1.0): " + ", ".join(f"{k} {v:.2f}" for k, v in goals.items()))
        print(ref.agreement_text())
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
        "device": jax.devices()[0].device_kind,
        "ratios_from": "process CPU time" if on_cpu else "wall time",
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "jax": jax.__version__,
        "reference": None if ref is None else ref.meta,
    }
    (out / "bench_decode.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return rows


def load_reference(model, ids, logits, *, path, max_len):
    """The reference PyTorch implementation at `path` (folder of `pldr_model_v510.py` and
    `power_law_attention_layer_v510.py`) holding `model`'s weights, ready to be timed round by
    round (`_Reference.round`), with its logits compared with ours. `None` (after one line
    saying why) when torch, torchtune or the reference code is not available, or the weights
    do not fit its state dict."""
    try:
        import torch
    except ImportError:
        print("reference: skipped (torch is not installed)")
        return None
    folder = Path(path)
    for name in ("pldr_model_v510.py", "power_law_attention_layer_v510.py"):
        if not (folder / name).is_file():
            print(f"reference: skipped ({folder / name} not found)")
            return None
    sys.path.insert(0, str(folder))
    try:
        import pldr_model_v510 as ref
    except ImportError as e:  # torchtune (RotaryPositionalEmbeddings) missing, or torchao
        print(f"reference: skipped (cannot import the reference model: {e})")
        return None
    from jaxattn.plga import to_reference

    c = model.config
    if c.num_heads * c.head_dim != c.d_model or c.rope != "interleaved" or c.causal_density:
        print(
            "reference: skipped (the reference needs heads·dk = D, interleaved RoPE, no causal "
            "density)"
        )
        return None
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
    weights = {k: torch.tensor(np.array(v, np.float32)) for k, v in to_reference(model).items()}
    missing, unexpected = net.load_state_dict(weights, strict=False)
    # the only entries of its state dict not in ours: RoPE buffers (not persistent in torchtune)
    if unexpected or any(not k.endswith(("cache", "theta")) for k in missing):
        print(f"reference: skipped (state dict mismatch: {missing[:3]} {unexpected[:3]})")
        return None
    net.eval()
    return _Reference(torch, net, model, ids, logits, max_len)


class _Reference:
    """The reference model, its decode states and its timings (see `load_reference`).

    Calls follow the reference's own generation loop: `net([ids, mask])` for the prompt (mask
    1 = masked, look-ahead), then `net([token, None], kvcachelst=…, Gcachelst=…)` per token,
    its KV cache `[k, v, A]` per layer (position-major `(1, seq, heads, dk)`, grown by
    concatenation) and, for KV+G, the prompt's `[A_LM, G_LM]` per layer from its attention
    outputs `[A_LM, P, a, b_a, G_LM, scores]`."""

    def __init__(self, torch, net, model, ids, logits, max_len):
        self.torch, self.net = torch, net
        self.prompt = torch.from_numpy(np.asarray(ids, np.int64).copy())[None]
        self.cpu = {k: [] for k in ("forward", "none", "kv", "kvg")}
        self.wall = {k: [] for k in self.cpu}
        with torch.inference_mode():
            lg, att, kv0 = self.run(self.prompt)
        ours = np.asarray(logits, np.float64)
        lg = lg[0].numpy().astype(np.float64)
        self.agreement = self._agreement(model, ids, ours, lg, max_len)
        tok0 = lg[-1].argmax()
        tok0 = torch.tensor([[int(tok0)]])
        G0 = [[a[0], a[4]] for a in att]
        self.seq = self.prompt
        self.caches = {"kv": (kv0, None), "kvg": (kv0, G0)}
        self.toks = {k: tok0 for k in ("none", "kv", "kvg")}
        self.meta = {
            "torch": torch.__version__,
            "max_norm_logit_error": self.agreement,
        }

    def run(self, x, net=None, **kw):
        net = self.net if net is None else net
        if "kvcachelst" in kw:
            mask = None  # one new token attends to every cached key (the reference's decode)
        else:
            S = x.shape[1]
            dtype = next(net.parameters()).dtype
            mask = self.torch.triu(self.torch.ones(S, S, dtype=dtype), 1)[None, None]
        out = net([x, mask], **kw)
        return out[0], out[2], out[3]

    def _agreement(self, model, ids, ours32, ref32, max_len):
        """Logits of the reference vs ours, max-normalised.

        A random-weight PLGA model amplifies rounding enormously: where `u = W A + b_W ≈ 0`,
        `A_LM = u² σ(u) + ε` is tiny and `A_P = A_LM^P` takes its log, so a last-bit change in
        `u` moves `A_P` by ~1e-3, and layers compound it (110M: float32 and float64 logits of
        one implementation differ by O(1)). So: (1) on the timed weights, each implementation's
        own float32-vs-float64 error beside the float32 and float64 disagreements (the
        reference's torchtune RoPE, which computes in float32 whatever the input, is replaced
        by the same rotation in float64 on its float64 copy); (2) on the same weights with
        `b_W + 3` (every `u` away from 0, a well-conditioned model), float32 logits of the
        prompt and of one KV and one KV+G step: these must agree to float32 rounding."""
        import copy

        import equinox as eqx
        import jax
        import jax.numpy as jnp

        from jaxattn.plga import decode_step, prefill, to_reference

        torch = self.torch
        out = {"float32": _max_norm(ref32, ours32)}
        net64 = copy.deepcopy(self.net).double()
        for layer in net64.decoder.dec_layers:
            rope = layer.mha1.rotary_embedding
            rope.forward = _rope64(torch, rope.dim, rope.base)
        with torch.inference_mode():
            ref64 = self.run(self.prompt, net64)[0][0].numpy()
        del net64
        with jax.enable_x64(True):
            f64 = lambda a: a.astype(jnp.float64) if jnp.issubdtype(a.dtype, jnp.floating) else a
            m64 = jax.tree.map(f64, model)
            ours64 = np.asarray(jax.jit(lambda m, i: m(i)[0])(m64, jnp.asarray(ids)))
            del m64
        out["float64"] = _max_norm(ref64, ours64)
        out["ours_float32_vs_float64"] = _max_norm(ours32, ours64)
        out["reference_float32_vs_float64"] = _max_norm(ref32, ref64)

        if model.attention != "plga":
            return out
        layers = model.layers
        shifted = eqx.tree_at(
            lambda m: [la.attn.b_W for la in m.layers], model, [la.attn.b_W + 3 for la in layers]
        )
        net = copy.deepcopy(self.net)
        net.load_state_dict(
            {k: torch.tensor(np.array(v)) for k, v in to_reference(shifted).items()}, strict=False
        )
        with torch.inference_mode():
            lg, att, kv = self.run(self.prompt, net)
            tok = int(lg[0, -1].argmax())
            G = [[a[0], a[4]] for a in att]
            x = torch.tensor([[tok]])
            ref_kv = self.run(x, net, kvcachelst=kv, Gcachelst=None)[0][0, -1].numpy()
            ref_kvg = self.run(x, net, kvcachelst=kv, Gcachelst=G)[0][0, -1].numpy()
        ours = np.asarray(jax.jit(lambda m, i: m(i)[0])(shifted, jnp.asarray(ids)))
        out["conditioned_float32"] = _max_norm(lg[0].numpy(), ours)
        for kind, r in (("kv", ref_kv), ("kvg", ref_kvg)):
            _, cache = prefill(shifted, jnp.asarray(ids), cache=kind, max_len=max_len)
            step, _ = decode_step(shifted, cache, jnp.asarray(tok))
            out[f"conditioned_float32_{kind}_step"] = _max_norm(r, np.asarray(step))
        return out

    def agreement_text(self) -> str:
        a = self.agreement
        text = (
            "reference logits vs ours (max-normalised), timed random weights: float32 "
            f"{a['float32']:.1e}, float64 {a['float64']:.1e}; each one's own float32 error "
            f"(vs its float64): ours {a['ours_float32_vs_float64']:.1e}, reference "
            f"{a['reference_float32_vs_float64']:.1e} (random weights amplify rounding: see "
            "_Reference._agreement)."
        )
        if "conditioned_float32" in a:
            text += (
                "\nsame weights with b_W + 3 (well-conditioned), float32: prompt "
                f"{a['conditioned_float32']:.1e}, KV step {a['conditioned_float32_kv_step']:.1e}, "
                f"KV+G step {a['conditioned_float32_kvg_step']:.1e}."
            )
        return text

    def round(self, *, new_tokens, none_tokens):
        """One timed round of each reference variant (forward, no cache, KV, KV+G)."""
        torch = self.torch
        with torch.inference_mode():
            t0 = _clock()
            self.run(self.prompt)
            self._add("forward", _since(t0), 1)
            t0 = _clock()
            for _ in range(none_tokens):
                self.seq = torch.cat([self.seq, self.toks["none"]], dim=1)
                lg, _, _ = self.run(self.seq)
                self.toks["none"] = lg[0, -1].argmax().reshape(1, 1)
            self._add("none", _since(t0), none_tokens)
            for name in ("kv", "kvg"):
                kv, Gc = self.caches[name]
                t0 = _clock()
                for _ in range(new_tokens):
                    lg, _, kv = self.run(self.toks[name], kvcachelst=kv, Gcachelst=Gc)
                    self.toks[name] = lg[0, -1].argmax().reshape(1, 1)
                self._add(name, _since(t0), new_tokens)
                self.caches[name] = (kv, Gc)

    def _add(self, name, cw, n):
        self.cpu[name].append(cw[0] / n)
        self.wall[name].append(cw[1] / n)

    def medians(self) -> dict[str, tuple[float, float]]:
        return {
            k: (float(np.median(self.cpu[k])), float(np.median(self.wall[k]))) for k in self.cpu
        }


def _rope64(torch, dim, base):
    """Interleaved RoPE in float64 (torchtune's `RotaryPositionalEmbeddings.forward` casts to
    float32), same call signature: `(x [b, s, heads, dk], *, input_pos=None)`."""
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))

    def forward(x, *, input_pos=None):
        start = 0 if input_pos is None else int(input_pos)
        ang = torch.arange(start, start + x.shape[1], dtype=torch.float64)[:, None] * inv
        cos, sin = torch.cos(ang)[None, :, None], torch.sin(ang)[None, :, None]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x0 * cos - x1 * sin, x1 * cos + x0 * sin], -1).flatten(3)

    return forward


def _max_norm(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


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
