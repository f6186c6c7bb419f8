"""Tsit5 with its stages written out in straight-line code: the sweep's solver.

`diffrax.Tsit5` runs the stages of a step in a `while_loop` over the rows of its Butcher
tableau (general code shared by every Runge–Kutta method, explicit or implicit). On the
CPU, XLA's runtime dispatches every kernel of a loop body on every iteration, about 0.1 µs
each, and for a small state (a particle member: `(d, n) = (2, 256)`) that dispatch is most
of a step: the stage loop alone is ~13 kernels × 7 stages. `UnrolledTsit5` is the same
method through diffrax's solver interface (`AbstractSolver.step`, `interpolation_cls`; the
tableau, the step loop, the step-size controller and the saving all stay diffrax's): only
the stage loop is written out, so the step body is one block of ~60 kernels, and the dense
interpolation sums the slopes elementwise (one kernel fewer per save).

The stage slopes are kept in one `(7, ...)` buffer, written stage by stage
(`.at[i].set`) and read back for the linear combinations. Without that buffer, XLA
duplicates every earlier stage's slope computation into each later stage's combination
(fusions of 80 to 370 operations) and a step costs more than diffrax's loop.

Measured (one CPU core, a particle member of the sweep, d = 2, n = 256, float64, 68 steps,
2026-12-07): 14.0 µs per step with diffrax's loop and 7.5 µs written out (16.6 and 10.4 µs
with the sweep's 201 save times); with XLA's small loops compiled whole
(`jaxattn.prefer_fast_cpu_loops`) both take ~7 µs. Same steps; saved states equal to
2e-14 (the combinations are summed in another order than diffrax's dot products, so they
agree to rounding, not bitwise).
"""

import diffrax
import equinox.internal as eqxi
import jax
import jax.numpy as jnp

# Tsit5's dense output: y(t0 + θ h) = y0 + Σ_i b_i(θ) k_i with quartic weights b_i
# (Tsitouras 2011, the continuous extension of the pair), each written as
# scale · θ^power · Π (θ − root) · (θ² + q θ + s) for its real roots and irreducible
# quadratic factor: (scale, power, roots, (q, s) or None). tests/test_tsit5.py checks them
# against diffrax's interpolation.
_DENSE_WEIGHTS = (
    (-1.0530884977290216, 1, (1.3299890189751412,), (-1.4364028541716351, 0.7139816917074209)),
    (0.1017, 2, (), (-2.1966568338249754, 1.2949852507374631)),
    (2.490627285651252793, 2, (), (-2.38535645472061657, 1.57803468208092486)),
    (-16.54810288924490272, 2, (1.21712927295533244, 0.61620406037800089), None),
    (47.37952196281928122, 2, (1.203071208372362603, 0.658047292653547382), None),
    (-34.87065786149660974, 2, (1.2, 0.666666666666666667), None),
    (2.5, 2, (1.0, 0.6), None),
)


def _dense_weight(theta, scale, power, roots, quadratic):
    b = scale * theta**power
    for r in roots:
        b = b * (theta - r)
    if quadratic is not None:
        q, s = quadratic
        b = b * (theta**2 + q * theta + s)
    return b


class _UnrolledTsit5Interpolation(diffrax.Tsit5.interpolation_cls):
    """Tsit5's dense interpolation with the combination `Σ_i b_i(θ) k_i` as elementwise
    arithmetic on the slope buffer instead of a dot product: a save in diffrax's loop is
    then one kernel fewer (measured, one core, a particle member with 201 saves: 0.717 ->
    0.626 ms a solve). The same weights; values equal diffrax's to rounding."""

    def evaluate(self, t0, t1=None, left=True):
        del left
        if t1 is not None:
            return self.evaluate(t1) - self.evaluate(t0)
        same = self.t0 == self.t1
        theta = jnp.where(same, 0, t0 - self.t0) / jnp.where(same, 1, self.t1 - self.t0)
        b = [_dense_weight(theta, *w) for w in _DENSE_WEIGHTS]

        def leaf(y0, k):
            out = y0
            for i, bi in enumerate(b):
                out = out + bi.astype(k.dtype) * k[i]
            return out

        return jax.tree.map(leaf, self.y0, self.k)


def _combination(coefficients, ks, stages: int):
    """`Σ_j coefficients[j] · ks[j]` over the first `stages` slopes (zero coefficients
    skipped), leaf by leaf of the state; `ks` holds the slopes with a leading stage axis."""
    terms = [(float(a), j) for j, a in enumerate(coefficients[:stages]) if a != 0]

    def leaf(k):
        a, j = terms[0]
        out = a * k[j]
        for a, j in terms[1:]:
            out = out + a * k[j]
        return out

    return jax.tree.map(leaf, ks)


class UnrolledTsit5(diffrax.Tsit5):
    """`diffrax.Tsit5` whose step evaluates its seven stages as straight-line code.

    The method is Tsitouras' explicit Runge–Kutta 5(4) pair (Ch. Tsitouras, "Runge–Kutta
    pairs of order 5(4) satisfying only the first column simplifying assumption", Computers
    & Mathematics with Applications 62 (2011) 770–775), first-same-as-last, with its
    fourth-order dense interpolation: diffrax's tableau, step loop, step-size controllers
    and saving, unchanged. The loop over the stages of one step is written out, and the
    interpolation's combination of the slopes is elementwise (see the module docstring
    for why and what it gains): on a CPU a particle sweep member steps about 1.9× faster
    (default XLA runtime; equal speed when `jaxattn.prefer_fast_cpu_loops` compiles loops
    whole). Every sweep member is solved
    with it (`SWEEP_SOLVER`); pass `solver=UnrolledTsit5()` to `simulate`,
    `solve_ott_antonsen` or `solve_watanabe_strogatz` to get the same speed and a member's
    own steps (its numbers to a few 1e-12: the sweep's program is compiled differently).

    States may be any PyTree of floating arrays; shapes, dtypes and the
    solution's attributes are those of `diffrax.Tsit5`. Steps, accepted/rejected counts and
    saved states equal diffrax's to rounding (its stage sums are dot products, summed in
    another order): measured 2e-14 on the saved tokens of a 68-step particle solve. It is
    differentiable like any JAX code, but is meant for forward solves: diffrax's default
    stage loop is the one checkpointed for reverse-mode autodiff.

    Terms whose vector field diffrax calls expensive (`is_vf_expensive`: no
    first-same-as-last) are stepped by diffrax's own stage loop.

    **Raises:** nothing of its own; diffrax's errors for terms it cannot solve (it accepts
    what `diffrax.Tsit5` accepts).
    """

    interpolation_cls = _UnrolledTsit5Interpolation

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        if solver_state is None:
            # diffrax turns first-same-as-last off for terms whose vector field is expensive
            # (`is_vf_expensive`, e.g. an SDE solved backwards by `BacksolveAdjoint`); those
            # take diffrax's own stage loop.
            return super().step(terms, t0, t1, y0, args, solver_state, made_jump)
        tableau = self.tableau
        first_step, f0 = solver_state
        # FSAL: the first stage is the previous step's last, except on the first step or
        # after a jump (one decision for a whole vmapped batch, as diffrax decides it).
        f0 = jax.lax.cond(
            eqxi.unvmap_any(first_step | made_jump),
            lambda: terms.vf(t0, y0, args),
            lambda: f0,
        )
        dt = t1 - t0
        control = terms.contr(t0, t1)
        time_dtype = jnp.result_type(t0, t1)
        k0 = terms.prod(f0, control)
        ks = jax.tree.map(lambda k: jnp.zeros((7,) + k.shape, k.dtype).at[0].set(k), k0)
        y1 = f1 = None
        for i, (a, c) in enumerate(zip(tableau.a_lower, tableau.c), start=1):
            increment = _combination(a, ks, i)
            yi = jax.tree.map(lambda y, inc: y + inc, y0, increment)
            ti = t1 if c == 1 else t0 + jnp.asarray(c, time_dtype) * dt
            fi = terms.vf(ti, yi, args)
            ki = terms.prod(fi, control)
            ks = jax.tree.map(lambda buf, k, i=i: buf.at[i].set(k), ks, ki)
            y1, f1 = yi, fi
        # Tsit5's last stage is evaluated at the solution (its last row of `a` is `b`).
        y_error = _combination(tableau.b_error, ks, 7)
        dense_info = dict(y0=y0, y1=y1, k=ks)
        return y1, y_error, dense_info, (jnp.array(False), f1), diffrax.RESULTS.successful
