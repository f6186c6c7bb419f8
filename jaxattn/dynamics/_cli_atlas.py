"""`jaxattn atlas`: the regime atlas report (see `jaxattn.dynamics._atlas`)."""

import argparse
import sys
import time


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "atlas",
        help="map where attention clusters, rotates or oscillates; write a report",
        description="Run the regime atlas on built-in inputs (the paper's cases, regime maps "
        "with theory overlaid, bifurcations, the Case-4 Hamiltonian, d = 100 runs, a "
        "gradient-based boundary crossing, flow families (normalisations, causal masking, "
        "the PLGA flow of a trained tiny PLDR-LLM layer), that layer's trained operator as a "
        "multi-head flow, multistability and chaos in three tokens) and write DIR/atlas.md, "
        "DIR/atlas.json and DIR/figures/. Exit code 3: "
        "the report is written but a figure could not be drawn (listed in atlas.md).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="small sizes: a few minutes on 2 CPU cores (the full run is GPU-sized)",
    )
    p.add_argument("--out", default="atlas", metavar="DIR", help="output folder")
    p.add_argument("--no-progress", action="store_true", help="no progress lines or bars")
    p.add_argument(
        "--float32",
        action="store_true",
        help="do not switch this process to float64 (high-d sections are float32 "
        "in --quick anyway)",
    )
    p.set_defaults(run=_run)


def _run(args) -> int:
    import jax

    # float64 for this command only, without touching the global setting.
    with jax.enable_x64(not args.float32):
        return _run_atlas(args)


def _run_atlas(args) -> int:
    import jax
    import matplotlib

    from .._cli_args import check_out_folder
    from ._atlas import run_atlas
    from ._cli import check_backend

    check_out_folder("--out", args.out)
    check_backend("atlas")
    matplotlib.use("Agg")  # this command only writes PNG files

    t = time.perf_counter()
    report = run_atlas(quick=args.quick, out_dir=args.out, progress=not args.no_progress)
    print(
        f"jaxattn atlas: wrote {report.get('markdown', args.out)} and "
        f"{args.out}/atlas.json in {time.perf_counter() - t:.1f} s "
        f"({'quick' if args.quick else 'full'} mode, {jax.default_backend()}).",
        file=sys.stdout,
    )
    errors = report.get("figure_errors") or []
    for e in errors:
        print(f"jaxattn atlas: figure not drawn: {e['figure']}: {e['error']}", file=sys.stderr)
    # 3: every number is written (atlas.json, atlas.md) but a figure could not be drawn
    return 3 if errors else 0
