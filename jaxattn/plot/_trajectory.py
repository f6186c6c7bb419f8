"""Figures of a particle run: tokens over time, |R₂| and arg R₂, R₂ in the complex plane.

matplotlib is imported only when a figure is made; the backend is never changed here (the
`jaxattn simulate` command selects Agg itself). All functions take concrete
(numpy-convertible) arrays. In d > 2, `R₂` is that of the tokens projected on their top-two
principal plane (`pca_plane`), and every figure says so.
"""

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
    import matplotlib.pyplot as plt

    return plt


_PROJ_NOTE = "\nR₂ of the tokens projected on their top-2 principal plane"


def _real(where: str, what: str, a) -> np.ndarray:
    """`a` as a float64 array.

    **Raises:** `ValueError` naming `what` for complex values, `TypeError` for values that are
    not numbers."""
    a = np.asarray(a)
    if a.dtype.kind == "c":
        raise ValueError(f"{where}: {what} must be real, got complex values ({a.dtype}).")
    if a.dtype.kind not in "biuf":
        raise TypeError(f"{where}: {what} must be an array of real numbers, got {a.dtype}.")
    return a.astype(np.float64)


def _tokens(where: str, xs, *, times: bool = True) -> np.ndarray:
    """Tokens `(times, n, d)` with `n >= 1`, `d >= 2` (and `times >= 1` unless `times` is
    False), as float64.

    **Raises:** `ValueError` naming `xs` for any other shape or complex values; `TypeError`
    for values that are not numbers."""
    xs = _real(where, "xs", xs)
    if xs.ndim != 3 or xs.shape[1] == 0 or xs.shape[2] < 2 or (times and xs.shape[0] == 0):
        raise ValueError(
            f"{where}: xs must have shape (times, n, d) with "
            + ("times >= 1, " if times else "")
            + f"n >= 1 tokens and d >= 2, got {xs.shape}."
        )
    return xs


def _times(where: str, ts, count: int, of: str) -> np.ndarray:
    """Save times `(count,)`, one per save of `of`, as float64.

    **Raises:** `ValueError` naming `ts` for another shape, complex or non-finite values."""
    ts = _real(where, "ts", ts)
    if ts.shape != (count,):
        raise ValueError(
            f"{where}: ts must have shape (times,) = ({count},), one time per save of {of}, "
            f"got {ts.shape}."
        )
    bad = np.flatnonzero(~np.isfinite(ts))
    if bad.size:
        raise ValueError(
            f"{where}: ts must be finite save times, got {ts[bad[0]]} at index {bad[0]}."
        )
    return ts


def _series(where: str, R2) -> np.ndarray:
    """`R₂` as a non-empty 1-D array of numbers.

    **Raises:** `ValueError` naming `R2` for another shape, `TypeError` for values that are
    not numbers."""
    R2 = np.asarray(R2)
    if R2.dtype.kind not in "biufc":
        raise TypeError(f"{where}: R2 must be an array of numbers, got {R2.dtype}.")
    if R2.ndim != 1 or R2.size == 0:
        raise ValueError(f"{where}: R2 must have shape (times,) with times >= 1, got {R2.shape}.")
    return R2


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

    **Raises:** `ValueError` unless `xs` is a real array of shape `(times, n, d)` with
    `n >= 1` and `d >= 2`.
    """
    xs = _tokens("order_parameter_series", xs, times=False)
    P = xs @ pca_plane(xs)
    theta = np.arctan2(P[..., 1], P[..., 0])
    return np.mean(np.exp(2j * theta), axis=-1)


def plot_tokens(ts, xs, *, ax=None, title=None, max_tokens: int = 64):
    """Tokens over time.

    - d = 2: the angles `θ_k(t)`, unwrapped in time (a token that turns keeps climbing
      instead of jumping back at 2π), one line per token coloured by its initial angle
      (colour bar); at most `max_tokens` evenly chosen tokens are drawn (the title says so).
    - d > 2: the tokens projected on the top-two principal plane (`pca_plane`), each path
      coloured by time (colour bar), final positions circled, with the unit circle.

    A single save time is drawn as points (d = 2) at that time.

    **Arguments:** `ts` shape `(times,)`; `xs` shape `(times, n, d)`; `ax` an optional
    matplotlib axes; `max_tokens` the most token paths drawn.

    **Returns:** the matplotlib axes.

    **Raises:** `ValueError` unless `xs` is a real array of shape `(times, n, d)` with
    `times, n >= 1` and `d >= 2` and `ts` a real array of shape `(times,)`, or when
    no value of `xs` is finite.
    """
    xs = _tokens("plot_tokens", xs)
    ts = _times("plot_tokens", ts, xs.shape[0], "xs")
    if not np.isfinite(xs).any():
        raise ValueError(
            "plot_tokens: xs holds no finite value (a solve that failed before its first "
            "save?); nothing to draw."
        )
    plt = _pyplot()
    if ax is None:
        _, ax = plt.subplots(figsize=(6.4, 4.5), layout="constrained")
    fig = ax.figure
    n, d = xs.shape[1], xs.shape[2]
    keep = np.unique(np.linspace(0, n - 1, min(n, max_tokens)).round().astype(int))
    shown = "" if len(keep) == n else f", {len(keep)} of {n} shown"
    if d == 2:
        from matplotlib.collections import LineCollection
        from matplotlib.colors import Normalize

        theta = np.unwrap(np.arctan2(xs[..., 1], xs[..., 0]), axis=0)[:, keep]
        theta0 = np.mod(theta[0], 2 * np.pi)
        segs = [np.column_stack([ts, theta[:, k]]) for k in range(len(keep))]
        lc = LineCollection(segs, cmap="twilight", norm=Normalize(0, 2 * np.pi), lw=0.8)
        lc.set_array(theta0)
        ax.add_collection(lc)
        if len(ts) == 1:  # no path to draw: the tokens at that time, as points
            ax.scatter(np.repeat(ts, len(keep)), theta[0], c=theta0, cmap=lc.cmap, norm=lc.norm)
        lo, hi = ts[0], ts[-1]
        ax.set_xlim((lo - 0.5, hi + 0.5) if lo == hi else (lo, hi))
        finite = theta[np.isfinite(theta)]
        lo, hi = (finite.min(), finite.max()) if finite.size else (0.0, 2 * np.pi)
        pad = 0.05 * max(hi - lo, 1e-3)
        ax.set_ylim(lo - pad, hi + pad)
        ax.set_xlabel("t")
        ax.set_ylabel(r"$\theta_k(t)$ (rad, unwrapped in time)")
        cb = fig.colorbar(lc, ax=ax, pad=0.02)
        cb.set_label(r"initial angle $\theta_k(0)$ (rad)")
    else:
        from matplotlib.colors import Normalize

        P = xs[:, keep] @ pca_plane(xs)
        circle = np.linspace(0, 2 * np.pi, 200)
        ax.plot(np.cos(circle), np.sin(circle), color="0.8", lw=1, label="unit circle")
        norm = Normalize(ts[0], ts[-1])
        T = np.broadcast_to(ts[:, None], P.shape[:2])
        sc = ax.scatter(
            P[..., 0].ravel(), P[..., 1].ravel(), c=T.ravel(), cmap="viridis", norm=norm, s=2, lw=0
        )
        ax.plot(P[-1, :, 0], P[-1, :, 1], "o", mfc="none", color="C3", ms=6, label="final")
        ax.set_aspect("equal")
        ax.set_xlabel("principal axis 1")
        ax.set_ylabel("principal axis 2")
        ax.legend(loc="upper left", bbox_to_anchor=(0.0, -0.12), fontsize=8, ncol=2)
        cb = fig.colorbar(sc, ax=ax, pad=0.02)
        cb.set_label("t")
    info = f"n = {n}, d = {d}{shown}"
    if d > 2:
        info += "; projected on their top-2 principal plane"
    ax.set_title(f"{title or 'tokens'}\n({info})", fontsize=10)
    return ax


def plot_order_parameter(ts, R2, *, axes=None, title=None, projected: bool = False):
    """`|R₂|` and `arg R₂` (unwrapped) against time, on two stacked axes.

    **Arguments:** `ts` shape `(times,)`; `R2` complex `(times,)`; `axes` two optional
    matplotlib axes; `projected` says that `R₂` is that of tokens projected on a plane (d > 2),
    which the labels then state.

    **Returns:** the two matplotlib axes.

    **Raises:** `ValueError` unless `R2` has shape `(times,)`, `times >= 1`, and `ts` is a
    real array of the same shape.
    """
    R2 = _series("plot_order_parameter", R2)
    ts = _times("plot_order_parameter", ts, R2.size, "R2")
    plt = _pyplot()
    if axes is None:
        _, axes = plt.subplots(2, 1, figsize=(6, 5), sharex=True, layout="constrained")
    axes[0].plot(ts, np.abs(R2), color="C0")
    axes[0].set_ylabel(r"$|R_2|$")
    axes[0].set_ylim(-0.02, 1.02)
    axes[1].plot(ts, np.unwrap(np.angle(R2)), color="C1")
    axes[1].set_ylabel(r"arg $R_2$ (rad, unwrapped)")
    axes[1].set_xlabel("t")
    t = title or "order parameter"
    axes[0].set_title(t + (_PROJ_NOTE if projected else ""), fontsize=10)
    return axes


def plot_order_parameter_plane(R2, *, ts=None, ax=None, title=None, projected: bool = False):
    """The path of `R₂(t)` in the complex plane, coloured by time when `ts` is given.

    When the path spans less than a third of the disc the view zooms to it (the title says
    so; the unit circle is drawn where it is in view).

    **Arguments:** `R2` complex `(times,)`; `ts` optional `(times,)`; `ax`; `projected` (d > 2:
    `R₂` of the tokens projected on their top-2 principal plane, stated in the title).

    **Returns:** the matplotlib axes.

    **Raises:** `ValueError` unless `R2` has shape `(times,)`, `times >= 1`, and `ts` (when
    given) is a real array of the same shape.
    """
    R2 = _series("plot_order_parameter_plane", R2)
    if ts is not None:
        ts = _times("plot_order_parameter_plane", ts, R2.size, "R2")
    plt = _pyplot()
    if ax is None:
        _, ax = plt.subplots(figsize=(5.6, 5), layout="constrained")
    fig = ax.figure
    circle = np.linspace(0, 2 * np.pi, 2000)
    ax.plot(np.cos(circle), np.sin(circle), color="0.7", lw=1)
    if ts is not None:
        from matplotlib.collections import LineCollection

        pts = np.column_stack([R2.real, R2.imag])
        lc = LineCollection(np.stack([pts[:-1], pts[1:]], 1), cmap="viridis", lw=1.0)
        lc.set_array(ts[:-1])
        ax.add_collection(lc)
        cb = fig.colorbar(lc, ax=ax, pad=0.02, shrink=0.85)
        cb.set_label("t")
    else:
        ax.plot(np.real(R2), np.imag(R2), color="C0", lw=0.8)
    ax.plot(np.real(R2[0]), np.imag(R2[0]), "o", color="C2", label="start")
    ax.plot(np.real(R2[-1]), np.imag(R2[-1]), "s", color="C3", label="end")
    ax.set_aspect("equal")
    finite = R2[np.isfinite(R2)]
    zoomed = False
    if finite.size:
        lo = np.array([finite.real.min(), finite.imag.min()])
        hi = np.array([finite.real.max(), finite.imag.max()])
        span = float(np.max(hi - lo))
        if span < 2.1 / 3:
            zoomed = True
            half = 0.5 * max(span, 1e-6) * 1.25
            c = 0.5 * (lo + hi)
            ax.set_xlim(c[0] - half, c[0] + half)
            ax.set_ylim(c[1] - half, c[1] + half)
    if not zoomed:
        ax.set_xlim(-1.05, 1.05)
        ax.set_ylim(-1.05, 1.05)
    ax.set_xlabel(r"Re $R_2$")
    ax.set_ylabel(r"Im $R_2$")
    ax.legend(loc="upper left", bbox_to_anchor=(0.0, -0.12), fontsize=8, ncol=3)
    t = title or r"$R_2$ in the complex plane"
    t += _PROJ_NOTE if projected else ""
    ax.set_title(t + ("\n(zoomed to the path)" if zoomed else ""), fontsize=10)
    return ax


def save_trajectory_figures(ts, xs, out_dir, *, title=None, dpi=110) -> list[Path]:
    """Write `tokens.png`, `order_parameter.png` and `order_parameter_plane.png` to `out_dir`.

    **Arguments:** `ts` shape `(times,)`; `xs` shape `(times, n, d)`; `out_dir` a folder
    (created if missing); `title` a suffix for the figure titles.

    **Returns:** the paths written.

    **Raises:** `ValueError` as `plot_tokens` does, before any figure is made or folder
    created (no figure is left open when drawing or writing one fails).
    """
    where = "save_trajectory_figures"
    xs = _tokens(where, xs)
    ts = _times(where, ts, xs.shape[0], "xs")
    plt = _pyplot()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    R2 = order_parameter_series(xs)
    suffix = f" — {title}" if title else ""
    projected = xs.shape[-1] > 2
    paths = []

    def draw(name, draw_on, **subplots):
        fig, ax = plt.subplots(layout="constrained", **subplots)
        try:
            draw_on(ax)
            paths.append(out / name)
            fig.savefig(paths[-1], dpi=dpi)
        finally:
            plt.close(fig)

    draw(
        "tokens.png",
        lambda ax: plot_tokens(ts, xs, ax=ax, title=f"tokens{suffix}"),
        figsize=(6.6, 4.6),
    )
    draw(
        "order_parameter.png",
        lambda axes: plot_order_parameter(
            ts, R2, axes=axes, title=f"order parameter{suffix}", projected=projected
        ),
        nrows=2,
        figsize=(6, 5),
        sharex=True,
    )
    draw(
        "order_parameter_plane.png",
        lambda ax: plot_order_parameter_plane(
            R2, ts=ts, ax=ax, title=rf"$R_2$ in the plane{suffix}", projected=projected
        ),
        figsize=(5.8, 5.4),
    )
    return paths
