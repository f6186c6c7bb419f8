"""`jaxattn simulate`: one particle run of the attention flow, with summary and figures."""

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from .._cli_args import check_out_folder, seed
from .._npz import load_numpy_file, read_error_reason
from ._presets import PRESETS

DEFAULT_PRESET = "case3-rotating"

USAGE_EXAMPLES = """\
examples:
  jaxattn simulate                                   # preset case3-rotating, n=64, d=2
  jaxattn simulate --preset case4-oscillating --t1 200
  jaxattn simulate --preset identity --kernel sa --d 8 --n 128
  jaxattn simulate --A A.json --V V.npz --beta 2 --out runs/mine
presets: """ + ", ".join(PRESETS)

EXIT_CODES = """
exit codes: 0 classified run; 1 the solve failed or the run cannot be classified (e.g. frozen
  by a large --score-shift); 2 bad input; 3 results written but a figure could not be drawn"""


def register(subparsers) -> None:
    """Add the `simulate` sub-command to the `jaxattn` parser."""
    p = subparsers.add_parser(
        "simulate",
        help="simulate tokens as particles on the sphere and classify the regime",
        description="Solve dx_k/dt = P⊥_{x_k}((1/n) Σ_j w_kj V x_j) for n tokens on S^{d-1}\n"
        "from uniform random starts; write the trajectory (npz), a summary with the regime\n"
        "and its evidence (JSON) and figures (PNG) to the output folder.",
        epilog=USAGE_EXAMPLES + EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--preset",
        default=None,
        metavar="NAME",
        help=f"named (A, V) of the paper's cases (default {DEFAULT_PRESET} unless --A/--V)",
    )
    p.add_argument(
        "--A",
        dest="A_file",
        default=None,
        metavar="FILE",
        help="A as a JSON nested list or an .npz/.npy file (key 'A' or its only array): a "
        "square d×d matrix of finite real numbers, d >= 2 (read without unpickling)",
    )
    p.add_argument(
        "--V",
        dest="V_file",
        default=None,
        metavar="FILE",
        help="V, same formats and checks (default: the preset's V, or I with --A)",
    )
    p.add_argument(
        "--beta", type=float, default=None, help="inverse temperature (default: preset's, 1)"
    )
    p.add_argument("--n", type=int, default=64, help="number of tokens (default 64)")
    p.add_argument(
        "--d",
        type=int,
        default=None,
        help="dimension (default: that of A; presets are block-embedded for even d > 2)",
    )
    p.add_argument("--kernel", choices=("lsa", "usa", "sa"), default="lsa", help="attention kernel")
    p.add_argument(
        "--score-shift",
        type=_score_shift,
        default=0.0,
        metavar="SHIFT|auto",
        help="USA only: subtract this from every score, i.e. rescale time by exp(shift) "
        "(needed when beta*sigma_max(A) passes the range of exp); 'auto' = 0 when the "
        "scores fit, else the largest initial score (time in units of the fastest initial "
        "pair), at least beta*sigma_max(A) - log(float max)/2",
    )
    p.add_argument("--t1", type=float, default=None, help="horizon (default: the preset's)")
    p.add_argument("--num-save", type=int, default=1001, help="save times (default 1001)")
    p.add_argument(
        "--seed", type=seed, default=0, help="PRNG seed of the initial tokens, 0 to 2**32 - 1 (0)"
    )
    p.add_argument("--rtol", type=float, default=1e-7)
    p.add_argument("--atol", type=float, default=1e-9)
    p.add_argument(
        "--max-steps",
        type=int,
        default=200_000,
        help="step budget of each solve piece (the run is solved in pieces along its save "
        "times, each with this budget; default 200000)",
    )
    p.add_argument("--float32", action="store_true", help="solve in float32 (default float64)")
    p.add_argument("--no-figures", action="store_true", help="skip the PNG figures")
    p.add_argument("--out", default="runs/simulate", help="output folder (default runs/simulate)")
    p.set_defaults(run=run)


def _score_shift(text: str):
    if text == "auto":
        return "auto"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'auto', got {text!r}") from None
    if not np.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be finite, got {text!r}")
    return value


def check_backend(command: str) -> None:
    """Start JAX's backend now and turn a failure (e.g. `JAX_PLATFORMS=cuda` on a machine
    without a GPU: a bare `AssertionError` deep inside JAX) into a one-line `ValueError`
    naming the variable."""
    import os

    import jax

    try:
        jax.devices()
    except (RuntimeError, AssertionError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ValueError(
            f"no usable JAX backend (JAX_PLATFORMS={os.environ.get('JAX_PLATFORMS')!r}): "
            f"{first}. Unset JAX_PLATFORMS or name a platform this machine has (e.g. cpu)."
        ) from None


def _load_matrix(path: str, name: str) -> np.ndarray:
    """The matrix given to the flag `--{name}`: a JSON nested list of real numbers, an
    `.npy` array or an `.npz` archive (the array named `name`, or its only array), read
    without unpickling (`allow_pickle=False`), as a float64 square d×d array, d >= 2.
    Integer and boolean arrays read as numbers (0/1); `true`/`false` in a JSON matrix are
    refused (beside numbers NumPy would read them as 1 and 0 without a word).

    **Raises:** `FileNotFoundError` or `ValueError` naming the flag and the file when the
    file is missing, unreadable or corrupt (truncated, not the format of its suffix), or
    holds something other than a finite real square matrix (complex numbers, strings,
    objects, JSON booleans, NaN or inf, a wrong shape).
    """
    flag, f = f"--{name}", Path(path)
    if not f.exists():
        raise FileNotFoundError(f"{flag}: no such file: {path}")
    suffix = f.suffix.lower()
    if suffix not in (".json", ".npy", ".npz"):
        raise ValueError(f"{flag}: {path} must be .json, .npy or .npz.")
    keys = None
    try:
        if suffix == ".json":
            raw = json.loads(f.read_text(encoding="utf-8"))
            booleans = _holds_bool(raw)  # NumPy would read true as 1 beside numbers
            M = np.asarray(raw)
        else:
            loaded = load_numpy_file(f)  # .npy or .npz, told by content; read whole
            if isinstance(loaded, dict):
                keys = list(loaded)
                key = name if name in keys else keys[0] if len(keys) == 1 else None
                M = None if key is None else np.asarray(loaded[key])
            else:
                M = np.asarray(loaded)
    except Exception as err:  # noqa: BLE001
        # Parsing untrusted bytes: json, zipfile, zlib and NumPy's header reader raise a
        # dozen unrelated types on a truncated or corrupt file (BadZipFile, EOFError,
        # zlib.error, TokenError, NotImplementedError, ...); each means "not readable".
        why = read_error_reason(err)
        raise ValueError(f"{flag}: cannot read a matrix from {path} ({why}).") from None
    if suffix == ".json" and booleans:
        raise ValueError(
            f"{flag}: {path} holds true/false; {name} must hold numbers (a JSON matrix is "
            "written with numbers; a boolean .npy reads as 0/1)."
        )
    if M is None:
        held = f"holds {keys}" if keys else "holds no arrays"
        raise ValueError(f"{flag}: {path} {held}; name the array '{name}'.")
    if M.dtype.kind == "c":
        raise ValueError(
            f"{flag}: {path} holds complex numbers (dtype {M.dtype}); {name} must be real."
        )
    if M.dtype.kind not in "biuf":
        what = f"dtype {M.dtype}"
        hint = " (a .json file holds the matrix itself: a nested list of numbers)" * (
            suffix == ".json"
        )
        raise ValueError(f"{flag}: {path} does not hold an array of real numbers ({what}){hint}.")
    M = M.astype(np.float64)
    if M.ndim != 2 or M.shape[0] != M.shape[1] or M.shape[0] < 2:
        raise ValueError(
            f"{flag}: {path} must hold a square d×d matrix with d >= 2, got shape {M.shape}."
        )
    if not np.all(np.isfinite(M)):
        raise ValueError(f"{flag}: {path} has non-finite entries (NaN or inf).")
    return M


def _holds_bool(x) -> bool:
    """Whether parsed JSON holds a boolean anywhere in its (nested) lists."""
    if isinstance(x, bool):
        return True
    return isinstance(x, list) and any(_holds_bool(v) for v in x)


def _resolve(args):
    """Matrices and parameters from the arguments; ValueError on anything inconsistent."""
    if args.preset is not None and args.preset not in PRESETS:
        raise ValueError(f"unknown preset {args.preset!r}; known presets: {', '.join(PRESETS)}.")
    check_out_folder("--out", args.out)
    use_preset = args.preset is not None or (args.A_file is None and args.V_file is None)
    pre = PRESETS[args.preset or DEFAULT_PRESET] if use_preset else None
    _check_sizes(args)
    A = _load_matrix(args.A_file, "A") if args.A_file else None
    V = _load_matrix(args.V_file, "V") if args.V_file else None
    if A is None and V is None:
        d = 2 if args.d is None else int(args.d)
        if d < 2 or d % 2:
            raise ValueError(
                f"--d: presets are 2×2 and block-embedded, so d must be even >= 2, got {d}."
            )
        k = d // 2
        A = np.kron(np.eye(k), pre.A)
        V = np.kron(np.eye(k), pre.V)
    else:
        d_ref = (A if A is not None else V).shape[0]
        if A is None:
            A = (
                np.kron(np.eye(d_ref // 2), pre.A)
                if pre is not None and d_ref % 2 == 0
                else np.eye(d_ref)
            )
        if V is None:
            V = (
                np.kron(np.eye(d_ref // 2), pre.V)
                if pre is not None and d_ref % 2 == 0
                else np.eye(d_ref)
            )
        if A.shape != V.shape:
            raise ValueError(f"--A and --V must have the same shape, got {A.shape} and {V.shape}.")
        if args.d is not None and int(args.d) != A.shape[0]:
            raise ValueError(f"--d {args.d} does not match the {A.shape[0]}×{A.shape[0]} matrices.")
        _check_sizes(args, d=A.shape[0])  # d from the files: checked now that it is known
    beta = args.beta if args.beta is not None else (pre.beta if pre is not None else 1.0)
    t1 = args.t1 if args.t1 is not None else (pre.t1 if pre is not None else 100.0)
    if not np.isfinite(beta) or beta <= 0:
        raise ValueError(f"--beta must be a finite positive number, got {beta}.")
    for name in ("rtol", "atol"):
        value = getattr(args, name)
        if not np.isfinite(value) or value <= 0:
            raise ValueError(f"--{name}: {name} must be a finite positive number, got {value}.")
    from ._solve import check_rtol_below_one

    check_rtol_below_one("--rtol", args.rtol)
    if not np.isfinite(t1) or t1 <= 0:
        raise ValueError(f"--t1 must be a finite positive number, got {t1}.")
    return pre, A, V, float(beta), float(t1)


def _check_sizes(args, d: int | None = None) -> None:
    """The counts, and whether the run can fit in memory (`memory_estimate`'s terms: the
    saved states, the solver's token-sized buffers, the n² scores of SA/USA, the d×d
    matrices), before anything is built: a huge --n, --d or --num-save is refused by name,
    not as an allocation failure deep inside NumPy or XLA. With --A/--V files `d` is theirs,
    checked again once they are read."""
    from types import SimpleNamespace

    from ._solve import memory_estimate
    from ._sweep import available_memory

    if args.n < 1:
        raise ValueError(f"--n must be at least 1, got {args.n}.")
    if args.num_save < 20:
        raise ValueError(f"--num-save must be at least 20, got {args.num_save}.")
    if args.max_steps < 1:
        raise ValueError(f"--max-steps must be at least 1, got {args.max_steps}.")
    if d is None:
        d = 2 if args.d is None else max(int(args.d), 2)
    quadratic = args.kernel in ("usa", "sa")
    dtype = np.float32 if args.float32 else np.float64
    # The solve's own estimate (a flow is only asked its kernel), plus the A and V built here.
    field = SimpleNamespace(kernel=args.kernel)
    need = memory_estimate(field, args.n, args.num_save, d=d, dtype=dtype)
    need += 2 * np.dtype(dtype).itemsize * d * d
    if need > 2**26 and need > (free := available_memory()) / 2:
        raise ValueError(
            f"--n {args.n}, d = {d}, --num-save {args.num_save} ({args.kernel.upper()}"
            f"{', float32' if args.float32 else ''}) need about {need / 2**30:.3g} GiB "
            f"(saved states{', n² scores' if quadratic else ''}, solver buffers, A and V), "
            f"more than half of the {free / 2**30:.3g} GiB available; use fewer tokens, save "
            "times or dimensions" + (", or the LSA kernel (O(n d²))." if quadratic else ".")
        )


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run(args) -> int:
    import jax

    # float64 for this command only, without touching the global setting.
    with jax.enable_x64(not args.float32):
        return _run(args)


def _run(args) -> int:
    t_start = time.perf_counter()
    pre, A, V, beta, t1 = _resolve(args)
    check_backend("simulate")
    import jax
    import jax.numpy as jnp
    from tqdm.auto import tqdm

    from ..plot import save_trajectory_figures
    from ..sphere import sample_uniform
    from ._regimes import REGIMES, _window_start, classify_regime, regime_name
    from ._solve import RESULTS, environment_record, simulate, usa_score_shift
    from ._theory import stated_prediction
    from ._vector_field import AttentionDynamics

    dtype = jnp.float32 if args.float32 else jnp.float64
    n, d = int(args.n), A.shape[0]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    label = (
        pre.name if (pre is not None and args.A_file is None and args.V_file is None) else "custom"
    )
    _progress(
        f"jaxattn simulate: {label}, kernel {args.kernel}, n={n}, d={d}, beta={beta:g}, "
        f"t1={t1:g}, {jnp.dtype(dtype).name} -> {out}"
    )
    if args.preset is not None and label == "custom":
        given = [flag for flag, path in (("--A", args.A_file), ("--V", args.V_file)) if path]
        _progress(
            f"  --preset {args.preset}: {' and '.join(given)} replace"
            f"{'s' if len(given) == 1 else ''} its matrices; the preset gives the rest "
            "(beta and t1 unless given"
            + (
                "; the other matrix is the preset's, block-embedded, for even d, else I"
                if len(given) == 1
                else ""
            )
            + ")"
        )

    # the classifier's late window must hold enough save times: checked before solving
    _window_start(args.num_save, 0.5)
    field = AttentionDynamics(
        jnp.asarray(A, dtype), jnp.asarray(V, dtype), beta=beta, kernel=args.kernel
    )
    shift = args.score_shift
    if shift == "auto":
        shift = 0.0
        if args.kernel == "usa" and usa_score_shift(field, dtype) > 0:
            # the smallest shift that fits can leave the top weights at exp(log(max)/2): a
            # hopelessly stiff run. Measure time in units of the fastest initial pair instead.
            first = sample_uniform(jax.random.key(args.seed), n, d, dtype=dtype)
            s = field.scores(first)  # self-scores move nothing (the field is tangent)
            top = float(jnp.max(jnp.where(jnp.eye(n, dtype=bool), -jnp.inf, s))) if n > 1 else 0.0
            shift = max(usa_score_shift(field, dtype), top)
    if shift and args.kernel != "usa":
        raise ValueError(
            f"--score-shift applies to the USA kernel only, got --kernel {args.kernel}."
        )
    field = AttentionDynamics(
        jnp.asarray(A, dtype),
        jnp.asarray(V, dtype),
        beta=beta,
        kernel=args.kernel,
        score_shift=float(shift),
    )
    x0 = sample_uniform(jax.random.key(args.seed), n, d, dtype=dtype)
    # Solve in equal chunks (one compilation, reused) so progress can be shown.
    chunks = min(10, args.num_save - 1)
    # chunk c covers the save indices bounds[c] .. bounds[c + 1] (all --num-save times kept)
    bounds = np.linspace(0, args.num_save - 1, chunks + 1).round().astype(int)
    num_save = args.num_save
    ts_all = np.linspace(0.0, t1, num_save)
    xs, steps, accepted, rejected, drift = [np.asarray(x0)[None]], 0, 0, 0, 0.0
    t_solve = time.perf_counter()
    x = x0
    result = RESULTS.successful
    bar = tqdm(
        range(chunks),
        desc="solving",
        unit="chunk",
        file=sys.stderr,
        disable=not sys.stderr.isatty(),
    )
    for c in bar:
        ts = jnp.asarray(ts_all[bounds[c] : bounds[c + 1] + 1], dtype)
        traj = simulate(
            field,
            x,
            t0=float(ts[0]),
            t1=float(ts[-1]),
            ts=ts,
            rtol=args.rtol,
            atol=args.atol,
            max_steps=args.max_steps,
            throw=False,
        )
        steps += int(traj.num_steps)
        accepted += int(traj.num_accepted_steps)
        rejected += int(traj.num_rejected_steps)
        drift = max(drift, float(traj.sphere_deviation))
        xs.append(np.asarray(traj.xs[1:]))
        x = traj.xs[-1]
        if not bool(traj.successful):
            result = traj.result
            bar.close()
            break
        if not sys.stderr.isatty():
            _progress(f"  solved to t = {float(ts[-1]):g} ({steps} steps)")
    t_solve = time.perf_counter() - t_solve
    xs = np.concatenate(xs)
    ts_done = ts_all[: xs.shape[0]]
    from ._solve import Trajectory

    z = jnp.asarray(0)
    full = Trajectory(
        ts=jnp.asarray(ts_done, dtype),
        xs=jnp.asarray(xs, dtype),
        result=result,
        num_steps=z + steps,
        num_accepted_steps=z + accepted,
        num_rejected_steps=z + rejected,
        sphere_deviation=jnp.asarray(drift, dtype),
        initial_deviation=jnp.asarray(0.0, dtype),
        environment=traj.environment,
    )
    ok = bool(full.result == RESULTS.successful)
    # With a score shift the horizon t1 covers only the physical time t1·exp(−shift); a run
    # in which no token moves at all is frozen by that rescaling: reported, not classified.
    moved = float(np.nanmax(np.linalg.norm(xs.astype(np.float64) - xs[:1], axis=-1)))
    frozen = None
    if ok and float(shift) > 0 and not moved > float(np.sqrt(np.finfo(dtype).eps)):
        frozen = (
            f"no token moved (largest displacement {moved:.3g} over the run): score_shift = "
            f"{float(shift):.6g} rescales time by exp({float(shift):.4g}), so t1 = {t1:g} covers "
            f"only the physical time {t1 * np.exp(-float(shift)):.3g}; not classified. Use a "
            f"smaller --score-shift (auto = {usa_score_shift(field, dtype):.6g}), float64, or a "
            f"horizon of order exp(score_shift)."
        )
    degenerate = None
    if ok and frozen is None:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # n = 1 is reported in the summary instead
            regime, evidence = jax.jit(classify_regime)(full)
        if n == 1:
            degenerate = "n = 1: a single token is not a cluster; the regime is undetermined."
    else:
        regime, evidence = REGIMES.undetermined, None
    name = regime_name(regime)
    if d == 2 and args.kernel == "lsa":
        pred = stated_prediction(jnp.asarray(A), jnp.asarray(V))
        prediction = {"claims": bool(pred.claims), "regime": regime_name(pred.regime)}
    else:
        prediction = None
    on_sphere = float(np.nanmax(np.abs(np.linalg.norm(xs.astype(np.float64), axis=-1) - 1)))

    environment = environment_record()
    np.savez_compressed(
        out / "trajectory.npz",
        ts=ts_done,
        xs=xs,
        A=A,
        V=V,
        beta=beta,
        score_shift=float(shift),
        environment=json.dumps(environment),
    )
    summary = {
        "command": "simulate",
        "parameters": {
            "preset": label,
            "kernel": args.kernel,
            "n": n,
            "d": d,
            "beta": beta,
            "t1": t1,
            "num_save": int(xs.shape[0]),
            "seed": args.seed,
            "rtol": args.rtol,
            "atol": args.atol,
            "max_steps": args.max_steps,
            "dtype": jnp.dtype(dtype).name,
            "A": A.tolist(),
            "V": V.tolist(),
        },
        "result": {
            "code": _result_name(full.result),
            "message": RESULTS[full.result] or "successful",
            "successful": ok,
        },
        "regime": {
            "name": name,
            # False when the solve failed or the run is frozen: `name` is then the
            # placeholder "undetermined", not a measurement.
            "classified": bool(ok and frozen is None),
            "description": REGIMES[regime],
            "evidence": None if evidence is None else evidence.as_dict(),
            "frozen": frozen,
            "degenerate": degenerate,
        },
        "time": {
            "score_shift": float(shift),
            "physical_horizon": t1 * float(np.exp(-float(shift))),
            "max_displacement": moved,
        },
        "environment": environment,
        "expected_regime": pre.expected
        if label != "custom" and args.kernel == "lsa" and d == 2
        else None,
        "stated_criterion": prediction,
        "sphere": {"max_step_drift_before_projection": drift, "max_norm_error_saved": on_sphere},
        "steps": {"num_steps": steps, "accepted": accepted, "rejected": rejected},
        "timing_s": {"solve_including_compile": round(t_solve, 3)},
    }
    # Results first: a figure that cannot be drawn or written loses nothing computed.
    summary["figures"] = []
    summary["figures_error"] = None
    summary["timing_s"]["total"] = round(time.perf_counter() - t_start, 3)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    figures, figure_error = [], None
    if not args.no_figures:
        import matplotlib

        matplotlib.use("Agg")  # this command only writes PNG files
        _progress("  drawing figures")
        try:
            figures = [
                str(p) for p in save_trajectory_figures(ts_done, xs, out, title=f"{label}, {name}")
            ]
        except Exception as err:  # noqa: BLE001 - any plotting failure is reported, not raised
            figure_error = f"{type(err).__name__}: {err}"
            _progress(f"  figures FAILED (results are written): {figure_error}")
        summary["figures"] = figures
        summary["figures_error"] = figure_error
        summary["timing_s"]["total"] = round(time.perf_counter() - t_start, 3)
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
    if frozen:
        _progress(f"frozen run: {frozen}")
    if not ok:  # why, not only the code (also in summary.json)
        _progress(f"the solve failed: {summary['result']['message']}")
    if degenerate:
        _progress(degenerate)
    shown = name if (ok and frozen is None) else "not classified"
    _progress(
        f"regime: {shown} | result: {summary['result']['code']} | steps {steps} | "
        f"sphere drift {drift:.1e} | {summary['timing_s']['total']:.1f}s"
    )
    _progress(
        f"wrote {out / 'trajectory.npz'}, {out / 'summary.json'}"
        + (f", {len(figures)} figures" if figures else "")
    )
    if not ok or frozen:
        return 1
    return 3 if figure_error else 0


def _result_name(result) -> str:
    from ._solve import RESULTS

    value = int(np.asarray(result._value))
    for name, item in RESULTS._name_to_item.items():
        if int(np.asarray(item._value)) == value:
            return name
    return str(value)
