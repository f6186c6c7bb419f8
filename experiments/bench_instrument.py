"""Benchmark of the regime instrument at its defaults (prints tables, writes JSON).

Questions answered, each measured side by side in one run:

1. Sweeps with no tuning (`sweep(A, V, 1.0, 0, method=...)`, auto chunks) on random
   (A, V) pairs, d = 2, n = 256, LSA, t1 = 50, physical and natural time: members/s,
   lockstep efficiency `Σ steps_i / Σ_chunks (size · max steps)`, and the ratio to a loop
   of `scipy.integrate.solve_ivp` (RK45, NumPy right-hand side, same tolerances; timed on a
   subset and scaled) and, for Watanabe–Strogatz, to the Ott–Antonsen sweep of the same
   members (goals: particles ≥ 10× scipy, WS ≥ 1/3 of OA, efficiency ≥ 0.8).
2. Regime maps of the rotating family `A = I, V = aI + bJ`: 64×64 cells × 8 inits with
   Ott–Antonsen and 32×32 × 4 with particles (n = 256): wall time, members/s, agreement of
   the dominant regime with the stated law (a > 0 rotating, a < 0 spread out).

Run: `python experiments/bench_instrument.py [--quick] [--out DIR]`. Timings exclude
compilation where a configuration is run twice (`_timed`), and include it for the maps
(what a user waits for).
"""

import argparse
import json
import os
import time

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402

from jaxattn.dynamics import regime_map, sweep  # noqa: E402


def _timed(fn):
    fn()  # compile
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def _scipy_rate(A, V, n, t1, members, rtol=1e-7, atol=1e-9):
    from scipy.integrate import solve_ivp

    rng = np.random.default_rng(0)
    t = time.perf_counter()
    for i in range(members):
        th = rng.uniform(-np.pi, np.pi, n)
        x0 = np.stack([np.cos(th), np.sin(th)], -1)
        a, v = A[i], V[i]

        def rhs(_, y):
            X = y.reshape(n, 2)
            X = X / np.linalg.norm(X, axis=1, keepdims=True)
            F = (1.0 / n) * X @ (a @ (X.T @ X) @ v.T)
            return (F - np.sum(F * X, axis=1, keepdims=True) * X).ravel()

        solve_ivp(rhs, (0.0, t1), x0.ravel(), method="RK45", rtol=rtol, atol=atol)
    return members / (time.perf_counter() - t)


def bench_defaults(pairs, n, t1, scipy_members):
    rng = np.random.default_rng(0)
    A, V = rng.normal(size=(2, pairs, 2, 2))
    scipy = _scipy_rate(A, V, n, t1, scipy_members)
    rows = [dict(name="scipy solve_ivp RK45 loop", members_per_s=scipy, vs_scipy=1.0)]
    for scale in ("physical", "natural"):
        rates = {}
        for method in ("ott_antonsen", "watanabe_strogatz", "particles"):
            s, r = _timed(
                lambda: sweep(
                    A,
                    V,
                    1.0,
                    0,
                    method=method,
                    n=n,
                    t1=t1,
                    num_save=101,
                    time_scale=scale,
                    progress=False,
                )
            )
            rates[method] = pairs / s
            rows.append(
                dict(
                    name=f"{method}, defaults, {scale} time",
                    members_per_s=pairs / s,
                    vs_scipy=pairs / s / scipy,
                    lockstep_efficiency=r.lockstep_efficiency,
                    chunk_sizes=sorted(set(r.plan["chunk_sizes"])),
                    group=r.plan["group"],
                    mean_steps=float(r.num_steps.mean()),
                    max_steps=int(r.num_steps.max()),
                )
            )
        rows.append(
            dict(
                name=f"WS / OA members/s, {scale} time",
                ratio=rates["watanabe_strogatz"] / rates["ott_antonsen"],
            )
        )
    return rows


def bench_maps(quick):
    rows = []
    for method, g, k, n in (("ott_antonsen", 64, 8, 64), ("particles", 32, 4, 256)):
        if quick:
            g, k = g // 4, max(k // 2, 1)
        t = time.perf_counter()
        m = regime_map(
            "rotating",
            {"a": np.linspace(-1, 1, g), "b": np.linspace(-1, 1, g)},
            method=method,
            n=n,
            inits=k,
            t1=100.0,
            num_save=201,
            progress=False,
        )
        s = time.perf_counter() - t
        a = m.axes[0][1][:, None] * np.ones(g)[None, :]
        claims = m.predicted >= 0
        decided = (m.dominant >= 0) & (m.dominant != 5)
        agree = claims & decided & ~m.disagreements()
        rows.append(
            dict(
                name=f"rotating family, {method}, {g}×{g} × {k} inits (n = {n})",
                seconds=s,
                members=m.regime.size,
                members_per_s=m.regime.size / s,
                cells_with_claim=int(claims.sum()),
                decided=int((claims & decided).sum()),
                agree=int(agree.sum()),
                disagree=int(m.disagreements().sum()),
                undetermined_near_a0=int((claims & ~decided & (np.abs(a) < 0.2)).sum()),
                lockstep_efficiency=m.sweep.lockstep_efficiency,
            )
        )
    return rows


def _print(rows):
    for r in rows:
        print(
            "  "
            + "; ".join(
                f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()
            )
        )


def main(*, quick=False, out_dir="bench_out"):
    os.makedirs(out_dir, exist_ok=True)
    pairs = 64 if quick else 512
    print(f"backend {jax.default_backend()}, {len(jax.devices())} device(s)")
    print(f"1. sweeps at defaults: {pairs} random pairs, d = 2, n = 256, t1 = 50")
    d = bench_defaults(pairs, 256, 50.0, 8 if quick else 32)
    _print(d)
    print("2. regime maps of the rotating family")
    m = bench_maps(quick)
    _print(m)
    with open(os.path.join(out_dir, "bench_instrument.json"), "w") as f:
        json.dump(dict(defaults=d, maps=m, backend=jax.default_backend()), f, indent=1, default=str)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default="bench_out")
    a = p.parse_args()
    main(quick=a.quick, out_dir=a.out)
