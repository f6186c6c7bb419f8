#!/usr/bin/env bash
# GPU check (< 8 minutes on one modern GPU): the sweep benchmark at GPU sizes (random (A, V)
# pairs, d = 2, default runner: OA at 10^4 and 10^6 members, WS at 10^4 and 10^5 and
# particles at 10^4, both at n = 1024), the decode benchmark
# and the full atlas; prints members/s, per-token times and the device. Matmuls run at
# "highest" precision (TF32 changes step counts); the precision is recorded in the JSON.
# Usage: bash experiments/gpu_check.sh [OUT_DIR] [PAIRS]   (PAIRS=64 is a CPU smoke test)
# Each part has its own time limit in seconds (SWEEP_S, DECODE_S, ATLAS_S; defaults 200, 100,
# 180: 8 minutes in all), so one slow or failing part still leaves the others their time;
# the sweep part writes its JSON after each job. It runs from a checkout without installing
# (PYTHON, default python3). On the H200 (2026-12-04) the sweeps took about 250 s with the
# earlier accelerator defaults (OA at 10^6: 75 s) and the atlas did not finish in 140 s.
set -uo pipefail
OUT="${1:-gpu_check_out}"
PAIRS="${2:-10000}"
PY="${PYTHON:-python3}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
case "$PAIRS" in
  '' | *[!0-9]* | 0) echo "gpu_check: PAIRS must be a positive integer, got '$PAIRS'" >&2; exit 2 ;;
esac
OUT="$(mkdir -p "$OUT" && cd "$OUT" && pwd)" || { echo "gpu_check: cannot create the output folder '${1:-gpu_check_out}'" >&2; exit 2; }
cd "$ROOT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
timeout "${SWEEP_S:-200}" "$PY" - "$OUT" "$PAIRS" <<'PY' 2>&1 | tee "$OUT/sweep.txt"
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
    kw = dict(method=method, n=n, t1=50.0, num_save=101, progress=False,
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
stopped() {  # part, status, limit: says why a part stopped, on screen and in its file
  local why="failed (exit status $2)"
  [ "$2" -eq 124 ] && why="ran past its limit of $3 s"
  echo "$1: stopped, $why" | tee -a "$OUT/$1.txt"
}
st=${PIPESTATUS[0]}; [ "$st" -eq 0 ] || stopped sweep "$st" "${SWEEP_S:-200}"
if [ "$PAIRS" -ge 1000 ]; then DECODE=(--config v51-110m); else DECODE=(--quick); fi
timeout "${DECODE_S:-100}" "$PY" experiments/bench_decode.py "${DECODE[@]}" --out-dir "$OUT" 2>&1 | tee "$OUT/decode.txt"
st=${PIPESTATUS[0]}; [ "$st" -eq 0 ] || stopped decode "$st" "${DECODE_S:-100}"
if [ "$PAIRS" -ge 1000 ]; then
  timeout "${ATLAS_S:-180}" "$PY" -m jaxattn atlas --out "$OUT/atlas" --no-progress 2>&1 | tee "$OUT/atlas.txt"
  st=${PIPESTATUS[0]}; [ "$st" -eq 0 ] || stopped atlas "$st" "${ATLAS_S:-180}"
fi
