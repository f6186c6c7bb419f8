"""d = 2: tokens as angles, order parameters and the Kuramoto–Daido form of the flow."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Complex, Float

from .._custom_types import Angles, Matrix
from ._vector_field import _is_concrete, _real_array

__all__ = [
    "angles_from_tokens",
    "tokens_from_angles",
    "order_parameter",
    "complex_coefficients",
    "kuramoto_daido_coupling",
    "kuramoto_daido",
    "doubled_phase_forcing",
    "angular_velocity",
    "KuramotoDaido",
]


def _check_2x2(where: str, **mats):
    """Shape checks (and, for concrete values, finiteness) of named 2×2 matrices."""
    out = []
    for name, m in mats.items():
        m = _real_array(where, name, m)
        if m.shape != (2, 2):
            raise ValueError(f"{where}: {name} must be a 2×2 matrix (d = 2), got shape {m.shape}.")
        if _is_concrete(m) and not np.all(np.isfinite(np.asarray(m))):
            raise ValueError(
                f"{where}: {name} has non-finite entries (NaN or inf): {np.asarray(m).tolist()}."
            )
        out.append(m)
    return out


def _check_scalar(where: str, name: str, x, *, positive: bool = False):
    x = _real_array(where, name, x)
    if x.ndim != 0:
        raise ValueError(f"{where}: {name} must be a scalar, got shape {x.shape}.")
    if _is_concrete(x):
        v = np.asarray(x)
        if not np.all(np.isfinite(v)):
            raise ValueError(f"{where}: {name} is not finite ({v}).")
        if positive and not np.all(v > 0):
            raise ValueError(
                f"{where}: {name} is an inverse temperature and must be > 0, got {v} (as "
                "AttentionDynamics and simulate refuse it; for β < 0 pass −A)."
            )
    return x


def _check_count(where: str, name: str, value, lo: int = 1) -> int:
    """`value` as an int: a Python or NumPy integer (never a bool, never a float) >= `lo`.

    **Raises:** `ValueError` naming `name` otherwise."""
    if (
        isinstance(value, (bool, np.bool_))
        or not isinstance(value, (int, np.integer))
        or value < lo
    ):
        raise ValueError(f"{where}: {name} must be an integer >= {lo}, got {value!r}.")
    return int(value)


def _check_angles(where: str, name: str, theta, *, min_n: int = 1):
    theta = _real_array(where, name, theta)
    if theta.ndim != 1:
        raise ValueError(
            f"{where}: {name} must be a 1-d array of angles of shape (n,), got shape {theta.shape}."
        )
    if theta.shape[0] < min_n:
        raise ValueError(f"{where}: {name} has n = {theta.shape[0]} angles; need n >= {min_n}.")
    if jnp.iscomplexobj(theta):
        raise ValueError(f"{where}: {name} must be real angles, got dtype {theta.dtype}.")
    if _is_concrete(theta):
        v = np.asarray(theta)
        bad = ~np.isfinite(v)
        if bad.any():
            k = int(np.argmax(bad))
            raise ValueError(f"{where}: {name}[{k}] is not finite ({v[k]}).")
    return theta


def angles_from_tokens(x: Float[Array, "... 2"]) -> Float[Array, "..."]:
    """Angles `θ = atan2(x₂, x₁)` of planar tokens, in `(−π, π]`.

    **Arguments:** `x` of shape `(..., 2)` (need not be normalised).

    **Returns:** angles of shape `(...)`, radians.

    **Raises:** `ValueError` if the last axis is not of size 2.
    """
    x = jnp.asarray(x)
    if x.shape[-1] != 2:
        raise ValueError(f"angles_from_tokens: tokens must have d = 2, got shape {x.shape}.")
    return jnp.arctan2(x[..., 1], x[..., 0])


def tokens_from_angles(theta: Float[Array, "..."]) -> Float[Array, "... 2"]:
    """Unit tokens `(cos θ, sin θ)`, shape `(..., 2)`."""
    theta = jnp.asarray(theta)
    return jnp.stack([jnp.cos(theta), jnp.sin(theta)], axis=-1)


def order_parameter(theta: Float[Array, "... n"], m: int = 2) -> Complex[Array, "..."]:
    """Kuramoto–Daido order parameter `R_m = (1/n) Σ_j exp(i m θ_j)` over the last axis.

    `|R_2| = 1` means all tokens sit on one antipodal pair; `R_2 = 0` is the balanced
    (e.g. uniform) state.

    **Arguments:** `theta` of shape `(..., n)`, radians (angles, not tokens: for planar
    tokens `x` of shape `(..., n, 2)` pass `angles_from_tokens(x)`); `m` the harmonic
    (integer ≥ 1).

    **Returns:** complex array of shape `(...)`.

    **Raises:** `ValueError` if `theta` has no axis or `n = 0` angles (the mean of no
    phases is undefined; it used to be NaN), if `theta` is not real (complex angles), or
    if `m` is not an integer >= 1.

    Source: Li et al. (2026), definition of `R₂`; Daido, Prog. Theor. Phys. 88 (1992).
    """
    m_arr = np.asarray(m) if not isinstance(m, jax.core.Tracer) else None
    if (
        isinstance(m, bool)
        or m_arr is None
        or m_arr.shape != ()
        or m_arr.dtype.kind not in "iu"
        or int(m_arr) < 1
    ):
        raise ValueError(f"order_parameter: m must be an integer >= 1, got {m!r}.")
    m = int(m_arr)
    theta = jnp.asarray(theta)
    if jnp.iscomplexobj(theta):
        raise ValueError(f"order_parameter: theta must be real angles, got dtype {theta.dtype}.")
    if theta.ndim == 0 or theta.shape[-1] == 0:
        raise ValueError(
            f"order_parameter: theta must have shape (..., n) with n >= 1 angles, got shape "
            f"{theta.shape}" + (" (n = 0)." if theta.ndim else ".")
        )
    return jnp.mean(jnp.exp(1j * m * theta), axis=-1)


def complex_coefficients(M: Matrix) -> tuple[Complex[Array, ""], Complex[Array, ""]]:
    """`(μ, ν)` with `M z = μ z + ν z̄` for a real 2×2 matrix acting on `z ∈ C`.

    `μ = ((m11 + m22) + i(m21 − m12))/2`, `ν = ((m11 − m22) + i(m21 + m12))/2`.

    **Raises:** `ValueError` if `M` is not of shape `(2, 2)`.
    """
    M = jnp.asarray(M)
    if M.shape[-2:] != (2, 2):
        raise ValueError(f"complex_coefficients: need a 2×2 matrix, got shape {M.shape}.")
    m11, m12, m21, m22 = M[..., 0, 0], M[..., 0, 1], M[..., 1, 0], M[..., 1, 1]
    mu = 0.5 * ((m11 + m22) + 1j * (m21 - m12))
    nu = 0.5 * ((m11 - m22) + 1j * (m21 + m12))
    return mu, nu


def kuramoto_daido_coupling(R, A: Matrix, V: Matrix):
    """The global field `(H, Ω)` of the d = 2 LSA flow at order parameter `R = R₂`.

    `H = a c R + (a e + b c) + b e R̄`, `Ω = Im(ā c + b̄ e + ā e R̄ + b̄ c R)` with
    `(a, b) = (μ, ν)` of `A` and `(c, e)` those of `V` (see `complex_coefficients`).

    **Returns:** `(H, Ω)`: complex `H` and real `Ω`, broadcast over the shape of `R`.

    Source: the docs, theory pages ("d = 2: Kuramoto–Daido form").
    """
    a, b = complex_coefficients(A)
    c, e = complex_coefficients(V)
    Rc = jnp.conj(R)
    H = a * c * R + (a * e + b * c) + b * e * Rc
    Omega = jnp.imag(jnp.conj(a) * c + jnp.conj(b) * e + jnp.conj(a) * e * Rc + jnp.conj(b) * c * R)
    return H, Omega


def kuramoto_daido(theta: Angles, A: Matrix, V: Matrix, beta=1.0) -> Angles:
    """Angular velocities of the d = 2 LSA flow in Kuramoto–Daido form.

    `dθ_k/dt = (β/2) [ Im(H e^{−2iθ_k}) + Ω ]`, with `(H, Ω)` from
    `kuramoto_daido_coupling` at `R₂ = (1/n) Σ_j e^{2iθ_j}`. Equal to the full field
    `AttentionDynamics(A, V, beta=beta, kernel="lsa")` expressed in angles.

    **Arguments:** `theta` shape `(n,)`; `A`, `V` shape `(2, 2)`; `beta` scalar.

    **Returns:** `dθ/dt`, shape `(n,)`.

    **Raises:** `ValueError` if `theta` is not 1-d or `A`, `V` are not 2×2 (and, for
    concrete values, if anything is non-finite).

    Source: docs/theory; Li et al. (2026), the d = 2 reduction.
    """
    theta = _check_angles("kuramoto_daido", "theta", theta)
    A, V = _check_2x2("kuramoto_daido", A=A, V=V)
    beta = _check_scalar("kuramoto_daido", "beta", beta)
    R = order_parameter(theta, 2)
    H, Omega = kuramoto_daido_coupling(R, A, V)
    return 0.5 * beta * (jnp.imag(H * jnp.exp(-2j * theta)) + Omega)


def doubled_phase_forcing(R, A: Matrix, V: Matrix, beta=1.0):
    """Frequency `ω` and complex forcing `H̃` of the doubled angles `φ_k = 2θ_k`.

    In d = 2 the LSA flow is `dφ_k/dt = ω + Im(H̃ e^{−iφ_k})` with `ω = β Ω(R)` and
    `H̃ = β H(R)` (see `kuramoto_daido_coupling`); equivalently `z_k = e^{iφ_k}` obeys the
    Riccati equation `dz/dt = iω z + (H̃ − conj(H̃) z²)/2` that the Watanabe–Strogatz and
    Ott–Antonsen reductions are built on.

    **Arguments:** `R` complex order parameter `R₂` (any shape); `A`, `V` of shape `(2, 2)`;
    `beta` scalar.

    **Returns:** `(ω, H̃)`, real and complex, with the shape of `R`.

    Source: the docs, theory pages ("d = 2: Kuramoto–Daido form").
    """
    H, Omega = kuramoto_daido_coupling(R, A, V)
    return beta * Omega, beta * H


def angular_velocity(x: Float[Array, "... 2"], v: Float[Array, "... 2"]) -> Float[Array, "..."]:
    """Angular velocity `dθ/dt = (x₁ v₂ − x₂ v₁)/|x|²` of planar tokens `x` moving with `v`.

    Converts the full vector field `AttentionDynamics(...)(t, x)` (shape `(n, 2)`) into the
    phase velocities that `kuramoto_daido` returns.

    **Arguments:** `x` positions and `v = dx/dt`, both of shape `(..., 2)`.

    **Returns:** `dθ/dt` of shape `(...)` (zero where `x = 0`).

    **Raises:** `ValueError` if the last axis of `x` or `v` is not of size 2, or their
    shapes do not broadcast together.
    """
    x = jnp.asarray(x)
    v = jnp.asarray(v)
    for name, a in (("x", x), ("v", v)):
        if a.shape[-1:] != (2,):
            raise ValueError(
                f"angular_velocity: {name} must have a last axis of size 2, got shape {a.shape}."
            )
    try:
        jnp.broadcast_shapes(x.shape, v.shape)
    except ValueError:
        raise ValueError(
            f"angular_velocity: x and v must broadcast together, got shapes {x.shape} and "
            f"{v.shape}."
        ) from None
    sq = jnp.sum(x * x, axis=-1)
    cross = x[..., 0] * v[..., 1] - x[..., 1] * v[..., 0]
    return cross / jnp.where(sq > 0, sq, 1)


class KuramotoDaido(eqx.Module):
    r"""The d = 2 LSA flow in angles, as a vector field for `diffrax`.

    $$\dot\theta_k = \frac\beta2\Big[\operatorname{Im}\big(H(R_2)\,e^{-2i\theta_k}\big)
    + \Omega(R_2)\Big],\qquad R_2 = \frac1n\sum_j e^{2i\theta_j},$$

    with `H`, `Ω` from `kuramoto_daido_coupling`. It is the full field
    `AttentionDynamics(A, V, beta=beta, kernel="lsa")` written in `θ` (exactly, in
    O(n) per evaluation), so `diffrax.diffeqsolve(diffrax.ODETerm(KuramotoDaido(A, V)), ...)`
    integrates the same dynamics without any constraint to keep.

    **Arguments:**

    - `A`, `V`: real 2×2 matrices.
    - `beta`: inverse temperature (scalar).

    `__call__(t, theta, args)` takes angles of shape `(n,)` and returns `dθ/dt`, shape `(n,)`.

    **Raises:** `ValueError` if `A` or `V` is not 2×2, `beta` is not a scalar, or (for
    concrete values) any of them is non-finite.

    Source: docs/theory; Li et al. (2026); Daido, Prog. Theor. Phys. 88 (1992).
    """

    A: Float[Array, "2 2"]
    V: Float[Array, "2 2"]
    beta: Float[Array, ""]

    def __init__(self, A, V, *, beta=1.0):
        A, V = _check_2x2("KuramotoDaido", A=A, V=V)
        beta = _check_scalar("KuramotoDaido", "beta", beta)
        dtype = jnp.result_type(A, V, beta, float)
        self.A = A.astype(dtype)
        self.V = V.astype(dtype)
        self.beta = beta.astype(dtype)

    def forcing(self, R):
        """`(ω, H̃)` of the doubled angles at order parameter `R` (`doubled_phase_forcing`)."""
        return doubled_phase_forcing(R, self.A, self.V, self.beta)

    def __call__(self, t, theta: Angles, args=None) -> Angles:
        del t, args
        theta = _check_angles("KuramotoDaido", "theta", theta)
        omega, Ht = self.forcing(order_parameter(theta, 2))
        return 0.5 * (jnp.imag(Ht * jnp.exp(-2j * theta)) + omega)
