"""One `diffrax.diffeqsolve` problem, solved whole or resumed in segments of `K` steps.

Every jaxattn solver (particles, Ott–Antonsen, Watanabe–Strogatz) builds a `Problem` and
hands it to `solve_problem`. A sweep can instead step a batch of problems `K` steps at a
time (`start_segments`, `advance_segments`): between segments it retires members that
finished and puts new members into their slots (compaction), so that no member waits for
the slowest one of its batch.

A segmented solve takes exactly the steps of the whole solve: each segment resumes from
the previous one's solver state (the FSAL stage), step-size controller state, `made_jump`
flag and the next step's end time, which diffrax would otherwise recompute from an
initial-step guess. The controller wrapper `ResumableController` records that end time
after every step, clipped to the horizon the way diffrax's loop clips it. Saved states
are interpolated within the very same steps, so a member's saves, step counts and result
equal those of its whole solve (bitwise on one device; tests compare to 1e-12). With
`dense_saves` the saves are interpolated from the segment's dense output after the
segment: the same interpolation of the same steps, to an ulp.
"""

from typing import Any

import diffrax
import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.numpy as jnp
from diffrax._term import WrapTerm  # what diffeqsolve wraps terms in (no public name)
from jaxtyping import Array, Bool, Float, Int, PyTree


class Problem(eqx.Module):
    """A prepared `diffeqsolve` problem: term, solver, initial state, arguments and the
    step-size controller. The array leaves (the flow's weights inside the term, `y0`,
    `args`) may carry a batch axis; the rest is configuration shared by a batch."""

    term: diffrax.ODETerm
    solver: diffrax.AbstractSolver
    y0: PyTree[Array]
    args: PyTree[Any]
    controller: diffrax.AbstractAdaptiveStepSizeController
    save_solver_state: bool = eqx.field(static=True)


def solve_problem(problem: Problem, t0, t1, dt0, ts, adjoint, max_steps) -> diffrax.Solution:
    """The whole solve of `problem` from `t0` to `t1`, saving at `ts` (`throw=False`)."""
    return diffrax.diffeqsolve(
        problem.term,
        problem.solver,
        t0=t0,
        t1=t1,
        dt0=dt0,
        y0=problem.y0,
        args=problem.args,
        saveat=diffrax.SaveAt(ts=ts, solver_state=problem.save_solver_state),
        stepsize_controller=problem.controller,
        adjoint=adjoint,
        max_steps=max_steps,
        throw=False,
    )


def _clip_floor(t1):
    # diffrax rounds a step ending within 100 float spacings of the horizon to the horizon.
    # The same 100 `prevbefore`s as diffrax, as one loop: unrolled inside `adapt_step_size`
    # they were ~2300 of the ~9400 HLO instructions of a compiled sweep chunk and ran after
    # every step; `ResumableController` now takes the floor once, when it is built.
    return jax.lax.fori_loop(0, 100, lambda _, f: eqxi.prevbefore(f), t1)


def _clip_to_end(tprev, tnext, t1, floor, keep):
    # The clip diffrax's loop applies to the controller's proposal after every step.
    tclip = jnp.where(keep, t1, tprev + 0.5 * (t1 - tprev))
    return jnp.where(tnext > floor, tclip, tnext)


class ResumableController(diffrax.AbstractAdaptiveStepSizeController):
    """Wraps an adaptive controller so that a solve can be resumed where it stopped.

    Its state is `(inner_state, tnext)`: after every step it records the end of the next
    step as diffrax's loop will use it (the proposal clipped to the horizon). A resumed
    solve passes that value as `resume_at`, and `init` returns it instead of guessing an
    initial step, so the resumed solve continues with the step it would have taken.
    """

    inner: diffrax.AbstractAdaptiveStepSizeController
    horizon: Float[Array, ""]
    resume_at: Float[Array, ""] | None
    floor: Float[Array, ""]  # `_clip_floor(horizon)`

    def __init__(self, inner, horizon, resume_at=None):
        self.inner = inner
        self.horizon = jnp.asarray(horizon)
        self.resume_at = resume_at
        self.floor = _clip_floor(self.horizon)

    @property
    def rtol(self):  # pyright: ignore
        return self.inner.rtol

    @property
    def atol(self):  # pyright: ignore
        return self.inner.atol

    @property
    def norm(self):  # pyright: ignore
        return self.inner.norm

    def wrap(self, direction):
        return eqx.tree_at(lambda c: c.inner, self, self.inner.wrap(direction))

    def init(self, terms, t0, t1, y0, dt0, args, func, error_order):
        if self.resume_at is not None:
            # diffeqsolve discards this state when a controller state is passed.
            return self.resume_at, None
        tnext, state = self.inner.init(terms, t0, t1, y0, dt0, args, func, error_order)
        return tnext, (state, jnp.minimum(tnext, t1))

    def adapt_step_size(self, t0, t1, y0, y1_candidate, args, y_error, error_order, state):
        inner, _ = state
        keep, next_t0, next_t1, made_jump, inner, result = self.inner.adapt_step_size(
            t0, t1, y0, y1_candidate, args, y_error, error_order, inner
        )
        tprev = jnp.minimum(next_t0, self.horizon)
        tnext = _clip_to_end(tprev, next_t1, self.horizon, self.floor, keep)
        return keep, next_t0, next_t1, made_jump, (inner, tnext), result


class SegmentState(eqx.Module):
    """Where a segmented solve stands: the state `y` at time `tprev`, what the next step
    needs (`solver_state`, `controller_state`, `made_jump`), the saves so far and diffrax's
    step statistics. `result` is diffrax's code of the last segment; `done` says the
    solve has ended (reached `t1` or failed), with `result` its outcome."""

    y: PyTree[Array]
    tprev: Float[Array, ""]
    solver_state: PyTree[Any]
    controller_state: PyTree[Any]
    made_jump: Bool[Array, ""]
    ys: PyTree[Array]
    num_saved: Int[Array, ""]
    num_steps: Int[Array, ""]
    num_accepted_steps: Int[Array, ""]
    num_rejected_steps: Int[Array, ""]
    result: diffrax.RESULTS
    done: Bool[Array, ""]


def _saves(num_or_ts, fns):
    """Normalise one save grid (`int`/array, `fns=None`) or several (tuples) to tuples:
    `(entries, fns, single)`."""
    if isinstance(num_or_ts, (tuple, list)):
        entries = tuple(num_or_ts)
        fns = (None,) * len(entries) if fns is None else tuple(fns)
        if len(fns) != len(entries):
            raise ValueError(f"{len(entries)} save grids but {len(fns)} save functions.")
        return entries, fns, False
    if fns is not None:
        raise ValueError("save_fns needs a tuple of save grids.")
    return (num_or_ts,), (None,), True


def _apply(fn, y):
    return y if fn is None else fn(y)


def start_segments(
    problem: Problem, t0, t1, dt0, num_save: int | tuple[int, ...], save_fns=None
) -> SegmentState:
    """The state of a solve that has not taken a step: what `diffeqsolve` computes before
    its loop (the controller's first step, the solver's initial state).

    `num_save` is the number of save times; or a tuple of them, one per save grid, with
    `save_fns` a tuple of functions `y ↦ pytree` (None: `y` itself) saved on each grid
    (then `ys` and `num_saved` are tuples too). A sweep saves on each grid only what its
    classifier reads."""
    solver, y0 = problem.solver, problem.y0
    # What diffeqsolve hands the controller and solver: the term wrapped with the time
    # direction (diffrax then starts adaptive solves with dt = 0.01 rather than its
    # initial-step estimate, which it keeps for bare `ODETerm`s).
    term = WrapTerm(problem.term, jnp.where(t0 < t1, 1, -1))
    controller = ResumableController(problem.controller, jnp.asarray(t1))
    error_order = solver.error_order(term)
    tnext, controller_state = controller.init(
        term, t0, t1, y0, dt0, problem.args, solver.func, error_order
    )
    tnext = jnp.minimum(tnext, t1)
    controller_state = (controller_state[0], tnext)
    solver_state = solver.init(term, t0, tnext, y0, problem.args)
    # Python scalars in the states (e.g. the PID controller's `at_dtmin = False`) become
    # arrays, as diffrax's loop makes them: a segment's state has the structure of the
    # next one's (a `while_loop` over segments carries it).
    as_array = lambda x: jnp.asarray(x) if isinstance(x, (bool, int, float)) else x  # noqa: E731
    controller_state = jax.tree.map(as_array, controller_state)
    solver_state = jax.tree.map(as_array, solver_state)
    # Unreached saves stay inf, as in diffeqsolve's output buffer.
    sizes, fns, single = _saves(num_save, save_fns)
    ys = tuple(
        jax.tree.map(
            lambda y, k=k: jnp.full((k,) + y.shape, jnp.inf, y.dtype),
            jax.eval_shape(lambda y, fn=fn: _apply(fn, y), y0),
        )
        for k, fn in zip(sizes, fns)
    )
    zero = jnp.zeros((), jnp.int32)
    num_saved = tuple(zero for _ in sizes)
    if single:
        ys, num_saved = ys[0], num_saved[0]
    return SegmentState(
        y=y0,
        tprev=jnp.asarray(t0),
        solver_state=solver_state,
        controller_state=controller_state,
        made_jump=jnp.array(False),
        ys=ys,
        num_saved=num_saved,
        num_steps=zero,
        num_accepted_steps=zero,
        num_rejected_steps=zero,
        result=diffrax.RESULTS.successful,
        done=jnp.array(False),
    )


def advance_segments(
    problem: Problem,
    state: SegmentState,
    t1,
    ts,
    *,
    steps: int,
    max_steps: int,
    save_fns=None,
    dense_saves: bool = False,
) -> SegmentState:
    """At most `steps` more steps of the solve (nothing for a solve that is `done`).

    The solve ends (`done`) when it reaches `t1`, fails, or has taken `max_steps` steps in
    all (a multiple of `steps`), exactly as the whole solve with `max_steps` would. `ts`
    and `save_fns` as the state was started (`start_segments`): one array of save times,
    or a tuple of them with their save functions.

    `dense_saves=True` (save functions None only): the segment keeps the dense output of
    its steps and the save times it reached are interpolated from it afterwards, all at
    once, instead of in diffrax's loop over save times after every step (the same
    interpolation of the same step; for a small state, under `vmap`, that loop was most of
    the cost of a step). The dense buffer holds `steps` steps.
    """
    grids, fns, single = _saves(ts, save_fns)
    if dense_saves and any(fn is not None for fn in fns):
        raise ValueError("dense_saves saves the state itself: it takes no save functions.")
    old_ys = (state.ys,) if single else state.ys
    old_saved = (state.num_saved,) if single else state.num_saved
    tprev = jnp.where(state.done, t1, state.tprev)  # a finished solve takes no step
    controller = ResumableController(
        problem.controller, jnp.asarray(t1), resume_at=state.controller_state[1]
    )
    if dense_saves:
        subs = [diffrax.SubSaveAt(t1=True)]
    else:
        subs = [
            *(
                diffrax.SubSaveAt(
                    ts=jnp.maximum(g, tprev),
                    **({} if fn is None else dict(fn=lambda t, y, a, fn=fn: fn(y))),
                )
                for g, fn in zip(grids, fns)
            ),
            diffrax.SubSaveAt(t1=True),
        ]
    sol = diffrax.diffeqsolve(
        problem.term,
        problem.solver,
        t0=tprev,
        t1=t1,
        dt0=None,
        y0=state.y,
        args=problem.args,
        saveat=diffrax.SaveAt(
            subs=subs,
            dense=dense_saves,
            solver_state=True,
            controller_state=True,
            made_jump=True,
        ),
        stepsize_controller=controller,
        solver_state=state.solver_state,
        controller_state=state.controller_state,
        made_jump=state.made_jump,
        max_steps=steps,
        throw=False,
    )
    *ys_segs, y_end = sol.ys
    t_end = sol.ts[-1][0]
    if dense_saves:
        # Every save time, clipped into the segment (those outside it are masked below;
        # a segment without an accepted step interpolates nothing it keeps).
        ys_segs = [jax.vmap(sol.interpolation.evaluate)(jnp.clip(g, tprev, t_end)) for g in grids]
    ys, num_saved = [], []
    for g, old, saved, seg in zip(grids, old_ys, old_saved, ys_segs):
        # Saves made in this segment: the next ones in order, up to the time reached.
        index = jnp.arange(g.shape[0])
        # A segment whose steps were all rejected saved nothing (diffrax saves after an
        # accepted step only), not even a save time equal to its start.
        reached = jnp.where(t_end > tprev, jnp.sum(g <= t_end, dtype=jnp.int32), saved)
        new = (index >= saved) & (index < reached) & ~state.done
        ys.append(
            jax.tree.map(
                lambda o, n: jnp.where(new.reshape((-1,) + (1,) * (o.ndim - 1)), n, o),
                old,
                seg,
            )
        )
        num_saved.append(jnp.where(state.done, saved, jnp.maximum(reached, saved)))
    ys, num_saved = (ys[0], num_saved[0]) if single else (tuple(ys), tuple(num_saved))
    keep = lambda new_x, old_x: jax.tree.map(  # noqa: E731
        lambda a, b: jnp.where(state.done, b, a), new_x, old_x
    )
    stats = {k: jnp.asarray(v, jnp.int32) for k, v in sol.stats.items()}
    num_steps = state.num_steps + jnp.where(state.done, 0, stats["num_steps"])
    result = diffrax.RESULTS.where(state.done, state.result, sol.result)
    out_of_steps = (sol.result == diffrax.RESULTS.max_steps_reached) & (num_steps < max_steps)
    done = state.done | ~out_of_steps
    result = diffrax.RESULTS.where(out_of_steps, diffrax.RESULTS.successful, result)
    return SegmentState(
        y=keep(jax.tree.map(lambda y: y[0], y_end), state.y),
        tprev=jnp.where(state.done, state.tprev, t_end),
        solver_state=keep(sol.solver_state, state.solver_state),
        controller_state=keep(sol.controller_state, state.controller_state),
        made_jump=keep(sol.made_jump, state.made_jump),
        ys=ys,
        num_saved=num_saved,
        num_steps=num_steps,
        num_accepted_steps=state.num_accepted_steps
        + jnp.where(state.done, 0, stats["num_accepted_steps"]),
        num_rejected_steps=state.num_rejected_steps
        + jnp.where(state.done, 0, stats["num_rejected_steps"]),
        result=result,
        done=done,
    )


class SegmentedSolution(eqx.Module):
    """The finished segmented solve, with the attributes of `diffrax.Solution` that the
    jaxattn solvers read (`ys`, `result`, `stats`, `solver_state`)."""

    ys: PyTree[Array]
    result: diffrax.RESULTS
    stats: dict
    solver_state: PyTree[Any]


def segments_solution(state: SegmentState) -> SegmentedSolution:
    """`state` of a finished segmented solve as a solution."""
    return SegmentedSolution(
        ys=state.ys,
        result=state.result,
        stats=dict(
            num_steps=state.num_steps,
            num_accepted_steps=state.num_accepted_steps,
            num_rejected_steps=state.num_rejected_steps,
        ),
        solver_state=state.solver_state,
    )
