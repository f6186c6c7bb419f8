"""Members/s of `sweep` on an accelerator against its chunk size, pool slots and strategy.

The defaults of `Runner` on GPUs and TPUs (`ACCELERATOR_SLOTS`, `ACCELERATOR_CHUNK`) come
from this script's first run on an H200 (2026-12-04), which set the earlier defaults (chunks
of 1024, 128 slots) against the alternatives; the rows with explicit `chunk_size=1024,
slots=128` reproduce those. Side by side in one run: random (A, V) pairs, d = 2, float32,
t1 = 50, 101 saves, matmuls at "highest" precision, the second call of each configuration
timed (the first compiles). Prints a table (with the slots each pool used: the chunk can
cap them) and writes it as JSON after each row.

Usage: python experiments/gpu_sizes.py OUT.json [SCALE]   (SCALE=0.01 is a CPU smoke test)
"""

import json
import sys
import time

import jax

jax.config.update("jax_default_matmul_precision", "highest")
import numpy as np  # noqa: E402

from jaxattn.dynamics import environment_record, sweep  # noqa: E402


def main(out: str, scale: float) -> None:
    print("environment:", environment_record(np.float32), flush=True)
    rng = np.random.default_rng(0)

    def pairs(k):
        A = rng.normal(size=(k, 2, 2)).astype(np.float32)
        V = rng.normal(size=(k, 2, 2)).astype(np.float32)
        return A, V

    big, small = max(64, int(1e5 * scale)), max(64, int(1e4 * scale))
    n = 1024 if scale >= 1 else 16
    oa, ws = pairs(big), pairs(small)
    # The most telling first: a run cut short by a time limit keeps the rows written so far.
    configs = [
        ("ott_antonsen", 3, oa, dict(chunk_size=1024)),
        ("ott_antonsen", 3, oa, dict()),
        ("watanabe_strogatz", n, ws, dict(chunk_size=1024, slots=128)),
        ("watanabe_strogatz", n, ws, dict()),
        ("particles", n, ws, dict(chunk_size=1024, slots=128)),
        ("particles", n, ws, dict()),
        ("particles", n, ws, dict(slots=4096)),
        ("ott_antonsen", 3, oa, dict(strategy="compact")),
        ("ott_antonsen", 3, oa, dict(chunk_size=16384)),
        ("watanabe_strogatz", n, ws, dict(slots=1024)),
        ("watanabe_strogatz", n, ws, dict(strategy="lockstep")),
    ]
    rows = []
    for method, nn, (A, V), opts in configs:
        kw = dict(
            method=method,
            n=nn,
            t1=50.0,
            num_save=101,
            progress=False,
            dtype=np.float32,
            rtol=1e-5,
            atol=1e-7,
            **opts,
        )
        t = time.perf_counter()
        sweep(A, V, 1.0, 0, **kw)
        first = time.perf_counter() - t
        t = time.perf_counter()
        r = sweep(A, V, 1.0, 0, **kw)
        s = time.perf_counter() - t
        row = dict(
            method=method,
            n=nn,
            members=len(A),
            options=opts,
            seconds=s,
            members_per_s=len(A) / s,
            first_call_s=first,
            lockstep_efficiency=r.lockstep_efficiency,
            failed=int(r.failed.sum()),
            chunk_sizes=r.plan["chunk_sizes"][:4],
            slots=r.plan.get("slots_per_device", [None])[:1],
            counts=r.counts(),
        )
        rows.append(row)
        print(
            f"{method:18s} n={nn:5d} members={len(A):7d} {str(opts):42s} "
            f"slots {str(row['slots'][0]):>5s} "
            f"{len(A) / s:10.1f} members/s ({s:6.2f} s; first {first:5.1f} s) "
            f"efficiency {r.lockstep_efficiency:.2f} failed {row['failed']}",
            flush=True,
        )
        with open(out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    usage = "usage: python experiments/gpu_sizes.py OUT.json [SCALE > 0]"
    if len(sys.argv) not in (2, 3):
        sys.exit(usage)
    try:
        scale = float(sys.argv[2]) if len(sys.argv) == 3 else 1.0
    except ValueError:
        sys.exit(f"{usage}; got SCALE {sys.argv[2]!r}")
    if not scale > 0:
        sys.exit(f"{usage}; got SCALE {scale}")
    main(sys.argv[1], scale)
