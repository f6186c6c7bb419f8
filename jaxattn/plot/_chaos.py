"""Figure of the atlas section "Chaos in three tokens": attractor, Poincaré section and the
running Lyapunov estimates of a three-token flow on the circle.

matplotlib is imported only when the figure is drawn; the backend is never changed here.
"""

from pathlib import Path

import numpy as np

__all__ = ["plot_chaos"]

_TOKEN_COLOURS = ("#1b9e77", "#d95f02", "#7570b3")
_EXPONENT_COLOURS = ("#d7191c", "#404040", "#2b83ba", "#fdae61")


def _one_time_per_row(section, key, rows_name, of, of_name):
    """`section[key]` as float64 times, checked to hold one time per row of `of`."""
    t = np.asarray(section[key], np.float64)
    if t.shape != of.shape[:1]:
        raise ValueError(
            f"plot_chaos: {key} must have shape ({rows_name},) = {of.shape[:1]}, one time per "
            f"row of {of_name}, got {t.shape}."
        )
    return t


def plot_chaos(section: dict, path=None):
    r"""Three panels for a chaos section (as returned by
    `jaxattn.dynamics.chaos_section`):

    1. the attractor on the torus: the relative angles `(θ₂ − θ₁, θ₃ − θ₁) mod 2π` along
       the saved trajectory (one point per save time, coloured by time);
    2. the Poincaré section `section["poincare"]` (the two other angles, in `[−π, π)`, at
       the crossings of the section described by `section["section"]`);
    3. the running Lyapunov estimates `λ_i(t)` of the first start with the final value and
       its uncertainty `λ_i ± σ_i` as a band over the averaging window, and zero marked.

    **Arguments:** `section` a dict with `ts` `(times,)`, `theta` `(times, 3)` (radians),
    `poincare` `(m, 2)`, `section` (str), `times` `(num_renorm,)`, `history`
    `(num_renorm, k)`, `exponents` `(K, k)` and `uncertainty` `(K, k)` (the first row is
    drawn); `path` where to save a PNG (optional).

    **Returns:** the matplotlib `Figure`.

    **Raises:** `ValueError` if a key is missing or an array does not have its shape:
    `theta` `(times, 3)` and `ts` `(times,)`; `poincare` `(m, 2)` (or empty); `history`
    `(num_renorm, k)` and `times` `(num_renorm,)`; `exponents` and `uncertainty` `(K, k)`
    or `(k,)`, `K >= 1`, with the `k` of `history`.
    """
    import matplotlib.pyplot as plt

    need = ("ts", "theta", "poincare", "section", "times", "history", "exponents", "uncertainty")
    missing = [k for k in need if k not in section]
    if missing:
        raise ValueError(f"plot_chaos: the section dict lacks {missing}.")
    theta = np.asarray(section["theta"], np.float64)
    if theta.ndim != 2 or theta.shape[1] != 3:
        raise ValueError(f"plot_chaos: theta must have shape (times, 3), got {theta.shape}.")
    ts = _one_time_per_row(section, "ts", "times", theta, "theta")
    pts = np.asarray(section["poincare"], np.float64)
    if pts.size == 0:
        pts = pts.reshape(0, 2)  # no crossings
    if pts.ndim != 2 or pts.shape[1] != 2:
        raise ValueError(f"plot_chaos: poincare must have shape (m, 2), got {pts.shape}.")
    hist = np.asarray(section["history"], np.float64)
    if hist.ndim != 2:
        raise ValueError(f"plot_chaos: history must have shape (num_renorm, k), got {hist.shape}.")
    times = _one_time_per_row(section, "times", "num_renorm", hist, "history")
    k = hist.shape[1]
    rows = {}
    for key in ("exponents", "uncertainty"):
        a = np.asarray(section[key], np.float64)
        if a.ndim not in (1, 2) or a.shape[-1] != k or a.size == 0:
            raise ValueError(
                f"plot_chaos: {key} must have shape (K, k) or (k,) with K >= 1 and the k = {k} "
                f"exponents of history, got {a.shape}."
            )
        rows[key] = np.atleast_2d(a)[0]
    lam, sig = rows["exponents"], rows["uncertainty"]

    fig, (ax, bx, cx) = plt.subplots(1, 3, figsize=(15, 4.6), constrained_layout=True)
    two_pi = 2 * np.pi
    rel = np.mod(theta[:, 1:] - theta[:, :1], two_pi)
    sc = ax.scatter(rel[:, 0], rel[:, 1], c=ts, s=0.6, cmap="viridis", rasterized=True)
    cb = fig.colorbar(sc, ax=ax)
    cb.set_label("time t")
    ax.set_xlabel("θ₂ − θ₁ (mod 2π, rad)")
    ax.set_ylabel("θ₃ − θ₁ (mod 2π, rad)")
    ax.set_xlim(0, two_pi)
    ax.set_ylim(0, two_pi)
    ax.set_title("attractor: relative token angles on the torus", fontsize=10)

    bx.plot(pts[:, 0], pts[:, 1], ".", ms=3, color="k", label=f"{len(pts)} crossings")
    bx.set_xlabel("θ₂ at the crossing (rad, in [−π, π))")
    bx.set_ylabel("θ₃ at the crossing (rad, in [−π, π))")
    bx.set_xlim(-np.pi, np.pi)
    bx.set_ylim(-np.pi, np.pi)
    bx.set_title("Poincaré section: " + str(section["section"]).split(";")[0], fontsize=10)
    bx.legend(loc="upper right", fontsize=8)

    ok = np.isfinite(hist[:, 0]) if hist.size else np.zeros(0, bool)
    for i in range(hist.shape[1]):
        col = _EXPONENT_COLOURS[i % len(_EXPONENT_COLOURS)]
        cx.plot(times[ok], hist[ok, i], color=col, lw=1.2, label=f"running estimate λ{i + 1}(t)")
        if np.isfinite(lam[i]) and np.isfinite(sig[i]) and ok.any():
            cx.fill_between(
                times[ok],
                lam[i] - sig[i],
                lam[i] + sig[i],
                color=col,
                alpha=0.2,
                lw=0,
                label=f"λ{i + 1} = {lam[i]:+.4f} ± {sig[i]:.4f}",
            )
    cx.axhline(0.0, color="0.5", lw=0.8, ls="--", label="zero")
    cx.set_xlabel("time t (estimate averaged from the end of the transient to t)")
    cx.set_ylabel("Lyapunov exponent estimate (1 / time)")
    cx.set_title("running Lyapunov estimates, band: final value ± uncertainty", fontsize=10)
    cx.legend(loc="center right", fontsize=7)
    fig.suptitle("Chaos in three tokens (USA, d = 2, n = 3)", fontsize=11)
    if path is not None:
        fig.savefig(Path(path), dpi=110)
    return fig
