"""Train the tiny PLDR-LLM whose last PLGA layer the regime atlas turns into particle flows,
and ship only what those flows need.

The run uses the project's own trainer (`jaxattn.plga.train`, the `jaxattn plga train`
machinery: AdamW, linear warm-up then cosine decay) on the packaged corpus
(`jaxattn/data/corpus/botchan.txt`) with the packaged 32k SentencePiece tokenizer, for a
CPU budget of a few minutes. From the trained model (cast to float64) it keeps, for the
LAST layer only:

- the PLGA attention layer's parameters (query/key/value/output maps with their biases, the
  row LayerNorm of the density operator, the metric learner, `W, b_W, P, a, b_a`), float32
  as trained — enough to rebuild `PowerLawGraphAttention`, hence `G_LM(D)` and the PLGA flow
  (`jaxattn.dynamics.PLGAFlow.from_layer`);
- the collapsed energy-curvature tensor `G` (mean of `G_LM` over held-out prompts, float64)
  and `β = r²`, `r` the RMS norm of the layer's input tokens on those prompts (the input is
  the previous layer's LayerNorm output, whose gain and offset are stored too), i.e. what
  `jaxattn.plga.trained_operator` computes from the whole model;
- the layer's input tokens of the first held-out prompt's first 16 positions (`x_probe`),
  so tests can compare the operator with the layer's own scores on real activations.

It writes `jaxattn/data/atlas_tiny_plga.npz` (no pickle: arrays and one JSON string) and
`jaxattn/data/atlas_tiny_plga.json` (provenance: script, git commit, configs, steps, seed,
corpus hash, final training and validation loss, date, library versions, SHA-256 of the
`.npz`). `jaxattn.plga.load_atlas_layer` reads them.

Run: `python experiments/train_atlas_model.py [--quick] [--steps N] [--out-dir DIR]`
(`--quick` trains 4 steps into the run folder and writes nothing into the package).
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PROBE_TOKENS = 16


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "jaxattn/plga", "experiments"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
        return out.stdout.strip() + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def main(
    *,
    quick: bool = False,
    seed: int = 0,
    steps: int = 1000,
    batch_size: int = 8,
    seq_len: int = 64,
    learning_rate: float = 1e-3,
    warmup_steps: int = 100,
    num_prompts: int = 8,
    out_dir="experiments/out/train_atlas_model",
    data_path=None,
):
    """Train, then write the last layer's flow data and its provenance (see the module
    docstring). Returns the provenance dict."""
    import jax
    import jax.numpy as jnp

    from jaxattn.plga import CONFIGS, PLDRLLM, Tokenizer, TrainConfig, train, trained_operator
    from jaxattn.plga._atlas_layer import save_atlas_layer
    from jaxattn.plga._data import load_text_data, read_documents, sha256_file

    if quick:
        steps, warmup_steps, num_prompts = 4, 2, 2
    out = Path(out_dir)
    run_dir = out / f"run_seed{seed}_steps{steps}"
    if data_path is None:
        data_path = (
            out / "atlas_tiny_plga.npz" if quick else ROOT / "jaxattn/data/atlas_tiny_plga.npz"
        )
    tok = Tokenizer()
    data = load_text_data(tok, None, seq_len=seq_len)
    config = CONFIGS["tiny"].replace(vocab_size=tok.vocab_size, pad_id=tok.pad_id)
    model = PLDRLLM(config, key=jax.random.key(seed))
    tc = TrainConfig(
        steps=steps,
        batch_size=batch_size,
        seq_len=seq_len,
        learning_rate=learning_rate,
        warmup_steps=warmup_steps,
        seed=seed,
        checkpoint_every=0,
        eval_every=0 if quick else 100,
    )
    t0 = time.perf_counter()
    res = train(model, data, tc, out_dir=run_dir, progress=not quick, log=print)
    seconds = time.perf_counter() - t0
    losses = [loss for _, loss in res.history]
    final_train = float(np.mean(losses[-20:]))
    final_val = float(res.val_history[-1][1]) if res.val_history else None

    layer = config.num_layers - 1
    prompts = np.asarray(data.val[:num_prompts, :seq_len])
    with jax.enable_x64(True):
        m64 = jax.tree.map(
            lambda x: (
                x.astype(jnp.float64) if isinstance(x, jax.Array) and x.dtype == jnp.float32 else x
            ),
            res.model,
        )
        op = trained_operator(m64, layer, ids=prompts)
        # the layer's input tokens on the first prompt (the previous layer's output)
        from jaxattn.plga._operator_flow import _layer_input_and_G

        x_in, _ = _layer_input_and_G(m64, jnp.asarray(prompts[:1]), layer)
        x_probe = np.asarray(x_in[0, :PROBE_TOKENS])
        prev_ln = res.model.layers[layer - 1].ln2 if layer else res.model.emb_norm
        provenance = dict(
            file=Path(data_path).name,
            what="last PLGA layer of a tiny PLDR-LLM trained by experiments/train_atlas_model.py",
            script="experiments/train_atlas_model.py",
            git_commit=_git_commit(),
            date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
            versions=_versions(),
            model_config=json.loads(json.dumps(config.__dict__)),
            train_config=json.loads(json.dumps(tc.__dict__)),
            layer=layer,
            steps=int(res.step),
            seed=seed,
            train_seconds=round(seconds, 1),
            corpus=dict(
                files=["jaxattn/data/corpus/botchan.txt"],
                documents=len(read_documents(None)),
                sha256=sha256_file(ROOT / "jaxattn/data/corpus/botchan.txt"),
                tokenizer="jaxattn/data/pldr_refinedweb_unigram32k.model",
                train_blocks=int(len(data.train)),
                val_blocks=int(len(data.val)),
            ),
            final_train_loss_mean_last_20=final_train,
            final_val_loss=final_val,
            val_loss_history=[[int(s), float(v)] for s, v in res.val_history],
            initial_train_loss=float(losses[0]),
            G_from=f"mean G_LM of layer {layer} over the first {num_prompts} validation blocks "
            f"({seq_len} tokens each), float64",
            beta_from="r², r the RMS norm of the layer's input tokens on the same prompts",
            beta=float(op.beta),
        )
        save_atlas_layer(
            data_path,
            attn=res.model.layers[layer].attn,
            G=np.asarray(op.G),
            beta=float(op.beta),
            x_probe=x_probe,
            input_ln=(np.asarray(prev_ln.weight), np.asarray(prev_ln.bias)),
            provenance=provenance,
        )
    prov = json.loads(Path(data_path).with_suffix(".json").read_text())
    print(
        f"trained {res.step} steps in {seconds:.0f} s: loss {losses[0]:.3f} -> {final_train:.3f} "
        f"(mean of the last 20), validation {final_val}; β = {float(op.beta):.2f}; wrote "
        f"{data_path} ({Path(data_path).stat().st_size / 1024:.0f} KiB, sha256 "
        f"{prov['sha256'][:12]}…)"
    )
    return prov


def _versions() -> dict:
    import equinox
    import jax

    import jaxattn

    return dict(
        jaxattn=getattr(jaxattn, "__version__", None),
        jax=jax.__version__,
        equinox=equinox.__version__,
        numpy=np.__version__,
        python=sys.version.split()[0],
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--out-dir", default="experiments/out/train_atlas_model")
    a = parser.parse_args()
    main(quick=a.quick, seed=a.seed, steps=a.steps, out_dir=a.out_dir)
