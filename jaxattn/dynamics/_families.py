"""Attention-flow families beyond one fixed head: several heads, time-varying weights, and the
homogenised (period-averaged) Ott–Antonsen reduction of periodic weights.

Every flow here follows the flow protocol of `_vector_field.py` (an `eqx.Module` with
`__call__(t, x, args) -> dx/dt`, parameters as array leaves, configuration static, optional
`manifold` and `natural_rate(x0)`), so `simulate`, the sweeps and the classifiers take them
unchanged.
"""

from collections.abc import Callable
from typing import Literal

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Complex, Float

from .._custom_types import Tokens
from ..sphere import normalise
from ._ott_antonsen import (
    DiscProjection,
    OttAntonsenSolution,
    finish_ott_antonsen,
    oa_start,
    ott_antonsen_field,
)
from ._segments import Problem, solve_problem
from ._solve import pid_controller, raise_on_failure, save_times
from ._vector_field import (
    KERNELS,
    NORMALISATIONS,
    _asarray_warn_cast,
    _is_concrete,
    _refuse_nonfinite,
    attention_drive,
    check_causal,
    kernel_rate,
    normalised_field,
)

__all__ = [
    "MultiHeadDynamics",
    "PeriodicMatrix",
    "TimeVaryingDynamics",
    "homogenised_ott_antonsen_field",
    "solve_homogenised_ott_antonsen",
]


def _check_options(where: str, kernel, normalisation):
    if kernel not in KERNELS:
        raise ValueError(f"{where}: kernel must be one of {KERNELS}, got {kernel!r}.")
    if normalisation not in NORMALISATIONS:
        raise ValueError(
            f"{where}: normalisation must be one of {NORMALISATIONS}, got {normalisation!r}."
        )


def _check_positive_beta(where: str, beta):
    if _is_concrete(beta):
        b = np.asarray(beta)
        if not np.all(np.isfinite(b)):
            raise ValueError(f"{where}: beta has non-finite entries (NaN or inf).")
        if not np.all(b > 0):
            raise ValueError(
                f"{where}: beta is an inverse temperature and must be > 0, got {b.tolist()}."
            )


class MultiHeadDynamics(eqx.Module):
    r"""Multi-head attention flow: `H` heads `(A_h, V_h, β_h)` whose outputs are summed,

    $$\mathrm{drive}_k = \sum_{h=1}^{H} W_o^{(h)}\frac1{N_k}\sum_{j\in J_k} w^{(h)}_{kj} V_h x_j,$$

    with the kernel weights of `AttentionDynamics` per head (`w^{(h)}` built from `A_h`,
    `β_h`), `J_k = {1..n}`, `N_k = n` (or `J_k = {1..k}`, `N_k = k` when `causal`), and the
    velocity given by the normalisation scheme (`normalised_field`: Post-LN
    `P⊥_{θ_k} drive_k` on the sphere, Pre-LN `drive_k` in R^d, nGPT
    `P⊥_{θ_k} drive_k/|drive_k|`), evaluated at `θ_k = x_k/|x_k|`.

    A transformer layer with head width `dk` concatenates heads and applies `W_O`; with
    full-width heads this is the sum above with per-head output blocks `W_o^{(h)}`. With
    `H = 1` and no output map this is `AttentionDynamics` (equal to rounding). LSA is
    evaluated through the moment `M = XᵀX` shared by the heads:
    `drive = (1/n) X Σ_h β_h A_h M V_hᵀ W_o^{(h)ᵀ}`, O(n d² + H d³).

    **Arguments:**

    - `A`, `V`: shape `(heads, d, d)`, the heads' bilinear forms and value maps.
    - `beta`: `β > 0`, a scalar (shared) or shape `(heads,)`.
    - `kernel`: `"lsa"`, `"usa"` or `"sa"` (all heads).
    - `causal`: token `k` attends to `j ≤ k` only (see `AttentionDynamics`).
    - `normalisation`: `"post_ln"` (default), `"pre_ln"` or `"ngpt"` (see `AttentionDynamics`).
    - `W_o`: optional output map, `(d, d)` (applied to the sum) or `(heads, d, d)` (one block
      per head); default the identity.
    - `score_shift`: USA only, subtracted from every score (a time rescaling).

    `manifold`: `"euclidean"` for Pre-LN, else `"sphere"`. `natural_rate(x0)`: the sum of
    the heads' rates (`kernel_rate`) times `‖W_o‖₂`; 1 for nGPT.

    **Raises:** `ValueError` for wrong shapes (naming the argument and the shape), `d < 2`,
    an unknown kernel or normalisation, non-real `A`, `V`, `W_o`, `beta` or `score_shift`
    (complex, strings), non-finite concrete entries, or a non-positive concrete `beta`.

    Source: multi-head flows as in Karagodin, Ge, Polyanskiy, Rigollet, arXiv 2510.22026
    (Sec. 2, the attention output summed over heads); single head: Geshkovski et al.,
    arXiv 2312.10794, eq. (1.1).
    """

    A: Float[Array, "heads d d"]
    V: Float[Array, "heads d d"]
    beta: Float[Array, " heads"]
    score_shift: Float[Array, ""]
    W_o: Float[Array, "..."] | None
    kernel: Literal["lsa", "usa", "sa"] = eqx.field(static=True)
    causal: bool = eqx.field(static=True)
    normalisation: Literal["post_ln", "pre_ln", "ngpt"] = eqx.field(static=True)

    def __init__(
        self,
        A,
        V,
        *,
        beta=1.0,
        kernel: str = "lsa",
        causal: bool = False,
        normalisation: str = "post_ln",
        W_o=None,
        score_shift=0.0,
    ):
        where = "MultiHeadDynamics"
        # real arrays (complex, strings refused by name), as AttentionDynamics takes them
        A = _asarray_warn_cast(where, "A", A)
        V = _asarray_warn_cast(where, "V", V)
        beta = _asarray_warn_cast(where, "beta", beta)
        score_shift = _asarray_warn_cast(where, "score_shift", score_shift)
        if W_o is not None:
            W_o = _asarray_warn_cast(where, "W_o", W_o)
        _refuse_nonfinite(where, A=A, V=V, W_o=W_o, score_shift=score_shift)
        dtype = jnp.result_type(A, V, float)
        if A.ndim != 3 or A.shape[1] != A.shape[2] or A.shape[1] < 2 or A.shape[0] < 1:
            raise ValueError(
                f"{where}: A must have shape (heads, d, d) with heads >= 1 and d >= 2, got "
                f"shape {A.shape}."
            )
        if V.shape != A.shape:
            raise ValueError(f"{where}: V must have the shape of A {A.shape}, got shape {V.shape}.")
        heads = A.shape[0]
        beta = jnp.asarray(beta, dtype)
        if beta.ndim == 0:
            beta = jnp.broadcast_to(beta, (heads,))
        if beta.shape != (heads,):
            raise ValueError(
                f"{where}: beta must be a scalar or have shape (heads,) = ({heads},), got "
                f"shape {beta.shape}."
            )
        _check_positive_beta(where, beta)
        if W_o is not None:
            W_o = jnp.asarray(W_o, dtype)
            d = A.shape[1]
            if W_o.shape not in ((d, d), (heads, d, d)):
                raise ValueError(
                    f"{where}: W_o must have shape (d, d) = ({d}, {d}) or (heads, d, d) = "
                    f"({heads}, {d}, {d}), got shape {W_o.shape}."
                )
        _check_options(where, kernel, normalisation)
        self.A = A.astype(dtype)
        self.V = V.astype(dtype)
        self.beta = beta
        self.score_shift = jnp.asarray(score_shift, dtype)
        self.W_o = W_o
        self.kernel = kernel
        self.causal = check_causal(where, causal)
        self.normalisation = normalisation

    @property
    def d(self) -> int:
        return self.A.shape[-1]

    @property
    def heads(self) -> int:
        return self.A.shape[-3]

    @property
    def manifold(self) -> str:
        return "euclidean" if self.normalisation == "pre_ln" else "sphere"

    def natural_rate(self, x0: Tokens | None = None) -> Float[Array, ""]:
        """Sum of the heads' rates (`kernel_rate`) times `‖W_o‖₂` (1 for nGPT)."""
        if self.normalisation == "ngpt":
            return jnp.ones((), self.A.dtype)
        rates = jax.vmap(lambda a, v, b: kernel_rate(a, v, b, self.kernel, self.score_shift, x0))(
            self.A, self.V, self.beta
        )
        if self.W_o is None:
            return jnp.sum(rates)
        if self.W_o.ndim == 2:
            return jnp.sum(rates) * jnp.linalg.norm(self.W_o, ord=2)
        return jnp.sum(rates * jax.vmap(lambda w: jnp.linalg.norm(w, ord=2))(self.W_o))

    def head_drives(self, x: Tokens) -> Float[Array, "heads n d"]:
        """Each head's un-projected mean field at `x/|x|` (before `W_o`), `(heads, n, d)`."""
        xh = normalise(x)
        return jax.vmap(
            lambda a, v, b: attention_drive(
                xh, a, v, b, self.kernel, causal=self.causal, score_shift=self.score_shift
            )
        )(self.A, self.V, self.beta)

    def drive(self, x: Tokens) -> Tokens:
        """The summed attention output `Σ_h W_o^{(h)} drive_h` at `x/|x|`, shape `(n, d)`."""
        xh = normalise(x)
        if self.kernel == "lsa" and not self.causal:
            n = xh.shape[0]
            moment = xh.T @ xh
            V = self.V
            if self.W_o is not None and self.W_o.ndim == 3:
                V = jnp.einsum("hij,hjk->hik", self.W_o, V)
            K = jnp.einsum("h,hij,jk,hlk->il", self.beta, self.A, moment, V)
            out = (xh @ K) / n
            if self.W_o is not None and self.W_o.ndim == 2:
                out = out @ self.W_o.T
            return out
        per_head = self.head_drives(x)
        if self.W_o is None:
            return jnp.sum(per_head, axis=0)
        if self.W_o.ndim == 2:
            return jnp.sum(per_head, axis=0) @ self.W_o.T
        return jnp.einsum("hkd,hed->ke", per_head, self.W_o)

    def __call__(self, t, x: Tokens, args=None) -> Tokens:
        del t, args
        return normalised_field(normalise(x), self.drive(x), self.normalisation)


class PeriodicMatrix(eqx.Module):
    r"""A matrix that oscillates in time, `M(t) = M₀ + M₁ sin(t/ε) + M₂ cos(t/ε)`.

    **Arguments:** `sine` `M₁` and `cosine` `M₂` of shape `(d, d)`, keyword `epsilon` `ε > 0`
    (the period is `2πε`), `constant` `M₀` (default zero).

    `__call__(t)` returns `M(t)`, shape `(d, d)`; `average()` returns `M₀`, the mean over
    one period.

    **Raises:** `ValueError` for shapes that differ or are not `(d, d)`, or a concrete
    `epsilon ≤ 0`.
    """

    sine: Float[Array, "d d"]
    cosine: Float[Array, "d d"]
    constant: Float[Array, "d d"]
    epsilon: Float[Array, ""]

    def __init__(self, sine, cosine, *, epsilon, constant=None):
        sine = jnp.asarray(sine)
        cosine = jnp.asarray(cosine)
        constant = jnp.zeros_like(sine) if constant is None else jnp.asarray(constant)
        dtype = jnp.result_type(sine, cosine, constant, float)
        for name, m in (("sine", sine), ("cosine", cosine), ("constant", constant)):
            if m.ndim != 2 or m.shape[0] != m.shape[1] or m.shape != sine.shape:
                raise ValueError(
                    f"PeriodicMatrix: {name} must be a square (d, d) matrix of the shape of "
                    f"sine {sine.shape}, got shape {m.shape}."
                )
        epsilon = jnp.asarray(epsilon, dtype)
        if _is_concrete(epsilon) and not float(epsilon) > 0:
            raise ValueError(f"PeriodicMatrix: epsilon must be > 0, got {float(epsilon)}.")
        self.sine = sine.astype(dtype)
        self.cosine = cosine.astype(dtype)
        self.constant = constant.astype(dtype)
        self.epsilon = epsilon

    def __call__(self, t) -> Float[Array, "d d"]:
        tau = t / self.epsilon
        return self.constant + jnp.sin(tau) * self.sine + jnp.cos(tau) * self.cosine

    def average(self) -> Float[Array, "d d"]:
        return self.constant


def _as_schedule(where: str, name: str, m, dtype_hint):
    """A constant matrix, a `PeriodicMatrix` or a jittable callable `t -> (d, d)`."""
    if isinstance(m, PeriodicMatrix) or callable(m):
        return m
    return jnp.asarray(m)


def _check_schedule(where: str, name: str, m) -> tuple[int, ...]:
    if not callable(m):
        return tuple(m.shape)
    try:
        out = eqx.filter_eval_shape(m, jnp.zeros((), float))
    except Exception as err:  # any failure to trace is the user's callable, not ours
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(
            f"{where}: {name}(t) is not jittable; it must be a JAX-traceable function of the "
            f"time t returning a (d, d) array (no Python control flow on t, no float(t) or "
            f"NumPy conversion): {type(err).__name__}: {first}"
        ) from None
    if not hasattr(out, "shape"):
        raise ValueError(f"{where}: {name}(t) must return a (d, d) array, got {type(out)}.")
    return tuple(out.shape)


class TimeVaryingDynamics(eqx.Module):
    r"""The attention flow with time-dependent weights `A(t)`, `V(t)`:

    $$\dot x_k = \text{velocity}_k\Big(\frac1{N_k}\sum_{j\in J_k} w_{kj}(t)\,V(t)\,x_j\Big),
    \qquad w_{kj}(t) \text{ built from } \beta\langle x_k, A(t)\, x_j\rangle,$$

    with the kernels, causal mask and normalisations of `AttentionDynamics`.

    **Arguments:**

    - `A`, `V`: each a constant `(d, d)` array, a `PeriodicMatrix`
      (`M₀ + M₁ sin(t/ε) + M₂ cos(t/ε)`), or a jittable callable `t -> (d, d)` (a function
      or an `eqx.Module`; its arrays are then parameters).
    - `beta`, `kernel`, `causal`, `normalisation`, `score_shift`: as in `AttentionDynamics`.

    `homogenised()` returns, for LSA with periodic (or constant) `A`, `V` of one `ε`, the
    period-averaged flow as a `MultiHeadDynamics` (LSA is bilinear in `(A, V)`, so the
    average of `F(A(t), V(t))` over a period is
    `F(A₀, V₀) + ½ F(A₁, V₁) + ½ F(A₂, V₂)`: three heads). In d = 2 its Ott–Antonsen
    reduction is `homogenised_ott_antonsen_field`. First-order averaging: solutions of the
    fast flow stay within O(ε) of the averaged flow on bounded time intervals.

    **Raises:** `ValueError` naming the argument for wrong shapes, an unknown kernel or
    normalisation, a non-positive concrete `beta`, and a callable `A` or `V` that JAX cannot
    trace (e.g. one that calls `float(t)` or branches on `t` in Python).

    Source: time-periodic weights as in the public code of Li et al. (2026) (the dynamics
    paper); averaging: Sanders, Verhulst, Murdock, *Averaging Methods in Nonlinear
    Dynamical Systems* (2007), Thm. 2.8.1.
    """

    A: Float[Array, "d d"] | PeriodicMatrix | Callable
    V: Float[Array, "d d"] | PeriodicMatrix | Callable
    beta: Float[Array, ""]
    score_shift: Float[Array, ""]
    kernel: Literal["lsa", "usa", "sa"] = eqx.field(static=True)
    causal: bool = eqx.field(static=True)
    normalisation: Literal["post_ln", "pre_ln", "ngpt"] = eqx.field(static=True)

    def __init__(
        self,
        A,
        V,
        *,
        beta=1.0,
        kernel: str = "lsa",
        causal: bool = False,
        normalisation: str = "post_ln",
        score_shift=0.0,
    ):
        where = "TimeVaryingDynamics"
        _check_options(where, kernel, normalisation)
        A = _as_schedule(where, "A", A, None)
        V = _as_schedule(where, "V", V, None)
        shape_A = _check_schedule(where, "A", A)
        shape_V = _check_schedule(where, "V", V)
        for name, shape in (("A", shape_A), ("V", shape_V)):
            if len(shape) != 2 or shape[0] != shape[1] or shape[0] < 2:
                raise ValueError(
                    f"{where}: {name} (or {name}(t)) must be a square (d, d) matrix with "
                    f"d >= 2, got shape {shape}."
                )
        if shape_A != shape_V:
            raise ValueError(f"{where}: A is {shape_A} but V is {shape_V}; they must match.")
        beta = jnp.asarray(beta, float)
        if beta.ndim != 0:
            raise ValueError(f"{where}: beta must be a scalar, got shape {beta.shape}.")
        _check_positive_beta(where, beta)
        self.A = A
        self.V = V
        self.beta = beta
        self.score_shift = jnp.asarray(score_shift, beta.dtype)
        self.kernel = kernel
        self.causal = check_causal(where, causal)
        self.normalisation = normalisation

    @property
    def manifold(self) -> str:
        return "euclidean" if self.normalisation == "pre_ln" else "sphere"

    def weights(self, t) -> tuple[Float[Array, "d d"], Float[Array, "d d"]]:
        """`(A(t), V(t))`."""
        A = self.A(t) if callable(self.A) else self.A
        V = self.V(t) if callable(self.V) else self.V
        return A, V

    def natural_rate(self, x0: Tokens | None = None) -> Float[Array, ""]:
        """The rate of `(A(0), V(0))` for constant parts, of the amplitudes `|M₀| + |M₁| +
        |M₂|` for periodic ones (`kernel_rate`); 1 for nGPT."""
        if self.normalisation == "ngpt":
            return jnp.ones((), self.beta.dtype)

        def bound(m):
            if isinstance(m, PeriodicMatrix):
                return m.constant, m.sine, m.cosine
            return (m(jnp.zeros((), self.beta.dtype)) if callable(m) else m,)

        nA = sum(jnp.linalg.norm(m, ord=2) for m in bound(self.A))
        nV = sum(jnp.linalg.norm(m, ord=2) for m in bound(self.V))
        d = bound(self.A)[0].shape[0]
        eye = jnp.eye(d, dtype=self.beta.dtype)
        return kernel_rate(nA * eye, nV * eye, self.beta, self.kernel, self.score_shift, x0)

    def __call__(self, t, x: Tokens, args=None) -> Tokens:
        del args
        A, V = self.weights(t)
        xh = normalise(x)
        drive = attention_drive(
            xh, A, V, self.beta, self.kernel, causal=self.causal, score_shift=self.score_shift
        )
        return normalised_field(xh, drive.astype(x.dtype), self.normalisation)

    def homogenised(self) -> MultiHeadDynamics:
        """The period-averaged flow (LSA, `A` and `V` periodic with one `ε` or constant) as a
        three-head `MultiHeadDynamics` `(A₀, V₀, β), (A₁, V₁, β/2), (A₂, V₂, β/2)`.

        **Raises:** `ValueError` for another kernel (USA/SA are not bilinear in `(A, V)`), a
        general callable, or two periodic matrices of different `ε` (concrete).
        """
        where = "TimeVaryingDynamics.homogenised"
        if self.kernel != "lsa":
            raise ValueError(
                f"{where}: only LSA is bilinear in (A, V), so only its average is a finite sum "
                f"of heads; got kernel {self.kernel!r}."
            )
        parts = []
        eps = []
        for name, m in (("A", self.A), ("V", self.V)):
            if isinstance(m, PeriodicMatrix):
                parts.append((m.constant, m.sine, m.cosine))
                eps.append(m.epsilon)
            elif callable(m):
                raise ValueError(
                    f"{where}: {name} is a general callable; averaging needs a PeriodicMatrix "
                    f"or a constant matrix."
                )
            else:
                parts.append((m, jnp.zeros_like(m), jnp.zeros_like(m)))
        if len(eps) == 2 and _is_concrete(eps[0]) and _is_concrete(eps[1]):
            if not np.isclose(float(eps[0]), float(eps[1]), rtol=1e-12, atol=0):
                raise ValueError(
                    f"{where}: A and V oscillate with different epsilon ({float(eps[0])} and "
                    f"{float(eps[1])}); the averaged flow is then not the one computed here."
                )
        (A0, A1, A2), (V0, V1, V2) = parts
        return MultiHeadDynamics(
            jnp.stack([A0, A1, A2]),
            jnp.stack([V0, V1, V2]),
            beta=jnp.stack([self.beta, self.beta / 2, self.beta / 2]),
            kernel="lsa",
            causal=self.causal,
            normalisation=self.normalisation,
        )


def homogenised_ott_antonsen_field(
    R: Complex[Array, "..."], flow: "TimeVaryingDynamics | MultiHeadDynamics"
) -> Complex[Array, "..."]:
    r"""The period-averaged Ott–Antonsen field of a d = 2 LSA flow with periodic weights:

    `dR/dt = F(R; A₀, V₀, β) + ½ F(R; A₁, V₁, β) + ½ F(R; A₂, V₂, β)`, with `F` the OA field
    (`ott_antonsen_field`, bilinear in `(A, V)`) — the OA reduction of
    `flow.homogenised()`. A `MultiHeadDynamics` (LSA, Post-LN, not causal) is reduced as the
    sum of its heads' OA fields.

    **Arguments:** `R` complex (any shape); `flow` a `TimeVaryingDynamics` or
    `MultiHeadDynamics` in d = 2.

    **Returns:** `dR/dt`, the shape of `R`.

    **Raises:** `ValueError` if the flow is not d = 2 LSA on the sphere without mask or output
    map (the OA reduction is exact only there).

    Source: the docs, theory pages ("Ott–Antonsen"); averaging: Sanders, Verhulst, Murdock (2007).
    """
    heads = flow.homogenised() if isinstance(flow, TimeVaryingDynamics) else flow
    where = "homogenised_ott_antonsen_field"
    if not isinstance(heads, MultiHeadDynamics):
        raise ValueError(f"{where}: flow must be a TimeVaryingDynamics or MultiHeadDynamics.")
    if (
        heads.kernel != "lsa"
        or heads.d != 2
        or heads.causal
        or heads.normalisation != "post_ln"
        or heads.W_o is not None
    ):
        raise ValueError(
            f"{where}: the Ott–Antonsen reduction needs d = 2 LSA, Post-LN, no causal mask and "
            f"no output map; got d = {heads.d}, kernel {heads.kernel!r}, causal {heads.causal}, "
            f"normalisation {heads.normalisation!r}, "
            f"{'no output map' if heads.W_o is None else 'an output map W_o'}."
        )
    fields = jax.vmap(lambda a, v, b: ott_antonsen_field(R, a, v, b))(heads.A, heads.V, heads.beta)
    return jnp.sum(fields, axis=0)


class _AveragedRhs(eqx.Module):
    heads: MultiHeadDynamics

    def __call__(self, t, y, args):
        del t, args
        dR = homogenised_ott_antonsen_field(y[0] + 1j * y[1], self.heads)
        return jnp.stack([jnp.real(dR), jnp.imag(dR)]).astype(y.dtype)


@eqx.filter_jit
def _solve_averaged(heads, R0, ts, t0, t1, solver, rtol, atol, max_steps):
    # The per-member input checks of `solve_ott_antonsen` (a traced non-finite or
    # non-positive input, |R0| > 1): a rejected member runs a zero field from the origin
    # and gets NaN and its code (`finish_ott_antonsen`).
    beta = jnp.where(jnp.all(jnp.isfinite(heads.beta)), jnp.min(heads.beta), jnp.nan)
    checks, invalid, y0 = oa_start(heads.A, heads.V, beta, R0, ts.dtype)
    run = eqx.tree_at(
        lambda h: (h.A, h.V, h.beta),
        heads,
        tuple(jnp.where(invalid, 0, a) for a in (heads.A, heads.V, heads.beta)),
    )
    # The solve of `solve_ott_antonsen` (`Problem`, `solve_problem`) with the averaged field.
    problem = Problem(
        term=diffrax.ODETerm(_AveragedRhs(run)),
        solver=DiscProjection(solver),
        y0=y0,
        args=None,
        controller=pid_controller(rtol, atol, stall_guard=True),
        save_solver_state=True,
    )
    sol = solve_problem(problem, t0, t1, None, ts, diffrax.RecursiveCheckpointAdjoint(), max_steps)
    return finish_ott_antonsen(checks, sol, ts)


def solve_homogenised_ott_antonsen(
    flow: "TimeVaryingDynamics | MultiHeadDynamics",
    R0,
    *,
    t1: float,
    t0: float = 0.0,
    ts=None,
    num_save: int = 101,
    solver: diffrax.AbstractSolver = diffrax.Tsit5(),
    rtol: float = 1e-9,
    atol: float = 1e-11,
    max_steps: int = 65536,
    throw: bool = True,
) -> OttAntonsenSolution:
    r"""Solve the homogenised Ott–Antonsen ODE (`homogenised_ott_antonsen_field`) from `R0`.

    **Arguments:** `flow` (see `homogenised_ott_antonsen_field`), `R0` complex in the closed
    unit disc, `t1`, `t0`, `ts` / `num_save`, `solver`, `rtol`, `atol`, `max_steps` as in
    `solve_ott_antonsen`; `throw` raises if the solve fails.

    **Returns:** an `OttAntonsenSolution` (`R` at the save times).

    **Raises:** `ValueError` for a flow the reduction does not cover, `|R0| > 1`, bad times.
    Under `jit`/`vmap` the input problems `solve_ott_antonsen` reports become the same
    result codes (`nonfinite_argument`, `outside_disc`, `nonpositive_beta`) with `R = NaN`.
    """
    where = "solve_homogenised_ott_antonsen"
    heads = flow.homogenised() if isinstance(flow, TimeVaryingDynamics) else flow
    homogenised_ott_antonsen_field(jnp.zeros((), complex), heads)  # the checks
    R0 = jnp.asarray(R0)
    if _is_concrete(R0) and not abs(complex(R0)) <= 1 + 1e-12:
        raise ValueError(f"{where}: R0 must lie in the closed unit disc, got |R0| = {abs(R0)}.")
    dtype = heads.A.dtype
    ts = save_times(where, ts, t0, t1, num_save, dtype, rtol=rtol, atol=atol, max_steps=max_steps)
    sol = _solve_averaged(
        heads,
        R0,
        ts,
        jnp.asarray(t0, dtype),
        jnp.asarray(t1, dtype),
        solver,
        rtol,
        atol,
        int(max_steps),
    )
    if throw:
        R = raise_on_failure(where, sol.result, sol.R, "OttAntonsenSolution.result", sol, (t0, t1))
        sol = eqx.tree_at(lambda s: s.R, sol, R)
    return sol
