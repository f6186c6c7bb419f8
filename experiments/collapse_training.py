"""Does PLGA collapse during training, and do the three stages of the collapse mechanism show?

Two runs of the `tiny` PLDR-LLM (`jaxattn plga train` machinery: `_train.train`, packaged
corpus, 32k SentencePiece tokenizer) bracket the reference schedule: super-critical (high peak
learning rate, short warm-up) and sub-critical (low peak, long warm-up). The runs advance in
interleaved chunks and checkpoint every `ckpt_every` steps, so a killed run resumes bit for bit
(`--train-only` trains or resumes; a plain call trains what is missing, then audits).

Every checkpoint (and the initial model, step 0) is audited in float64 on held-out text:

- loss (training, and validation at the checkpoint);
- the invariance order parameter of A, A_LM, A_P, G_LM per layer (median over prompt pairs);
- the rank-one audit of A (numerical rank, s₂/s₁, rank-one deficit, identity of rows, heads);
- cache fidelity (KV+G against full recomputation, greedy, teacher-forced);
- the collapse mechanism: rotary twirl (commutant residual of the density operator before and
  after RoPE), concentration (exponent of the spread of D/S across prompts against S),
  contraction (Jacobian norm of the metric learner's row map at the visited rows).

The trained operator of the last layer is then run as a particle flow (`operator_regimes`:
heads summed and one at a time, random initial tokens) at step 0 and at the last checkpoint.

Run: `python experiments/collapse_training.py [--quick] [--out-dir DIR] [--steps N]`; prints a
table per run and writes `collapse_training.json`, `order_parameter_over_training.png`,
`mechanism_over_training.png`, per run `<run>_twirl.png`, `<run>_concentration.png`,
`<run>_contraction.png`, and `operator_regimes.png`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

SETTINGS = {
    "supercritical": {"lr": 3e-3, "warmup": 50},
    "subcritical": {"lr": 3e-4, "warmup": 600},
}
"""Peak learning rate and linear warm-up of each run. PLDR-LLM trains with AdamW, linear warm-up
then cosine decay to 10 % of the peak (peak ≈ 1e-3, warm-up ≈ 2000 steps, arXiv 2410.16703);
the two settings bracket it: a high peak reached after a short warm-up (super-critical) and a
low peak reached after a long one (sub-critical)."""


def _training_data(seq_len: int):
    from jaxattn.plga._data import Tokenizer, load_text_data

    tok = Tokenizer()
    return tok, load_text_data(tok, None, seq_len=seq_len)


def train_runs(
    out: Path,
    settings: dict,
    *,
    steps: int,
    ckpt_every: int,
    seed: int,
    seq_len: int,
    batch_size: int = 8,
    chunk: int | None = None,
    log=print,
):
    """Train every setting to `steps`, interleaved in chunks of `chunk` steps (default
    `ckpt_every`) so all runs advance together; each chunk resumes from the run's latest
    checkpoint (bit for bit), so killing and restarting this function continues the runs."""
    import jax

    from jaxattn.plga._checkpoint import latest_checkpoint
    from jaxattn.plga._model import CONFIGS, PLDRLLM
    from jaxattn.plga._train import TrainConfig, _step_of, train

    tok, data = _training_data(seq_len)
    config = CONFIGS["tiny"].replace(vocab_size=tok.vocab_size, pad_id=tok.pad_id)
    model = PLDRLLM(config, key=jax.random.key(seed))
    chunk = int(chunk or ckpt_every)
    active = dict(settings)
    while active:
        for label, s in list(active.items()):
            run_dir = out / label
            last = latest_checkpoint(run_dir)
            done = 0 if last is None else _step_of(last)
            if done >= steps:
                del active[label]
                continue
            tc = TrainConfig(
                steps=steps,
                batch_size=batch_size,
                seq_len=seq_len,
                learning_rate=s["lr"],
                warmup_steps=s["warmup"],
                seed=seed,
                checkpoint_every=ckpt_every,
                eval_every=0,
            )
            res = train(
                model,
                data,
                tc,
                out_dir=run_dir,
                progress=False,
                log=None,
                resume=last is not None,
                stop_after=chunk,
            )
            log(
                f"  {label}: step {res.step}/{steps}, loss {res.history[-1][1]:.3f}, "
                f"{chunk / res.seconds:.2f} steps/s"
            )
    return data


def _val_losses(run_dir: Path) -> dict[int, float]:
    out = {}
    path = run_dir / "metrics.jsonl"
    if path.is_file():
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            if "val_loss" in entry:
                out[int(entry["step"])] = float(entry["val_loss"])
    return out


def audit_model(model, prompts: np.ndarray, *, new_tokens: int, max_rows: int) -> tuple[dict, dict]:
    """Float64 audits of one model on held-out prompts `(n, seq)`: a row of numbers and the
    mechanism audit objects (for the figures)."""
    import jax
    import jax.numpy as jnp

    from jaxattn.plga import mechanism_audits
    from jaxattn.plga._audits import cache_fidelity, head_spread, invariance_audit, rank_one_audit

    inv = invariance_audit(model, prompts)
    med = {
        n: np.median(np.asarray(inv.by_rms)[:, :, i], axis=0).tolist()
        for i, n in enumerate(inv.tensors)
    }
    med_mean = {
        n: np.median(np.asarray(inv.by_mean_abs)[:, :, i], axis=0).tolist()
        for i, n in enumerate(inv.tensors)
    }
    A = model(jnp.asarray(prompts[0]))[1]
    A = jnp.stack([d.A for d in A])  # (layers, heads, dk, dk)
    r1 = rank_one_audit(A)
    fid = cache_fidelity(
        model, prompts[0, : prompts.shape[1] // 2], max_new_tokens=new_tokens, caches=("kvg",)
    )
    mech = mechanism_audits(model, prompts, key=jax.random.key(0), max_rows=max_rows)
    tw, co, ct = mech["twirl"], mech["concentration"], mech["contraction"]
    row = {
        "order_parameter_by_rms": med,
        "order_parameter_by_mean_abs": med_mean,
        "A_numerical_rank_median": np.median(np.asarray(r1.numerical_rank), axis=1).tolist(),
        "A_s2_over_s1_median": np.median(np.asarray(r1.s2_over_s1), axis=1).tolist(),
        "A_rank_one_deficit_median": np.median(np.asarray(r1.rank_one_deficit), axis=1).tolist(),
        "A_row_spread_median": np.median(np.asarray(r1.row_spread), axis=1).tolist(),
        "A_head_spread": [float(head_spread(a)) for a in A],
        "kvg_max_rel_dlogit": max(fid["kvg"]["rel_dlogit"]),
        "kvg_argmax_agreement": fid["kvg"]["argmax_agreement"],
        "kvg_max_rel_dG": float(np.max(fid["kvg"]["rel_dG"])),
        "twirl_lengths": np.asarray(tw.lengths).tolist(),
        "twirl_before_median": np.median(np.asarray(tw.residual_before)[:, -1], (0, 2)).tolist(),
        "twirl_after_median": np.median(np.asarray(tw.residual_after)[:, -1], (0, 2)).tolist(),
        "concentration_exponent_median": np.median(np.asarray(co.exponent), -1).tolist(),
        "concentration_exponent_ci_median": np.median(np.asarray(co.exponent_ci), -2).tolist(),
        "learner_input_exponent_median": np.median(
            np.asarray(co.learner_input_exponent), -1
        ).tolist(),
        "contraction_norm_median": np.median(np.asarray(ct.norm), -1).tolist(),
        "contraction_norm_max": np.max(np.asarray(ct.norm), -1).tolist(),
        "contracting_fraction": np.mean(np.asarray(ct.norm) < 1, -1).tolist(),
        "product_bound_median": np.median(np.asarray(ct.product_bound), -1).tolist(),
        "unit_norm_median": np.median(np.asarray(ct.unit_norms), 1).tolist(),
        "max_rayleigh_residual": float(np.max(np.asarray(ct.rayleigh_residual))),
    }
    return row, mech


def _initial_model(seed: int, vocab_size: int, pad_id: int):
    import jax
    import jax.numpy as jnp

    from jaxattn.plga._model import CONFIGS, PLDRLLM

    config = CONFIGS["tiny"].replace(vocab_size=vocab_size, pad_id=pad_id)
    # the same initialisation as the runs (float32 master weights), audited in float64
    return jax.tree.map(
        lambda x: x.astype(jnp.float64) if eqx_is_float(x) else x,
        PLDRLLM(config, key=jax.random.key(seed)),
    )


def eqx_is_float(x) -> bool:
    import equinox as eqx
    import jax.numpy as jnp

    return eqx.is_inexact_array(x) and jnp.issubdtype(x.dtype, jnp.floating)


def audit_run(
    run_dir: Path, prompts, *, seed: int, tok, new_tokens: int, max_rows: int, log=print
) -> tuple[list[dict], dict]:
    """Audit step 0 and every checkpoint of a run not audited yet (cached in
    `run_dir/audits.json`); returns the rows by step and the last model's mechanism audits."""
    import jax
    import jax.numpy as jnp

    from jaxattn.plga._checkpoint import checkpoint_dirs, load_model

    cache_path = run_dir / "audits.json"
    cache = json.loads(cache_path.read_text()) if cache_path.is_file() else {}
    val = _val_losses(run_dir)
    last_mech = None
    with jax.enable_x64(True):
        todo = [(0, None)] + [(int(p.name.split("_")[-1]), p) for p in checkpoint_dirs(run_dir)]
        for i, (step, path) in enumerate(todo):
            last = i == len(todo) - 1
            if str(step) in cache and not last:
                continue
            t0 = time.perf_counter()
            if path is None:
                model, loss = _initial_model(seed, tok.vocab_size, tok.pad_id), None
            else:
                model, manifest = load_model(path, dtype=jnp.float64)
                loss = manifest.get("metrics", {}).get("loss")
            row, mech = audit_model(model, prompts, new_tokens=new_tokens, max_rows=max_rows)
            row.update(step=step, loss=loss, val_loss=val.get(step))
            cache[str(step)] = row
            cache_path.write_text(json.dumps(cache))
            last_mech = mech
            log(f"  audited {run_dir.name} step {step} in {time.perf_counter() - t0:.0f} s")
    rows = [cache[k] for k in sorted(cache, key=int)]
    return rows, last_mech


def table(label: str, rows: list[dict]) -> str:
    head = (
        f"{'step':>5} {'loss':>6} {'val':>6} | {'δ_rms A':>16} {'δ_rms G_LM':>16} | "
        f"{'rank A':>9} {'deficit A':>16} | {'KV+G rel|Δlogit|':>16} | "
        f"{'twirl after':>11} {'conc. exp':>13} {'‖J_φ‖ med':>13} {'<1':>9}"
    )
    lines = [f"run {label}", head]
    f2 = lambda v: "/".join(f"{x:.1e}" for x in v)
    f3 = lambda v: "/".join(f"{x:.2f}" for x in v)
    for r in rows:
        loss = "" if r["loss"] is None else f"{r['loss']:6.3f}"
        vl = "" if r.get("val_loss") is None else f"{r['val_loss']:6.3f}"
        op = r["order_parameter_by_rms"]
        rank = "/".join(f"{x:g}" for x in r["A_numerical_rank_median"])
        lines.append(
            f"{r['step']:>5} {loss:>6} {vl:>6} | {f2(op['A']):>16} {f2(op['G_LM']):>16} | "
            f"{rank:>9} {f2(r['A_rank_one_deficit_median']):>16} | "
            f"{r['kvg_max_rel_dlogit']:>16.2e} | {f3(r['twirl_after_median']):>11} "
            f"{f3(r['concentration_exponent_median']):>13} "
            f"{f3(r['contraction_norm_median']):>13} {f3(r['contracting_fraction']):>9}"
        )
    lines.append("(per-layer values separated by '/'; δ = median over prompt pairs)")
    return "\n".join(lines)


def _curves(rows: list[dict]) -> dict:
    mean = lambda key: [float(np.mean(r[key])) for r in rows]
    return {
        "steps": [r["step"] for r in rows],
        "loss": [np.nan if r["loss"] is None else r["loss"] for r in rows],
        "order_parameter_A": [float(np.mean(r["order_parameter_by_rms"]["A"])) for r in rows],
        "order_parameter_G_LM": [float(np.mean(r["order_parameter_by_rms"]["G_LM"])) for r in rows],
        "rank_one_deficit_A": mean("A_rank_one_deficit_median"),
        "twirl_residual": mean("twirl_after_median"),
        "concentration_exponent": mean("concentration_exponent_median"),
        "contraction_norm": mean("contraction_norm_median"),
    }


def main(
    *,
    quick: bool = False,
    seed: int = 0,
    out_dir="experiments/out/collapse_training",
    settings=None,
    steps: int = 1500,
    ckpt_every: int = 50,
    seq_len: int = 64,
    num_prompts: int = 6,
    new_tokens: int = 8,
    max_rows: int = 256,
    train: bool = True,
    operator_layer: int = -1,
    operator_inits: int = 8,
    operator_t1: float = 100.0,
    operator: bool = True,
    plot: bool = True,
):
    """Train (or resume) each setting, audit step 0 and every checkpoint, run the trained
    operator as a flow early vs late, print tables, save JSON and figures."""
    if quick:
        steps, ckpt_every, num_prompts, new_tokens, max_rows = 4, 2, 3, 3, 16
        operator_inits, operator_t1 = 2, 5.0
    settings = SETTINGS if settings is None else settings
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if train:
        data = train_runs(
            out, settings, steps=steps, ckpt_every=ckpt_every, seed=seed, seq_len=seq_len
        )
        tok = _training_data(seq_len)[0]
    else:
        tok, data = _training_data(seq_len)
    prompts = np.asarray(data.val[:num_prompts, :seq_len])
    results = {"settings": settings, "steps": steps, "prompts": list(prompts.shape), "runs": {}}
    mechs = {}
    for label, s in settings.items():
        t0 = time.perf_counter()
        rows, mech = audit_run(
            out / label, prompts, seed=seed, tok=tok, new_tokens=new_tokens, max_rows=max_rows
        )
        mechs[label] = mech
        results["runs"][label] = {**s, "checkpoints": rows, "seconds": time.perf_counter() - t0}
        print(table(label, rows))
        (out / "collapse_training.json").write_text(json.dumps(results, indent=1))

    if not operator:
        return results
    # the trained operator as a flow: step 0 against the last checkpoint of each run
    import jax
    import jax.numpy as jnp

    from jaxattn.plga import operator_regimes
    from jaxattn.plga._checkpoint import checkpoint_dirs, load_model

    with jax.enable_x64(True):
        models = {"step 0": _initial_model(seed, tok.vocab_size, tok.pad_id)}
        for label in settings:
            dirs = checkpoint_dirs(out / label)
            if dirs:
                m, manifest = load_model(dirs[-1], dtype=jnp.float64)
                models[f"{label} step {manifest['step']}"] = m
        layer = operator_layer % models["step 0"].config.num_layers
        t0 = time.perf_counter()
        regimes = operator_regimes(models, layer, ids=prompts, inits=operator_inits, t1=operator_t1)
    regimes["seconds"] = time.perf_counter() - t0
    results["operator_regimes"] = regimes
    for cp in regimes["checkpoints"]:
        print(f"operator flow, layer {layer}, {cp['label']} (β = {cp['beta']:.1f}):")
        for name, f in cp["flows"].items():
            fr = ", ".join(f"{k} {v:.2f}" for k, v in f["fractions"].items())
            print(f"  {name:>12}: {fr}; failed {f['failed']}; ‖A‖ {f['A_norm']:.2f}")
    (out / "collapse_training.json").write_text(json.dumps(results, indent=1))

    if plot:
        import matplotlib

        matplotlib.use("Agg")
        from jaxattn.plot import (
            plot_concentration,
            plot_contraction,
            plot_mechanism_over_training,
            plot_operator_regimes,
            plot_order_parameter_over_training,
            plot_twirl,
        )

        runs = {
            label: {
                "steps": [r["step"] for r in res["checkpoints"]],
                **{
                    t: np.array([r["order_parameter_by_rms"][t] for r in res["checkpoints"]])
                    for t in ("A", "A_LM", "A_P", "G_LM")
                },
            }
            for label, res in results["runs"].items()
        }
        plot_order_parameter_over_training(
            None,
            runs,
            title="tiny PLDR-LLM: invariance order parameter",
            path=out / "order_parameter_over_training.png",
        )
        plot_mechanism_over_training(
            {k: _curves(v["checkpoints"]) for k, v in results["runs"].items()},
            title="tiny PLDR-LLM: collapse and its mechanism over training",
            path=out / "mechanism_over_training.png",
        )
        for label, mech in mechs.items():
            if mech is None:
                continue
            step = results["runs"][label]["checkpoints"][-1]["step"]
            plot_twirl(
                mech["twirl"], title=f"{label}, step {step}", path=out / f"{label}_twirl.png"
            )
            plot_concentration(
                mech["concentration"],
                title=f"{label}, step {step}",
                path=out / f"{label}_concentration.png",
            )
            plot_contraction(
                mech["contraction"],
                title=f"{label}, step {step}",
                path=out / f"{label}_contraction.png",
            )
        plot_operator_regimes(
            regimes,
            title=f"layer {regimes['layer']} as a flow (n = {regimes['n']})",
            path=out / "operator_regimes.png",
        )
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out-dir", default="experiments/out/collapse_training")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--ckpt-every", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train-only", action="store_true", help="train (or resume), no audits")
    parser.add_argument("--no-train", action="store_true", help="audit the checkpoints there")
    args = parser.parse_args()
    if args.train_only:
        train_runs(
            Path(args.out_dir),
            SETTINGS,
            steps=args.steps,
            ckpt_every=args.ckpt_every,
            seed=args.seed,
            seq_len=64,
        )
        raise SystemExit(0)
    main(
        quick=args.quick,
        out_dir=args.out_dir,
        steps=args.steps,
        ckpt_every=args.ckpt_every,
        seed=args.seed,
        train=not args.no_train,
    )
