#!/usr/bin/env bash
# GPU sizes for the sweep benchmark (< 8 minutes on one modern GPU): 10^4 random (A, V)
# pairs, d = 2, n = 1024, particles (natural time) and the OA / WS reductions; prints
# members/s. Usage: bash experiments/gpu_check.sh [OUT_DIR]
set -euo pipefail
OUT="${1:-gpu_check_out}"
mkdir -p "$OUT"
python - "$OUT" <<'PY'
import json, sys, time
import jax
jax.config.update("jax_enable_x64", False)  # float32 on the GPU: the sweep's home
import numpy as np
from jaxattn.dynamics._sweep import sweep

out = sys.argv[1]
print("devices:", jax.devices())
rng = np.random.default_rng(0)
pairs = 10_000
A = rng.normal(size=(pairs, 2, 2)).astype(np.float32)
V = rng.normal(size=(pairs, 2, 2)).astype(np.float32)
rows = []
for method, n, chunk in (("ott_antonsen", 1, 10_000), ("watanabe_strogatz", 1024, 10_000),
                         ("particles", 1024, 2_500)):
    kw = dict(method=method, n=n, t1=50.0, num_save=101, chunk_size=chunk, progress=True,
              dtype=np.float32, rtol=1e-5, atol=1e-7)
    t = time.perf_counter(); sweep(A[:chunk], V[:chunk], 1.0, 0, **kw)
    compile_s = time.perf_counter() - t
    t = time.perf_counter(); r = sweep(A, V, 1.0, 0, **kw); s = time.perf_counter() - t
    row = dict(method=method, n=n, pairs=pairs, seconds=s, members_per_s=pairs / s,
               first_call_s=compile_s, failed=int(r.failed.sum()), counts=r.counts())
    rows.append(row)
    print(f"{method:18s} n={n:5d}: {pairs / s:10.1f} members/s  ({s:.1f} s; first chunk {compile_s:.1f} s)"
          f"  failed={row['failed']}", flush=True)
json.dump(rows, open(f"{out}/gpu_check.json", "w"), indent=1)
PY
