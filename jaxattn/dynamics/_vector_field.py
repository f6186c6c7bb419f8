"""The attention particle flow on the sphere: LSA, USA and SA kernels, causal masking and
the normalisation schemes (Post-LN, Pre-LN, nGPT).

**The flow protocol.** A *flow* is an `equinox.Module` with `__call__(t, x, args) -> dx/dt`
acting on tokens `x` of shape `(n, d)` and returning an array of the same shape. Its array
leaves are its parameters (what `jax.grad` differentiates and a sweep batches: a batch of
flows is the same module with a leading batch axis on those leaves, vmapped with
`eqx.filter_vmap`); its configuration (kernel, flags) lives in static fields. Two optional
members are read by `simulate` and the sweeps when present:

- `manifold`: `"sphere"` (the default when absent) — the tokens live on S^{d-1}, the field
  must be tangent there (`<x_k, f_k> = 0` at unit `x_k`), `simulate` normalises `x0` and
  maps every step back onto the sphere; or `"euclidean"` — the state is the raw residual
  stream in R^d (e.g. Pre-LN, where the token norms evolve): no normalisation, no projection.
- `natural_rate(x0) -> scalar`: a bound of the speed `|dx/dt|` near `x0`, used to integrate
  in the flow's own time `s = r t` (the sweep runs `f(s/r, x)/r`); default 1.

`AttentionDynamics` below, `MultiHeadDynamics`, `TimeVaryingDynamics` and `PLGAFlow` all
follow it; a user flow of ten lines does too (see `tests/test_families.py`).
"""

import math
from typing import Literal, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._custom_types import Matrix, Tokens
from .._warn import warn_at_caller
from ..sphere import _norm_from_squares, normalise, project_tangent, safe_norm

__all__ = [
    "AttentionDynamics",
    "KERNELS",
    "NORMALISATIONS",
    "attention_drive",
    "normalised_field",
    "kernel_rate",
]

KERNELS = ("lsa", "usa", "sa")
NORMALISATIONS = ("post_ln", "pre_ln", "ngpt")


def attention_drive(
    xh: Tokens,
    A: Matrix,
    V: Matrix,
    beta,
    kernel: str,
    *,
    causal: bool = False,
    score_shift=0.0,
) -> Tokens:
    r"""The un-projected attention mean field at unit tokens `xh`, shape `(n, d)`:

    `drive_k = (1/N_k) Σ_{j ∈ J_k} w_kj V x_j`, with `J_k = {1..n}`, `N_k = n` (full
    attention) or `J_k = {1..k}`, `N_k = k` (causal mask: token k attends to j ≤ k).

    Weights: LSA `w_kj = β<x_k, A x_j>` (evaluated through the moment `M = Σ_j x_j x_jᵀ`,
    or its prefix sums `M_k` when causal: O(n d²)); USA `w_kj = exp(β<x_k, A x_j> − shift)`
    (row maximum factored out); SA `w_kj = N_k softmax_{j ∈ J_k}(β<x_k, A x_j>)`.

    Source: Geshkovski et al., arXiv 2312.10794, eqs. (1.1)–(1.3); causal masking:
    Karagodin, Polyanskiy, Rigollet, *Clustering in causal attention masking*,
    arXiv 2411.04990, eq. (1.2) (softmax; LSA/USA are masked the same way, with the mean
    over the visible prefix).
    """
    n = xh.shape[0]
    if kernel == "lsa":
        xa = xh @ A
        if causal:
            prefix = jnp.cumsum(xh[:, :, None] * xh[:, None, :], axis=0)  # M_k, (n, d, d)
            count = jnp.arange(1, n + 1, dtype=xh.dtype)[:, None]
            return (beta / count) * (jnp.einsum("kd,kde->ke", xa, prefix) @ V.T)
        moment = xh.T @ xh
        return (beta / n) * (xh @ (A @ moment @ V.T))
    s = beta * (xh @ A) @ xh.T
    vx = xh @ V.T
    if causal:
        allowed = jnp.tril(jnp.ones((n, n), bool))
        s = jnp.where(allowed, s, -jnp.inf)
    m = jnp.max(s, axis=1, keepdims=True)
    w = jnp.exp(s - m)  # masked entries are exp(-inf) = 0
    if kernel == "sa":
        return (w @ vx) / jnp.sum(w, axis=1, keepdims=True)
    count = jnp.arange(1, n + 1, dtype=xh.dtype)[:, None] if causal else n
    return jnp.exp(m - score_shift) * (w @ vx) / count


# Token-major evaluation: the state `y = xᵀ`, shape `(d, n)`, one contiguous row of `n`
# numbers per coordinate. The d-sums below are written out over rows (d is small where
# this layout is used, `_solve.token_major_pays`), so that XLA fuses the whole field into
# a few passes over the tokens instead of tiny library dot products with transposes.
_WRITTEN_OUT_D = 4  # moments and products as sums of rows up to this d; dots above


def _row_sum(terms):
    out = terms[0]
    for term in terms[1:]:
        out = out + term
    return out


def unit_columns(y: Float[Array, "d n"]) -> tuple[Float[Array, "d n"], Float[Array, " n"]]:
    """The columns of `y` (tokens, token-major) normalised, and their norms: `normalise`
    and `safe_norm` of `yᵀ`, laid out as `y` (a zero column stays zero)."""
    r = _norm_from_squares(_row_sum([y[a] * y[a] for a in range(y.shape[0])]))
    return y / jnp.where(r > 0, r, 1), r


def _moment_entries(u: Float[Array, "d n"]) -> dict:
    """The entries `M[a, b] = Σ_j u[a, j] u[b, j]` of the moment of tokens stored
    token-major, `d ≤ _WRITTEN_OUT_D`: the d(d+1)/2 row products summed in one reduction
    (one pass over the tokens; as separate sums, each was its own loop and kernel launch
    in XLA's CPU program, twice the time of the whole field at n = 256, d = 2)."""
    d = u.shape[0]
    pairs = [(a, b) for a in range(d) for b in range(a, d)]
    sums = jnp.sum(jnp.stack([u[a] * u[b] for a, b in pairs]), axis=1)
    m = {}
    for i, (a, b) in enumerate(pairs):
        m[a, b] = m[b, a] = sums[i]
    return m


def _lsa_drive_token_major(u, A, V, beta):
    """`attention_drive(uᵀ, A, V, β, "lsa").T` for unit columns `u` of shape `(d, n)`:
    `drive = Bᵀ u` with `B = (β/n) A M Vᵀ`, `M = u uᵀ` (`_moment_entries`). For d ≤ 4 the
    d × d products are written out as scalar sums, which XLA fuses with the pass over the
    tokens (as matrix products they were two more kernel launches per evaluation; about
    1.5× the field's time at n = 256, d = 2, on CPU)."""
    d, n = u.shape
    if d > _WRITTEN_OUT_D:
        return ((beta / n) * (A @ (u @ u.T) @ V.T)).T @ u
    m = _moment_entries(u)
    am = [[_row_sum([A[a, k] * m[k, b] for k in range(d)]) for b in range(d)] for a in range(d)]
    scale = beta / n
    B = [
        [scale * _row_sum([am[a][b] * V[e, b] for b in range(d)]) for e in range(d)]
        for a in range(d)
    ]
    return jnp.stack([_row_sum([B[a][e] * u[a] for a in range(d)]) for e in range(d)])


def normalised_field(xh: Tokens, drive: Tokens, normalisation: str) -> Tokens:
    r"""The velocity of the residual stream for a normalisation scheme, given the attention
    output `drive` read at the unit tokens `xh` (Karagodin, Ge, Polyanskiy, Rigollet,
    *Normalization in attention dynamics*, arXiv 2510.22026, eq. (NA) with the speed
    factors `s_k` of its Table 2; written here as the field of the state `x_k = r_k θ_k`):

    - `"post_ln"` (`s_k = 1`): `dx_k/dt = P⊥_{θ_k} drive_k` — the flow on the sphere;
    - `"pre_ln"` (`s_k = r_k`): `dx_k/dt = drive_k` — the unnormalised residual stream
      whose attention reads `θ_k = x_k/|x_k|`, so that `dθ_k/dt = P⊥_{θ_k} drive_k / r_k`
      and `dr_k/dt = <θ_k, drive_k>` (the radius evolves: state manifold R^d);
    - `"ngpt"` (`s_k = |drive_k|/α`, `α = 1`): `dx_k/dt = P⊥_{θ_k} drive_k / |drive_k|` —
      normalised updates of unit speed at most (a zero drive gives zero velocity).
    """
    if normalisation == "pre_ln":
        return drive
    tangent = project_tangent(xh, drive)
    if normalisation == "ngpt":
        norm = safe_norm(drive, keepdims=True)
        return tangent / jnp.where(norm > 0, norm, 1)
    return tangent


def kernel_rate(A, V, beta, kernel: str, score_shift=0.0, x0=None):
    r"""The natural rate of one head: a bound of the drive's norm.

    LSA `|β| ‖A‖₂ ‖V‖₂`; SA `‖V‖₂`; USA `‖V‖₂ · max_k (1/n) Σ_j exp(β<x_k, A x_j> − shift)`
    at the unit tokens `x0` when given (the sweep's rule: the bound `‖V‖ e^{β‖A‖}`
    overstates typical speeds by orders of magnitude), else `‖V‖₂ exp(|β| ‖A‖₂ − shift)`.
    Non-finite or zero rates are replaced by 1.
    """
    A = jnp.where(jnp.isfinite(A), A, 0)
    V = jnp.where(jnp.isfinite(V), V, 0)
    nV = jnp.linalg.norm(V, ord=2)
    if kernel == "lsa":
        r = jnp.abs(beta) * jnp.linalg.norm(A, ord=2) * nV
    elif kernel == "sa":
        r = nV
    elif x0 is None:
        r = nV * jnp.exp(jnp.abs(beta) * jnp.linalg.norm(A, ord=2) - score_shift)
    else:
        xh = normalise(jnp.where(jnp.isfinite(x0), x0, 0))
        s = beta * (xh @ A) @ xh.T
        r = nV * jnp.max(jnp.mean(jnp.exp(s - score_shift), axis=1))
    return jnp.where(jnp.isfinite(r) & (r > 0), r, 1.0)


def _is_concrete(x) -> bool:
    try:
        np.asarray(x)
    except Exception:
        return False
    return True


def _real_array(where: str, name: str, x):
    """`x` as a JAX array of real numbers, or a `ValueError` naming it: complex weights,
    strings and objects are refused here, not deep inside JAX (a complex A would run and
    give a complex "flow" off the sphere)."""
    if not isinstance(x, jax.Array):
        try:
            kind = np.asarray(x).dtype.kind
        except Exception:  # ragged, or holding traced numbers: JAX decides below
            kind = None
        if kind in ("U", "S"):  # text: refused before JAX reads it as a dtype name
            raise ValueError(f"{where}: {name} is not an array of numbers (it holds text).")
        try:
            x = jnp.asarray(x)  # lists of traced numbers included
        except (TypeError, ValueError) as err:
            raise ValueError(f"{where}: {name} is not an array of numbers ({err}).") from None
    if not (np.dtype(x.dtype).kind in "biu" or jnp.issubdtype(x.dtype, jnp.floating)):
        raise ValueError(f"{where}: {name} must hold real numbers, got dtype {x.dtype}.")
    return x


class Narrowing(NamedTuple):
    """What a cast to a narrower float type changed (`narrowing`): `changed` of `size`
    entries, the largest by the relative `worst` at entry `index` (`before -> after`)."""

    changed: int
    size: int
    worst: float
    index: tuple
    before: float
    after: float


def narrowing(value, dtype) -> Narrowing | None:
    """The entries of a concrete floating `value` that change when it is cast to the
    narrower float `dtype` (float64 to float32 when 64-bit floats are off), or `None`
    when none does (or when the cast does not narrow, or `value` is not concrete).

    The one narrowing check of the package: `AttentionDynamics` (through
    `_asarray_warn_cast`) and the sweeps (`_sweep`) word their warnings from it. NaN stays
    NaN (not a change); an entry that becomes zero or infinite counts as a relative change
    of 1 or inf.
    """
    src = getattr(value, "dtype", None)
    if src is None or not _is_concrete(value):
        return None
    src, dst = np.dtype(src), np.dtype(dtype)
    if not (
        np.issubdtype(src, np.floating)
        and np.issubdtype(dst, np.floating)
        and src.itemsize > dst.itemsize
    ):
        return None
    wide = np.asarray(value, dtype=np.float64)
    narrow = np.asarray(value).astype(dst).astype(np.float64)
    changed = (wide != narrow) & ~(np.isnan(wide) & np.isnan(narrow))
    if not changed.any():
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.abs(narrow - wide) / np.abs(wide)
    worst = float(np.max(np.where(changed, rel, 0)))
    k = np.unravel_index(np.argmax(np.where(changed, rel, -1)), wide.shape) if wide.ndim else ()
    return Narrowing(
        int(changed.sum()), int(wide.size), worst, tuple(int(i) for i in k), wide[k], narrow[k]
    )


def _asarray_warn_cast(where: str, name: str, value):
    """`jnp.asarray(value)`, with a `UserWarning` when a concrete input of a wider float type
    (float64 while JAX runs in float32) is cast down and an entry changes (`narrowing`).

    The warning names the argument, how many entries changed and the largest relative change
    (an entry that becomes zero or infinite counts as a relative change of 1 or inf): e.g.
    `A = I + 1e-12 E` in float32 is `I`, the perturbation is gone.

    **Raises:** `ValueError` naming the argument if it is not an array of real numbers
    (complex, strings, objects).
    """
    arr = _real_array(where, name, value)
    if not jnp.issubdtype(arr.dtype, jnp.floating):
        return arr
    lost = narrowing(value, arr.dtype)
    if lost is not None:
        src = np.dtype(value.dtype).name
        warn_at_caller(
            f"{where}: {name} was given as {src} and cast to {np.dtype(arr.dtype).name} "
            f"(64-bit floats are disabled in JAX): {lost.changed} of {lost.size} entries "
            f"changed, the largest by a relative {lost.worst:.3g} (entry {lost.index}: "
            f"{lost.before!r} -> {lost.after!r}). Enable float64 (jax.enable_x64) or cast "
            f"{name} yourself to silence this."
        )
    return arr


def _refuse_nonfinite(where: str, **arrays) -> None:
    """**Raises:** `ValueError` naming the first concrete array of `arrays` (a `None` is
    skipped) with a NaN or infinite entry; traced ones cannot be checked here."""
    for name, m in arrays.items():
        if m is not None and _is_concrete(m) and not np.all(np.isfinite(np.asarray(m))):
            raise ValueError(f"{where}: {name} has non-finite entries (NaN or inf).")


def check_causal(where: str, causal) -> bool:
    """`causal` as a bool; **raises** `ValueError` naming `where` for anything but a bool
    (`"yes"` or `2` would otherwise read as `True`)."""
    if not isinstance(causal, (bool, np.bool_)):
        raise ValueError(f"{where}: causal must be True or False, got {causal!r}.")
    return bool(causal)


class AttentionDynamics(eqx.Module):
    r"""Vector field of self-attention dynamics on the unit sphere S^{d-1}.

    $$\dot x_k = P^\perp_{x_k}\Big(\frac1n\sum_{j=1}^n w_{kj}\, V x_j\Big),\qquad
    P^\perp_x v = v - \langle x, v\rangle x,$$

    with the attention weights

    - `kernel="lsa"` (linear self-attention): `w_kj = β <x_k, A x_j>`;
    - `kernel="usa"` (unnormalised softmax): `w_kj = exp(β <x_k, A x_j> − score_shift)`;
    - `kernel="sa"` (softmax): `w_kj = n exp(β<x_k, A x_j>) / Σ_l exp(β<x_k, A x_l>)`.

    LSA is evaluated through the moment `M = XᵀX` as `F = (β/n) X A M Vᵀ` in O(n d²).
    USA and SA are evaluated with the row maximum of the scores factored out. For USA the
    factor `exp(max_j s_kj − score_shift)` is bounded on the sphere by
    `exp(β σ_max(A) − score_shift)`; `simulate` checks that bound against the floating
    range before solving. A nonzero `score_shift` rescales time by `exp(score_shift)`
    (same orbits, `t_physical = t · exp(−score_shift)`), which is how scores past the
    range of `exp` (≈ 88 in float32) are integrated.

    The field is evaluated at `x_k/|x_k|`, so it is homogeneous of degree zero and the
    norm of every token is an exact invariant of the continuous flow.

    **Arguments:**

    - `A`: the bilinear form `QᵀK`, shape `(d, d)`.
    - `V`: the value matrix, shape `(d, d)`.
    - `beta`: inverse temperature β > 0 (a scalar; differentiable). β ≤ 0 is refused.
    - `kernel`: one of `"lsa"`, `"usa"`, `"sa"`.
    - `score_shift`: USA only, the constant subtracted from every score (time rescaling).
    - `causal`: mask the attention so that token `k` attends to `j ≤ k` only (the mean is
      then over the visible prefix, `1/k` instead of `1/n`; LSA stays O(n d²) through the
      prefix moments). Karagodin, Polyanskiy, Rigollet, arXiv 2411.04990, eq. (1.2).
    - `normalisation`: `"post_ln"` (default, the flow on the sphere above), `"pre_ln"`
      (`dx_k/dt = drive_k(x/|x|)`, the unnormalised residual stream; the token norms
      evolve and the state manifold is R^d) or `"ngpt"` (`dx_k/dt = P⊥ drive_k/|drive_k|`),
      following arXiv 2510.22026, eq. (NA) and Table 2; see `normalised_field`.

    `__call__(t, x, args)` takes tokens `x` of shape `(n, d)` and returns `dx/dt`, same shape.
    `manifold` is `"euclidean"` for Pre-LN and `"sphere"` otherwise (the flow protocol, see
    the module docstring); `natural_rate(x0)` bounds the speed.

    **Raises:** `ValueError` if `A` or `V` is not square `(d, d)` with `d ≥ 2`, if their
    sizes differ, if the kernel or normalisation is unknown, if concrete `A`, `V`, `beta`
    are not finite, if a concrete `beta ≤ 0`, or if a concrete `score_shift` is not a
    finite scalar or is nonzero for a kernel other than USA. A `UserWarning` if a float64
    input is cast to float32 (JAX without float64) and an entry changes (e.g.
    `I + 1e-12 E` becomes `I`).

    Source: Li et al., *On the Diverse Dynamical Behaviors Arising in Deep Linear
    Transformers* (2026), eq. (1); Geshkovski et al., arXiv 2312.10794, eqs. (1.1)–(1.3).
    """

    A: Matrix
    V: Matrix
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
        score_shift=0.0,
        causal: bool = False,
        normalisation: str = "post_ln",
    ):
        where = "AttentionDynamics"
        A = _asarray_warn_cast(where, "A", A)
        V = _asarray_warn_cast(where, "V", V)
        beta = _asarray_warn_cast(where, "beta", beta)
        score_shift = _asarray_warn_cast(where, "score_shift", score_shift)
        dtype = jnp.result_type(A, V, float)
        self.A = A.astype(dtype)
        self.V = V.astype(dtype)
        self.beta = jnp.asarray(beta, dtype=dtype)
        self.score_shift = jnp.asarray(score_shift, dtype=dtype)
        self.kernel = kernel
        self.causal = check_causal(where, causal)
        self.normalisation = normalisation

    def __check_init__(self):
        if self.kernel not in KERNELS:
            raise ValueError(
                f"AttentionDynamics: kernel must be one of {KERNELS}, got {self.kernel!r}."
            )
        if self.normalisation not in NORMALISATIONS:
            raise ValueError(
                f"AttentionDynamics: normalisation must be one of {NORMALISATIONS}, got "
                f"{self.normalisation!r}."
            )
        for name, m in (("A", self.A), ("V", self.V)):
            if m.ndim != 2 or m.shape[0] != m.shape[1] or m.shape[0] < 2:
                raise ValueError(
                    f"AttentionDynamics: {name} must be a square (d, d) matrix with d >= 2, "
                    f"got shape {m.shape}."
                )
        if self.A.shape != self.V.shape:
            raise ValueError(
                f"AttentionDynamics: A and V must have the same shape, got A {self.A.shape} "
                f"and V {self.V.shape}."
            )
        if self.beta.ndim != 0:
            raise ValueError(
                f"AttentionDynamics: beta must be a scalar, got shape {self.beta.shape}."
            )
        _refuse_nonfinite("AttentionDynamics", A=self.A, V=self.V, beta=self.beta)
        if self.score_shift.ndim != 0:
            raise ValueError(
                f"AttentionDynamics: score_shift must be a scalar, got shape "
                f"{self.score_shift.shape}."
            )
        if _is_concrete(self.score_shift):
            shift = float(np.asarray(self.score_shift))
            if not math.isfinite(shift):
                raise ValueError(
                    f"AttentionDynamics: score_shift must be a finite number, got {shift}."
                )
            if shift != 0 and self.kernel != "usa":
                # only the USA weights exp(beta s - score_shift) read it
                raise ValueError(
                    f"AttentionDynamics: score_shift applies to the USA kernel only, got "
                    f"score_shift={shift:g} with kernel {self.kernel!r}."
                )
        # One policy for β everywhere: an inverse temperature, β > 0. (β < 0 is not a
        # "repulsive" variant with a meaning of its own: for LSA it is the flow of −A, for
        # SA a softmax that favours the least aligned tokens; pass −A for the former.)
        # A traced β ≤ 0 (inside jit/vmap, e.g. a swept β) makes `simulate` report
        # `RESULTS.nonpositive_beta` for that member instead.
        if _is_concrete(self.beta) and not np.all(np.asarray(self.beta) > 0):
            raise ValueError(
                f"AttentionDynamics: beta is an inverse temperature and must be > 0, got "
                f"{np.asarray(self.beta).tolist()} (for LSA, beta < 0 is the flow of -A: "
                f"pass -A instead)."
            )

    @property
    def d(self) -> int:
        return self.A.shape[0]

    @property
    def manifold(self) -> str:
        """`"euclidean"` for Pre-LN (the token norms evolve), else `"sphere"`."""
        return "euclidean" if self.normalisation == "pre_ln" else "sphere"

    def natural_rate(self, x0: Tokens | None = None) -> Float[Array, ""]:
        """A bound of the speed (see `kernel_rate`; 1 for nGPT, whose speed is at most 1)."""
        if self.normalisation == "ngpt":
            return jnp.ones((), self.A.dtype)
        return kernel_rate(self.A, self.V, self.beta, self.kernel, self.score_shift, x0)

    def scores(self, x: Tokens) -> Float[Array, "n n"]:
        """Scores `s_kj = β <x_k, A x_j>` at the normalised tokens, shape `(n, n)`."""
        xh = normalise(x)
        return self.beta * (xh @ self.A) @ xh.T

    def drive(self, x: Tokens) -> Tokens:
        """The un-projected mean field `(1/n) Σ_j w_kj V x_j` at `x/|x|` (the sum over
        `j ≤ k` divided by `k` when causal), shape `(n, d)`."""
        return attention_drive(
            normalise(x),
            self.A,
            self.V,
            self.beta,
            self.kernel,
            causal=self.causal,
            score_shift=self.score_shift,
        )

    def __call__(self, t, x: Tokens, args=None) -> Tokens:
        del t, args
        return normalised_field(normalise(x), self.drive(x), self.normalisation)

    def token_major(self, t, y: Float[Array, "d n"], args=None) -> Float[Array, "d n"]:
        """`dx/dt` of the token-major state `y = xᵀ` (shape `(d, n)`), laid out as `y`: the
        same field as `__call__(t, yᵀ).T`, to rounding. LSA without a causal mask is
        evaluated on the rows of `y` (one pass over the tokens per coordinate; at n = 1024,
        d = 2 about 3× faster than through the transposes); other kernels transpose."""
        if self.kernel != "lsa" or self.causal:
            return self(t, y.T, args).T
        del t, args
        u, _ = unit_columns(y)
        drive = _lsa_drive_token_major(u, self.A, self.V, self.beta)
        if self.normalisation == "pre_ln":
            return drive
        along = _row_sum([u[a] * drive[a] for a in range(u.shape[0])])
        tangent = drive - along * u
        if self.normalisation == "ngpt":
            _, norm = unit_columns(drive)
            return tangent / jnp.where(norm > 0, norm, 1)
        return tangent

    def direct_sum(self, x: Tokens) -> Tokens:
        """Reference O(n² d) evaluation of the field (pairwise weights), for checks."""
        xh = normalise(x)
        n = xh.shape[0]
        s = self.beta * (xh @ self.A) @ xh.T
        if self.causal:
            allowed = np.tril(np.ones((n, n), bool))
            count = jnp.arange(1, n + 1, dtype=xh.dtype)[:, None]
        else:
            allowed = np.ones((n, n), bool)
            count = n
        if self.kernel == "lsa":
            w = s
        elif self.kernel == "usa":
            w = jnp.exp(s - self.score_shift)
        else:
            e = jnp.where(allowed, jnp.exp(s - jnp.max(s, axis=1, keepdims=True)), 0)
            w = count * e / jnp.sum(e, axis=1, keepdims=True)
        w = jnp.where(allowed, w, 0)
        drive = jnp.einsum("kj,jd->kd", w, xh @ self.V.T) / count
        return normalised_field(xh, drive, self.normalisation)

    def score_bound(self) -> Float[Array, ""]:
        """Upper bound `β σ_max(A)` of every score on the sphere (|<x, A y>| ≤ σ_max(A))."""
        return jnp.abs(self.beta) * jnp.linalg.norm(self.A, ord=2)
