"""`jaxattn plga audit`: collapse audits of a trained checkpoint or of a stored `G_LM` tensor,
written as JSON and figures.

The results (`audit.json`) are written before any figure is drawn; a figure that cannot be
written is named in one line and the command exits with status 3 (results kept), as
`jaxattn simulate` and `jaxattn atlas` do."""

from __future__ import annotations

import json
import pathlib
import sys

__all__ = ["register", "run_audit"]


def register(plga_subparsers) -> None:
    """Add `audit` to the `plga` command group."""
    p = plga_subparsers.add_parser(
        "audit",
        help="collapse audits of a checkpoint (order parameter, rank-one, Perron-Frobenius, "
        "caches) or of a G_LM file",
        description="Collapse audits of a PLDR-LLM. With --ckpt: invariance order parameter per "
        "layer and deductive tensor over pairs of prompts, rank-one audit of A, Perron-Frobenius "
        "check of A_LM, RoPE commutant residual of G_LM, cache fidelity (KV, KV+G vs "
        "recomputation) and non-causality. With --g-lm: the array-only audits of a stored G_LM "
        "(layers, heads, dk, dk), e.g. the shipped PLDR-LLM v51-110M-1 tensor. Writes audit.json "
        "first, then the figures, to --out (a figure that cannot be written is named, the results "
        "are kept, exit status 3). A run directory means its newest usable checkpoint (a corrupt "
        "newest step falls back to the previous one, and says so).",
    )
    p.add_argument("--ckpt", metavar="DIR", help="run directory (latest step) or step directory")
    p.add_argument(
        "--g-lm",
        metavar="FILE",
        nargs="?",
        const="v51",
        help="audit a G_LM array instead (.npz with key G_LM, or .npy); without FILE: the shipped "
        "PLDR-LLM v51-110M-1 G_LM",
    )
    p.add_argument(
        "--prompts",
        metavar="FILE",
        help="text file, one prompt per line (default: windows of the packaged corpus)",
    )
    p.add_argument("--out", metavar="DIR", default="audit", help="output directory (./audit)")
    p.add_argument(
        "--num-prompts",
        type=int,
        default=None,
        help=f"prompts used from the corpus ({DEFAULT_NUM_PROMPTS}; not with --prompts)",
    )
    p.add_argument(
        "--seq-len",
        type=int,
        default=None,
        help="tokens per prompt (64, or the model's context length if shorter; shorter prompts "
        "shorten all)",
    )
    p.add_argument("--new-tokens", type=int, default=8, help="greedy tokens for cache fidelity (8)")
    p.add_argument("--tokenizer", metavar="MODEL", help="default: the run's tokenizer.model")
    p.add_argument(
        "--rope",
        choices=("interleaved", "half"),
        default=None,
        help="RoPE pairing for the commutant (default: the model's; interleaved for --g-lm)",
    )
    p.add_argument(
        "--float32", action="store_true", help="audit the model in float32 (default float64)"
    )
    p.add_argument("--no-figures", action="store_true", help="write only audit.json")
    p.set_defaults(run=run_audit)


class _Figures:
    """Figures to draw after the results are written: `add(name, draw)` with `draw(path)`.
    Falsy when figures are switched off (`--no-figures`)."""

    def __init__(self, out: pathlib.Path, enabled: bool):
        self.out, self.enabled, self.jobs = out, enabled, []

    def __bool__(self) -> bool:
        return self.enabled

    def add(self, name: str, draw) -> None:
        if self.enabled:
            self.jobs.append((name, draw))

    def draw(self) -> list[str]:
        """Draw every figure; return one line per figure that could not be written."""
        failed = []
        for name, draw in self.jobs:
            try:
                draw(self.out / name)
            except Exception as err:  # any plotting failure: label it, keep the results
                failed.append(f"figure {self.out / name} not written ({type(err).__name__}: {err})")
        return failed


def _load_g_lm(spec: str):
    import numpy as np

    if spec == "v51":
        spec = pathlib.Path(__file__).resolve().parents[1] / "data" / "pldr_v51_110m_1_G_LM.npz"
    from ._data import check_input_file

    path = check_input_file(spec, "--g-lm")
    from .._npz import load_numpy_file, read_error_reason

    try:
        loaded = load_numpy_file(path)  # .npy or .npz, told by content; never unpickled
    except Exception as err:  # noqa: BLE001
        # Untrusted bytes: zipfile, zlib and NumPy raise many unrelated types on a damaged
        # file; each means "not readable".
        raise ValueError(
            f"--g-lm: {path} is not a readable .npy/.npz array file "
            f"({read_error_reason(err)}; object arrays and pickles are refused)"
        ) from None
    if isinstance(loaded, dict):
        if "G_LM" not in loaded:
            keys = ", ".join(loaded)
            raise ValueError(f"--g-lm: {path} has no array 'G_LM' (keys: {keys})")
        g = loaded["G_LM"]
    else:
        g = loaded
    if g.ndim == 3:
        g = g[None]
    if g.ndim != 4 or g.shape[-1] != g.shape[-2] or g.size == 0:
        raise ValueError(f"--g-lm: need a non-empty shape (layers, heads, dk, dk), got {g.shape}")
    if not np.issubdtype(g.dtype, np.floating) and not np.issubdtype(g.dtype, np.integer):
        raise ValueError(f"--g-lm: need a real numeric array, got dtype {g.dtype}")
    if not np.all(np.isfinite(g)):
        bad = np.argwhere(~np.isfinite(g))[0].tolist()
        raise ValueError(f"--g-lm: {path} has non-finite entries (first at index {bad})")
    return path, g


DEFAULT_SEQ_LEN = 64
"""`--seq-len` when not given (capped at the model's context length)."""

DEFAULT_NUM_PROMPTS = 8
"""`--num-prompts` when neither it nor `--prompts` is given."""


def _min_prompt_tokens(model) -> int:
    """The fewest tokens per prompt the audits of `model` accept: 2 (a prefix and a suffix for
    the non-causality and cache audits); for PLGA layers, enough for two prefix lengths of the
    concentration audit (`default_lengths`)."""
    if model.attention != "plga":
        return 2
    from ._mechanism import default_lengths

    seq = 2
    while len(default_lengths(seq)) < 2:
        seq += 1
    return seq


def _seq_len(args, model) -> int:
    """`--seq-len`, checked against the model (default: `DEFAULT_SEQ_LEN` capped at its
    context length)."""
    ctx, low = model.config.context_length, _min_prompt_tokens(model)
    if args.seq_len is None:
        return min(DEFAULT_SEQ_LEN, ctx)
    seq = int(args.seq_len)
    if not low <= seq <= ctx:
        raise ValueError(
            f"--seq-len {seq} must be between {low} (the shortest prompt the audits use) and "
            f"the context length {ctx}"
        )
    return seq


def _prompts(args, tokenizer, model):
    import numpy as np

    from ._data import check_input_file, read_documents

    seq = _seq_len(args, model)
    low = _min_prompt_tokens(model)
    if args.prompts:
        path = check_input_file(args.prompts, "--prompts")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise ValueError(f"--prompts: {path} is not UTF-8 text ({err.reason})") from None
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        rows = [tokenizer.encode(ln)[:seq] for ln in lines]
        short = sum(len(r) < low for r in rows)
        rows = [r for r in rows if len(r) >= low]
        if len(rows) < 2:
            raise ValueError(
                f"--prompts: need at least 2 prompts of at least {low} tokens each; {path} has "
                f"{len(lines)} non-empty line{'s' if len(lines) != 1 else ''}, {short} of them "
                f"shorter than {low} tokens"
            )
        seq = min(len(r) for r in rows)
        skipped = f", {short} shorter than {low} tokens skipped" if short else ""
        source = f"{path} ({len(rows)} prompts of {seq} tokens{skipped})"
        return np.asarray([r[:seq] for r in rows], dtype=np.int32), source
    stream = [t for d in read_documents(None) for t in tokenizer.encode(d)]
    n = DEFAULT_NUM_PROMPTS if args.num_prompts is None else int(args.num_prompts)
    windows = len(stream) // seq
    if n > windows:
        raise ValueError(
            f"--num-prompts {n}: the corpus gives only {windows} windows of {seq} tokens "
            "(give fewer prompts or a shorter --seq-len)"
        )
    stride = max((len(stream) - seq) // n, seq)
    rows = [stream[i * stride : i * stride + seq] for i in range(n)]
    return np.asarray(rows, dtype=np.int32), f"packaged corpus ({n} windows of {seq} tokens)"


def _audit_bytes(model, prompts: int, seq: int, itemsize: int) -> int:
    """Rough peak memory of the checkpoint audits on `prompts` prompts of `seq` tokens: the
    per-pair order parameters of the invariance audit (quadratic in `prompts`: kept for the
    distribution over pairs) and, per prompt, the activations, deductive tensors, prefix
    density operators and learner rows (a generous constant: the estimate should err high)."""
    c = model.config
    L, H, dk = c.num_layers, c.num_heads, c.head_dim
    pairs = prompts * (prompts - 1) // 2
    per_pair = 56 + 4 * 8 * L * 4  # indices (NumPy, JAX), two variants x 4 tensors, host copies
    activations = seq * (16 * c.d_model + 4 * H * seq + 2 * c.dff)
    tensors = L * H * dk * dk * (8 + 6 * 6)  # deductive tensors; densities at <= 6 lengths
    rows = L * H * dk * (dk + c.A_dff) * 4 * max(c.num_reslayerA, 1)  # contraction audit
    per_prompt = 4 * itemsize * (activations + tensors + rows)
    return int(pairs * per_pair + prompts * per_prompt)


def _check_memory(args, model, prompts: int, seq: int, itemsize: int) -> None:
    """Refuse, before any work, an audit whose estimated memory (`_audit_bytes`) exceeds half
    of the memory available, naming the largest prompt count that fits."""
    from ..dynamics import memory_available

    need = _audit_bytes(model, prompts, seq, itemsize)
    if need <= 2**28:
        return
    free = memory_available()
    if free is None or need <= free / 2:  # (unknown: nothing to compare with)
        return
    lo, hi = 2, prompts
    while hi - lo > 1:  # the largest count within half the available memory
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _audit_bytes(model, mid, seq, itemsize) <= free / 2 else (lo, mid)
    flag = "--prompts" if args.prompts else "--num-prompts"
    raise ValueError(
        f"{flag}: auditing {prompts} prompts of {seq} tokens needs about {need / 2**30:.3g} GiB "
        f"({prompts * (prompts - 1) // 2} prompt pairs), more than half of the "
        f"{free / 2**30:.3g} GiB available; at most {lo} prompts fit"
    )


def _audit_g_lm(args, loaded, figures: bool) -> dict:
    import numpy as np

    from ._audits import RANK_RTOL, as_host, energy_curvature_audit

    path, g = loaded
    report = energy_curvature_audit(g, rope=args.rope or "interleaved")
    report["source"] = str(path)
    print(f"G_LM {path.name}: shape {tuple(g.shape)}")
    ranks = np.asarray(report["numerical_rank"])
    ratio = np.asarray(report["s2_over_s1"])
    comm = np.asarray(report["commutant_residual"])
    print(
        f"{'layer':>5} | {'rank min/median/max':>19} | {'s2/s1 median':>12} | "
        f"{'commutant residual median':>25}"
    )
    for layer in range(g.shape[0]):
        r = ranks[layer]
        print(
            f"{layer:>5} | {int(r.min()):>5}/{int(np.median(r)):>6}/{int(r.max()):>5} | "
            f"{np.median(ratio[layer]):>12.2e} | {np.median(comm[layer]):>25.3f}"
        )
    if figures:

        def draw_spectra(target, s=np.asarray(report["singular_values"])):
            from ..plot._audits import plot_singular_spectra

            plot_singular_spectra(s, rtol=RANK_RTOL, title=f"G_LM: {path.name}", path=target)

        figures.add("g_lm_singular_spectra.png", draw_spectra)
    return as_host(report)


def _prepare_ckpt(args):
    """Load the checkpoint, its tokenizer and the prompts, and check every argument that
    depends on them, before any audit runs. Returns `(step_dir, fallback, model, manifest,
    prompts, source)`."""
    import jax.numpy as jnp

    from . import _checkpoint
    from ._data import Tokenizer

    step_dir, fallback = _checkpoint.usable_checkpoint(args.ckpt)
    if fallback:
        print(fallback)
    tok_path = args.tokenizer
    if tok_path is None:
        for cand in (step_dir / "tokenizer.model", step_dir.parent / "tokenizer.model"):
            if cand.is_file():
                tok_path = cand
                break
    tokenizer = Tokenizer(tok_path)
    dtype = jnp.float32 if args.float32 else jnp.float64
    model, manifest = _checkpoint.load_model(step_dir, dtype=dtype)
    if model.config.vocab_size != tokenizer.vocab_size:
        raise ValueError(
            f"tokenizer {tokenizer.path} has {tokenizer.vocab_size} pieces, "
            f"the model {model.config.vocab_size}"
        )
    prompts, source = _prompts(args, tokenizer, model)
    _check_memory(args, model, prompts.shape[0], prompts.shape[1], jnp.dtype(dtype).itemsize)
    return step_dir, fallback, model, manifest, prompts, source


def _audit_ckpt(args, prepared, figures: bool) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from ._audits import (
        RANK_RTOL,
        as_host,
        cache_fidelity,
        deductive_tensors,
        head_spread,
        invariance_audit,
        noncausality_audit,
        perron_frobenius_audit,
        perturb_suffix,
        rank_one_audit,
        rope_commutant_residual,
    )

    step_dir, fallback, model, manifest, prompts, source = prepared
    dtype = model.dtype
    print(f"checkpoint {step_dir} (step {manifest.get('step')}); prompts: {source}")
    report: dict = {
        "checkpoint": str(step_dir),
        "fallback": fallback,
        "step": manifest.get("step"),
        "prompts": source,
        "prompt_shape": list(prompts.shape),
        "dtype": str(jnp.dtype(dtype)),
    }
    if model.attention != "plga":
        print("an SDPA model has no deductive outputs: only cache fidelity is audited")
    else:
        inv = invariance_audit(model, prompts)
        report["order_parameter"] = inv.summary()
        # Heads whose power law overflowed the dtype on these prompts (their attention is an
        # arg-max there): the audit's numbers for them describe that, not the power law.
        from ._attention import format_score_overflow

        overflow = model.score_overflow(prompts)
        report["score_overflow"] = [r._asdict() for r in overflow]
        if overflow:
            print(format_score_overflow(overflow))
        T = deductive_tensors(model, prompts)
        A0 = T["A"][0]
        r1 = rank_one_audit(A0)
        report["rank_one_A"] = as_host(r1)
        report["rank_one_A"]["head_spread"] = [float(head_spread(a)) for a in A0]
        report["perron_frobenius_A_LM"] = as_host(perron_frobenius_audit(T["A_LM"][0]))
        G_mean = jnp.mean(T["G_LM"], axis=0)
        report["rank_one_G_LM"] = as_host(rank_one_audit(G_mean))
        report["commutant_residual_G_LM"] = as_host(
            rope_commutant_residual(G_mean, rope=args.rope or model.config.rope)
        )
        split = prompts.shape[1] // 2
        vocab = model.config.vocab_size
        alt = perturb_suffix(prompts[0], split, key=jax.random.key(0), vocab_size=vocab)
        report["noncausality"] = noncausality_audit(model, prompts[0], alt, split=split)
        med = np.median(np.asarray(inv.by_rms), axis=0)
        pf_pos = report["perron_frobenius_A_LM"]["entrywise_positive"]
        npairs = inv.pairs.shape[0]
        print(
            f"order parameter (by rms, median over {npairs} pair{'s' if npairs != 1 else ''}), "
            "rows = layers:"
        )
        print("       " + " ".join(f"{t:>9}" for t in inv.tensors))
        for layer, row in enumerate(med):
            print(f"  L{layer:<3}  " + " ".join(f"{x:9.2e}" for x in row))
        ranks = np.asarray(r1.numerical_rank)
        print(
            "rank of A (prompt 0) per layer, min/median/max over heads: "
            + "; ".join(f"{r.min()}/{int(np.median(r))}/{r.max()}" for r in ranks)
        )
        print(
            f"A_LM entrywise positive in {np.mean(pf_pos):.2f} of the heads; "
            f"non-causality rel |Δlogit| {report['noncausality']['rel_dlogit']:.2e}"
        )
        from ._mechanism import mechanism_audits, mechanism_table

        mech = mechanism_audits(model, prompts, rope=args.rope or model.config.rope)
        report["mechanism"] = {k: a.summary() for k, a in mech.items()}
        print(mechanism_table(mech))
        if figures:
            from ..plot import _mechanism as mplots

            for name in ("twirl", "concentration", "contraction"):
                draw = getattr(mplots, f"plot_{name}")
                figures.add(f"{name}.png", lambda target, a=mech[name], f=draw: f(a, path=target))
    n_new = min(int(args.new_tokens), model.config.context_length - prompts.shape[1] // 2 + 1)
    if n_new < int(args.new_tokens):
        print(
            f"note: cache fidelity decodes {n_new} new tokens, not --new-tokens "
            f"{args.new_tokens}: its prompt (half of --seq-len, {prompts.shape[1] // 2} tokens) "
            f"and the new tokens must fit the context length {model.config.context_length}",
            file=sys.stderr,
        )
    fid = cache_fidelity(model, prompts[0, : max(prompts.shape[1] // 2, 1)], max_new_tokens=n_new)
    report["cache_fidelity"] = fid
    for kind in ("kv", "kvg"):
        f = fid[kind]
        print(
            f"cache {kind}: max |Δlogit| {max(f['max_abs_dlogit']):.3e}, argmax agreement "
            f"{f['argmax_agreement']:.2f}, free-running tokens agree {f['token_agreement']:.2f}"
        )
    if figures:
        from ..plot import _audits as plots

        step = manifest.get("step")
        figures.add(
            "cache_fidelity.png",
            lambda target: plots.plot_cache_fidelity(
                {k: fid[k] for k in ("kv", "kvg")},
                title=f"cache fidelity, step {step}",
                path=target,
            ),
        )
        if model.attention == "plga":
            s_A = np.asarray(r1.singular_values)
            s_G = np.asarray(rank_one_audit(G_mean).singular_values)
            by_rms = {t: np.asarray(inv.by_rms)[:, :, i] for i, t in enumerate(inv.tensors)}
            figures.add(
                "A_singular_spectra.png",
                lambda target: plots.plot_singular_spectra(
                    s_A, rtol=RANK_RTOL, title="A (prompt 0)", path=target
                ),
            )
            figures.add(
                "G_LM_singular_spectra.png",
                lambda target: plots.plot_singular_spectra(
                    s_G, rtol=RANK_RTOL, title="G_LM (mean over prompts)", path=target
                ),
            )
            figures.add(
                "order_parameter.png",
                lambda target: plots.plot_order_parameter(
                    by_rms, title="invariance order parameter (by rms)", path=target
                ),
            )
    return report


def _check_arguments(args) -> None:
    """The checks that need neither the checkpoint nor the G_LM file."""
    if not args.ckpt and not args.g_lm:
        raise ValueError("give --ckpt DIR (a training checkpoint) or --g-lm [FILE] (a G_LM array)")
    from .._cli_args import check_out_folder

    check_out_folder("--out", args.out)
    if args.ckpt:
        if args.new_tokens < 1:
            raise ValueError(f"--new-tokens must be ≥ 1, got {args.new_tokens}")
        if args.prompts is not None and args.num_prompts is not None:
            raise ValueError(
                "--num-prompts has no effect with --prompts FILE (the file's lines are the "
                "prompts); give one of them"
            )
        if args.num_prompts is not None and args.num_prompts < 2:
            raise ValueError(f"--num-prompts must be ≥ 2, got {args.num_prompts}")
        if args.seq_len is not None and args.seq_len < 2:
            raise ValueError(f"--seq-len must be ≥ 2, got {args.seq_len}")
        if args.prompts is not None:
            from ._data import check_input_file

            check_input_file(args.prompts, "--prompts")


def run_audit(args) -> int:
    import jax

    _check_arguments(args)
    out = pathlib.Path(args.out)
    figures = _Figures(out, enabled=not args.no_figures)
    report = {}
    with jax.enable_x64(not args.float32):  # float64 audits without touching the global setting
        # Every input is read and every argument checked before any audit runs (a refusal
        # leaves no half-written output).
        g_lm = _load_g_lm(args.g_lm) if args.g_lm else None
        ckpt = _prepare_ckpt(args) if args.ckpt else None
        out.mkdir(parents=True, exist_ok=True)
        if g_lm is not None:
            report["g_lm"] = _audit_g_lm(args, g_lm, figures)
        if ckpt is not None:
            report["checkpoint"] = _audit_ckpt(args, ckpt, figures)
    (out / "audit.json").write_text(json.dumps(report))  # results first, figures after
    failed = figures.draw()
    written = sorted(p.name for p in out.iterdir() if p.is_file())
    print(f"wrote {out}/: {', '.join(written)}", file=sys.stderr)
    for line in failed:
        print(f"jaxattn plga audit: {line}; results kept in {out / 'audit.json'}", file=sys.stderr)
    return 3 if failed else 0
