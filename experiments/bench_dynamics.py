"""Benchmark: how fast is the attention particle flow in jaxattn?

Two questions:

1. Right-hand side: the O(n d²) moment form of LSA (`AttentionDynamics.__call__`) against
   the O(n² d) pairwise sum (`AttentionDynamics.direct_sum`), both jitted, for
   n ∈ {256, 1024, 4096}, d ∈ {2, 16, 64} (median wall time of repeated calls).
2. One solve at n = 200, d = 100 (the paper's size), to t1 = 5 (a handful of steps:
   overhead-bound) and t1 = 50 (clustering under way, ~100 steps): `jaxattn.dynamics.simulate` with
   `diffrax.Dopri5` against `scipy.integrate.solve_ivp(method="RK45")` (the same
   Dormand–Prince 5(4) pair) on a numpy right-hand side, at the same rtol/atol; speed ratio
   and the error of each against a tight reference (Dopri8 at rtol 1e-12).

Goals (issue 2): ≥ 50× for the RHS at n = 4096, d = 64; ≥ 10× for the solve.
Measured on the shared 2-core CPU (one XLA thread, CPU time): RHS ×60 at n = 4096, d = 64;
the solve ×0.6–0.9, i.e. not met: both sides evaluate the same O(n d²) moment form, which at
n = 200, d = 100 is compute-bound (~0.7 ms per call), so scipy's per-step Python overhead is
small and there is nothing left for compilation to win on one CPU thread.
Run: `python experiments/bench_dynamics.py` (a few minutes; `--quick` for a smoke run).
Run as a script, XLA and BLAS are single-threaded and times are process CPU time
(`time.process_time`), so a busy shared machine measures work, not waiting; pass
`clock="wall"` to `main` for wall time. Compare ratios, not seconds, across machines.
"""

import argparse
import json
import os
import statistics
import time
from pathlib import Path

_CLOCK = {"process": time.process_time, "wall": time.perf_counter}
_clock = time.process_time


def _median_time(fn, *args, repeats=7, min_time=0.2):
    import jax

    jax.block_until_ready(fn(*args))  # compile + warm up
    times = []
    for _ in range(repeats):
        reps, t0 = 0, _clock()
        while True:
            jax.block_until_ready(fn(*args))
            reps += 1
            elapsed = _clock() - t0
            if elapsed >= min_time / repeats or reps >= 1000:
                break
        times.append(elapsed / reps)
    return statistics.median(times)


def bench_rhs(*, sizes, dims, seed=0, repeats=7, dtype="float64"):
    """Median time of one RHS evaluation, moment form vs direct sum. Returns rows of dicts."""
    import jax
    import jax.numpy as jnp

    from jaxattn.dynamics import AttentionDynamics
    from jaxattn.sphere import sample_uniform

    rows = []
    key = jax.random.key(seed)
    for d in dims:
        kA, kV, key = jax.random.split(key, 3)
        A = jax.random.normal(kA, (d, d), dtype) / jnp.sqrt(d)
        V = jax.random.normal(kV, (d, d), dtype) / jnp.sqrt(d)
        field = AttentionDynamics(A, V, beta=1.0)
        fast = jax.jit(lambda f, x: f(0.0, x, None))
        direct = jax.jit(lambda f, x: f.direct_sum(x))
        for n in sizes:
            key, kx = jax.random.split(key)
            x = sample_uniform(kx, n, d, dtype=dtype)
            err = float(jnp.max(jnp.abs(fast(field, x) - direct(field, x))))
            t_fast = _median_time(fast, field, x, repeats=repeats)
            t_direct = _median_time(direct, field, x, repeats=repeats)
            rows.append(
                dict(
                    n=n,
                    d=d,
                    moment_s=t_fast,
                    direct_s=t_direct,
                    speedup=t_direct / t_fast,
                    max_abs_diff=err,
                )
            )
            print(
                f"  rhs n={n:5d} d={d:3d}: moment {t_fast * 1e6:10.1f} µs  direct "
                f"{t_direct * 1e6:11.1f} µs  ×{t_direct / t_fast:7.1f}  |Δ| {err:.1e}",
                flush=True,
            )
    return rows


def _numpy_rhs(A, V, beta):
    import numpy as np

    n_d = None

    def rhs(t, y):
        nonlocal n_d
        X = y.reshape(n_d)
        Xh = X / np.linalg.norm(X, axis=1, keepdims=True)
        n = Xh.shape[0]
        drive = (beta / n) * (Xh @ (A @ (Xh.T @ Xh) @ V.T))
        F = drive - np.sum(Xh * drive, axis=1, keepdims=True) * Xh
        return F.ravel()

    def set_shape(shape):
        nonlocal n_d
        n_d = shape

    return rhs, set_shape


def bench_solve(*, n=200, d=100, t1=5.0, rtol=1e-6, atol=1e-9, seed=0, repeats=3):
    """One LSA solve with simulate (Dopri5) vs scipy solve_ivp (RK45), same tolerances."""
    import diffrax
    import jax
    import jax.numpy as jnp
    import numpy as np
    from scipy.integrate import solve_ivp

    from jaxattn.dynamics import AttentionDynamics, simulate
    from jaxattn.sphere import sample_uniform

    kA, kV, kx = jax.random.split(jax.random.key(seed), 3)
    # A, V = I + noise/√d: clustering sets in over t ~ 1 while the tokens still move at t1
    A = jnp.eye(d) + jax.random.normal(kA, (d, d)) / jnp.sqrt(d)
    V = jnp.eye(d) + jax.random.normal(kV, (d, d)) / jnp.sqrt(d)
    x0 = sample_uniform(kx, n, d)
    field = AttentionDynamics(A, V, beta=1.0)
    ts = jnp.array([0.0, t1])

    def run(solver, rt, at):
        return simulate(
            field,
            x0,
            t1=t1,
            ts=ts,
            solver=solver,
            rtol=rt,
            atol=at,
            max_steps=1_000_000,
            project=False,
        ).final

    ref = np.asarray(run(diffrax.Dopri8(), 1e-12, 1e-14))
    jax_solve = jax.jit(lambda: run(diffrax.Dopri5(), rtol, atol))
    t0 = _clock()
    jax.block_until_ready(jax_solve())
    t_compile = _clock() - t0
    t_jax = _median_time(jax_solve, repeats=repeats, min_time=0.0)
    x_jax = np.asarray(jax_solve())
    # projected variant (the default of simulate): keeps |x_k| = 1 to rounding
    proj = jax.jit(
        lambda: (
            simulate(
                field,
                x0,
                t1=t1,
                ts=ts,
                solver=diffrax.Dopri5(),
                rtol=rtol,
                atol=atol,
                max_steps=1_000_000,
            ).final
        )
    )
    t_proj = _median_time(proj, repeats=repeats, min_time=0.0)
    x_proj = np.asarray(proj())

    rhs, set_shape = _numpy_rhs(np.asarray(A), np.asarray(V), 1.0)
    set_shape((n, d))
    times = []
    for _ in range(max(1, repeats)):
        t0 = _clock()
        sol = solve_ivp(rhs, (0.0, t1), np.asarray(x0).ravel(), method="RK45", rtol=rtol, atol=atol)
        times.append(_clock() - t0)
    t_scipy = statistics.median(times)
    x_scipy = sol.y[:, -1].reshape(n, d)
    x_scipy = x_scipy / np.linalg.norm(x_scipy, axis=1, keepdims=True)

    def err(x):
        return float(np.max(np.abs(x - ref)))

    row = dict(
        n=n,
        d=d,
        t1=t1,
        rtol=rtol,
        atol=atol,
        jax_s=t_jax,
        jax_projected_s=t_proj,
        jax_compile_s=t_compile,
        scipy_s=t_scipy,
        speedup=t_scipy / t_jax,
        speedup_projected=t_scipy / t_proj,
        err_jax=err(x_jax),
        err_jax_projected=err(x_proj),
        err_scipy=err(x_scipy),
        scipy_nfev=int(sol.nfev),
    )
    print(
        f"  solve n={n} d={d} t1={t1:g} rtol={rtol:g}: jaxattn {t_jax:.3f} s (projected "
        f"{t_proj:.3f} s, compile {t_compile:.1f} s), scipy RK45 {t_scipy:.3f} s "
        f"({sol.nfev} RHS calls) -> ×{t_scipy / t_jax:.1f}; error vs Dopri8@1e-12: "
        f"jaxattn {row['err_jax']:.1e} (projected {row['err_jax_projected']:.1e}), "
        f"scipy {row['err_scipy']:.1e}",
        flush=True,
    )
    return row


def main(*, quick=False, seed=0, out_dir=None, repeats=7, clock="process"):
    """Run both benchmarks, print the table, and (with `out_dir`) write `bench_dynamics.json`.

    **Arguments:** `quick` small sizes for a smoke run; `seed`; `out_dir` a folder or None;
    `repeats` timing repeats (median); `clock` `"process"` (CPU time of this process) or
    `"wall"`.

    **Returns:** a dict with the `rhs` rows and the `solve` rows (t1 = 5 and t1 = 50).
    """
    import jax

    global _clock
    _clock = _CLOCK[clock]
    jax.config.update("jax_enable_x64", True)  # the benchmark's own choice, at run time
    sizes = (64, 256) if quick else (256, 1024, 4096)
    dims = (2, 16) if quick else (2, 16, 64)
    print(
        f"jaxattn dynamics benchmark on {jax.devices()[0].device_kind} "
        f"({jax.default_backend()}), float64, {clock} time, "
        f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}",
        flush=True,
    )
    rhs = bench_rhs(sizes=sizes, dims=dims, seed=seed, repeats=3 if quick else repeats)
    horizons = (2.0,) if quick else (5.0, 50.0)
    solves = [
        bench_solve(
            n=50 if quick else 200,
            d=20 if quick else 100,
            t1=t1,
            seed=seed,
            repeats=1 if quick else 3,
        )
        for t1 in horizons
    ]
    print()
    print("| n | d | moment form (µs) | direct sum (µs) | speed-up |")
    print("|---:|---:|---:|---:|---:|")
    for r in rhs:
        print(
            f"| {r['n']} | {r['d']} | {r['moment_s'] * 1e6:.1f} | {r['direct_s'] * 1e6:.1f} | "
            f"{r['speedup']:.1f}× |"
        )
    print()
    print(
        "| solve (n, d, t1, rtol/atol) | jaxattn Dopri5 | scipy RK45 | speed-up "
        "| error jaxattn | error scipy |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for s in solves:
        print(
            f"| {s['n']}, {s['d']}, {s['t1']:g}, {s['rtol']:g}/{s['atol']:g} | {s['jax_s']:.3f} s "
            f"(projected {s['jax_projected_s']:.3f} s) | {s['scipy_s']:.3f} s "
            f"({s['scipy_nfev']} RHS calls) | {s['speedup']:.1f}× | {s['err_jax']:.1e} "
            f"| {s['err_scipy']:.1e} |"
        )
    result = {"rhs": rhs, "solve": solves}
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench_dynamics.json").write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    # single-threaded XLA and BLAS (set before jax/numpy start): CPU time is then the work
    os.environ.setdefault(
        "XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    )
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", default=None)
    parser.add_argument("--clock", choices=("process", "wall"), default="process")
    a = parser.parse_args()
    main(quick=a.quick, seed=a.seed, out_dir=a.out_dir, clock=a.clock)
