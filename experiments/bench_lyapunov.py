"""Benchmark: what does a Lyapunov spectrum cost relative to the plain solve?

For each case, `lyapunov_spectrum(k=2)` (state plus two tangent vectors, JVPs, QR every
segment) against `simulate` of the same trajectory (same flow, initial tokens, horizon,
solver, rtol/atol; two save points), both jitted and warmed up, median of repeated calls.
The tangent vectors are re-orthonormalised every 2 time units (at least 20 segments).
The Ott–Antonsen case compares `lyapunov_spectrum_ott_antonsen` with `solve_ott_antonsen`.
Goal (issue 9): ≤ 3× for k = 2.

The ratio is reported as time and as accepted steps: the augmented solve controls the error
of the tangent vectors too, so it may take more steps than the plain solve.

Measured on the shared 2-core CPU (one XLA thread, process CPU time, float64): Ott–Antonsen
2.3×; LSA n = 64, d = 3: 3.5×; USA n = 32, d = 8: 3.3×; the three-token candidate 4.1–5.9×
(noisy). The goal is met for the OA reduction only. With error control on the state alone
the step counts match the plain solve to within 15 % (segment restarts), so the excess is
per step: two JVPs cost about twice the primal for the attention fields, and for three
tokens the step is dominated by per-operation overhead that the augmented state multiplies.

Run: `python experiments/bench_lyapunov.py` (a few minutes; `--quick` for a smoke run).
As a script XLA and BLAS are single-threaded and times are process CPU time
(`time.process_time`), so a busy shared machine measures work, not waiting.
"""

import argparse
import json
import os
import statistics
import time
from pathlib import Path


def _median_time(fn, *args, repeats=5):
    import jax

    out = jax.block_until_ready(fn(*args))  # compile + warm up
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        jax.block_until_ready(fn(*args))
        times.append(time.process_time() - t0)
    return statistics.median(times), out


def _cases(quick):
    import numpy as np

    rng = np.random.default_rng(0)
    th3 = np.array([0.4, 2.1, -1.9])
    x3 = np.stack([np.cos(th3), np.sin(th3)], -1)
    out = [
        dict(
            name="USA n=3 d=2 (chaos candidate)",
            A=np.array([[0.0, 0.0], [-2.0, 1.0]]),
            V=np.array([[0.0, 1.0], [-2.0, 0.0]]),
            kernel="usa",
            x0=x3,
            t1=100.0 if quick else 400.0,
        )
    ]
    for n, d, kernel, t1 in ((64, 3, "lsa", 40.0), (32, 8, "usa", 20.0)):
        x0 = rng.normal(size=(n, d))
        out.append(
            dict(
                name=f"{kernel.upper()} n={n} d={d}",
                A=rng.normal(size=(d, d)) / np.sqrt(d),
                V=rng.normal(size=(d, d)) / np.sqrt(d),
                kernel=kernel,
                x0=x0 / np.linalg.norm(x0, axis=1, keepdims=True),
                t1=t1 / 4 if quick else t1,
            )
        )
    return out


def main(*, quick=False, seed=0, out_dir=None, repeats=5, k=2, segment=2.0):
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxattn.dynamics import (
        AttentionDynamics,
        lyapunov_spectrum,
        lyapunov_spectrum_ott_antonsen,
        simulate,
        solve_ott_antonsen,
    )

    del seed
    repeats = 2 if quick else repeats
    tol = dict(rtol=1e-8, atol=1e-10)
    rows = []
    with jax.enable_x64(True):
        for c in _cases(quick):
            field = AttentionDynamics(c["A"], c["V"], beta=1.0, kernel=c["kernel"])
            x0 = jnp.asarray(c["x0"])
            t1 = c["t1"]
            plain = eqx.filter_jit(
                lambda f, x, t1=t1: simulate(f, x, t1=t1, num_save=2, max_steps=2**20, **tol)
            )
            lyap = eqx.filter_jit(
                lambda f, x, t1=t1: lyapunov_spectrum(
                    f, x, t1=t1, k=k, num_renorm=max(20, round(t1 / segment)), **tol
                )
            )
            tp, tr = _median_time(plain, field, x0, repeats=repeats)
            tl, sp = _median_time(lyap, field, x0, repeats=repeats)
            rows.append(
                dict(
                    case=c["name"],
                    t1=t1,
                    plain_s=tp,
                    lyapunov_s=tl,
                    ratio=tl / tp,
                    plain_steps=int(tr.num_accepted_steps),
                    lyapunov_steps=int(sp.num_accepted_steps),
                    exponents=np.asarray(sp.exponents).tolist(),
                )
            )
        A, V = jnp.eye(2), jnp.array([[0.2, 1.0], [-1.0, -0.2]])
        t1 = 100.0 if quick else 400.0
        plain = jax.jit(lambda a, v: solve_ott_antonsen(a, v, 0.3 + 0.1j, t1=t1, num_save=2, **tol))
        lyap = jax.jit(
            lambda a, v: lyapunov_spectrum_ott_antonsen(
                a, v, 0.3 + 0.1j, t1=t1, k=2, num_renorm=max(20, round(t1 / segment)), **tol
            )
        )
        tp, tr = _median_time(plain, A, V, repeats=repeats)
        tl, sp = _median_time(lyap, A, V, repeats=repeats)
        rows.append(
            dict(
                case="Ott–Antonsen Case-4 orbit",
                t1=t1,
                plain_s=tp,
                lyapunov_s=tl,
                ratio=tl / tp,
                plain_steps=int(tr.num_accepted_steps),
                lyapunov_steps=int(sp.num_accepted_steps),
                exponents=np.asarray(sp.exponents).tolist(),
            )
        )
    print(
        f"lyapunov_spectrum(k={k}, renormalised every {segment:g} time units, at least 20 "
        f"segments) vs the plain solve, rtol 1e-8, "
        f"atol 1e-10, float64, process CPU time, median of {repeats}; goal ratio <= 3"
    )
    print(f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")
    head = f"{'case':32s} {'t1':>6s} {'plain s':>9s} {'lyap s':>9s} {'ratio':>6s} "
    head += f"{'steps':>7s} {'steps':>7s}  exponents"
    print(head)
    for r in rows:
        print(
            f"{r['case']:32s} {r['t1']:6.0f} {r['plain_s']:9.4f} {r['lyapunov_s']:9.4f} "
            f"{r['ratio']:6.2f} {r['plain_steps']:7d} {r['lyapunov_steps']:7d}  "
            + ", ".join(f"{e:+.4f}" for e in r["exponents"])
        )
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench_lyapunov.json").write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    # one XLA/BLAS thread: CPU time then measures the work of one core
    os.environ.setdefault(
        "XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    )
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out-dir", default=None)
    a = p.parse_args()
    main(quick=a.quick, out_dir=a.out_dir)
