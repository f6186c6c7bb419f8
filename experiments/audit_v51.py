"""Audit of the real learned energy-curvature tensor G_LM of PLDR-LLM v51-110M-1.

Question: how collapsed is the released model's G_LM? Per layer and head: singular spectra,
numerical rank (#{s > 64·eps_f32·s₁}), s₂/s₁, identity of rows and heads, the
Perron–Frobenius structure where it applies (G_LM has negative entries, so the theorem itself
does not; the leading singular vectors say what survives of the positive A_P), and the distance
from the RoPE commutant (can G be folded into the query projection?).

Run: `python experiments/audit_v51.py [--out-dir DIR]`. Prints tables, writes
`audit_v51.json` and `v51_singular_spectra.png`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from jaxattn.plga._audits import RANK_RTOL, as_host, energy_curvature_audit

DEFAULT_G_LM = Path(__file__).resolve().parents[1] / "jaxattn" / "data" / "pldr_v51_110m_1_G_LM.npz"


def load_g_lm(path=DEFAULT_G_LM) -> np.ndarray:
    with np.load(path, allow_pickle=False) as f:
        return np.asarray(f["G_LM"])


def _q(v) -> str:
    v = np.asarray(v, dtype=np.float64)
    return f"{np.min(v):.2e} / {np.median(v):.2e} / {np.max(v):.2e}"


def tables(report: dict) -> str:
    """The report as plain-text tables (per layer, then per layer × head)."""
    pf = report["perron_frobenius"]
    layers, heads = np.asarray(report["numerical_rank"]).shape
    lines = []
    lines.append("Per layer (min / median / max over the heads)")
    lines.append(
        f"{'layer':>5} | {'numerical rank':>16} | {'s2/s1':>28} | {'row spread':>28} | "
        f"{'head spread':>11} | {'commutant residual':>28}"
    )
    for layer in range(layers):
        r = np.asarray(report["numerical_rank"][layer])
        lines.append(
            f"{layer:>5} | {int(r.min()):>4} / {int(np.median(r)):>3} / {int(r.max()):>3} | "
            f"{_q(report['s2_over_s1'][layer]):>28} | {_q(report['row_spread'][layer]):>28} | "
            f"{float(report['head_spread'][layer]):>11.3f} | "
            f"{_q(report['commutant_residual'][layer]):>28}"
        )
    lines.append("")
    lines.append("Perron–Frobenius structure per layer (counts over the heads)")
    lines.append(
        f"{'layer':>5} | {'positive fraction':>17} | {'entrywise >0':>12} | {'λ1 real >0':>10} | "
        f"{'Perron vec >0':>13} | {'spectral gap (median)':>21} | {'v1 single-signed':>16} | "
        f"{'u1 single-signed':>16}"
    )
    right = np.asarray(report["right_sign_definiteness"]) == 1.0
    left = np.asarray(report["left_sign_definiteness"]) == 1.0
    for layer in range(layers):
        lines.append(
            f"{layer:>5} | {np.mean(pf['positive_fraction'][layer]):>17.3f} | "
            f"{int(np.sum(pf['entrywise_positive'][layer])):>9}/{heads} | "
            f"{int(np.sum(pf['dominant_real_positive'][layer])):>7}/{heads} | "
            f"{int(np.sum(pf['perron_vector_positive'][layer])):>10}/{heads} | "
            f"{np.median(pf['spectral_gap'][layer]):>21.3f} | "
            f"{int(np.sum(right[layer])):>13}/{heads} | {int(np.sum(left[layer])):>13}/{heads}"
        )
    lines.append("")
    lines.append("Numerical rank per layer (rows) and head (columns)")
    lines.append("layer | " + " ".join(f"{h:>4}" for h in range(heads)))
    for layer in range(layers):
        lines.append(
            f"{layer:>5} | " + " ".join(f"{int(x):>4}" for x in report["numerical_rank"][layer])
        )
    lines.append("")
    lines.append("s2/s1 per layer (rows) and head (columns)")
    lines.append("layer | " + " ".join(f"{h:>7}" for h in range(heads)))
    for layer in range(layers):
        lines.append(f"{layer:>5} | " + " ".join(f"{x:7.1e}" for x in report["s2_over_s1"][layer]))
    lines.append("")
    lines.append("RoPE commutant residual per layer (rows) and head (columns)")
    lines.append("layer | " + " ".join(f"{h:>5}" for h in range(heads)))
    for layer in range(layers):
        lines.append(
            f"{layer:>5} | " + " ".join(f"{x:5.3f}" for x in report["commutant_residual"][layer])
        )
    return "\n".join(lines)


def main(
    *,
    quick: bool = False,
    seed: int = 0,
    out_dir="experiments/out/audit_v51",
    g_lm=DEFAULT_G_LM,
    plot=True,
):
    """Audit the shipped G_LM, print the tables, save JSON (and the spectra figure).

    `quick` and `seed` are accepted for the common experiment signature; the audit is
    deterministic and takes about a second.
    """
    del quick, seed
    g = load_g_lm(g_lm)
    report = energy_curvature_audit(g)
    text = tables(report)
    print(
        f"G_LM of PLDR-LLM v51-110M-1: shape {tuple(g.shape)}, rank threshold {RANK_RTOL:.3e}·s1\n"
    )
    print(text)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "audit_v51.json").write_text(json.dumps(as_host(report)))
    if plot:
        from jaxattn.plot._audits import plot_singular_spectra

        plot_singular_spectra(
            report["singular_values"],
            rtol=RANK_RTOL,
            title="PLDR-LLM v51-110M-1 G_LM",
            path=out / "v51_singular_spectra.png",
        )
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", default="experiments/out/audit_v51")
    parser.add_argument("--g-lm", default=str(DEFAULT_G_LM))
    args = parser.parse_args()
    main(out_dir=args.out_dir, g_lm=args.g_lm)
