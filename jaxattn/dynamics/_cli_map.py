"""`jaxattn map`: a regime map of a family of flows from the shell (see `regime_map`)."""

import argparse
import os
import sys
import time

_METHODS = {
    "particles": "particles",
    "ott_antonsen": "ott_antonsen",
    "oa": "ott_antonsen",
    "watanabe_strogatz": "watanabe_strogatz",
    "ws": "watanabe_strogatz",
}


def register(subparsers) -> None:
    from ._regime_map import FAMILIES

    families = "\n".join(
        f"  {f.name:9s} {f.description}; parameters (defaults): "
        + ", ".join(f"{k}={v}" for k, v in f.params.items())
        for f in FAMILIES.values()
    )
    p = subparsers.add_parser(
        "map",
        help="regime map of a family over one or two parameters (basin fractions)",
        description="Map the long-run regimes of a family of attention flows over one or two "
        "parameters, with K initial conditions per cell. Writes DIR/regime_map.npz, "
        "DIR/regime_map.json, DIR/regime_map.png and DIR/summary.md; the sweep's chunks go "
        "to DIR/sweep, so rerunning the same command resumes an interrupted map.",
        epilog="families:\n" + families + "\n\nexample:\n"
        "  jaxattn map rotating --x a=-1:1:32 --y b=-1:1:32 --method oa --inits 8",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("family", nargs="?", default="case4", help="family name (default case4)")
    p.add_argument(
        "--x",
        default=None,
        metavar="NAME=LO:HI:NUM",
        help="first axis (cell centres); default: the family's first parameter on -2:2:24",
    )
    p.add_argument("--y", default=None, metavar="NAME=LO:HI:NUM", help="optional second axis")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="hold a parameter at a value (repeatable)",
    )
    p.add_argument(
        "--method",
        default="ott_antonsen",
        choices=sorted(_METHODS),
        help="particles (any d, any kernel), ott_antonsen/oa or watanabe_strogatz/ws "
        "(d = 2 LSA); default ott_antonsen",
    )
    p.add_argument("--kernel", default="lsa", choices=("lsa", "usa", "sa"))
    p.add_argument("--n", type=int, default=64, help="tokens per member (default 64)")
    p.add_argument(
        "--t1", type=float, default=200.0, help="horizon in natural time units (default 200)"
    )
    p.add_argument("--num-save", type=int, default=401, help="save points (default 401)")
    p.add_argument(
        "--inits", type=int, default=4, help="initial conditions per cell, K (default 4)"
    )
    p.add_argument("--seed", type=int, default=0, help="base seed (default 0)")
    p.add_argument(
        "--lyapunov",
        type=int,
        default=0,
        metavar="K",
        help="also measure K Lyapunov exponents per member and label chaos (default 0: off)",
    )
    p.add_argument(
        "--out", default=None, metavar="DIR", help="output folder (default runs/map/FAMILY)"
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a different map already in --out (default: resume the same map, "
        "refuse a different one)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--float32", action="store_true", help="compute in float32 (default float64)")
    p.set_defaults(run=_run)


def _parse_set(items) -> dict:
    fixed = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            if not sep or not name.strip():
                raise ValueError
            fixed[name.strip()] = float(value)
        except ValueError:
            raise ValueError(f"--set {item!r}: expected NAME=VALUE, e.g. --set beta=2") from None
    return fixed


def _run(args) -> int:
    import jax

    if args.out is None:
        args.out = os.path.join("runs", "map", args.family)
    try:
        with jax.enable_x64(not args.float32):
            return _run_map(args)
    except KeyboardInterrupt:
        print(
            f"jaxattn map: interrupted; finished chunks are kept in {args.out}/sweep: rerun "
            "the same command to resume.",
            file=sys.stderr,
        )
        return 130


def _run_map(args) -> int:
    import matplotlib

    from ._regime_map import FAMILIES, parse_axis

    if args.family not in FAMILIES:
        raise ValueError(f"unknown family {args.family!r}; choose one of {', '.join(FAMILIES)}.")
    fam = FAMILIES[args.family]
    axes = [parse_axis(args.x or f"{next(iter(fam.params))}=-2:2:24")]
    if args.y:
        axes.append(parse_axis(args.y))
    for name, value in (("--n", args.n), ("--inits", args.inits), ("--num-save", args.num_save)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}.")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise ValueError(f"--out {args.out!r} is a file; give a folder.")
    from ._sweep import Runner

    runner = Runner(
        out_dir=os.path.join(args.out, "sweep"),
        resume=not args.overwrite,
        progress=not args.no_progress,
    )
    t = time.perf_counter()
    try:
        m = _map(args, axes, runner)
    except ValueError as err:
        if "different sweep" in str(err):
            raise ValueError(
                f"{args.out} holds a different map; pass another --out, or --overwrite to "
                "replace it."
            ) from None
        raise
    if m.failed.all():
        print(
            f"jaxattn map: every member failed ({m.sweep.failures()[0]['reason']}); "
            f"see {args.out}/sweep/chunk_*.json.",
            file=sys.stderr,
        )
        return 1
        # Results are on disk (m.save ran inside regime_map); figures come after.
        (axes,)
    summary = _summary_markdown(m, args, time.perf_counter() - t)
    md = os.path.join(args.out, "summary.md")
    status = 0
    figure = os.path.join(args.out, "regime_map.png")
    try:
        matplotlib.use("Agg")  # this command only writes PNG files
        import matplotlib.pyplot as plt

        from ..plot import plot_regime_map

        fig = plot_regime_map(m).figure
        fig.savefig(figure, dpi=150, bbox_inches="tight")
        plt.close(fig)
        summary += "\n![regime map](regime_map.png)\n"
    except Exception as err:  # the results are kept; say what failed
        summary += f"\n**Figure not written**: {type(err).__name__}: {err}\n"
        print(f"jaxattn map: figure not written ({err}); results kept.", file=sys.stderr)
        status = 1
    with open(md, "w") as f:
        f.write(summary)
    s = m.summary()
    dom = ", ".join(f"{k} {v}" for k, v in s["dominant"].items() if v)
    print(
        f"jaxattn map: {s['cells']} cells × {m.inits} inits in {m.seconds:.1f} s "
        f"({s['members'] / max(m.seconds, 1e-9):.1f} members/s); dominant: {dom}; "
        f"multistable cells {s['multistable_cells']}, failed members {s['failed_members']}"
        + (
            f"; theory disagreements {s['disagreements']}/{s['cells_with_claim']}"
            if "disagreements" in s
            else ""
        )
        + (
            f"; resumed ({m.sweep.chunks_loaded} of "
            f"{m.sweep.chunks_loaded + m.sweep.chunks_computed} chunks from {args.out}/sweep)"
            if m.sweep.chunks_loaded
            else ""
        )
        + f". Wrote {args.out}/ (regime_map.npz, regime_map.json, summary.md"
        + (", regime_map.png)." if status == 0 else ").")
    )
    return status


def _map(args, axes, runner):
    from ._regime_map import regime_map

    return regime_map(
        args.family,
        axes,
        fixed=_parse_set(args.set),
        method=_METHODS[args.method],
        kernel=args.kernel,
        n=args.n,
        inits=args.inits,
        seed=args.seed,
        t1=args.t1,
        num_save=args.num_save,
        judge=None if not args.lyapunov else _judge(args.lyapunov),
        runner=runner,
        out_dir=args.out,
        progress=not args.no_progress,
    )


def _judge(k):
    from ._sweep import Judge

    return Judge(lyapunov=k)


def _summary_markdown(m, args, seconds) -> str:
    from ._sweep import REGIME_NAMES

    s = m.summary()
    axes = ", ".join(f"`{n}` ∈ [{v[0]:g}, {v[-1]:g}] ({len(v)} cells)" for n, v in m.axes)
    fixed = ", ".join(f"`{k}` = {v:g}" for k, v in m.fixed.items()) or "none"
    sw = m.sweep
    lines = [
        f"# Regime map: {m.family}",
        "",
        f"- axes: {axes}; fixed: {fixed}",
        f"- method: {m.method}, kernel {m.kernel}, n = {args.n}, horizon {args.t1:g} natural "
        f"time units, {m.inits} initial conditions per cell"
        + (
            f"; {args.lyapunov} Lyapunov exponents per member (chaos label on)"
            if args.lyapunov
            else ""
        ),
        f"- {s['members']} members in {seconds:.1f} s; lockstep efficiency "
        f"{sw.lockstep_efficiency:.2f}; backend {sw.environment.get('backend')}, "
        f"{sw.environment.get('dtype')}",
        "",
        "| regime | cells where dominant |",
        "|---|---|",
    ]
    lines += [f"| {name} | {s['dominant'][name]} |" for name in REGIME_NAMES]
    lines += [
        "",
        f"- multistable cells (no regime holds ≥ 90 % of the inits): {s['multistable_cells']}",
        f"- failed members (never counted as a regime): {s['failed_members']}",
    ]
    if "disagreements" in s:
        lines.append(
            f"- stated theory: claims in {s['cells_with_claim']} cells; the dominant regime "
            f"contradicts it in {s['disagreements']}"
        )
    return "\n".join(lines) + "\n"
