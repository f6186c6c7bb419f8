r"""The Watanabe–Strogatz reduction of the d = 2 LSA flow: exact for every finite n.

With `φ_k = 2θ_k` and `z_k = e^{iφ_k}`, the d = 2 LSA flow is
`dφ_k/dt = ω(t) + Im(H̃(t) e^{−iφ_k})`, i.e. every `z_k` obeys the same Riccati equation

    dz/dt = f + iω z − conj(f) z²,        f = H̃/2,  ω = βΩ(R₂),  H̃ = βH(R₂)

(`_circle.doubled_phase_forcing`). Its flow maps are Möbius automorphisms of the unit disc,
so `z_k(t) = M_t(w_k)` with constants `w_k = e^{iψ_k}` and

    M_t(w) = (ζ + e^{iΨ} w) / (1 + conj(ζ) e^{iΨ} w),       |ζ| < 1, Ψ ∈ R.

Derivation of the parameter ODEs (re-derived here): `M_t(0) = ζ` is carried by the flow, so
`ζ` obeys the same Riccati equation, `dζ/dt = f + iωζ − conj(f) ζ²`. The derivative at the
origin, `M_t'(0) = e^{iΨ}(1 − |ζ|²)`, obeys the variational equation
`d/dt M_t'(0) = F'(ζ) M_t'(0)` with `F'(ζ) = iω − 2 conj(f) ζ`; its real part is the identity
`d log(1 − |ζ|²)/dt = −2 Re(conj(f) ζ)` (which `dζ/dt` satisfies), its imaginary part gives

    dΨ/dt = ω + 2 Im(conj(ζ) f) = ω + Im(conj(ζ) H̃).

The three real ODEs are closed by `R₂ = (1/n) Σ_k M_t(w_k)`.

Gauge (Pikovsky & Rosenblum 2008): the n + 3 numbers `(ζ, Ψ, ψ_k)` describe n angles, so
three are fixed by `Σ_k e^{iψ_k} = 0` and `Ψ(t0) = 0`. Then `ζ(t)` is the conformal
(Douady–Earle) barycentre of the points `z_k(t)`, which exists and is unique iff no point
carries half or more of the tokens (in particular `n ≥ 3`), and the `w_k`, up to one common
rotation, are constants of motion (functions of the state that the flow conserves).

Lift. For `|ζ| < 1` and `|v| = 1`, `M(v) = v (1 + ζ conj(v)) / conj(1 + ζ conj(v))` and
`Re(1 + ζ conj(v)) > 0`, so with `v_k = e^{i(Ψ + ψ_k)}`

    θ_k(t) = (Ψ(t) + ψ_k)/2 + arg(1 + ζ(t) e^{−i(Ψ(t) + ψ_k)})

is continuous in `t` (principal `arg`), and with real (lifted) `ψ_k` chosen so that it equals
the given `θ_k(t0)`, it is the continuous angle of token `k`: `θ_k` and `θ_k + π` (same
`z_k`) stay distinct tokens.
"""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Complex, Float

from ..sphere import _atan2, _sort
from ._circle import _check_2x2, _check_angles, _check_scalar, doubled_phase_forcing
from ._ott_antonsen import DiscProjection
from ._segments import Problem, solve_problem
from ._solve import (
    RESULTS,
    Solution,
    check_solve_dtype,
    pid_controller,
    promote_result,
    raise_on_failure,
    save_times,
    step_statistics,
)
from ._vector_field import _is_concrete

__all__ = [
    "cross_ratio",
    "WatanabeStrogatzConstants",
    "watanabe_strogatz_constants",
    "watanabe_strogatz_reconstruct",
    "WatanabeStrogatzSolution",
    "solve_watanabe_strogatz",
]


def cross_ratio(z1, z2, z3, z4):
    r"""Cross-ratio `[z1, z2; z3, z4] = (z1 − z3)(z2 − z4) / ((z1 − z4)(z2 − z3))`.

    Invariant under every Möbius map; for four points of the unit circle it is real. Along
    the d = 2 LSA flow the cross-ratios of the points `e^{2iθ_k}` are constants of motion
    (Watanabe–Strogatz).

    Coincident points: if the denominator vanishes and the numerator does not
    (`z1 = z4` or `z2 = z3` only), the cross-ratio is the point at infinity and `inf + 0j`
    is returned; if both vanish (three or more points coincide, e.g. `z1 = z3 = z4`) it is
    undefined and `nan + nanj` is returned. No NaN or inf is produced anywhere else, and
    gradients are finite (zero) at the degenerate points.

    **Arguments:** `z1`, `z2`, `z3`, `z4` complex (or real) arrays, broadcast together.

    **Returns:** the complex cross-ratio (complex64 for float32/complex64 inputs, else
    JAX's default complex), the broadcast shape.

    **Raises:** `ValueError` when an argument is not numeric or the shapes do not broadcast
    together.

    Source: Marvel, Mirollo & Strogatz, Chaos 19, 043104 (2009), §III; Watanabe & Strogatz,
    Physica D 74, 197 (1994).
    """
    zs = []
    for name, z in zip(("z1", "z2", "z3", "z4"), (z1, z2, z3, z4)):
        kind = (np.asarray(z) if not isinstance(z, jax.Array) else z).dtype.kind
        if kind not in "biufc":
            raise ValueError(f"cross_ratio: {name} must hold numbers, got {z!r}.")
        zs.append(jnp.asarray(z))
    try:
        jnp.broadcast_shapes(*(z.shape for z in zs))
    except ValueError:
        raise ValueError(
            "cross_ratio: z1, z2, z3, z4 must broadcast together, got shapes "
            f"{', '.join(str(z.shape) for z in zs)}."
        ) from None
    # Real points are points of the complex plane: computed in complex (the degenerate
    # values below are complex, and casting them to a real dtype is refused by JAX).
    dtype = jnp.result_type(*zs, complex)
    z1, z2, z3, z4 = (z.astype(dtype) for z in zs)
    num = (z1 - z3) * (z2 - z4)
    den = (z1 - z4) * (z2 - z3)
    zero_den = den == 0
    safe = num / jnp.where(zero_den, 1, den)
    nan = jnp.asarray(complex(np.nan, np.nan), dtype)
    degenerate = jnp.where(num == 0, nan, jnp.asarray(complex(np.inf, 0.0), dtype))
    return jnp.where(zero_den, degenerate, safe)


class WatanabeStrogatzConstants(eqx.Module):
    """Möbius parameters at `t0` and the constants of motion of a Watanabe–Strogatz state.

    **Fields:**

    - `theta0`: the initial angles, shape `(n,)`.
    - `zeta0`: `ζ(t0)`, the conformal barycentre of the points `e^{2iθ_k(t0)}` (complex).
    - `Psi0`: `Ψ(t0)` (the gauge sets it to 0).
    - `psi`: the lifted constants `ψ_k`, real, shape `(n,)`; `w_k = e^{iψ_k}` satisfy
      `Σ_k w_k = 0`, and `(Ψ0 + ψ_k)/2 + arg(1 + ζ0 e^{−i(Ψ0+ψ_k)}) = θ_k(t0)`.
    - `residual`: `|(1/n) Σ_k w_k|` reached by the barycentre iteration (gauge error).
    - `valid`: whether the gauge could be fixed (barycentre found inside the disc).
    - `half_angle`: `(cos(ψ_k/2), sin(ψ_k/2))`, two real arrays of shape `(n,)`: `e^{iψ_k/2}`
      to rounding, computed without trigonometry from the initial tokens
      (`e^{iψ_k/2} = e^{iθ_k(t0)} e^{−i arg(1 + ζ0 conj(w_k))}`); its square is `w_k`.
    """

    theta0: Float[Array, " n"]
    zeta0: Complex[Array, ""]
    Psi0: Float[Array, ""]
    psi: Float[Array, " n"]
    residual: Float[Array, ""]
    valid: Bool[Array, ""]
    half_angle: tuple[Float[Array, " n"], Float[Array, " n"]]

    @property
    def w(self) -> Complex[Array, " n"]:
        """The constants `w_k = e^{iψ_k}` on the unit circle, shape `(n,)`."""
        return jnp.exp(1j * self.psi)


def _mobius(zeta, v):
    """`(ζ + v)/(1 + conj(ζ) v)`, equal to `ζ` where the denominator vanishes (|ζ| = 1)."""
    den = 1 + jnp.conj(zeta) * v
    ok = den != 0
    return jnp.where(ok, (zeta + v) / jnp.where(ok, den, 1), zeta)


def _barycentre(z, max_iter, tol):
    """Conformal barycentre: `ζ` in the disc with `Σ_k (z_k − ζ)/(1 − conj(ζ) z_k) = 0`.

    Newton's method in the recentred frame: at the current `ζ` the points are moved to
    `p = M_ζ^{-1}(z)`; there `F(δ) = mean M_δ^{-1}(p) ≈ m − δ + conj(δ) m₂` (with
    `m = mean p`, `m₂ = mean p²`), so `δ = (m + m₂ conj(m))/(1 − |m₂|²)`; the hyperbolic step
    is capped (`|δ| ≤ 1/2`) and `ζ ← M_ζ(δ)`.
    """

    def recentre(zeta):
        # (z − ζ)/D as (z − ζ) conj(D) · (1/|D|²): XLA's complex division is scalar code
        # on the CPU (the iteration took 2.4× as long with it).
        D = 1 - jnp.conj(zeta) * z
        return (z - zeta) * jnp.conj(D) * (1 / (jnp.real(D) ** 2 + jnp.imag(D) ** 2))

    def cond(state):
        _, it, res = state
        return (it < max_iter) & (res > tol)

    def body(state):
        zeta, it, _ = state
        p = recentre(zeta)
        m = jnp.mean(p)
        m2 = jnp.mean(p * p)
        den = 1 - jnp.abs(m2) ** 2
        delta = (m + m2 * jnp.conj(m)) / jnp.where(den > 0, den, 1)
        size = jnp.abs(delta)
        delta = jnp.where(size > 0.5, delta * (0.5 / jnp.where(size > 0.5, size, 1)), delta)
        zeta = (zeta + delta) / (1 + jnp.conj(zeta) * delta)
        res = jnp.abs(jnp.mean(recentre(zeta)))
        return zeta, it + 1, jnp.where(jnp.isfinite(res), res, jnp.inf)

    zeta0 = jnp.zeros((), z.dtype)
    res0 = jnp.abs(jnp.mean(z))
    zeta, _, res = jax.lax.while_loop(cond, body, (zeta0, jnp.array(0), res0))
    return zeta, res


def _largest_group_size(theta, atol):
    """Size of the largest group of coinciding points `e^{2iθ_k}` (sorted gaps < atol), jit-safe."""
    n = theta.shape[0]
    phi = _sort(jnp.mod(2 * theta, 2 * jnp.pi))
    gaps = jnp.diff(jnp.concatenate([phi, phi[:1] + 2 * jnp.pi]))
    close = gaps < atol  # close[k]: sorted points k and k+1 (cyclically) coincide
    new_group = jnp.concatenate([jnp.ones((1,), bool), ~close[:-1]])
    ids = jnp.cumsum(new_group) - 1
    counts = jax.ops.segment_sum(jnp.ones((n,), jnp.int32), ids, num_segments=n)
    # The last group continues into the first one across 2π.
    wrap = close[-1] & (ids[-1] > 0)
    merged = counts[0] + counts[ids[-1]]
    largest = jnp.maximum(jnp.max(counts), jnp.where(wrap, merged, 0))
    return jnp.where(jnp.all(close), n, largest)


def _double_angle(c, s):
    """`(cos 2a, sin 2a)` from `(cos a, sin a)`: the square of the unit complex `c + is`
    (no trigonometry; XLA's float64 `cos`/`sin` are scalar code on the CPU)."""
    return c * c - s * s, 2 * c * s


@eqx.filter_jit
def _constants(theta0, max_iter, tol, points=None):
    rdtype = theta0.dtype
    n = theta0.shape[0]
    eps = float(jnp.finfo(rdtype).eps)
    ok = jnp.isfinite(theta0)
    finite = jnp.all(ok)
    th = jnp.where(ok, theta0, 0)
    # e^{iθ} once, or the caller's tokens (XLA's float64 `cos`/`sin` and complex `exp` are
    # scalar code on the CPU, ~9 µs a pair at n = 256); `z`, `w` and `e^{iψ/2}` follow
    # from it algebraically.
    if points is None:
        c, s = jnp.cos(theta0), jnp.sin(theta0)
    else:
        c, s = points[:, 0], points[:, 1]
    c, s = jnp.where(ok, c, 1), jnp.where(ok, s, 0)
    z = jax.lax.complex(*_double_angle(c, s))  # e^{2iθ}
    zeta, res = _barycentre(z, max_iter, tol)
    # Near a two-cluster state the barycentre sits near the circle and rounding limits the
    # residual to about eps/(1 − |ζ|): accept that, and reject sets where one point holds
    # half of the tokens or more (the barycentre does not exist there).
    gap = 1 - jnp.abs(zeta)
    accept = jnp.maximum(tol, 1e2 * eps / jnp.where(gap > 0, gap, 1))
    nondegenerate = 2 * _largest_group_size(th, 1e-12) < n
    valid = finite & nondegenerate & (gap > 0) & (res <= accept)
    # Lifted ψ_k: θ_k(0) = ψ_k/2 + arg(1 + ζ0 conj(w_k)) with Ψ0 = 0, where
    # w_k = (z_k − ζ0)/D_k, D_k = 1 − conj(ζ0) z_k: the argument of |D_k|² + ζ0 conj(z_k − ζ0) D_k
    # (the same number times |D_k|² > 0), without a complex division and through the
    # vectorised `_atan2` (XLA's complex division and `atan2` are scalar code on the CPU).
    D = 1 - jnp.conj(zeta) * z
    p = (jnp.real(D) ** 2 + jnp.imag(D) ** 2) + zeta * jnp.conj(z - zeta) * D
    pr, pi = jnp.real(p), jnp.imag(p)
    psi = 2 * th - 2 * _atan2(pi, pr)
    # e^{iψ/2} = e^{iθ} conj(p)/|p| (the same branch as ψ: ψ/2 = θ − arg p exactly).
    size = jnp.sqrt(pr * pr + pi * pi)
    inv = 1 / jnp.where(size > 0, size, 1)
    pr, pi = jnp.where(size > 0, pr * inv, 1), jnp.where(size > 0, pi * inv, 0)
    half = (c * pr + s * pi, s * pr - c * pi)
    return WatanabeStrogatzConstants(
        theta0=theta0,
        zeta0=zeta,
        Psi0=jnp.zeros((), rdtype),
        psi=psi.astype(rdtype),
        residual=res.astype(rdtype),
        valid=valid,
        half_angle=tuple(h.astype(rdtype) for h in half),
    )


def _largest_coincident_group(theta: np.ndarray, atol: float) -> tuple[int, float]:
    """Size of the largest group of coinciding points `e^{2iθ}` (gaps < atol), and its angle."""
    phi = np.sort(np.mod(2 * theta, 2 * np.pi))
    n = phi.size
    gaps = np.diff(np.concatenate([phi, phi[:1] + 2 * np.pi]))
    close = gaps < atol  # close[k]: sorted points k and k+1 (cyclically) coincide
    if close.all():
        return n, float(phi[0])
    start = int(np.argmin(close)) + 1  # begin right after a real gap
    best, size, at, best_at = 1, 1, phi[start % n], phi[start % n]
    for j in range(1, n):
        k = (start + j) % n
        if close[(k - 1) % n]:
            size += 1
        else:
            size, at = 1, phi[k]
        if size > best:
            best, best_at = size, at
    return best, float(best_at)


def watanabe_strogatz_constants(
    theta0: Float[Array, " n"],
    *,
    max_iter: int = 200,
    tol: float | None = None,
    points: Float[Array, "n 2"] | None = None,
) -> WatanabeStrogatzConstants:
    r"""Möbius parameters at `t0` and constants of motion for the angles `θ_k(t0)`.

    Solves for the gauge of Pikovsky & Rosenblum: `ζ0` is the conformal barycentre of the
    points `z_k = e^{2iθ_k}`, i.e. `Σ_k (z_k − ζ0)/(1 − conj(ζ0) z_k) = 0`, `Ψ0 = 0`, and
    `w_k = e^{iψ_k} = (z_k − ζ0)/(1 − conj(ζ0) z_k)`, so that `z_k = M(w_k)` with
    `M(w) = (ζ0 + e^{iΨ0} w)/(1 + conj(ζ0) e^{iΨ0} w)` and `Σ_k w_k = 0`. The real `ψ_k`
    are lifted so that `θ_k(t0) = (Ψ0 + ψ_k)/2 + arg(1 + ζ0 e^{−i(Ψ0 + ψ_k)})` exactly,
    which keeps `θ_k` and `θ_k + π` apart.

    Applied to the angles at any later time of the same flow it returns the `ζ(t)` of the
    solution and the same `w_k` up to one common rotation: these are the `n − 3` real
    constants of motion (equivalently the cross-ratios of the `z_k`).

    What Watanabe–Strogatz needs: three real parameters describe the motion, so `n ≥ 3`;
    and the barycentre exists (uniquely) iff no point `z_k` is shared by half or more of the
    tokens (`θ_j ≡ θ_k mod π`). With `n/2` or more tokens on one antipodal pair the state is
    (part of) a two-cluster state on the boundary of the WS phase space, where the Möbius
    parametrisation degenerates.

    **Arguments:**

    - `theta0`: angles, shape `(n,)`, `n ≥ 3`.
    - `max_iter`, `tol`: Newton iterations for the barycentre and the target for the gauge
      residual `|(1/n) Σ_k w_k|` (default `100 eps` of the dtype). Near a two-cluster state
      rounding limits the residual to about `eps/(1 − |ζ0|)`; residuals up to
      `100 eps/(1 − |ζ0|)` are accepted.
    - `points`: the tokens `(cos θ_k, sin θ_k)`, shape `(n, 2)`, real, when the caller has
      them (as `sweep` has from its sampler): the constants then need no trigonometry. They
      must be the tokens of `theta0` to rounding (`1000 eps` of the dtype, relative to
      `max(1, |θ_k|)`): checked on concrete input, not under `jit`/`vmap` (where non-finite
      points give `valid = False`).

    **Returns:** a `WatanabeStrogatzConstants`.

    **Raises:** `ValueError` if `theta0` is not 1-d, `n < 3`, half precision (float16,
    bfloat16), `points` is not a real `(n, 2)` array, or (concrete input) a token of
    `points` is not finite or not that of `theta0`, an angle is non-finite, a point
    `e^{2iθ_k}` carries at least half of the tokens, or the barycentre iteration fails.
    Under `jit`/`vmap` failure is reported by `valid = False`.

    Source: Pikovsky & Rosenblum, PRL 101, 264103 (2008), eqs. (4)–(6); Marvel, Mirollo &
    Strogatz, Chaos 19, 043104 (2009); Watanabe & Strogatz, Physica D 74, 197 (1994).
    """
    where = "watanabe_strogatz_constants"
    theta0 = _check_angles(where, "theta0", theta0, min_n=1)
    n = theta0.shape[0]
    if n < 3:
        raise ValueError(
            f"{where}: need n >= 3 tokens, got n = {n}. The Watanabe–Strogatz reduction "
            f"describes the motion by 3 real Möbius parameters plus n − 3 constants; with "
            f"fewer tokens it is not a reduction (and the gauge Σ_k e^{{iψ_k}} = 0 cannot "
            f"be fixed)."
        )
    if not jnp.issubdtype(theta0.dtype, jnp.floating):
        theta0 = theta0.astype(jnp.result_type(float))
    check_solve_dtype(where, theta0.dtype)
    if tol is None:
        tol = 1e2 * float(jnp.finfo(theta0.dtype).eps)
    if points is not None:
        points = jnp.asarray(points)
        if points.shape != (n, 2):
            raise ValueError(
                f"{where}: points must be the tokens (cos θ_k, sin θ_k) of theta0, shape "
                f"({n}, 2), got shape {points.shape}."
            )
        if not jnp.issubdtype(points.dtype, jnp.floating):
            raise ValueError(
                f"{where}: points must be real floating-point tokens (cos θ_k, sin θ_k), "
                f"got dtype {points.dtype}."
            )
        if jnp.finfo(points.dtype).bits < 32:
            raise ValueError(
                f"{where}: points are {points.dtype.name}; half precision is not supported "
                f"(about 3 significant digits). Pass float32 or float64 tokens, or leave "
                f"points out."
            )
        if _is_concrete(points) and _is_concrete(theta0):
            # A concrete call can afford the trigonometry the argument saves: the tokens
            # must be those of theta0 (another lift θ + π flips e^{iψ/2}), in its precision.
            got = np.asarray(points, np.float64)
            th = np.asarray(theta0, np.float64)
            ok = np.isfinite(got).all(axis=1)
            if not ok.all():
                k = int(np.argmin(ok))
                raise ValueError(f"{where}: points[{k}] is not finite ({got[k].tolist()}).")
            want = np.stack([np.cos(th), np.sin(th)], -1)
            err = np.abs(got - want).max(axis=1) / np.maximum(1.0, np.abs(th))
            bound = 1e3 * float(jnp.finfo(theta0.dtype).eps)
            if np.any(err > bound):
                k = int(np.argmax(err))
                raise ValueError(
                    f"{where}: points[{k}] = {got[k].tolist()} is not the token "
                    f"(cos θ, sin θ) of theta0[{k}] = {float(th[k])!r} (difference "
                    f"{np.abs(got[k] - want[k]).max():.3g}, allowed {bound:.3g} in "
                    f"{theta0.dtype}); pass the tokens of theta0 itself, or leave points out."
                )
        points = points.astype(theta0.dtype)
    if _is_concrete(theta0):
        th = np.asarray(theta0, dtype=np.float64)
        size, at = _largest_coincident_group(th, 1e-12)
        if 2 * size >= n:
            what = "all points coincide" if size == n else f"{size} of n = {n} tokens coincide"
            raise ValueError(
                f"{where}: degenerate initial set: {what} on the circle of doubled angles "
                f"(2θ ≡ {at:.6g} mod 2π, i.e. θ ≡ {at / 2:.6g} mod π). The Möbius gauge of "
                f"Watanabe–Strogatz needs every point e^{{2iθ_k}} to carry fewer than half of "
                f"the tokens (its conformal barycentre does not exist otherwise)."
            )
    consts = _constants(theta0, int(max_iter), tol, points)
    if _is_concrete(consts.valid) and not bool(consts.valid):
        raise ValueError(
            f"{where}: the barycentre iteration did not converge (gauge residual "
            f"{float(consts.residual):.3g}, |ζ0| = {float(abs(consts.zeta0)):.17g}); "
            f"the points e^{{2iθ_k}} are too "
            f"concentrated for the Möbius gauge in {theta0.dtype}."
        )
    return consts


def watanabe_strogatz_reconstruct(
    zeta: Complex[Array, "..."], Psi: Float[Array, "..."], constants: WatanabeStrogatzConstants
) -> Float[Array, "... n"]:
    r"""Every token angle from the Möbius parameters: the continuous lift of `θ_k`.

    `θ_k = (Ψ + ψ_k)/2 + arg(1 + ζ e^{−i(Ψ + ψ_k)})`, so that `e^{2iθ_k} = M(e^{iψ_k})`,
    `M(w) = (ζ + e^{iΨ} w)/(1 + conj(ζ) e^{iΨ} w)`, and `θ_k` is continuous along a
    continuous path of `(ζ, Ψ)` with `|ζ| < 1` (lifted `Ψ` as integrated by
    `solve_watanabe_strogatz`). At `(ζ0, Ψ0)` it returns `constants.theta0`; the angles are
    real numbers (not reduced mod 2π): the token identity `θ_k` vs `θ_k + π` is kept.

    **Arguments:** `zeta` complex and `Psi` real of one shape `(...)`; `constants` from
    `watanabe_strogatz_constants`.

    **Returns:** angles of shape `(..., n)`.
    """
    zeta = jnp.asarray(zeta)[..., None]
    Psi = jnp.asarray(Psi)[..., None]
    phase = Psi + constants.psi
    return 0.5 * phase + jnp.angle(1 + zeta * jnp.exp(-1j * phase)).astype(phase.dtype)


class WatanabeStrogatzSolution(Solution):
    """A solution of the Watanabe–Strogatz equations.

    **Fields:**

    - `ts`: save times, shape `(times,)`.
    - `zeta`: the Möbius centre `ζ(t)`, complex, shape `(times,)` (NaN for a rejected input).
    - `Psi`: the rotation angle `Ψ(t)` (lifted, real), shape `(times,)`.
    - `constants`: the `WatanabeStrogatzConstants` (gauge at `t0`).
    - `result`: a `RESULTS` code.
    - `num_steps`, `num_accepted_steps`, `num_rejected_steps`: step statistics.
    - `disc_overshoot`: the largest `|ζ| − 1 > 0` a step produced before it was clipped.

    `angles()` reconstructs every `θ_k(t)` (shape `(times, n)`), `order_parameter()` gives
    `R₂(t)`.
    """

    zeta: Complex[Array, " times"]
    Psi: Float[Array, " times"]
    constants: WatanabeStrogatzConstants
    disc_overshoot: Float[Array, ""]

    def angles(self) -> Float[Array, "times n"]:
        """Every token angle `θ_k(t)` (continuous lift), shape `(times, n)`."""
        return watanabe_strogatz_reconstruct(self.zeta, self.Psi, self.constants)

    def points(self) -> Float[Array, "times n 2"]:
        """Every token as a point `(cos θ_k, sin θ_k)` of the circle, shape `(times, n, 2)`.

        Same tokens as `angles()`, computed without inverse trigonometry:
        `e^{iθ} = e^{iφ/2} u/|u|` with `φ = Ψ + ψ_k`, `u = 1 + ζ e^{−iφ}`.
        """
        return _points(self.zeta, self.Psi, self.constants.psi)

    def order_parameter(self) -> Complex[Array, " times"]:
        """`R₂(t) = (1/n) Σ_k M_t(w_k)`, shape `(times,)`."""
        return _order_parameter(self.zeta, self.Psi, self.constants.psi)


@jax.jit
def _points(zeta, Psi, psi, half=None):
    """Tokens `(cos θ_k, sin θ_k)` at Möbius parameters `zeta`, `Psi` (shape `(times,)`) for
    the constants `psi` (shape `(n,)`), shape `(times, n, 2)`: `WatanabeStrogatzSolution.points`.
    `half`: `(cos(ψ/2), sin(ψ/2))` when the caller has them
    (`WatanabeStrogatzConstants.half_angle`).

    Real arithmetic with `e^{iφ/2} = e^{iΨ/2} e^{iψ_k/2}` (trigonometry per save and per
    token, not per both), one save at a time: on the CPU, XLA's complex exponential is
    scalar code and a fused `(times, n)` loop with two outputs runs ~10× slower than a
    loop over saves of `(n,)` vectors.
    """
    pc, ps = (jnp.cos(0.5 * psi), jnp.sin(0.5 * psi)) if half is None else half

    def one(_, p):
        z_re, z_im, Pc, Ps = p
        hc = Pc * pc - Ps * ps  # e^{iφ/2}
        hs = Ps * pc + Pc * ps
        er, ei = _double_angle(hc, -hs)  # e^{−iφ}
        ur = 1 + z_re * er - z_im * ei  # u = 1 + ζ e^{−iφ}
        ui = z_re * ei + z_im * er
        size = jnp.sqrt(ur * ur + ui * ui)
        ok = size > 0
        inv = 1 / jnp.where(ok, size, 1)
        x = jnp.where(ok, (hc * ur - hs * ui) * inv, hc)
        y = jnp.where(ok, (hc * ui + hs * ur) * inv, hs)
        # One complex output per save (two real outputs of one loop run ~3× slower).
        return None, jax.lax.complex(x, y)

    per_save = (jnp.real(zeta), jnp.imag(zeta), jnp.cos(0.5 * Psi), jnp.sin(0.5 * Psi))
    z = jax.lax.scan(one, None, per_save)[1]
    return jnp.stack([jnp.real(z), jnp.imag(z)], axis=-1)


def _token_speeds(ts, zeta, Psi, psi, w=None):
    """Mean geodesic speed of the tokens on each save interval, shape `(times − 1,)`, from
    the Möbius parameters `zeta`, `Psi` at the save times `ts` (shape `(times,)`) and the
    constants `psi` (shape `(n,)`): what `_regimes._token_motion` gives of the
    reconstructed tokens (to rounding), without reconstructing them.

    With `θ_k = φ_k/2 + arg u_k`, `φ_k = Ψ + ψ_k`, `u_k = 1 + ζ e^{−iφ_k}`, the lifted step of
    token `k` is `Δθ_k = ΔΨ/2 + arg(u_k' conj(u_k))` and its geodesic distance is `|Δθ_k|`
    wrapped into `[0, π]`: one arctangent per token and interval (`sphere._atan2`, through
    the one-argument `sphere._atan`, a vectorised rational function: XLA's float64 `atan2`
    and `atan` are scalar code on the CPU), in real arithmetic, one interval at a time
    (as `_points`). Each interval recomputes both ends' `u` and reduces one complex
    array (the mean of `|Δθ|` as its real part) instead of carrying `u` to the next
    interval: on the CPU a loop body with the carry as a second output, or with a real
    reduction, compiled several times slower (at n = 256, 512 members: 112 → 40 µs per
    member; it was the largest part of a Watanabe–Strogatz member's classification).
    `w`: `(cos ψ, sin ψ)` when the caller has them.
    """
    wc, ws = (jnp.cos(psi), jnp.sin(psi)) if w is None else w  # e^{−iψ} = wc − i ws

    def u(z, c, s):  # 1 + ζ e^{−iφ}, with e^{−iΨ} = c − i s
        er = c * wc - s * ws
        ei = -(s * wc + c * ws)
        zr, zi = jnp.real(z), jnp.imag(z)
        return 1 + zr * er - zi * ei, zr * ei + zi * er

    def one(_, p):
        z0, c0, s0, z, c, s, half_dPsi = p
        pur, pui = u(z0, c0, s0)
        ur, ui = u(z, c, s)
        # arg(u' conj(u)) + ΔΨ/2, wrapped into (−π, π].
        step = half_dPsi + _atan2(ui * pur - ur * pui, ur * pur + ui * pui)
        step = jnp.abs(step - 2 * jnp.pi * jnp.round(step / (2 * jnp.pi)))
        return None, jnp.real(jnp.mean(jax.lax.complex(step, jnp.zeros_like(step))))

    C, S = jnp.cos(Psi), jnp.sin(Psi)
    per_interval = (zeta[:-1], C[:-1], S[:-1], zeta[1:], C[1:], S[1:], 0.5 * jnp.diff(Psi))
    _, mean_step = jax.lax.scan(one, None, per_interval)
    return mean_step / (ts[1:] - ts[:-1])


@jax.jit
def _order_parameter(zeta, Psi, psi):
    """`R₂ = (1/n) Σ_k M(e^{iψ_k})` at Möbius parameters `zeta`, `Psi` (shape `(times,)`),
    complex, shape `(times,)`: `WatanabeStrogatzSolution.order_parameter`. One save at a
    time, as `_points`."""
    return _order_parameter_w(zeta, Psi, jnp.cos(psi), jnp.sin(psi))


def _order_parameter_w(zeta, Psi, wr, wi):
    """`_order_parameter` from `wr, wi = cos ψ, sin ψ` (shape `(n,)`)."""

    def one(_, p):
        return None, _mobius_mean(*p, wr, wi)

    per_save = (jnp.real(zeta), jnp.imag(zeta), jnp.cos(Psi), jnp.sin(Psi))
    return jax.lax.scan(one, None, per_save)[1]


def _mobius_mean(zr, zi, c, s, wr, wi):
    r"""`(1/n) Σ_k M(w_k)` in real arithmetic: `M(w) = (ζ + e^{iΨ}w)/(1 + conj(ζ) e^{iΨ}w)`
    with `ζ = zr + i zi`, `e^{iΨ} = c + i s` and `w_k = wr_k + i wi_k` (the last axis,
    `n`; the arguments broadcast together).

    The same numbers as `mean(_mobius(ζ, e^{iΨ} w))` to rounding, but XLA's complex
    exponential and division are scalar code on the CPU: written out in real multiply-adds
    the sum vectorises, about 15× faster at n = 256 (it is the whole cost of a WS step).
    Equal to `ζ` where the denominator vanishes (|ζ| = 1), as `_mobius`.

    **Returns:** the complex `R₂`, the broadcast shape of the arguments without the last axis.
    """
    vr = c * wr - s * wi
    vi = s * wr + c * wi
    br = 1 + zr * vr + zi * vi  # 1 + conj(ζ) v
    bi = zr * vi - zi * vr
    ar = zr + vr  # ζ + v
    ai = zi + vi
    den = br * br + bi * bi
    ok = den > 0
    inv = 1 / jnp.where(ok, den, 1)
    Rr = jnp.where(ok, (ar * br + ai * bi) * inv, zr)
    Ri = jnp.where(ok, (ai * br - ar * bi) * inv, zi)
    # One complex reduction: XLA's CPU code for two reductions of one elementwise graph
    # is ~15× slower than for one.
    return jnp.mean(jax.lax.complex(Rr, Ri), axis=-1)


def _ws_rhs(t, y, args):
    del t
    A, V, beta, wr, wi = args
    # Raw state (smooth across |ζ| = 1); `DiscProjection` clips after each step.
    R = _mobius_mean(y[0], y[1], jnp.cos(y[2]), jnp.sin(y[2]), wr, wi)
    zeta = y[0] + 1j * y[1]
    omega, Ht = doubled_phase_forcing(R, A, V, beta)
    f = 0.5 * Ht
    dzeta = 1j * omega * zeta + f - jnp.conj(f) * zeta**2
    dPsi = omega + jnp.imag(jnp.conj(zeta) * Ht)
    return jnp.stack([jnp.real(dzeta), jnp.imag(dzeta), dPsi]).astype(y.dtype)


class WatanabeStrogatzChecks(eqx.Module):
    """What `finish_watanabe_strogatz` needs of `prepare_watanabe_strogatz`."""

    bad: Bool[Array, ""]
    degenerate: Bool[Array, ""]
    # Finite inputs whose field is already non-finite at the start (weights so large that
    # the products overflow): `nonfinite_flow` at once, on every path (a sweep member steps
    # without the stall guard and would otherwise run to max_steps).
    overflow: Bool[Array, ""]
    constants: WatanabeStrogatzConstants
    # `(cos ψ_k, sin ψ_k)` as the right-hand side reads them (of ψ = 0 for a rejected
    # input), for the sweep's classification of the solve: XLA's float64 `cos` and `sin`
    # are scalar code on the CPU (4.4 µs a pair at n = 256).
    w: tuple[Float[Array, " n"], Float[Array, " n"]]
    # `(cos(ψ_k/2), sin(ψ_k/2))` likewise (the last tokens of the classification).
    half: tuple[Float[Array, " n"], Float[Array, " n"]]


def prepare_watanabe_strogatz(A, V, beta, consts, dtype, solver, rtol, atol, *, stall_guard=False):
    """The Watanabe–Strogatz `Problem` for the constants `consts`, with the per-member
    input checks (a rejected member runs a zero field: cheap, cannot poison a batch).
    `stall_guard` for a standalone solve (`pid_controller`)."""
    bad = ~(
        jnp.all(jnp.isfinite(A))
        & jnp.all(jnp.isfinite(V))
        & jnp.isfinite(beta)
        & jnp.all(jnp.isfinite(consts.theta0))
    )
    degenerate = ~consts.valid & ~bad
    invalid = bad | degenerate
    y0 = jnp.stack([jnp.real(consts.zeta0), jnp.imag(consts.zeta0), consts.Psi0]).astype(dtype)
    # The constants as real pairs `w_k = (cos ψ_k, sin ψ_k)`, computed once (diffrax is
    # happiest with real pytrees, and the right-hand side then needs no trigonometry per
    # token): the squares of `e^{iψ_k/2}` (ψ = 0 for a rejected input).
    hc, hs = (jnp.where(invalid, x, h).astype(dtype) for x, h in zip((1, 0), consts.half_angle))
    w = _double_angle(hc, hs)
    f0 = _ws_rhs(0.0, jnp.where(invalid, 0, y0), (A, V, beta, *w))
    overflow = ~invalid & ~jnp.all(jnp.isfinite(f0))
    invalid = invalid | overflow
    args = (jnp.where(invalid, 0, A), jnp.where(invalid, 0, V), jnp.where(invalid, 0, beta), *w)
    problem = Problem(
        term=diffrax.ODETerm(_ws_rhs),
        solver=DiscProjection(solver),
        y0=jnp.where(invalid, 0, y0),
        args=args,
        controller=pid_controller(rtol, atol, stall_guard=stall_guard),
        save_solver_state=True,
    )
    checks = WatanabeStrogatzChecks(
        bad=bad,
        degenerate=degenerate,
        overflow=overflow,
        constants=consts,
        w=w,
        half=(hc, hs),
    )
    return problem, checks


def finish_watanabe_strogatz(checks: WatanabeStrogatzChecks, sol, ts):
    """The `WatanabeStrogatzSolution` of a finished solve (whole or segmented)."""
    invalid = checks.bad | checks.degenerate | checks.overflow
    ys = jnp.where(invalid, jnp.nan, sol.ys)
    result = promote_result(sol.result)
    result = RESULTS.where(checks.overflow, RESULTS.nonfinite_flow, result)
    result = RESULTS.where(checks.degenerate, RESULTS.degenerate_configuration, result)
    result = RESULTS.where(checks.bad, RESULTS.nonfinite_argument, result)
    return WatanabeStrogatzSolution(
        ts=ts,
        zeta=ys[:, 0] + 1j * ys[:, 1],
        Psi=ys[:, 2],
        constants=checks.constants,
        result=result,
        **step_statistics(sol),
        disc_overshoot=jnp.where(invalid, jnp.nan, sol.solver_state[1]),
    )


@eqx.filter_jit
def _solve_ws(A, V, beta, consts, ts, t0, t1, dt0, solver, rtol, atol, max_steps, adjoint):
    problem, checks = prepare_watanabe_strogatz(
        A, V, beta, consts, ts.dtype, solver, rtol, atol, stall_guard=True
    )
    sol = solve_problem(problem, t0, t1, dt0, ts, adjoint, max_steps)
    return finish_watanabe_strogatz(checks, sol, ts)


def solve_watanabe_strogatz(
    A: Float[Array, "2 2"],
    V: Float[Array, "2 2"],
    theta0: Float[Array, " n"],
    *,
    beta=1.0,
    t1: float,
    t0: float = 0.0,
    ts: Float[Array, " times"] | None = None,
    num_save: int = 101,
    dt0: float | None = None,
    solver: diffrax.AbstractSolver = diffrax.Tsit5(),
    rtol: float = 1e-8,
    atol: float = 1e-10,
    max_steps: int = 16384,
    adjoint: diffrax.AbstractAdjoint = diffrax.RecursiveCheckpointAdjoint(),
    max_iter: int = 200,
    throw: bool = True,
    points: Float[Array, "n 2"] | None = None,
) -> WatanabeStrogatzSolution:
    r"""Solve the d = 2 LSA flow of `n` tokens exactly through three Watanabe–Strogatz ODEs.

    With `z_k = e^{2iθ_k} = M_t(e^{iψ_k})`, `M_t(w) = (ζ + e^{iΨ}w)/(1 + conj(ζ) e^{iΨ}w)`:

    $$\dot\zeta = \tfrac12\tilde H + i\omega\zeta - \tfrac12\overline{\tilde H}\zeta^2,\qquad
    \dot\Psi = \omega + \operatorname{Im}(\bar\zeta\tilde H),\qquad
    R_2 = \frac1n\sum_k M_t(e^{i\psi_k}),$$

    `ω = βΩ(R₂)`, `H̃ = βH(R₂)` (`doubled_phase_forcing`); the constants `ψ_k` and `ζ(t0)`
    come from `watanabe_strogatz_constants(theta0)` (gauge `Σ_k e^{iψ_k} = 0`, `Ψ(t0) = 0`).
    Each evaluation costs O(n) for `R₂`; the state has three real numbers for any `n`.
    `solution.angles()` reconstructs every `θ_k(t)` (continuous, token identity kept).

    `ζ` is clipped to the closed disc after every step (`DiscProjection`); as the tokens
    approach a two-cluster state `|ζ| → 1` and the reconstruction loses accuracy like
    `eps/(1 − |ζ|)`.

    jit-, vmap- and grad-safe in `A`, `V`, `beta` (the constants do not depend on them);
    the barycentre is a `while_loop`, so reverse-mode derivatives in `theta0` are not
    supported.

    **Arguments:**

    - `A`, `V`: real 2×2 matrices; `beta` scalar.
    - `theta0`: initial angles, shape `(n,)`, `n ≥ 3`, no point `e^{2iθ}` shared by half or
      more of the tokens (see `watanabe_strogatz_constants`).
    - `t1`, `t0`, `ts`, `num_save`, `dt0`, `solver`, `rtol`, `atol`, `max_steps`, `adjoint`,
      `throw`: as in `solve_ott_antonsen`; `max_iter` for the barycentre.
    - `points`: the tokens of `theta0`, as `watanabe_strogatz_constants` takes them.

    **Returns:** a `WatanabeStrogatzSolution`.

    **Raises:** `ValueError` as `watanabe_strogatz_constants` and for `A`, `V` not 2×2 or
    non-finite, or `beta ≤ 0` (concrete; an inverse temperature, as `simulate` refuses
    it). Under `jit`/`vmap`: non-finite arguments give
    `RESULTS.nonfinite_argument`, a degenerate set (no barycentre) gives
    `RESULTS.degenerate_configuration`, with NaN outputs; raised when `throw=True`.

    Source: Watanabe & Strogatz, Physica D 74, 197 (1994); Pikovsky & Rosenblum, PRL 101,
    264103 (2008), eqs. (7)–(8); Marvel, Mirollo & Strogatz, Chaos 19, 043104 (2009);
    the docs, theory pages ("Watanabe–Strogatz").
    """
    where = "solve_watanabe_strogatz"
    A, V = _check_2x2(where, A=A, V=V)
    beta = _check_scalar(where, "beta", beta, positive=True)
    theta0 = _check_angles(where, "theta0", theta0)
    dtype = jnp.result_type(A, V, beta, theta0, float)  # a Python beta stays weak
    check_solve_dtype(where, dtype)  # before the constants, which would name themselves
    consts = watanabe_strogatz_constants(theta0.astype(dtype), max_iter=max_iter, points=points)
    ts = save_times(where, ts, t0, t1, num_save, dtype, rtol=rtol, atol=atol, max_steps=max_steps)
    sol = _solve_ws(
        A.astype(dtype),
        V.astype(dtype),
        beta.astype(dtype),
        consts,
        ts,
        jnp.asarray(t0, dtype),
        jnp.asarray(t1, dtype),
        None if dt0 is None else jnp.asarray(dt0, dtype),
        solver,
        rtol,
        atol,
        int(max_steps),
        adjoint,
    )
    if throw:
        zeta = raise_on_failure(
            "solve_watanabe_strogatz",
            sol.result,
            sol.zeta,
            "WatanabeStrogatzSolution.result",
            sol,
            (t0, t1),
        )
        sol = eqx.tree_at(lambda s: s.zeta, sol, zeta)
    return sol
