"""Straggler-aware sweeps: the compacting runner against the old lockstep path and scipy.

Question: on 512 random (A, V) pairs (d = 2, n = 256, LSA, t1 = 50, float64, the sweep's
default save grid and tolerances), how many members per second does `sweep` do with
`Runner(strategy="compact")` (a pool of slots stepped K steps at a time and refilled
from the queue: the default for particles and WS; OA defaults to lockstep, whose compile is
shorter) and with `Runner(strategy="lockstep")` (the old default: one
vmapped solve per chunk, chunks grouped by an Ott–Antonsen pilot), for particles and
Watanabe–Strogatz in physical and natural time, plus Ott–Antonsen; against a loop of
`scipy.integrate.solve_ivp` (RK45, same tolerances and initial tokens) on the particles in
the same time scale (timed on a random subset of 64 pairs). Printed side by side from one
run: members/s, ratio to scipy, ratio to the Ott–Antonsen pool (`strategy="compact"`, its
fastest warm sweep) in the same time scale ("× OA"), lockstep efficiency, steps mean / max. For the issue's
"one pinned core" comparison run it under `taskset -c 0`.

Timings exclude compilation: every compiled shape is first built on a batch of easy
members of the same size (a warm-up), then the real batch is timed. The machine's load
average is printed with the table (ratios, not absolutes, are the result).

`--scan` also times a few (slots, segment_steps) pairs of the compacting particle sweep;
`--layout` also times the compact particle sweep with the token-row state layout `(n, d)`
against the default token-major `(d, n)` (`_solve.token_major_pays`), same members.
`--saves` also times the compact particle sweep (natural time) with 51 and 21 save times
instead of the default 201, same members and steps: what the saves (dense-output
interpolation and the moment series at every save time) cost of a member.

`--budget` also splits what a member costs into a part per member (setup, the saves, the
judge) and a part per solver step, by timing the compact sweep of the same members with
t1, t1/4 and t1/16 and fitting `seconds = a + b · steps` (a least-squares line through the
three means), and times the floor of the stepping itself: one member's bare
`diffrax.diffeqsolve` (the sweep's solver and tolerances, the particle field on the
token-major state, no projection, sweep or judge) with 2 and with the default 201 save
times. It prints the per-member time the goals allow (10x the scipy loop for particles,
1/3 of the Ott–Antonsen sweep for WS) against these parts.

`--xla-loops fast` (the default) runs with XLA's small while loops compiled whole
(`jaxattn.prefer_fast_cpu_loops`, as the `jaxattn` command and the test suite run),
`--xla-loops default` with XLA's default CPU runtime (what a script that does not ask for
it gets). `--loops` also runs the same benchmark in a child process with the other setting
(same members, its own scipy loop) and prints both side by side with the ratio, and whether
the two give the same regimes, steps and R2.

Run: `python experiments/bench_compaction.py [--quick] [--pairs 512] [--scan] [--layout] [--saves]
[--budget] [--repeat 3] [--methods particles ...] [--xla-loops fast|default] [--loops]`. Each sweep configuration is timed
`--repeat` times (default 3; the repeats go round all configurations) and the fastest
run is reported. The scipy loop is timed `--repeat` times before and as many after the
sweeps, and its fastest run is used too (the range is printed).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402

# The scipy baseline is bench_sweep's, so both benchmarks time the same loop.
from bench_sweep import _scipy_member  # noqa: E402

from jaxattn._xla_flags import SMALL_LOOP_OPTION, prefer_fast_cpu_loops  # noqa: E402
from jaxattn.dynamics import _sweep as sw  # noqa: E402
from jaxattn.dynamics import sample_wrapped_cauchy  # noqa: E402
from jaxattn.dynamics._sweep import Integration, Runner, attention_members, sweep  # noqa: E402


def _pairs(num, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(num, 2, 2)), rng.normal(size=(num, 2, 2))


def _run(A, V, *, method, time_scale, runner, n, t1, num_save=201):
    with warnings.catch_warnings():
        # The budget's short horizons (t1/16) leave every member undetermined by design.
        warnings.filterwarnings("ignore", message="sweep: every one of the")
        return sweep(
            attention_members(A, V, 1.0, 0, n=n, method=method),
            integration=Integration(t1, num_save, time_scale=time_scale),
            runner=runner,
        )


def _warm(A, V, *, method, time_scale, runner, n, t1, num_save=201):
    """Compile every chunk shape the timed run will use, on easy members (A = V = I): the
    plan is made as the sweep makes it (the pilot's predicted costs, then the chunks)."""
    B = A.shape[0]
    easy = np.broadcast_to(np.eye(2), (B, 2, 2))
    _run(
        easy,
        easy,
        method=method,
        time_scale=time_scale,
        runner=runner,
        n=n,
        t1=t1,
        num_save=num_save,
    )
    if runner.strategy == "lockstep":
        members = attention_members(A, V, 1.0, 0, n=n, method=method)
        integ = Integration(t1, time_scale=time_scale)
        group = sw._resolve_group(members, members.flow, runner)
        cost = sw._predicted_cost(members, members.flow, integ, group)
        perm = np.argsort(cost, kind="stable")
        sizes = set(sw._chunk_plan(cost, perm, len(jax.devices()), runner, 10**9))
        for size in sorted(sizes - {B}):
            r = Runner(strategy="lockstep", chunk_size=size, group="none", progress=False)
            _run(
                easy[:size], easy[:size], method=method, time_scale=time_scale, runner=r, n=n, t1=t1
            )


REPEAT = 1  # timed runs per configuration (`--repeat`): the best is reported


def _timed(A, V, **kw):
    _warm(A, V, **kw)
    best = float("inf")
    for _ in range(REPEAT):
        t = time.perf_counter()
        res = _run(A, V, **kw)
        best = min(best, time.perf_counter() - t)
    return best, res


def _bare_floor(A, V, x0, t1, num_save, repeat=20):
    """Microseconds per step of one bare `diffeqsolve` of the particle field (the sweep's
    solver, tolerances and step-size controller; token-major state `x0ᵀ`; no projection,
    sweep bookkeeping or judge), saving at 2 and at `num_save` times, and its steps."""
    import diffrax
    import jax.numpy as jnp

    from jaxattn.dynamics import AttentionDynamics

    flow = AttentionDynamics(A=jnp.asarray(A), V=jnp.asarray(V), beta=1.0)
    y0 = jnp.asarray(x0.T)
    defaults = Integration(t1)  # the sweep's tolerances and step budget
    out = {}
    for saves in (2, num_save):
        ts = jnp.linspace(0.0, t1, saves)

        @jax.jit
        def solve(y0, ts=ts):
            return diffrax.diffeqsolve(
                diffrax.ODETerm(flow.token_major),
                sw.SWEEP_SOLVER,
                0.0,
                t1,
                None,
                y0,
                saveat=diffrax.SaveAt(ts=ts),
                stepsize_controller=diffrax.PIDController(rtol=defaults.rtol, atol=defaults.atol),
                max_steps=defaults.max_steps,
                throw=False,
                adjoint=diffrax.ForwardMode(),
            )

        jax.block_until_ready(solve(y0).ys)
        best = float("inf")
        for _ in range(repeat):
            t = time.perf_counter()
            sol = solve(y0)
            jax.block_until_ready(sol.ys)
            best = min(best, time.perf_counter() - t)
        steps = int(sol.stats["num_steps"])
        out[saves] = (best / steps * 1e6, steps)
    return out


def _budget(A, V, x0, *, methods, n, t1, compact, scipy_rate, oa_rate):
    """Per-member and per-step parts of a compact member's cost (module docstring), against
    what the goals allow; printed as a table."""
    lines = []
    for method in [m for m in methods if m != "ott_antonsen"]:
        for ts in ("physical", "natural"):
            pts = []
            for t in (t1, t1 / 4, t1 / 16):
                s, res = _timed(A, V, method=method, time_scale=ts, runner=compact, n=n, t1=t)
                pts.append((float(res.num_steps.mean()), s / A.shape[0]))
            steps, secs = (np.array(v) for v in zip(*pts))
            b, a = np.polyfit(steps, secs, 1)
            if method == "particles":
                goal, allowed = "10x scipy", 1 / (10 * scipy_rate[ts])
            else:
                goal, allowed = "1/3 OA", 3 / oa_rate[ts]
            lines.append(
                (
                    f"{method}, {ts}",
                    secs[0] * 1e3,
                    a * 1e3,
                    b * 1e6,
                    steps[0],
                    goal,
                    allowed * 1e3,
                    (allowed - a) / steps[0] * 1e6,
                )
            )
    floor = _bare_floor(A[0], V[0], x0, t1, 201)
    print(f"\nwhat a member costs (compact, n = {n}; fit over t1, t1/4, t1/16) against the goals")
    print(
        f"{'sweep':34s} {'ms/member':>9s} {'per member':>10s} {'per step':>9s} "
        f"{'steps':>6s} {'goal':>10s} {'allows':>7s} {'steps may':>9s}"
    )
    print(f"{'':34s} {'':>9s} {'ms':>10s} {'µs':>9s} {'':>6s} {'':>10s} {'ms':>7s} {'µs':>9s}")
    for name, total, a, b, st, goal, allowed, per_step in lines:
        print(
            f"{name:34s} {total:9.3f} {a:10.3f} {b:9.1f} {st:6.0f} {goal:>10s} "
            f"{allowed:7.3f} {per_step:9.1f}"
        )
    (f2, s2), (f201, _) = floor[2], floor[201]
    print(
        f"bare diffeqsolve of the particle field (pair 0, physical, {s2} steps): "
        f"{f2:.1f} µs/step with 2 save times, {f201:.1f} with 201"
    )
    return dict(rows=lines, bare_floor={str(k): v for k, v in floor.items()})


def _side_by_side(runs):
    """Members/s with XLA's small while loops compiled whole ("fast") and with its default
    CPU runtime, the ratio, and whether both gave the same regimes, steps and R2."""
    fast = {r["name"]: r for r in runs["fast"]}
    default = {r["name"]: r for r in runs["default"]}
    print("\nXLA small while loops compiled whole (fast) against XLA's default CPU runtime")
    print(f"{'configuration':62s} {'default':>9s} {'fast':>9s} {'ratio':>6s}  same results")
    for name, f in fast.items():
        d = default.get(name)
        if d is None:
            continue
        same = ""
        if "regimes" in f:
            dR2 = np.nanmax(np.abs(np.asarray(f["R2"]) - np.asarray(d["R2"])))
            same = (
                f"regimes {f['regimes'] == d['regimes']}, steps {f['steps'] == d['steps']}, "
                f"max |dR2| {dR2:.1e}"
            )
        print(
            f"{name[:62]:62s} {d['members_per_s']:9.1f} {f['members_per_s']:9.1f} "
            f"{f['members_per_s'] / d['members_per_s']:6.2f}  {same}"
        )


def main(
    *,
    quick=False,
    pairs=512,
    n=256,
    t1=50.0,
    scipy_members=64,
    scan=False,
    layout=False,
    saves=False,
    budget=False,
    out_dir="bench_out",
    methods=("particles", "watanabe_strogatz", "ott_antonsen"),
):
    if quick:
        pairs, n, scipy_members = 64, 32, 8
    A, V = _pairs(pairs)
    rows = []

    def add(name, seconds, res=None):
        row = dict(name=name, seconds=seconds, members_per_s=pairs / seconds)
        if res is not None:
            row.update(
                efficiency=float(res.lockstep_efficiency),
                mean_steps=float(res.num_steps.mean()),
                max_steps=int(res.num_steps.max()),
                regimes=res.regime.tolist(),
                steps=res.num_steps.tolist(),
                R2=[[z.real, z.imag] for z in np.asarray(res.R2).ravel().tolist()],
            )
        rows.append(row)
        print(f"  {name}: {row['members_per_s']:.1f} members/s", flush=True)

    # scipy RK45 loops, physical and natural time (V → V/r, `natural_rate`), the sweep's
    # tolerances and initial tokens (every member draws them with seed 0), timed on a
    # random subset of the pairs and scaled. Only the solves are timed (the tokens are
    # drawn once, before: drawing them with JAX in the loop once cost more than the
    # solves and made the loop look ~3× slower than it is).
    k_phase, k_tok = jax.random.split(jax.random.key(np.uint32(0)))
    R0 = 0.1 * np.exp(2j * np.pi * float(jax.random.uniform(k_phase, (), dtype=float)))
    th = np.asarray(sample_wrapped_cauchy(k_tok, n, R0))
    x0 = np.stack([np.cos(th), np.sin(th)], -1)
    subset = np.random.default_rng(1).choice(pairs, min(scipy_members, pairs), replace=False)
    scipy_seconds = {}
    # The natural rates (a JAX computation) are taken before, out of the timed loop: inside
    # it, their first call compiled and every call dispatched, which made the first scipy
    # timing in natural time read up to 1.5x slow and flattered the sweeps.
    rates = {i: float(sw.natural_rate(A[i], V[i], 1.0)) for i in subset}

    def scipy_loop():
        # Timed `REPEAT` times before the sweeps and `REPEAT` times after, and the fastest run
        # is used, as for the sweeps (the loop is bound by NumPy's per-call cost, which
        # drifts with the machine's load; all runs are kept in the JSON).
        for _ in range(REPEAT):
            for ts in ("physical", "natural"):
                t = time.perf_counter()
                for i in subset:
                    r = rates[i] if ts == "natural" else 1.0
                    _scipy_member(A[i], V[i] / r, x0, t1, 1e-7, 1e-9)
                seconds = (time.perf_counter() - t) / len(subset) * pairs
                scipy_seconds.setdefault(ts, []).append(seconds)

    # One untimed member first: the first calls pay scipy's and NumPy's warm-up.
    _scipy_member(A[subset[0]], V[subset[0]], x0, t1, 1e-7, 1e-9)
    scipy_loop()
    compact = Runner(strategy="compact", progress=False)
    lockstep = Runner(strategy="lockstep", progress=False)
    common = dict(n=n, t1=t1)
    results = {}
    configs = [
        (method, ts, name, runner)
        for method in methods
        for ts in ("physical", "natural")
        for name, runner in (("lockstep (old default)", lockstep), ("compact", compact))
    ]
    for method, ts, _, runner in configs:
        _warm(A, V, method=method, time_scale=ts, runner=runner, **common)
    # The repeats go round the configurations (not one configuration three times in a
    # row), so that a slow spell of the machine, which lasts seconds, spoils one run of
    # several configurations rather than every run of one.
    best = {}
    for _ in range(REPEAT):
        for method, ts, name, runner in configs:
            t = time.perf_counter()
            res = _run(A, V, method=method, time_scale=ts, runner=runner, **common)
            s = time.perf_counter() - t
            if s < best.get((method, ts, name), (float("inf"),))[0]:
                best[(method, ts, name)] = (s, res)
    for method, ts, name, _ in configs:
        s, res = best[(method, ts, name)]
        add(f"{method}, {ts}, {name}", s, res)
        results[(method, ts, name)] = res
    scipy_loop()
    scipy_rate = {}
    for ts in ("physical", "natural"):
        runs = scipy_seconds[ts]
        add(
            f"scipy solve_ivp RK45 loop, {ts} (timed on {len(subset)}, fastest of {len(runs)}; "
            f"{pairs / max(runs):.1f}-{pairs / min(runs):.1f})",
            min(runs),
        )
        scipy_rate[ts] = rows[-1]["members_per_s"]
    for method in methods:
        for ts in ("physical", "natural"):
            a, b = (results[(method, ts, k)] for k in ("lockstep (old default)", "compact"))
            same = bool(np.array_equal(a.regime, b.regime))
            steps = bool(np.array_equal(a.num_steps, b.num_steps))
            err = float(np.nanmax(np.abs(a.R2 - b.R2)))
            print(
                f"  {method} {ts}: compact vs lockstep regimes equal {same}, steps equal "
                f"{steps}, max |ΔR2| {err:.2e}"
            )
    if layout:
        # Token-major particle state ((d, n): `_solve.token_major_pays`) against the
        # token-row layout ((n, d)), both compact, same members.
        for ts in ("physical", "natural"):
            keep = sw.token_major_pays
            try:
                sw.token_major_pays = lambda n, d: False
                s_rows, r_rows = _timed(
                    A, V, method="particles", time_scale=ts, runner=compact, **common
                )
            finally:
                sw.token_major_pays = keep
            add(f"layout: particles, {ts}, compact, (n, d) rows", s_rows, r_rows)
            major = results.get(("particles", ts, "compact"))
            if major is not None:
                print(
                    f"  layout {ts}: (d, n) vs (n, d) regimes equal "
                    f"{bool(np.array_equal(major.regime, r_rows.regime))}, steps equal "
                    f"{bool(np.array_equal(major.num_steps, r_rows.num_steps))}, max |ΔR2| "
                    f"{float(np.nanmax(np.abs(major.R2 - r_rows.R2))):.2e}"
                )
    if saves:
        # Same members and steps, fewer save times: the difference is what saving costs.
        for num_save in (201, 51, 21):
            s, res = _timed(
                A,
                V,
                method="particles",
                time_scale="natural",
                runner=compact,
                num_save=num_save,
                **common,
            )
            add(f"saves: particles, natural, compact, {num_save} save times", s, res)
    if scan:
        for S, K in ((32, 16), (8, 32), (4, 64), (2, 32), (1, 64)):
            r = Runner(slots=S, segment_steps=K, progress=False)
            s, res = _timed(A, V, method="particles", time_scale="physical", runner=r, **common)
            add(f"scan: particles physical, slots {S}, K {K}", s, res)

    # WS is compared with the fastest warm Ott–Antonsen sweep: its pool (32 slots on CPU).
    oa = {
        ts: next(
            (r for r in rows if r["name"] == f"ott_antonsen, {ts}, compact"),
            dict(members_per_s=float("nan")),
        )
        for ts in ("physical", "natural")
    }
    parts = None
    if budget:
        parts = _budget(
            A,
            V,
            x0,
            methods=methods,
            n=n,
            t1=t1,
            compact=compact,
            scipy_rate=scipy_rate,
            oa_rate={ts: r["members_per_s"] for ts, r in oa.items()},
        )
    print(f"\nXLA_FLAGS: {os.environ.get('XLA_FLAGS', '')!r}")
    print(
        f"load average {os.getloadavg()}, {os.cpu_count()} cores, "
        f"{pairs} pairs, d = 2, n = {n}, t1 = {t1}, float64, sweeps: best of {REPEAT} timed runs"
    )
    print("× scipy: against the scipy loop in the same time scale")
    print(
        f"{'configuration':62s} {'members/s':>10s} {'× scipy':>8s} {'× OA':>6s} "
        f"{'eff.':>5s} {'steps mean/max':>15s}"
    )
    for r in rows:
        ts = "natural" if (", natural" in r["name"]) else "physical"
        eff = f"{r['efficiency']:.2f}" if "efficiency" in r else ""
        st = f"{r['mean_steps']:.0f}/{r['max_steps']}" if "mean_steps" in r else ""
        print(
            f"{r['name']:62s} {r['members_per_s']:10.1f} "
            f"{r['members_per_s'] / scipy_rate[ts]:8.2f} "
            f"{r['members_per_s'] / oa[ts]['members_per_s']:6.3f} {eff:>5s} {st:>15s}"
        )
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "bench_compaction.json"), "w") as f:
        json.dump(
            dict(
                rows=rows,
                scipy=scipy_rate,
                budget=parts,
                load=os.getloadavg(),
                pairs=pairs,
                n=n,
                t1=t1,
                repeat=REPEAT,
                scipy_seconds=scipy_seconds,
                xla_flags=os.environ.get("XLA_FLAGS", ""),
            ),
            f,
            indent=1,
        )
    return rows


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--scan", action="store_true")
    p.add_argument("--layout", action="store_true")
    p.add_argument("--saves", action="store_true")
    p.add_argument("--budget", action="store_true")
    p.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="timed runs of each sweep configuration; the fastest is reported (default 3: "
        "one run swung by +-5 %% on a shared machine)",
    )
    p.add_argument(
        "--xla-loops",
        choices=["fast", "default"],
        default="fast",
        help="fast: XLA's small while loops compiled whole (jaxattn.prefer_fast_cpu_loops, "
        "as the jaxattn command runs); default: XLA's default CPU runtime",
    )
    p.add_argument(
        "--loops",
        action="store_true",
        help="also run the benchmark with the other --xla-loops setting in a child process "
        "and print both side by side",
    )
    p.add_argument("--pairs", type=int, default=512)
    p.add_argument("--n", type=int, default=256)
    p.add_argument("--out", default="bench_out")
    p.add_argument(
        "--methods",
        nargs="+",
        default=["particles", "watanabe_strogatz", "ott_antonsen"],
        choices=["particles", "watanabe_strogatz", "ott_antonsen"],
    )
    a = p.parse_args()
    if a.repeat < 1:
        p.error(f"--repeat must be at least 1, got {a.repeat}")
    REPEAT = a.repeat
    if a.xla_loops == "fast" and not prefer_fast_cpu_loops():
        print(f"note: XLA_FLAGS kept as it is: {os.environ.get('XLA_FLAGS', '')!r}")
    if a.loops:
        other = "default" if a.xla_loops == "fast" else "fast"
        child_out = tempfile.mkdtemp(prefix="bench_compaction_")
        argv = [a for a in sys.argv[1:] if a != "--loops"]
        # The child starts JAX afresh (XLA reads its flags once); without this process's
        # option in its environment.
        env = dict(
            os.environ,
            XLA_FLAGS=os.environ.get("XLA_FLAGS", "").replace(SMALL_LOOP_OPTION, "").strip(),
        )
        print(f"== child process: --xla-loops {other}", flush=True)
        subprocess.run(
            [sys.executable, __file__, *argv, "--xla-loops", other, "--out", child_out],
            check=True,
            env=env,
        )
        print(f"\n== this process: --xla-loops {a.xla_loops}", flush=True)
    rows = main(
        quick=a.quick,
        pairs=a.pairs,
        n=a.n,
        scan=a.scan,
        layout=a.layout,
        saves=a.saves,
        budget=a.budget,
        out_dir=a.out,
        methods=tuple(a.methods),
    )
    if a.loops:
        with open(os.path.join(child_out, "bench_compaction.json")) as f:
            child = json.load(f)
        _side_by_side({a.xla_loops: rows, other: child["rows"]})
