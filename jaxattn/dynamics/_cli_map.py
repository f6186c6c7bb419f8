"""`jaxattn map`: a regime map of a family of flows from the shell (see `regime_map`)."""

import argparse
import math
import os
import sys
import time

from .._cli_args import seed

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
        epilog="families:\n"
        + families
        + "\n\nparameters with an integer default (d and draw of random) take whole numbers"
        "\n(d >= 2, draw >= 0); d is shared by every member of a map, so it is held with"
        "\n--set d=K (one map per d), never an axis.\n\nexample:\n"
        "  jaxattn map rotating --x a=-1:1:32 --y b=-1:1:32 --method oa --inits 8",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("family", nargs="?", default="case4", help="family name (default case4)")
    p.add_argument(
        "--x",
        default=None,
        metavar="NAME=LO:HI:NUM",
        help="first axis: NUM cell centres from LO to HI, or NAME=V1,V2,... (strictly "
        "increasing); default: the family's first parameter on -2:2:24",
    )
    p.add_argument("--y", default=None, metavar="NAME=LO:HI:NUM", help="optional second axis")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="hold a parameter at a finite value (repeatable), e.g. --set d=3",
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
    p.add_argument(
        "--seed",
        type=seed,
        default=0,
        help="base seed: member seeds are seed*inits + k, below 2**32 (0)",
    )
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
    """`{name: (value, item)}` of the `--set NAME=VALUE` items; **raises** `ValueError`
    naming the item when it is not of that form or the value is not finite."""
    fixed = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            if not sep or not name.strip():
                raise ValueError
            number = float(value)
        except ValueError:
            raise ValueError(f"--set {item!r}: expected NAME=VALUE, e.g. --set beta=2") from None
        if not math.isfinite(number):
            raise ValueError(f"--set {item!r}: the value must be a finite number.")
        fixed[name.strip()] = (number, item)
    return fixed


# Options of the command that users mistake for family parameters.
_OPTIONS = {"n": "--n", "inits": "--inits", "seed": "--seed", "t1": "--t1"}


def _check_values(fam, axes, fixed, inits):
    """The axes and fixed values of a built-in family, checked before anything is built.

    `axes`: `[(flag, spec, (name, values))]`; `fixed`: `{name: (value, item)}`. Integer
    parameters (those whose default is an int: `d` and `draw` of `random`) take whole
    numbers (returned rounded, as floats); `d` >= 2, the others (seeds) >= 0. `d` cannot
    vary along an axis: one map is one compiled sweep, whose members share a dimension.

    **Returns:** `(axes, fixed)` as `regime_map` takes them. **Raises:** `ValueError`
    naming the flag, the item and the problem.
    """
    import numpy as np

    from ._sweep import available_memory

    integer = {k for k, v in fam.params.items() if isinstance(v, int) and not isinstance(v, bool)}
    items = [(flag, spec, name, np.asarray(values)) for flag, spec, (name, values) in axes]
    items += [("--set", item, name, np.asarray([v])) for name, (v, item) in fixed.items()]
    out_axes, out_fixed, where_d = [], {}, f"d={fam.params.get('d')} (the default)"
    for flag, spec, name, values in items:
        where = f"{flag} {spec!r}"
        if name not in fam.params:
            hint = f"; {name} is the option {_OPTIONS[name]}" if name in _OPTIONS else ""
            raise ValueError(
                f"{where}: unknown parameter {name!r} of family {fam.name!r}; its parameters "
                f"are {', '.join(fam.params)}{hint}."
            )
        if name == "d" and flag != "--set" and np.unique(values).size > 1:
            raise ValueError(
                f"{where}: d cannot be an axis: one map is one compiled sweep, whose members "
                "share the dimension d. Run one map per d, holding it with --set d=K."
            )
        if name in integer:
            frac = values[values != np.round(values)]
            if frac.size:
                e_g = "--set d=3" if name == "d" else f"{name}=0:3:4 or {name}=0,1,2"
                raise ValueError(
                    f"{where}: {name} is an integer parameter; got the fractional value "
                    f"{frac[0]:g} (give whole numbers, e.g. {e_g})."
                )
            values = np.round(values)
            low = 2 if name == "d" else 0
            if values.min() < low:
                what = "the dimension and" if name == "d" else "an integer parameter;"
                raise ValueError(
                    f"{where}: {name} is {what} must be >= {low}, got {values.min():g}."
                )
        if name == "d":
            where_d = where
        if flag == "--set":
            out_fixed[name] = float(values[0])
        else:
            out_axes.append((name, values))
    if "d" in fam.params:
        # every member holds its own d×d A and V (built, stacked, repeated per init): refuse
        # a d that cannot fit here by name, not as NumPy's MemoryError deep in the build
        d = float(out_fixed.get("d", dict(out_axes).get("d", [fam.params["d"]])[0]))
        cells = math.prod(len(v) for _, v in out_axes)
        need = 2 * 2 * 8 * d * d * cells * (inits + 1)  # bytes; a float: inf for a huge d
        if need > 2**26 and need > (free := available_memory()) / 2:
            raise ValueError(
                f"{where_d}: the A and V of {cells} cells x {inits} inits need about "
                f"{need / 2**30:.3g} GiB, more than half of the {free / 2**30:.3g} GiB "
                "available; use a smaller d, fewer cells or fewer --inits."
            )
    return out_axes, out_fixed


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

    from .._cli_args import check_out_folder
    from ._regime_map import FAMILIES, largest_base_seed, parse_axis

    if args.family not in FAMILIES:
        raise ValueError(f"unknown family {args.family!r}; choose one of {', '.join(FAMILIES)}.")
    fam = FAMILIES[args.family]
    specs = [("--x", args.x or f"{next(iter(fam.params))}=-2:2:24")]
    if args.y:
        specs.append(("--y", args.y))
    for name, value in (("--n", args.n), ("--inits", args.inits), ("--num-save", args.num_save)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}.")
    axes, fixed = _check_values(
        fam,
        [(flag, spec, parse_axis(spec)) for flag, spec in specs],
        _parse_set(args.set),
        args.inits,
    )
    check_out_folder("--out", args.out)
    largest = largest_base_seed(args.inits)
    if not 0 <= args.seed <= largest:
        raise ValueError(
            f"--seed must be in [0, {largest}] with --inits {args.inits} (the members' seeds "
            f"seed·inits + k lie in [0, 2**32)), got {args.seed}."
        )
    from ._sweep import Runner

    runner = Runner(
        out_dir=os.path.join(args.out, "sweep"),
        resume=not args.overwrite,
        progress=not args.no_progress,
    )
    t = time.perf_counter()
    try:
        m = _map(args, axes, fixed, runner)
    except ValueError as err:
        if "different sweep" in str(err):
            found = getattr(err, "what", None)  # `DifferentSweepError`: what differs
            what = f" ({found})" if found else ""
            raise ValueError(
                f"{args.out} holds a different map{what}; pass another --out, or --overwrite "
                "to replace it."
            ) from None
        if "resume=False" in str(err):  # the library's advice, in this command's words
            raise ValueError(
                str(err).replace("pass resume=False to overwrite the folder", "pass --overwrite")
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
            f"; theory disagreements {s['disagreements']}/{s['cells_compared']} decided cells "
            f"({s['cells_with_claim']} with a claim)"
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
    if s["failed_members"]:
        print(f"jaxattn map: members failed because: {_reasons(m.sweep)}.", file=sys.stderr)
    return status


def _reasons(sweep) -> str:
    """The most common reasons members failed, with counts, in one line."""
    return "; ".join(f"{why} ({k})" for why, k in sweep.failure_reasons()[:3])


def _map(args, axes, fixed, runner):
    from ._regime_map import regime_map

    return regime_map(
        args.family,
        axes,
        fixed=fixed,
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
    if s["failed_members"]:
        lines.append(f"- why they failed: {_reasons(sw)}")
    if "disagreements" in s:
        lines.append(
            f"- stated theory: claims in {s['cells_with_claim']} cells, of which "
            f"{s['cells_compared']} decided (failed and undetermined cells are not compared); "
            f"the dominant regime contradicts it in {s['disagreements']}"
        )
    return "\n".join(lines) + "\n"
