"""The collapse mechanism of PLGA, measured: rotary twirl, statistical concentration and
row-map contraction.

The PLGA paper explains why a trained `G_LM` stops depending on its input with three stages,
stated as hypotheses:

1. **Rotary twirl.** RoPE rotates query `s` by `R(p_s)`, so the density operator
   `D = Σ_s q̃_sᵀ q̃_s = Σ_s R(p_s) q_sᵀ q_s R(p_s)ᵀ` is a position average of rotated
   matrices: its components outside the commutant of the RoPE rotations (the block-diagonal
   matrices whose 2×2 pair blocks are complex scalars, `rope_commutant_projection`) turn with
   frequencies `θ_i ± θ_j` and partly cancel.
2. **Statistical concentration.** `D/S` is an empirical second moment over `S` positions; a
   law of large numbers (matrix Bernstein) makes it concentrate around a dataset-level mean at
   the rate `S^{−1/2}`.
3. **Row-map contraction.** The metric learner `φ: R^{dk} → R^{dk}` (applied to every row of
   `LN(D)`) is contractive on the rows it visits, squeezing the concentrated inputs to one
   output profile.

`twirl_audit`, `concentration_audit` and `contraction_audit` measure each stage on any
PLDR-LLM and any prompts; the array-level pieces (`density_concentration`,
`row_map_spectral_norm`) act on plain arrays and learners. Everything is jit-compiled once per
shape; call inside `with jax.enable_x64(True):` for float64 without touching the global
setting.

Source: Gokden, *Power law graph attention: exact generalization of scaled dot-product
attention, empirical collapse at inference* (2026), the collapse mechanism; PLDR-LLM, arXiv
2410.16703 and 2502.13502; docs/theory/plga.md, steps 1–3.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Int, PRNGKeyArray

from ._audits import _check_batch_ids, _safe_div, _safe_sqrt, _wide, rope_commutant_residual
from ._metric_learner import MetricLearner

__all__ = [
    "TwirlAudit",
    "ConcentrationAudit",
    "ContractionAudit",
    "default_lengths",
    "layer_densities",
    "twirl_audit",
    "density_concentration",
    "concentration_audit",
    "row_map_spectral_norm",
    "contraction_audit",
    "mechanism_audits",
    "mechanism_table",
]


# ============================================================================= densities


def default_lengths(seq: int, num: int = 6, *, smallest: int = 4) -> np.ndarray:
    """A geometric grid of prefix lengths `smallest … seq` (distinct integers, `seq` last)."""
    seq = int(seq)
    if seq < 1:
        raise ValueError(f"default_lengths: `seq` must be ≥ 1, got {seq}.")
    lo = min(int(smallest), seq)
    return np.unique(np.round(np.geomspace(lo, seq, int(num))).astype(int))


def _check_plga(model, fn: str) -> None:
    if any(layer.attn.attention != "plga" for layer in model.layers):
        raise ValueError(f"{fn}: the model has SDPA layers (no density operator, no learner).")


def _check_lengths(lengths, seq: int, fn: str) -> Array:
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or lengths.size == 0 or lengths.dtype.kind not in "iu":
        raise ValueError(f"{fn}: `lengths` must be a non-empty 1-D integer array, got {lengths!r}.")
    if lengths.min() < 1 or lengths.max() > seq:
        raise ValueError(
            f"{fn}: every entry of `lengths` must lie in [1, {seq}] (the prompt length), got "
            f"{lengths.tolist()}."
        )
    return jnp.asarray(lengths, jnp.int32)


def _prefix_densities(model, ids, length):
    """Per layer the density operators of the first `length` positions of `ids`, before and
    after RoPE, and the learner input `LN(D)`: three arrays `(layers, heads, dk, dk)`.

    The model runs on the whole buffer with the positions `≥ length` removed from the density
    operator and masked as keys, so every valid position sees exactly the model run on the
    prefix (one compilation serves every length)."""
    seq = ids.shape[0]
    pos = jnp.arange(seq)
    valid = pos < length
    allowed = jnp.tril(jnp.ones((seq, seq), bool)) & (valid & (ids != model.config.pad_id))[None]
    x = model.embed(ids)
    before, after, learner_in = [], [], []
    for layer in model.layers:
        attn = layer.attn
        hi = jnp.promote_types(x.dtype, jnp.float32)
        w = valid.astype(hi)[:, None, None]
        q_raw = attn.wq(x).reshape(seq, attn.num_heads, attn.head_dim).astype(hi)
        q, _, _ = attn.project(x, pos)
        qf = q.astype(hi)
        d_pre = jnp.einsum("shm,shn->hmn", q_raw * w, q_raw)
        d_post = jnp.einsum("shm,shn->hmn", qf * w, qf)
        before.append(d_pre)
        after.append(d_post)
        learner_in.append(attn.gram_norm(d_post))
        # the layer itself, through the model's own forward (one layer at a time)
        one = eqx.tree_at(lambda m: m.layers, model, [layer])
        x, _, _ = one.run_layers(
            x, allowed=allowed, positions=pos, G=[None], density_weights=valid.astype(x.dtype)
        )
    return jnp.stack(before), jnp.stack(after), jnp.stack(learner_in)


@eqx.filter_jit
def _densities_batch(model, ids, lengths):
    per_length = jax.vmap(_prefix_densities, in_axes=(None, None, 0))
    return jax.vmap(per_length, in_axes=(None, 0, None))(model, ids, lengths)


def layer_densities(
    model, ids: Int[ArrayLike, "prompts seq"], *, lengths=None
) -> tuple[Array, Array, Array]:
    """The density operators a PLDR-LLM forms on prefixes of its prompts.

    For prompt `p`, prefix length `S` and layer `l`, with `q_s` the layer's biased query rows
    of head `h` and `q̃_s` the same rows after RoPE (docs/theory/plga.md, steps 1–2):
    `D_pre = Σ_{s<S} q_sᵀ q_s`, `D = Σ_{s<S} q̃_sᵀ q̃_s`, and the learner input `LN(D)`. Each
    prefix is the model run on those `S` tokens alone (the later positions are dropped from the
    density operator and masked as keys), so deeper layers see the prefix's own inputs.

    **Arguments:** `model` (a `PLDRLLM` with PLGA layers); `ids` `(prompts, seq)`; `lengths`
    (default `default_lengths(seq)`), integers in `[1, seq]`.

    **Returns:** `(D_pre, D, LN(D))`, each `(prompts, len(lengths), layers, heads, dk, dk)`, in
    `promote(model dtype, float32)`.

    **Raises:** `ValueError` for bad ids or lengths, or a model with SDPA layers.
    """
    _check_plga(model, "layer_densities")
    ids = _check_batch_ids(model, ids, "layer_densities")
    if lengths is None:
        lengths = default_lengths(ids.shape[1])
    lengths = _check_lengths(lengths, ids.shape[1], "layer_densities")
    return _densities_batch(model, ids, lengths)


# ============================================================================= twirl


class TwirlAudit(eqx.Module):
    """How much of the density operator lies outside the RoPE commutant, before and after RoPE.

    - `lengths` `(S,)`: prefix lengths;
    - `residual_before`, `residual_after` `(prompts, S, layers, heads)`:
      `‖D − Π D‖_F / ‖D‖_F` (`rope_commutant_residual`) of `D_pre = Σ qᵀq` and of
      `D = Σ q̃ᵀq̃`; 0 means `D` commutes with every RoPE rotation;
    - `rope` (static): the pairing.
    """

    lengths: Int[Array, " S"]
    residual_before: Float[Array, "prompts S layers heads"]
    residual_after: Float[Array, "prompts S layers heads"]
    rope: str = eqx.field(static=True)

    def summary(self) -> dict:
        """Host values: per length, layer and head the median over prompts of both residuals,
        and the mean over heads of the ratio after/before (the twirl's suppression)."""
        b, a = np.asarray(self.residual_before), np.asarray(self.residual_after)
        ratio = np.where(b > 0, a / np.where(b > 0, b, 1), 0.0)
        return {
            "lengths": np.asarray(self.lengths).tolist(),
            "residual_before_median": np.median(b, axis=0).tolist(),
            "residual_after_median": np.median(a, axis=0).tolist(),
            "after_over_before_mean": np.median(ratio, axis=0).mean(axis=-1).tolist(),
        }


@eqx.filter_jit
def _residuals(d_pre, d_post, rope):
    return rope_commutant_residual(d_pre, rope=rope), rope_commutant_residual(d_post, rope=rope)


def twirl_audit(
    model, ids: Int[ArrayLike, "prompts seq"], *, lengths=None, rope: str | None = None
) -> TwirlAudit:
    """Stage 1 of the collapse mechanism: the rotary twirl of the density operator.

    RoPE gives `D = Σ_s R(p_s) q_sᵀ q_s R(p_s)ᵀ`. Split any `M` into its RoPE-commutant part
    `Π M` and the rest: the rest of the pair block `(i, j)` turns by `e^{i p (θ_i − θ_j)}`
    (complex-linear part) and `e^{−i p (θ_i + θ_j)}` (anti-linear part) with the position `p`,
    so a position average suppresses it — by about `1/(S|θ_i ± θ_j|)` for stationary queries,
    except for the slowest pairs (`θ = base^{−2i/dk}` down to `≈ 1e−4`), which do not turn
    within a context. This audit measures `‖D − ΠD‖_F/‖D‖_F` per layer and head for `D_pre`
    (without RoPE) and `D` (with RoPE) at each prefix length.

    **Arguments:** `model` (a `PLDRLLM` with PLGA layers); `ids` `(prompts, seq)`; `lengths`
    (default `default_lengths(seq)`); `rope` (default the model's pairing).

    **Returns:** a `TwirlAudit`.

    **Raises:** `ValueError` for bad ids/lengths, an unknown `rope`, or SDPA layers.

    Source: Gokden, PLGA (2026), collapse mechanism, stage 1; RoPE: Su et al., arXiv 2104.09864.
    """
    rope = model.config.rope if rope is None else rope
    if rope not in ("interleaved", "half"):
        raise ValueError(f"twirl_audit: `rope` must be 'interleaved' or 'half', got {rope!r}.")
    ids = jnp.asarray(ids)
    if lengths is None and ids.ndim == 2:
        lengths = default_lengths(ids.shape[1])
    d_pre, d_post, _ = layer_densities(model, ids, lengths=lengths)
    before, after = _residuals(d_pre, d_post, rope)
    return TwirlAudit(jnp.asarray(lengths, jnp.int32), before, after, rope)


# ============================================================================= concentration


class ConcentrationAudit(eqx.Module):
    """Concentration of the normalised density operator across prompts.

    With `D̂_p(S) = D_p(S)/S` for prompt `p` and `D̄(S)` its mean over prompts:

    - `lengths` `(S,)`;
    - `deviation` `(prompts, S, *batch)`: `‖D̂_p − D̄‖_F / ‖D̄‖_F`;
    - `spread` `(S, *batch)`: `√(mean_p ‖D̂_p − D̄‖²_F) / ‖D̄‖_F`;
    - `band` `(S, *batch, 2)`: 2.5 % and 97.5 % quantiles of `spread` under the Bayesian
      bootstrap over prompts (Dirichlet(1, …, 1) prompt weights; Rubin 1981), which, unlike
      resampling with replacement, never collapses to a single prompt when there are few;
    - `exponent` `(*batch)`: least-squares slope of `log spread` against `log S` (the law of
      large numbers gives `−1/2`); `exponent_ci` `(*batch, 2)`: its bootstrap 95 % interval.
    - `learner_input_spread`, `learner_input_exponent`: the same for `LN(D)` (the rows the
      metric learner sees; `LN` is scale-free, so `LN(D) = LN(D/S)`); `None` for arrays.
    """

    lengths: Int[Array, " S"]
    deviation: Float[Array, "prompts S *batch"]
    spread: Float[Array, " S *batch"]
    band: Float[Array, "S *batch 2"]
    exponent: Float[Array, "*batch"]
    exponent_ci: Float[Array, "*batch 2"]
    learner_input_spread: Float[Array, " S *batch"] | None = None
    learner_input_exponent: Float[Array, "*batch"] | None = None

    def summary(self) -> dict:
        """Host values: lengths, spread and band, exponent and its interval."""
        out = {
            "lengths": np.asarray(self.lengths).tolist(),
            "spread": np.asarray(self.spread).tolist(),
            "band": np.asarray(self.band).tolist(),
            "exponent": np.asarray(self.exponent).tolist(),
            "exponent_ci": np.asarray(self.exponent_ci).tolist(),
        }
        if self.learner_input_spread is not None:
            out["learner_input_spread"] = np.asarray(self.learner_input_spread).tolist()
            out["learner_input_exponent"] = np.asarray(self.learner_input_exponent).tolist()
        return out


def _spread(x, weights):
    """`√(Σ_p w_p‖x_p − x̄‖²/Σw) / ‖x̄‖` over the leading prompt axis (`x̄` the weighted mean),
    and the per-prompt deviations; the last two axes are the matrix."""
    w = weights / jnp.sum(weights)
    wb = w.reshape(w.shape + (1,) * (x.ndim - 1))
    mean = jnp.sum(wb * x, axis=0)
    dev2 = jnp.sum(jnp.square(x - mean), axis=(-2, -1))
    norm = _safe_sqrt(jnp.sum(jnp.square(mean), axis=(-2, -1)))
    wd = w.reshape(w.shape + (1,) * (dev2.ndim - 1))
    spread = _safe_div(_safe_sqrt(jnp.sum(wd * dev2, axis=0)), norm)
    return spread, _safe_div(_safe_sqrt(dev2), norm)


def _slope(log_s, y):
    """Least-squares slope of `y` (leading axis = lengths) against `log_s`."""
    xc = log_s - jnp.mean(log_s)
    xc = xc.reshape(xc.shape + (1,) * (y.ndim - 1))
    yc = y - jnp.mean(y, axis=0)
    return jnp.sum(xc * yc, axis=0) / jnp.sum(xc * xc, axis=0)


BOOTSTRAP_CHUNK = 8
"""`density_concentration` draws its bootstrap resamples this many at a time (working memory of
`BOOTSTRAP_CHUNK` resamples, not of all `num_bootstrap`)."""


@eqx.filter_jit
def _concentration(densities, lengths, key, num_bootstrap):
    d = _wide(densities)
    s = lengths.astype(d.dtype)
    d = d / s.reshape((1, -1) + (1,) * (d.ndim - 2))
    c = jax.lax.stop_gradient(jnp.max(jnp.abs(d)))
    d = d / jnp.where(c > 0, c, 1)
    P = d.shape[0]
    spread, deviation = _spread(d, jnp.ones((P,), d.dtype))
    log_s = jnp.log(s)
    log_floor = jnp.log(jnp.finfo(d.dtype).tiny)
    logsp = lambda v: jnp.log(jnp.maximum(v, jnp.exp(log_floor)))
    exponent = _slope(log_s, logsp(spread))

    def boot(k):  # Bayesian bootstrap: Dirichlet(1, …, 1) weights on the prompts
        sp, _ = _spread(d, jax.random.dirichlet(k, jnp.ones((P,), d.dtype)))
        return sp, _slope(log_s, logsp(sp))

    # A few resamples at a time: one vmap over all of them would hold `num_bootstrap` copies of
    # the deviations `d − d̄` (prompts · lengths · batch · dk² each) at once.
    keys = jax.random.split(key, num_bootstrap)
    sp_b, ex_b = jax.lax.map(boot, keys, batch_size=min(BOOTSTRAP_CHUNK, num_bootstrap))
    q = jnp.asarray([0.025, 0.975], d.dtype)
    band = jnp.moveaxis(jnp.quantile(sp_b, q, axis=0), 0, -1)
    ci = jnp.moveaxis(jnp.quantile(ex_b, q, axis=0), 0, -1)
    return spread, deviation, band, exponent, ci


def density_concentration(
    densities: Float[ArrayLike, "prompts S *batch dk dk"],
    lengths: Int[ArrayLike, " S"],
    *,
    key: PRNGKeyArray | None = None,
    num_bootstrap: int = 200,
) -> ConcentrationAudit:
    """Concentration of density operators across prompts against the number of positions.

    `D̂_p(S) = D_p(S)/S` (the empirical second moment of prompt `p` over `S` positions);
    `spread(S) = √(mean_p ‖D̂_p − D̄‖²_F)/‖D̄‖_F`, `D̄` the mean over prompts. For rows drawn
    i.i.d. from `N(0, C)`, `E ‖D̂ − C‖²_F = (tr C² + (tr C)²)/S`, so the spread falls as
    `S^{−1/2}`; the fitted `exponent` is the least-squares slope of `log spread` on `log S`,
    with a Bayesian-bootstrap interval over prompts (Dirichlet(1, …, 1) prompt weights, the
    same weights at every length, so a common factor does not move the slope).

    **Arguments:** `densities` `(prompts, S, ..., dk, dk)`: the summed (not yet divided)
    density operators over the first `lengths[i]` positions; `lengths` `(S,)` positive and
    increasing, at least two; `key` for the bootstrap (default `jax.random.key(0)`);
    `num_bootstrap` resamples.

    **Returns:** a `ConcentrationAudit` (without the learner-input fields).

    **Raises:** `ValueError` for fewer than 2 prompts or 2 lengths, mismatched shapes, or
    non-increasing lengths.

    Source: Gokden, PLGA (2026), collapse mechanism, stage 2 (matrix Bernstein); Tropp, *An
    introduction to matrix concentration inequalities*, arXiv 1501.01571, Thm. 6.1.1.
    """
    densities = jnp.asarray(densities)
    lengths_np = np.asarray(lengths)
    if densities.ndim < 4 or densities.shape[-1] != densities.shape[-2]:
        raise ValueError(
            "density_concentration: `densities` must have shape (prompts, S, ..., dk, dk), "
            f"got {densities.shape}."
        )
    if densities.shape[0] < 2:
        raise ValueError(
            f"density_concentration: need at least 2 prompts, got {densities.shape[0]}."
        )
    if lengths_np.shape != (densities.shape[1],) or lengths_np.size < 2:
        raise ValueError(
            "density_concentration: `lengths` must have shape (S,) with S ≥ 2 matching "
            f"densities.shape[1] = {densities.shape[1]}, got {lengths_np.shape}."
        )
    if np.any(lengths_np <= 0) or np.any(np.diff(lengths_np) <= 0):
        raise ValueError(
            f"density_concentration: `lengths` must be positive and increasing, got "
            f"{lengths_np.tolist()}."
        )
    if int(num_bootstrap) < 2:
        raise ValueError(
            f"density_concentration: `num_bootstrap` must be ≥ 2, got {num_bootstrap}."
        )
    key = jax.random.key(0) if key is None else key
    spread, deviation, band, exponent, ci = _concentration(
        densities, jnp.asarray(lengths_np), key, int(num_bootstrap)
    )
    return ConcentrationAudit(jnp.asarray(lengths_np), deviation, spread, band, exponent, ci)


def concentration_audit(
    model,
    ids: Int[ArrayLike, "prompts seq"],
    *,
    lengths=None,
    key: PRNGKeyArray | None = None,
    num_bootstrap: int = 200,
) -> ConcentrationAudit:
    """Stage 2 of the collapse mechanism: concentration of `D/S` across prompts.

    Runs `layer_densities` on prefixes of the prompts and applies `density_concentration` to
    the RoPE'd density operators (batch axes `(layers, heads)`); also reports the spread and
    exponent of the learner input `LN(D)`. Real text is not i.i.d.: an exponent above `−1/2`
    (slower concentration) measures long-range correlation of the queries; one near 0 means no
    concentration within the context.

    **Arguments:** `model`; `ids` `(prompts, seq)`, at least 2 prompts; `lengths` (default
    `default_lengths(seq)`, at least 2); `key`, `num_bootstrap` as `density_concentration`.

    **Returns:** a `ConcentrationAudit` with batch axes `(layers, heads)`.

    **Raises:** `ValueError` as `layer_densities` and `density_concentration`.

    Source: Gokden, PLGA (2026), collapse mechanism, stage 2.
    """
    ids = jnp.asarray(ids)
    if lengths is None and ids.ndim == 2:
        lengths = default_lengths(ids.shape[1])
    _, d_post, ln = layer_densities(model, ids, lengths=lengths)
    audit = density_concentration(d_post, lengths, key=key, num_bootstrap=num_bootstrap)
    # LN(D) is already normalised: undo the division by S of density_concentration.
    s = jnp.asarray(lengths, ln.dtype).reshape((1, -1) + (1,) * (ln.ndim - 2))
    ln_audit = density_concentration(ln * s, lengths, key=key, num_bootstrap=2)
    return ConcentrationAudit(
        audit.lengths,
        audit.deviation,
        audit.spread,
        audit.band,
        audit.exponent,
        audit.exponent_ci,
        learner_input_spread=ln_audit.spread,
        learner_input_exponent=ln_audit.exponent,
    )


# ============================================================================= contraction


class ContractionAudit(eqx.Module):
    """Spectral norms of the Jacobian of the metric learner's row map at visited rows.

    - `norm` `(layers, rows)`: `‖∂φ/∂r‖₂` of the whole learner `φ` at each row `r` of `LN(D)`;
    - `unit_norms` `(layers, rows, units)`: `‖∂u_k/∂h‖₂` of each residual unit `u_k` at its own
      input `h_k = u_{k−1}(…u_1(r))`;
    - `product_bound` `(layers, rows)`: `Π_k unit_norms`, an upper bound of `norm` (chain rule);
    - `rayleigh_residual` `(layers, rows)`: `‖JᵀJv − σ²v‖/σ²` at the returned vector (0 at an
      exact singular pair; 0 also for a zero Jacobian), the convergence check of the power
      iteration;
    - `num_iterations` (static).

    `norm < 1` on the visited rows is the contraction of stage 3.
    """

    norm: Float[Array, "layers rows"]
    unit_norms: Float[Array, "layers rows units"]
    product_bound: Float[Array, "layers rows"]
    rayleigh_residual: Float[Array, "layers rows"]
    num_iterations: int = eqx.field(static=True)

    def summary(self) -> dict:
        """Host values per layer: the distribution of `norm` and `product_bound`, the fraction
        of rows where `φ` contracts (`norm < 1`), the median of each unit's norm and the
        largest Rayleigh residual."""
        from ._audits import summarise

        n, pb = np.asarray(self.norm), np.asarray(self.product_bound)
        u = np.asarray(self.unit_norms)
        return {
            "norm": [summarise(x) for x in n],
            "product_bound": [summarise(x) for x in pb],
            "contracting_fraction": np.mean(n < 1, axis=-1).tolist(),
            "unit_norm_median": np.median(u, axis=1).tolist(),
            "max_rayleigh_residual": np.max(np.asarray(self.rayleigh_residual), axis=-1).tolist(),
        }


def _power_norm(f, x, v0, num_iterations):
    """`‖∂f/∂x‖₂` by power iteration on `JᵀJ` (one JVP and one VJP per step), with the
    Rayleigh residual of the final vector. A zero Jacobian gives exactly 0."""
    _, jvp = jax.linearize(f, x)
    vjp = jax.linear_transpose(jvp, x)

    def gram(v):
        return vjp(jvp(v))[0]

    def unit(w):
        n = _safe_sqrt(jnp.sum(w * w))
        return _safe_div(w, n)

    v = jax.lax.fori_loop(0, num_iterations, lambda _, v: unit(gram(v)), unit(v0))
    sigma2 = jnp.sum(jnp.square(jvp(v)))
    res = _safe_div(_safe_sqrt(jnp.sum(jnp.square(gram(v) - sigma2 * v))), sigma2)
    return _safe_sqrt(sigma2), res


def _split_units(learner: MetricLearner) -> MetricLearner:
    """The learner as a stack of one-unit learners (leading axis = unit)."""
    arrays, static = eqx.partition(learner, eqx.is_array)
    arrays = jax.tree.map(lambda a: a[:, None], arrays)
    return eqx.combine(arrays, static)


def _row_norms(learner, rows, keys, num_iterations):
    units = _split_units(learner)

    def one(r, k):
        ku, kw = jax.random.split(k)
        norm, res = _power_norm(learner, r, jax.random.normal(kw, r.shape, r.dtype), num_iterations)

        def step(h, u):
            return u(h), h

        _, inputs = jax.lax.scan(step, r, units)  # h_k, the input of unit k

        def unit_norm(u, h, kk):
            return _power_norm(u, h, jax.random.normal(kk, h.shape, h.dtype), num_iterations)[0]

        n_units = inputs.shape[0]
        un = eqx.filter_vmap(unit_norm)(units, inputs, jax.random.split(ku, n_units))
        return norm, un, res

    return jax.vmap(one)(rows, keys)


@eqx.filter_jit
def _row_norms_jit(learner, rows, keys, num_iterations):
    return _row_norms(learner, rows, keys, num_iterations)


def row_map_spectral_norm(
    learner: MetricLearner,
    rows: Float[ArrayLike, "rows dk"],
    *,
    key: PRNGKeyArray,
    num_iterations: int = 60,
) -> tuple[Array, Array, Array]:
    """Spectral norm of the Jacobian of a metric learner's row map at given rows, by power
    iteration (`JᵀJ` applied through one JVP and one VJP per step; no dense Jacobian).

    **Arguments:** `learner` (a `MetricLearner`, `φ: R^{dk} → R^{dk}`); `rows` `(rows, dk)`;
    `key` for the random start vectors; `num_iterations` power steps (the error of `σ₁` falls
    like `(σ₂/σ₁)^{2·num_iterations}`).

    **Returns:** `(norm (rows,), unit_norms (rows, units), rayleigh_residual (rows,))`, see
    `ContractionAudit`.

    **Raises:** `ValueError` if `rows` is not `(rows, dk)` or `num_iterations < 1`.

    Source: Gokden, PLGA (2026), collapse mechanism, stage 3.
    """
    if not isinstance(learner, MetricLearner):
        raise ValueError(
            f"row_map_spectral_norm: `learner` must be a MetricLearner, got {type(learner)}."
        )
    rows = jnp.asarray(rows)
    dk = learner.w1.shape[-1]
    if rows.ndim != 2 or rows.shape[1] != dk:
        raise ValueError(
            f"row_map_spectral_norm: `rows` must have shape (rows, {dk}), got {rows.shape}."
        )
    if int(num_iterations) < 1:
        raise ValueError(
            f"row_map_spectral_norm: `num_iterations` must be ≥ 1, got {num_iterations}."
        )
    rows = rows.astype(jnp.result_type(learner.w1.dtype, rows.dtype))
    keys = jax.random.split(key, rows.shape[0])
    return _row_norms_jit(learner, rows, keys, int(num_iterations))


@eqx.filter_jit
def _contraction(learners, rows, keys, num_iterations):
    one = lambda learner, r, k: _row_norms(learner, r, k, num_iterations)
    return eqx.filter_vmap(one)(learners, rows, keys)


def contraction_audit(
    model,
    ids: Int[ArrayLike, "prompts seq"],
    *,
    key: PRNGKeyArray | None = None,
    num_iterations: int = 60,
    max_rows: int | None = None,
) -> ContractionAudit:
    """Stage 3 of the collapse mechanism: is the metric learner's row map contractive on the
    rows the model visits?

    The visited rows of layer `l` are the rows of `LN(D)` (the learner input, docs/theory/plga.md
    step 3) over every prompt and head: `prompts · heads · dk` rows of length `dk` (with a
    causal density operator, those of the whole sequence). At each row the spectral norm of
    the Jacobian of the whole learner `φ` and of each residual unit (at its own input) is
    found by power iteration (`row_map_spectral_norm`); `Π_k ‖J_{u_k}‖ ≥ ‖J_φ‖` is the product
    bound along the units.

    **Arguments:** `model` (a `PLDRLLM` with PLGA layers); `ids` `(prompts, seq)`; `key`
    (power-iteration starts and row subsampling; default `jax.random.key(0)`);
    `num_iterations`; `max_rows`: audit a random subset of this many rows per layer (default
    all).

    **Returns:** a `ContractionAudit`.

    **Raises:** `ValueError` for bad ids, SDPA layers, `num_iterations < 1` or `max_rows < 1`.

    Source: Gokden, PLGA (2026), collapse mechanism, stage 3.
    """
    if int(num_iterations) < 1:
        raise ValueError(f"contraction_audit: `num_iterations` must be ≥ 1, got {num_iterations}.")
    ids = jnp.asarray(ids)
    key = jax.random.key(0) if key is None else key
    seq = ids.shape[1] if ids.ndim == 2 else 1
    _, _, ln = layer_densities(model, ids, lengths=np.asarray([seq]))
    # (prompts, 1, layers, heads, dk, dk) → (layers, prompts·heads·dk, dk)
    L, dk = ln.shape[2], ln.shape[-1]
    rows = jnp.moveaxis(ln[:, 0], 1, 0).reshape(L, -1, dk)
    kr, ki = jax.random.split(key)
    if max_rows is not None:
        if int(max_rows) < 1:
            raise ValueError(f"contraction_audit: `max_rows` must be ≥ 1, got {max_rows}.")
        if int(max_rows) < rows.shape[1]:
            pick = jax.random.choice(kr, rows.shape[1], (int(max_rows),), replace=False)
            rows = rows[:, pick]
    learners = [layer.attn.metric_learner for layer in model.layers]
    stacked = jax.tree.map(lambda *a: jnp.stack(a), *learners)
    rows = rows.astype(jnp.result_type(learners[0].w1.dtype, rows.dtype))
    keys = jax.random.split(ki, L * rows.shape[1]).reshape(L, rows.shape[1])
    norm, unit_norms, res = _contraction(stacked, rows, keys, int(num_iterations))
    return ContractionAudit(
        norm=norm,
        unit_norms=unit_norms,
        product_bound=jnp.prod(unit_norms, axis=-1),
        rayleigh_residual=res,
        num_iterations=int(num_iterations),
    )


# ============================================================================= all three


def mechanism_audits(
    model,
    ids: Int[ArrayLike, "prompts seq"],
    *,
    lengths=None,
    rope: str | None = None,
    key: PRNGKeyArray | None = None,
    num_iterations: int = 60,
    max_rows: int | None = None,
) -> dict:
    """The three stages at once: `{"twirl": TwirlAudit, "concentration": ConcentrationAudit,
    "contraction": ContractionAudit}` on the same prompts (arguments as the three audits)."""
    key = jax.random.key(0) if key is None else key
    kc, kj = jax.random.split(key)
    return {
        "twirl": twirl_audit(model, ids, lengths=lengths, rope=rope),
        "concentration": concentration_audit(model, ids, lengths=lengths, key=kc),
        "contraction": contraction_audit(
            model, ids, key=kj, num_iterations=num_iterations, max_rows=max_rows
        ),
    }


def mechanism_table(audits: dict) -> str:
    """A per-layer text table of `mechanism_audits`: twirl residual before → after RoPE at the
    longest prefix (median over prompts and heads), concentration exponent with its interval
    (median over heads), and the Jacobian norm of the row map (median, fraction of rows < 1,
    median product bound)."""
    tw, co, ct = audits["twirl"], audits["concentration"], audits["contraction"]
    before = np.median(np.asarray(tw.residual_before)[:, -1], axis=(0, 2))
    after = np.median(np.asarray(tw.residual_after)[:, -1], axis=(0, 2))
    ex = np.median(np.asarray(co.exponent), axis=-1)
    ci = np.median(np.asarray(co.exponent_ci), axis=-2)
    n, pb = np.asarray(ct.norm), np.asarray(ct.product_bound)
    S = int(np.asarray(tw.lengths)[-1])
    lines = [
        f"collapse mechanism (S = {S}; medians over prompts/heads/rows):",
        f"{'layer':>5} | {'twirl residual before → after':>29} | "
        f"{'concentration exponent [95%]':>28} | {'‖J_φ‖':>8} {'< 1':>5} {'Π‖J_u‖':>8}",
    ]
    for layer in range(len(before)):
        lines.append(
            f"{layer:>5} | {before[layer]:>13.3f} → {after[layer]:<13.3f} | "
            f"{ex[layer]:>9.3f} [{ci[layer, 0]:7.3f}, {ci[layer, 1]:7.3f}] | "
            f"{np.median(n[layer]):>8.3f} {np.mean(n[layer] < 1):>5.2f} "
            f"{np.median(pb[layer]):>8.3f}"
        )
    return "\n".join(lines)
