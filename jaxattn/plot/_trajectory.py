"""Figures of a particle run: tokens over time, |R₂| and arg R₂, R₂ in the complex plane.

matplotlib is imported only when a figure is made, with the non-interactive Agg backend
when there is no display. All functions take concrete (numpy-convertible) arrays.
"""

import os
from pathlib import Path

import numpy as np

__all__ = [
    "pca_plane",
    "order_parameter_series",
    "plot_tokens",
    "plot_order_parameter",
    "plot_order_parameter_plane",
    "save_trajectory_figures",
]


def _pyplot():
    import matplotlib

    if not os.environ.get("DISPLAY") and not os.environ.get("MPLBACKEND"):
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def pca_plane(xs) -> np.ndarray:
    """The top two principal axes of all tokens at all save times, shape `(d, 2)`.

    In d = 2 this is the identity (the circle is drawn as it is).

    **Arguments:** `xs` tokens of shape `(times, n, d)`.
    """
    xs = np.asarray(xs, dtype=np.float64)
    d = xs.shape[-1]
    if d == 2:
        return np.eye(2)
    flat = xs.reshape(-1, d)
    flat = flat[np.all(np.isfinite(flat), axis=1)]
    if flat.shape[0] == 0:
        return np.eye(d)[:, :2]
    # second moment (not covariance): antipodal clusters are one axis, as for R₂
    _, vecs = np.linalg.eigh(flat.T @ flat)
    return vecs[:, ::-1][:, :2]


def order_parameter_series(xs) -> np.ndarray:
    """`R₂(t) = (1/n) Σ_k e^{2iθ_k(t)}` of the tokens (projected on `pca_plane` when d > 2).

    **Arguments:** `xs` tokens of shape `(times, n, d)`.

    **Returns:** complex array of shape `(times,)`.
    """
    xs = np.asarray(xs, dtype=np.float64)
    P = xs @ pca_plane(xs)
    theta = np.arctan2(P[..., 1], P[..., 0])
    return np.mean(np.exp(2j * theta), axis=-1)


def plot_tokens(ts, xs, *, ax=None, title=None):
    """Tokens over time: in d = 2 the angles θ_k(t) (mod 2π); in d > 2 the tokens projected
    on the top-two principal plane, each path coloured by time, with the unit circle.

    **Arguments:** `ts` shape `(times,)`; `xs` shape `(times, n, d)`; `ax` an optional
    matplotlib axes.

    **Returns:** the matplotlib axes.
    """
    plt = _pyplot()
    ts = np.asarray(ts, dtype=np.float64)
    xs = np.asarray(xs, dtype=np.float64)
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4.5))
    n, d = xs.shape[1], xs.shape[2]
    if d == 2:
        theta = np.mod(np.arctan2(xs[..., 1], xs[..., 0]), 2 * np.pi)
        for k in range(n):
            ax.plot(ts, theta[:, k], ".", ms=1.5, color=plt.cm.viridis(k / max(n - 1, 1)))
        ax.set_xlabel("t")
        ax.set_ylabel(r"$\theta_k$ (rad)")
        ax.set_ylim(0, 2 * np.pi)
    else:
        P = xs @ pca_plane(xs)
        circle = np.linspace(0, 2 * np.pi, 200)
        ax.plot(np.cos(circle), np.sin(circle), color="0.8", lw=1)
        colours = plt.cm.viridis(np.linspace(0, 1, len(ts)))
        for k in range(n):
            ax.scatter(P[:, k, 0], P[:, k, 1], c=colours, s=2)
        ax.plot(P[-1, :, 0], P[-1, :, 1], "o", mfc="none", color="C3", ms=6, label="final")
        ax.set_aspect("equal")
        ax.set_xlabel("principal axis 1")
        ax.set_ylabel("principal axis 2")
        ax.legend(loc="upper right", fontsize=8)
    ax.set_title(title or f"tokens (n = {n}, d = {d})")
    return ax


def plot_order_parameter(ts, R2, *, axes=None, title=None):
    """`|R₂|` and `arg R₂` (unwrapped) against time, on two stacked axes.

    **Returns:** the two matplotlib axes.
    """
    plt = _pyplot()
    ts = np.asarray(ts, dtype=np.float64)
    R2 = np.asarray(R2)
    if axes is None:
        _, axes = plt.subplots(2, 1, figsize=(6, 5), sharex=True)
    axes[0].plot(ts, np.abs(R2), color="C0")
    axes[0].set_ylabel(r"$|R_2|$")
    axes[0].set_ylim(-0.02, 1.02)
    axes[1].plot(ts, np.unwrap(np.angle(R2)), color="C1")
    axes[1].set_ylabel(r"arg $R_2$ (unwrapped)")
    axes[1].set_xlabel("t")
    axes[0].set_title(title or "order parameter")
    return axes


def plot_order_parameter_plane(R2, *, ax=None, title=None):
    """The path of `R₂(t)` in the complex plane, inside the unit disc.

    **Returns:** the matplotlib axes.
    """
    plt = _pyplot()
    R2 = np.asarray(R2)
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 5))
    circle = np.linspace(0, 2 * np.pi, 200)
    ax.plot(np.cos(circle), np.sin(circle), color="0.7", lw=1)
    ax.plot(np.real(R2), np.imag(R2), color="C0", lw=0.8)
    ax.plot(np.real(R2[0]), np.imag(R2[0]), "o", color="C2", label="start")
    ax.plot(np.real(R2[-1]), np.imag(R2[-1]), "s", color="C3", label="end")
    ax.set_aspect("equal")
    ax.set_xlim(-1.05, 1.05)
    ax.set_ylim(-1.05, 1.05)
    ax.set_xlabel(r"Re $R_2$")
    ax.set_ylabel(r"Im $R_2$")
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title(title or r"$R_2$ in the complex plane")
    return ax


def save_trajectory_figures(ts, xs, out_dir, *, title=None, dpi=110) -> list[Path]:
    """Write `tokens.png`, `order_parameter.png` and `order_parameter_plane.png` to `out_dir`.

    **Arguments:** `ts` shape `(times,)`; `xs` shape `(times, n, d)`; `out_dir` a folder
    (created if missing); `title` a suffix for the figure titles.

    **Returns:** the paths written.
    """
    plt = _pyplot()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    R2 = order_parameter_series(xs)
    suffix = f" — {title}" if title else ""
    paths = []
    fig, ax = plt.subplots(figsize=(6, 4.5))
    plot_tokens(ts, xs, ax=ax, title=f"tokens{suffix}")
    paths.append(out / "tokens.png")
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=dpi)
    plt.close(fig)
    fig, axes = plt.subplots(2, 1, figsize=(6, 5), sharex=True)
    plot_order_parameter(ts, R2, axes=axes, title=f"order parameter{suffix}")
    paths.append(out / "order_parameter.png")
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=dpi)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(5, 5))
    plot_order_parameter_plane(R2, ax=ax, title=rf"$R_2$ in the plane{suffix}")
    paths.append(out / "order_parameter_plane.png")
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=dpi)
    plt.close(fig)
    return paths
