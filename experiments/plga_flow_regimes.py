"""Regimes of the PLGA flow of a random-initialised tiny PLDR-LLM layer.

The PLGA flow (`jaxattn.dynamics.PLGAFlow`) is the continuous-time limit of a deep PLGA
encoder whose layers share the weights of one PLGA layer: softmax attention on the sphere
S^{dk−1} whose bilinear form `G_LM(D)` is regenerated at every instant by the layer's metric
learner from the tokens' own density operator `D = Σ θ_jθ_jᵀ` (no RoPE). This script takes
layer 0 of a freshly initialised `PLDRLLM(CONFIGS["tiny"])` (4 heads, dk = 32), and sweeps
its flow over random initial laws (`K` seeds each):

- `uniform`: tokens uniform on S^{dk−1};
- `cap`: tokens `normalise(e₁ + s g)`, `g` standard normal (`s = 0.5`), a concentrated law;

for the flow of all heads, of each head alone, and of the collapsed flow (G frozen at its
value for a uniform sample). It prints the regime counts per flow and law.

Run: `python experiments/plga_flow_regimes.py [--quick]`.
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxattn.dynamics as jd
from jaxattn.plga import CONFIGS, PLDRLLM
from jaxattn.sphere import normalise, sample_uniform


def _cap(key, n, d, dtype):
    g = jax.random.normal(key, (n, d), dtype)
    return normalise(jnp.zeros((n, d), dtype).at[:, 0].set(1.0) + 0.5 * g)


def main(*, quick=False, seed=0, n=None, K=None, t1=None):
    jax.config.update("jax_enable_x64", True)  # this script's choice
    n = (16 if quick else 64) if n is None else n
    K = (4 if quick else 16) if K is None else K
    t1 = (100.0 if quick else 400.0) if t1 is None else t1
    model = PLDRLLM(CONFIGS["tiny"], key=jax.random.key(seed), dtype=jnp.float64)
    layer = model.layers[0].attn
    dk = layer.head_dim
    flows = {"all heads": jd.PLGAFlow.from_layer(layer)}
    if not quick:
        for h in range(layer.num_heads):
            flows[f"head {h}"] = jd.PLGAFlow.from_layer(layer, heads=h)
    G0 = flows["all heads"].energy_curvature(
        sample_uniform(jax.random.key(seed + 1), n, dk, dtype=jnp.float64)
    )
    flows["all heads, G frozen"] = flows["all heads"].frozen(G0)
    laws = {"uniform": "uniform", "cap": _cap}
    integration = jd.Integration(t1=t1, num_save=201)
    runner = jd.Runner(progress=False)
    print(
        f"PLGA flow of layer 0 of a random-initialised tiny PLDR-LLM (seed {seed}): "
        f"{layer.num_heads} heads, dk = {dk}, n = {n} tokens, K = {K} initial samples per law, "
        f"t1 = {t1:g} natural time units (rate Σ‖V_h‖ = {float(flows['all heads'].natural_rate()):g})"
    )
    columns = [*jd.REGIME_NAMES, "failed"]
    print(f"{'flow':22s} {'law':8s} " + " ".join(f"{r[:12]:>12s}" for r in columns))
    rows = {}
    for name, flow in flows.items():
        for law_name, law in laws.items():
            t = time.perf_counter()
            members = jd.Members(
                flow, seeds=np.arange(K) + 100 * seed, n=n, d=dk, batched=False, init=law
            )
            res = jd.sweep(members, integration=integration, runner=runner)
            counts = res.counts() if callable(res.counts) else res.counts
            rows[(name, law_name)] = counts
            print(
                f"{name:22s} {law_name:8s} "
                + " ".join(f"{counts.get(r, 0):12d}" for r in columns)
                + f"   ({time.perf_counter() - t:.0f} s; clusters: "
                + f"{sorted(set(np.asarray(res.evidence['num_clusters']).tolist()))})"
            )
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    a = parser.parse_args()
    main(quick=a.quick, seed=a.seed)
