#!/usr/bin/env bash
# GPU check (< 8 minutes on one modern GPU): the sweep benchmark at GPU sizes (random (A, V)
# pairs, d = 2, default runner: OA at 10^4 and 10^6 members, WS at 10^4 and 10^5 and
# particles at 10^4, both at n = 1024), the decode benchmark
# and the full atlas; prints members/s, per-token times and the device. Matmuls run at
# "highest" precision (TF32 changes step counts); the precision is recorded in the JSON.
# Usage: bash experiments/gpu_check.sh [OUT_DIR] [PAIRS]   (PAIRS=64 is a CPU smoke test)
set -euo pipefail
OUT="${1:-gpu_check_out}"
PAIRS="${2:-10000}"
mkdir -p "$OUT"
python - "$OUT" "$PAIRS" <<'PY'
import json, sys, time
import jax
jax.config.update("jax_enable_x64", False)  # float32 on the GPU: the sweep's home
jax.config.update("jax_default_matmul_precision", "highest")
import numpy as np
from jaxattn.dynamics import environment_record, sweep

out = sys.argv[1]
env = environment_record(np.float32)
print("environment:", env)
rng = np.random.default_rng(0)
base = int(sys.argv[2])
rows = []
gpu_sizes = base >= 1000
n_big = 1024 if gpu_sizes else 64
jobs = [("ott_antonsen", 1, base), ("watanabe_strogatz", n_big, base), ("particles", n_big, base)]
if gpu_sizes:
    jobs += [("ott_antonsen", 1, 100 * base), ("watanabe_strogatz", n_big, 10 * base)]
for method, n, pairs in jobs:
    n = max(n, 3)  # the n the members run with (a sweep needs n >= 3), as printed
    A = rng.normal(size=(pairs, 2, 2)).astype(np.float32)
    V = rng.normal(size=(pairs, 2, 2)).astype(np.float32)
    kw = dict(method=method, n=n, t1=50.0, num_save=101, progress=True,
              dtype=np.float32, rtol=1e-5, atol=1e-7)
    t = time.perf_counter(); sweep(A, V, 1.0, 0, **kw)
    compile_s = time.perf_counter() - t
    t = time.perf_counter(); r = sweep(A, V, 1.0, 0, **kw); s = time.perf_counter() - t
    row = dict(method=method, n=n, pairs=pairs, seconds=s, members_per_s=pairs / s,
               first_call_s=compile_s, failed=int(r.failed.sum()), counts=r.counts(),
               lockstep_efficiency=r.lockstep_efficiency, chunk_sizes=r.plan["chunk_sizes"][:8],
               environment=r.environment)
    rows.append(row)
    print(f"{method:18s} n={n:5d} members={pairs:8d}: {pairs / s:10.1f} members/s  ({s:.1f} s; first call {compile_s:.1f} s)"
          f"  failed={row['failed']}  lockstep efficiency {r.lockstep_efficiency:.2f}", flush=True)
    json.dump(rows, open(f"{out}/gpu_check.json", "w"), indent=1)  # after each job
PY
if [ "$PAIRS" -ge 1000 ]; then
  python experiments/bench_decode.py --config v51-110m | tee "$OUT/decode.txt"
  timeout 300 jaxattn atlas --out "$OUT/atlas" --no-progress | tee "$OUT/atlas.txt" || echo "atlas: not finished in 300 s"
else
  python experiments/bench_decode.py --quick | tee "$OUT/decode.txt"
fi
