"""How fast do tokens contract under Post-LN, Pre-LN and nGPT? (arXiv 2510.22026)

Karagodin, Ge, Polyanskiy, Rigollet, *Normalization in attention dynamics* (arXiv 2510.22026)
read normalisation as speed regulation: with the same attention (here softmax, `A = V = I`,
β = 1), Post-LN moves the directions at unit speed and clusters them exponentially fast,
whereas under Pre-LN the token norms grow linearly in time, the angular speed falls like
`1/r ~ 1/t`, and the contraction becomes algebraic, a power of `t`.

This script runs the three schemes from the same initial tokens (`jaxattn.dynamics.simulate`
with `AttentionDynamics(..., normalisation=...)`), measures the spread of the directions
`V(t) = 1 − |(1/n) Σ_k θ_k|²` (zero exactly at one cluster), and fits on the late window
(where `V` lies between `1e-2` and `1e-12`; `jaxattn.dynamics.decay_fits`)

- an exponential law `log V = a − λ t` (slope λ, R² of the fit), and
- a power law `log V = b − p log t` (exponent p, R² of the fit),

printing one table. The better fit (higher R²) names the decay law.

Run: `python experiments/normalisation_decay.py [--quick]`.
"""

import argparse
import json
import os

import jax
import jax.numpy as jnp
import numpy as np

import jaxattn.dynamics as jd
from jaxattn.dynamics import decay_fits, direction_spread
from jaxattn.sphere import sample_uniform


def main(*, quick=False, seed=0, n=32, d=3, beta=1.0, t1=None, out_dir=None):
    jax.config.update("jax_enable_x64", True)  # this script's choice
    t1 = (300.0 if quick else 3000.0) if t1 is None else t1
    num_save = 301 if quick else 2001
    ts = jnp.concatenate([jnp.zeros(1), jnp.geomspace(1e-2, t1, num_save - 1)])
    x0 = sample_uniform(jax.random.key(seed), n, d, dtype=jnp.float64)
    rows = {}
    for scheme in ("post_ln", "pre_ln", "ngpt"):
        field = jd.AttentionDynamics(
            jnp.eye(d), jnp.eye(d), beta=beta, kernel="sa", normalisation=scheme
        )
        traj = jd.simulate(field, x0, t1=t1, ts=ts, rtol=1e-10, atol=1e-13, max_steps=2**20)
        spread = direction_spread(traj.xs)
        radius = np.mean(np.linalg.norm(np.asarray(traj.xs), axis=-1), axis=-1)
        fits = decay_fits(np.asarray(ts), spread)
        fits["radius_end"] = float(radius[-1])
        fits["spread_end"] = float(spread[-1])
        rows[scheme] = fits
    print(f"n = {n}, d = {d}, softmax A = V = I, beta = {beta}, t1 = {t1:g}, seed {seed}")
    print(
        f"{'scheme':8s} {'law':12s} {'exp rate λ':>11s} {'R² exp':>8s} {'power p':>8s} "
        f"{'R² pow':>8s} {'window t':>17s} {'V(t1)':>9s} {'|x|(t1)':>8s}"
    )
    for scheme, f in rows.items():
        if "law" not in f:
            print(f"{scheme:8s} (too few points in the fit window: {f['points']})")
            continue
        print(
            f"{scheme:8s} {f['law']:12s} {f['exp_rate']:11.4f} {f['exp_r2']:8.4f} "
            f"{f['power_exponent']:8.3f} {f['power_r2']:8.4f} "
            f"{f['t_window'][0]:7.2f}–{f['t_window'][1]:8.2f} {f['spread_end']:9.2e} "
            f"{f['radius_end']:8.2f}"
        )
    if out_dir is not None:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "normalisation_decay.json"), "w") as fh:
            json.dump(rows, fh, indent=2)
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    a = parser.parse_args()
    main(quick=a.quick, seed=a.seed, out_dir=a.out)
