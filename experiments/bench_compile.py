"""Compile time and run time of jaxattn's programs on the CPU under XLA's default fusion
emitters and under `--xla_cpu_use_fusion_emitters=false` (XLA's elemental emitters), side by
side in one run.

Question: compilation dominates the test suite and first calls on a laptop CPU (the suite's
compile listener measured 55 % of all in-process test time in XLA's backend compiler on
2026-12-03). What does the emitter choice buy in compile time, and what does it cost or buy
in run time? The numbers decide whether `jaxattn`'s command line (and the tests) turn the
elemental emitters on (`jaxattn.prefer_fast_cpu_compiles`).

Each configuration runs in its own subprocess (XLA reads `XLA_FLAGS` once, when the CPU
backend starts); configurations alternate over `--rounds` rounds so that load from other
processes hits both alike, and medians are reported. Per program: XLA compile seconds (JAX's
`backend_compile_duration` events of the first call), run seconds (a second call on new
inputs, compiled code only), and the outputs' agreement between the configurations.

Programs (float64): `sweep` of random (A, V) pairs (d = 2, n = 64, t1 = 50) by particles,
Watanabe–Strogatz and Ott–Antonsen; one `simulate` (n = 256, d = 8); a PLDR-LLM training
step (`jax.value_and_grad` of the next-token loss, small config) and its forward pass.

Run: `python experiments/bench_compile.py [--rounds 2] [--members 64] [--out FILE.json]`.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

FLAG = "--xla_cpu_use_fusion_emitters=false"

_CHILD = r"""
import json, sys, time
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp, numpy as np
members = int(sys.argv[1])
compile_s = {"v": 0.0}
def _listen(event, duration, **kw):
    if event == "/jax/core/compile/backend_compile_duration":
        compile_s["v"] += duration
jax.monitoring.register_event_duration_secs_listener(_listen)

def measure(name, first, second, summary):
    compile_s["v"] = 0.0
    out = first(); jax.block_until_ready(out)
    c = compile_s["v"]
    t = time.perf_counter(); out2 = second(); jax.block_until_ready(out2)
    r = time.perf_counter() - t
    results[name] = dict(compile=c, run=r, summary=summary(out2))

results = {}
from jaxattn.dynamics import sweep, simulate, AttentionDynamics
from jaxattn.sphere import sample_uniform
rng = np.random.default_rng(0)
A = rng.normal(size=(members, 2, 2)); V = rng.normal(size=(members, 2, 2))
for method in ("particles", "watanabe_strogatz", "ott_antonsen"):
    kw = dict(n=64, t1=50.0, method=method, progress=False)
    run = lambda s: sweep(A, V, 1.0, np.arange(members) + s, **kw)
    measure(method, lambda: run(0), lambda: run(10_000),
            lambda r: dict(regimes=r.regime_names.tolist(), R2=np.abs(np.asarray(r.R2)).tolist(),
                           steps=int(np.sum(r.num_steps))))
Ad = jnp.asarray(rng.normal(size=(8, 8))) / 3; Vd = jnp.eye(8)
flow = AttentionDynamics(Ad, Vd, beta=1.0, kernel="sa")
sim = jax.jit(lambda x0: simulate(flow, x0, t1=20.0).xs[-1])
measure("simulate", lambda: sim(sample_uniform(jax.random.key(0), 256, 8)),
        lambda: sim(sample_uniform(jax.random.key(1), 256, 8)),
        lambda x: dict(x=np.asarray(x).ravel().tolist()))
from jaxattn.plga import PLDRLLM, PLDRLLMConfig
import equinox as eqx, optax
cfg = PLDRLLMConfig(vocab_size=256, d_model=64, num_layers=2, num_heads=2, head_dim=32, dff=128,
                    A_dff=64, num_reslayerA=2, num_denseA=1, context_length=64)
model = PLDRLLM(cfg, key=jax.random.key(0), dtype=jnp.float64)
def loss(m, ids):
    logits, _ = m(ids[:-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, ids[1:]).mean()
step = eqx.filter_jit(eqx.filter_value_and_grad(loss))
fwd = eqx.filter_jit(lambda m, ids: m(ids)[0])
ids = lambda s: jax.random.randint(jax.random.key(s), (64,), 0, 256)
measure("plga_train_step", lambda: step(model, ids(0)), lambda: step(model, ids(1)),
        lambda o: dict(loss=float(o[0])))
measure("plga_forward", lambda: fwd(model, ids(0)), lambda: fwd(model, ids(1)),
        lambda o: dict(logits=np.asarray(o).ravel()[:512].tolist()))
print(json.dumps(results))
"""


def _run(flag: str, members: int) -> dict:
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + flag).strip()
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(members)],
        env=env,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise SystemExit(
            f"bench_compile: child with XLA_FLAGS={env['XLA_FLAGS']!r} failed:\n"
            + out.stderr[-3000:]
        )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _agreement(a, b) -> str:
    """How far the second configuration's outputs are from the first's."""
    import numpy as np

    worst, same_labels = 0.0, True
    for k in a:
        if k == "regimes":
            same_labels = a[k] == b[k]
            continue
        x, y = np.asarray(a[k], float), np.asarray(b[k], float)
        ok = np.isfinite(x) & np.isfinite(y)
        scale = np.maximum(np.abs(x[ok]), 1.0)
        if ok.any():
            worst = max(worst, float(np.max(np.abs(x[ok] - y[ok]) / scale)))
    return f"{worst:.1e}" + ("" if same_labels else " (regimes differ)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--members", type=int, default=64)
    p.add_argument("--out", default=None, help="write the table as JSON here")
    args = p.parse_args()
    from jaxattn._xla_flags import _knows_elemental_flag

    if not _knows_elemental_flag():
        sys.exit(
            "bench_compile: this jaxlib (0.11.1 or later) has no elemental CPU emitters "
            "and no --xla_cpu_use_fusion_emitters flag; there is nothing to compare."
        )
    runs = {"default": [], "elemental": []}
    for _ in range(args.rounds):
        runs["default"].append(_run("", args.members))
        runs["elemental"].append(_run(FLAG, args.members))
    rows = []
    print(f"XLA CPU emitters: default vs {FLAG} ({args.rounds} rounds, medians)")
    head = f"{'program':18s} {'compile s':>10s} {'elemental':>10s} {'ratio':>6s}"
    head += f" {'run s':>8s} {'elemental':>10s} {'ratio':>6s}  max rel. diff"
    print(head)
    for prog in runs["default"][0]:
        med = {
            cfg: {q: statistics.median(r[prog][q] for r in rs) for q in ("compile", "run")}
            for cfg, rs in runs.items()
        }
        agree = _agreement(
            runs["default"][0][prog]["summary"], runs["elemental"][0][prog]["summary"]
        )
        c0, c1 = med["default"]["compile"], med["elemental"]["compile"]
        r0, r1 = med["default"]["run"], med["elemental"]["run"]
        print(
            f"{prog:18s} {c0:10.2f} {c1:10.2f} {c1 / c0:6.2f} {r0:8.3f} {r1:10.3f} "
            f"{r1 / r0:6.2f}  {agree}"
        )
        rows.append(
            dict(
                program=prog,
                compile_default=c0,
                compile_elemental=c1,
                run_default=r0,
                run_elemental=r1,
                max_relative_difference=agree,
            )
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                dict(flag=FLAG, rounds=args.rounds, members=args.members, rows=rows), f, indent=1
            )


if __name__ == "__main__":
    main()
