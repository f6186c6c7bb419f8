"""Benchmark of `jaxattn.dynamics.sweep` (prints tables, writes JSON).

Questions answered:

1. Throughput (members/s) for random (A, V) pairs, d = 2, n = 256, LSA, t1 = 50: vmapped
   particle sweeps (plain lockstep, stiffness-grouped chunks, natural time), the exact
   Watanabe–Strogatz reduction, the Ott–Antonsen ODE, solo jitted solves in a loop, and a
   loop of `scipy.integrate.solve_ivp` with a NumPy right-hand side (goal: ≥ 100×).
2. Reduced (OA / WS) sweeps against the particle sweep at n = 10⁴, with the regime labels
   compared (goal: ≥ 1000× for OA).
3. Throughput with 1, 2 and 8 host devices (subprocesses with
   `XLA_FLAGS=--xla_force_host_platform_device_count=K`).
4. The effect of the XLA CPU flag `CPU_FLAG` on vmapped sweeps (subprocesses).
5. Peak memory of `jax.grad` through a solve with n = 256, d = 64, t1 = 100, for
   `max_steps` M and 4M (compiled temp-buffer size; goal < 2 GB, growth < 1.5×).

Run: `python experiments/bench_sweep.py [--quick] [--out DIR] [--pairs 512]`.
Timings exclude compilation (each configuration is run once to compile, then timed).
"""

import argparse
import json
import os
import subprocess
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)

import diffrax  # noqa: E402
import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxattn.dynamics import AttentionDynamics, sample_wrapped_cauchy, simulate  # noqa: E402
from jaxattn.dynamics._sweep import sweep  # noqa: E402
from jaxattn.sphere import sample_uniform  # noqa: E402


def _pairs(num, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(num, 2, 2)), rng.normal(size=(num, 2, 2))


def _timed(fn, repeat=1):
    fn()  # compile
    t = time.perf_counter()
    for _ in range(repeat):
        out = fn()
    return (time.perf_counter() - t) / repeat, out


def _scipy_member(A, V, x0, t1, rtol, atol):
    from scipy.integrate import solve_ivp

    n, d = x0.shape

    def rhs(t, y):
        X = y.reshape(n, d)
        X = X / np.linalg.norm(X, axis=1, keepdims=True)
        M = X.T @ X
        F = (1.0 / n) * X @ (A @ M @ V.T)
        F = F - np.sum(F * X, axis=1, keepdims=True) * X
        return F.ravel()

    sol = solve_ivp(rhs, (0.0, t1), x0.ravel(), method="RK45", rtol=rtol, atol=atol)
    return sol


def bench_throughput(pairs, n, t1, scipy_members, solo_members, chunk, small=16):
    A, V = _pairs(pairs)
    kw = dict(n=n, t1=t1, num_save=101, progress=False, rtol=1e-7, atol=1e-9)
    rows = []

    def add(name, seconds, members, res=None, note=""):
        rows.append(
            dict(
                name=name,
                seconds=seconds,
                members=members,
                members_per_s=members / seconds,
                note=note,
                max_steps=int(res.num_steps.max()) if res is not None else None,
                mean_steps=float(res.num_steps.mean()) if res is not None else None,
            )
        )

    s, r = _timed(
        lambda: sweep(A, V, 1.0, 0, time_scale="physical", group="none", chunk_size=None, **kw)
    )
    add(
        "particles, plain vmap (lockstep), physical t1",
        s,
        pairs,
        r,
        "every member steps at the pace of the slowest",
    )
    s, r = _timed(
        lambda: sweep(
            A, V, 1.0, 0, time_scale="physical", group="stiffness", chunk_size=chunk, **kw
        )
    )
    add(
        f"particles, stiffness-grouped chunks of {chunk}, physical t1",
        s,
        pairs,
        r,
        "members sorted by β‖A‖‖V‖ before chunking",
    )
    s, r = _timed(
        lambda: sweep(A, V, 1.0, 0, time_scale="natural", group="none", chunk_size=None, **kw)
    )
    add(
        "particles, natural time (t1 in units of 1/(β‖A‖‖V‖))",
        s,
        pairs,
        r,
        "same number of own time units per member",
    )
    s, r = _timed(
        lambda: sweep(A, V, 1.0, 0, time_scale="physical", group="pilot", chunk_size=small, **kw)
    )
    add(
        f"particles, OA-pilot-grouped chunks of {small}, physical t1",
        s,
        pairs,
        r,
        "members sorted by the step count of an OA pilot sweep",
    )
    s, r = _timed(
        lambda: sweep(A, V, 1.0, 0, time_scale="natural", group="pilot", chunk_size=small, **kw)
    )
    add(f"particles, natural time + OA-pilot-grouped chunks of {small}", s, pairs, r)
    s, r = _timed(
        lambda: sweep(
            A,
            V,
            1.0,
            0,
            method="watanabe_strogatz",
            time_scale="physical",
            group="none",
            chunk_size=None,
            **kw,
        )
    )
    add("Watanabe–Strogatz (exact), plain vmap, physical t1", s, pairs, r)
    s, r = _timed(
        lambda: sweep(
            A,
            V,
            1.0,
            0,
            method="watanabe_strogatz",
            time_scale="physical",
            group="pilot",
            chunk_size=small,
            **kw,
        )
    )
    add(f"Watanabe–Strogatz (exact), OA-pilot-grouped chunks of {small}, physical t1", s, pairs, r)
    s, r = _timed(
        lambda: sweep(
            A,
            V,
            1.0,
            0,
            method="watanabe_strogatz",
            time_scale="natural",
            group="pilot",
            chunk_size=small,
            **kw,
        )
    )
    add(
        f"Watanabe–Strogatz (exact), natural time + OA-pilot-grouped chunks of {small}", s, pairs, r
    )
    s, r = _timed(
        lambda: sweep(
            A,
            V,
            1.0,
            0,
            method="ott_antonsen",
            time_scale="physical",
            group="stiffness",
            chunk_size=chunk,
            **kw,
        )
    )
    add(f"Ott–Antonsen, grouped chunks of {chunk}, physical t1", s, pairs, r)

    # Solo jitted solves in a loop (one compile, then per-member calls).
    ts = jnp.linspace(0.0, t1, 101)

    @eqx.filter_jit
    def solo(a, v, x0):
        tr = simulate(AttentionDynamics(a, v), x0, t1=t1, ts=ts, rtol=1e-7, atol=1e-9, throw=False)
        return tr.xs[-1], tr.num_steps

    x0s = []
    for i in range(solo_members):
        k_phase, k_tok = jax.random.split(jax.random.key(np.uint32(0)))
        R0 = 0.1 * jnp.exp(2j * jnp.pi * jax.random.uniform(k_phase, (), dtype=jnp.float64))
        th = sample_wrapped_cauchy(k_tok, n, R0, dtype=jnp.float64)
        x0s.append(jnp.stack([jnp.cos(th), jnp.sin(th)], -1))
    jax.block_until_ready(solo(jnp.asarray(A[0]), jnp.asarray(V[0]), x0s[0]))
    t = time.perf_counter()
    for i in range(solo_members):
        jax.block_until_ready(solo(jnp.asarray(A[i]), jnp.asarray(V[i]), x0s[i]))
    s = (time.perf_counter() - t) / solo_members * pairs
    add(f"solo jitted solves in a loop (timed on {solo_members}, scaled)", s, pairs)

    # scipy.integrate.solve_ivp with a NumPy right-hand side (same tolerances).
    t = time.perf_counter()
    for i in range(scipy_members):
        _scipy_member(A[i], V[i], np.asarray(x0s[i % len(x0s)]), t1, 1e-7, 1e-9)
    s = (time.perf_counter() - t) / scipy_members * pairs
    add(f"scipy solve_ivp RK45 loop (timed on {scipy_members}, scaled)", s, pairs)
    base = rows[-1]["members_per_s"]
    for r_ in rows:
        r_["speedup_vs_scipy"] = r_["members_per_s"] / base
    return rows


def bench_reduced(n, members, t1):
    A, V = _pairs(members, seed=1)
    kw = dict(t1=t1, num_save=201, progress=False, rtol=1e-7, atol=1e-9, chunk_size=None)
    sp, rp = _timed(lambda: sweep(A, V, 1.0, 0, n=n, **kw))
    sw, rw = _timed(lambda: sweep(A, V, 1.0, 0, n=n, method="watanabe_strogatz", **kw))
    so, ro = _timed(lambda: sweep(A, V, 1.0, 0, method="ott_antonsen", **kw), repeat=3)
    return dict(
        n=n,
        members=members,
        t1_natural=t1,
        particles_s=sp,
        ws_s=sw,
        oa_s=so,
        particles_members_per_s=members / sp,
        ws_members_per_s=members / sw,
        oa_members_per_s=members / so,
        oa_speedup=sp / so,
        ws_speedup=sp / sw,
        labels_equal_ws=float(np.mean(rp.regime == rw.regime)),
        labels_equal_oa=float(np.mean(rp.regime == ro.regime)),
    )


_DEVICE_SCRIPT = """
import json, sys, time, numpy as np, jax
jax.config.update("jax_enable_x64", True)
from jaxattn.dynamics._sweep import sweep
rng = np.random.default_rng(0)
A = rng.normal(size=(int(sys.argv[1]), 2, 2)); V = rng.normal(size=A.shape)
kw = dict(n=int(sys.argv[2]), t1=50.0, num_save=101, progress=False, chunk_size=None,
          time_scale="natural")
sweep(A, V, 1.0, 0, **kw)
t = time.perf_counter(); sweep(A, V, 1.0, 0, **kw); s = time.perf_counter() - t
print(json.dumps(dict(devices=len(jax.devices()), seconds=s, members_per_s=len(A) / s)))
"""


_FLAG_SCRIPT = """
import json, sys, time, numpy as np, jax
jax.config.update("jax_enable_x64", True)
from jaxattn.dynamics._sweep import sweep
rng = np.random.default_rng(0)
A = rng.normal(size=(int(sys.argv[1]), 2, 2)); V = rng.normal(size=A.shape)
out = {}
for method in ("particles", "watanabe_strogatz"):
    kw = dict(n=int(sys.argv[2]), t1=50.0, num_save=101, progress=False, chunk_size=16,
              time_scale="natural", group="pilot", method=method, rtol=1e-7, atol=1e-9)
    sweep(A, V, 1.0, 0, **kw)
    t = time.perf_counter(); sweep(A, V, 1.0, 0, **kw); s = time.perf_counter() - t
    out[method] = len(A) / s
print(json.dumps(out))
"""

# XLA's CPU backend routes the small batched products and size-d reductions of a vmapped
# particle step to a library path that is slow at these shapes; switching those fusion
# kinds off (a process-wide XLA flag, so only the user can choose it) is measured here.
CPU_FLAG = (
    "--xla_cpu_experimental_ynn_fusion_type="
    "-LIBRARY_FUSION_TYPE_REDUCE,-LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"
)


def bench_xla_flag(pairs, n):
    rows = []
    for flag in ("", CPU_FLAG):
        env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " " + flag).strip())
        out = subprocess.run(
            [sys.executable, "-c", _FLAG_SCRIPT, str(pairs), str(n)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        res = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(dict(flag=flag or "(none)", **res))
    return rows


def bench_devices(pairs, n, counts=(1, 2, 8)):
    rows = []
    for k in counts:
        env = dict(
            os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={k}", JAX_PLATFORMS="cpu"
        )
        out = subprocess.run(
            [sys.executable, "-c", _DEVICE_SCRIPT, str(pairs), str(n)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return rows


def bench_memory(n=256, d=64, t1=100.0, max_steps=(1024, 4096), checkpoints=None):
    key = jax.random.key(0)
    x0 = sample_uniform(key, n, d)
    A = jax.random.normal(jax.random.key(1), (d, d)) / np.sqrt(d)
    V = jnp.eye(d)
    ts = jnp.linspace(t1 / 2, t1, 11)
    rows = []
    for m in max_steps:

        def loss(A, m=m):
            tr = simulate(
                AttentionDynamics(A, V),
                x0,
                t1=t1,
                ts=ts,
                max_steps=m,
                rtol=1e-6,
                atol=1e-8,
                throw=False,
                adjoint=diffrax.RecursiveCheckpointAdjoint(checkpoints=checkpoints),
            )
            C = jnp.einsum("tnd,tne->tde", tr.xs, tr.xs) / n
            return jnp.mean(C**2)

        g = jax.jit(jax.grad(loss))
        compiled = g.lower(A).compile()
        mem = compiled.memory_analysis()
        temp = getattr(mem, "temp_size_in_bytes", None)
        total = sum(
            getattr(mem, f, 0) or 0
            for f in ("temp_size_in_bytes", "argument_size_in_bytes", "output_size_in_bytes")
        )
        t = time.perf_counter()
        jax.block_until_ready(compiled(A))
        rows.append(
            dict(
                max_steps=m,
                checkpoints=checkpoints,
                temp_bytes=temp,
                total_bytes=total,
                seconds=time.perf_counter() - t,
                state_bytes=n * d * 8,
            )
        )
    rows[-1]["growth_vs_first"] = rows[-1]["total_bytes"] / rows[0]["total_bytes"]
    return rows


def _table(rows, cols, headers):
    widths = [max(len(h), *(len(c(r)) for r in rows)) for c, h in zip(cols, headers)]
    line = " | ".join(h.ljust(w) for h, w in zip(headers, widths))
    print(line)
    print("-+-".join("-" * w for w in widths))
    for r in rows:
        print(" | ".join(c(r).ljust(w) for c, w in zip(cols, widths)))


def main(
    *,
    quick=False,
    pairs=512,
    n=256,
    t1=50.0,
    out_dir="bench_out",
    n_reduced=10_000,
    reduced_members=None,
    scipy_members=None,
    solo_members=None,
    chunk=64,
    devices=(1, 2, 8),
):
    os.makedirs(out_dir, exist_ok=True)
    scipy_members = scipy_members or (4 if quick else 16)
    solo_members = solo_members or (16 if quick else 64)
    reduced_members = reduced_members or (8 if quick else 32)
    report = dict(
        quick=quick,
        cpu_count=os.cpu_count(),
        devices=[str(d) for d in jax.devices()],
        note="timings on a shared CPU; compile excluded",
    )
    print(f"== 1. throughput: {pairs} random (A, V) pairs, d = 2, n = {n}, t1 = {t1}")
    report["throughput"] = bench_throughput(pairs, n, t1, scipy_members, solo_members, chunk)
    _table(
        report["throughput"],
        [
            lambda r: r["name"],
            lambda r: f"{r['members_per_s']:.1f}",
            lambda r: f"{r['speedup_vs_scipy']:.1f}×",
            lambda r: "" if r["max_steps"] is None else f"{r['mean_steps']:.0f}/{r['max_steps']}",
        ],
        ["configuration", "members/s", "vs scipy", "steps mean/max"],
    )
    print(f"\n== 2. reduced sweeps vs particles at n = {n_reduced} ({reduced_members} members)")
    red = bench_reduced(n_reduced, reduced_members, 50.0)
    report["reduced"] = red
    _table(
        [red],
        [
            lambda r: f"{r['particles_members_per_s']:.2f}",
            lambda r: f"{r['ws_members_per_s']:.2f}",
            lambda r: f"{r['oa_members_per_s']:.1f}",
            lambda r: f"{r['oa_speedup']:.0f}×",
            lambda r: f"{r['labels_equal_ws']:.2f}",
            lambda r: f"{r['labels_equal_oa']:.2f}",
        ],
        ["particles m/s", "WS m/s", "OA m/s", "OA speed-up", "labels = (WS)", "labels = (OA)"],
    )
    if devices:
        print(f"\n== 3. host devices ({pairs} pairs, n = {n}, natural time)")
        report["devices_scaling"] = bench_devices(pairs, n, devices)
        _table(
            report["devices_scaling"],
            [lambda r: str(r["devices"]), lambda r: f"{r['members_per_s']:.1f}"],
            ["devices", "members/s"],
        )
    print(f"\n== 4. XLA CPU fusion flag ({pairs} pairs, n = {n}, natural time, pilot chunks of 16)")
    report["xla_flag"] = bench_xla_flag(pairs, n)
    _table(
        report["xla_flag"],
        [
            lambda r: r["flag"][:40],
            lambda r: f"{r['particles']:.1f}",
            lambda r: f"{r['watanabe_strogatz']:.1f}",
        ],
        ["XLA_FLAGS", "particles m/s", "WS m/s"],
    )
    print("\n== 5. memory of jax.grad through a solve (n = 256, d = 64, t1 = 100)")
    report["memory"] = bench_memory() + bench_memory(checkpoints=32)
    _table(
        report["memory"],
        [
            lambda r: str(r["max_steps"]),
            lambda r: (
                "log(max_steps) (default)" if r["checkpoints"] is None else str(r["checkpoints"])
            ),
            lambda r: f"{r['total_bytes'] / 2**20:.1f} MiB",
            lambda r: f"{r['seconds']:.2f} s",
            lambda r: f"{r['growth_vs_first']:.2f}×" if "growth_vs_first" in r else "",
        ],
        ["max_steps", "checkpoints", "compiled buffers", "grad time", "growth (4× steps)"],
    )
    with open(os.path.join(out_dir, "bench_sweep.json"), "w") as f:
        json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default="bench_out")
    p.add_argument("--pairs", type=int, default=512)
    p.add_argument("--n", type=int, default=256)
    p.add_argument("--n-reduced", type=int, default=10_000)
    p.add_argument("--no-devices", action="store_true")
    a = p.parse_args()
    main(
        quick=a.quick,
        pairs=a.pairs,
        n=a.n,
        out_dir=a.out,
        n_reduced=a.n_reduced,
        devices=() if a.no_devices else (1, 2, 8),
    )
