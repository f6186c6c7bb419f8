"""The stated criteria (Cases 1, 2, 4) against long-run classification of random matrices.

Each batch is solved in one compiled, vmapped call: the Ott–Antonsen ODE for R₂ (the
mean-field flow the criteria are about) and, where the claim concerns particles too, a
particle run of n = 16 tokens from uniform starts.
"""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxattn.dynamics import AttentionDynamics, simulate
from jaxattn.dynamics._ott_antonsen import ott_antonsen_field
from jaxattn.dynamics._regimes import (
    REGIMES,
    classify_order_parameter,
    classify_regime,
    regime_name,
)
from jaxattn.dynamics._theory import (
    block_embed,
    case1_criterion,
    case2_criterion,
    case3_matrices,
    case4_criterion,
    case4_matrices,
    stated_prediction,
)
from jaxattn.sphere import sample_uniform

BATCH = 72
T1 = 200.0
TS = jnp.linspace(0.0, T1, 2001)


def _oa_solve(A, V, R0):
    def rhs(t, y, args):
        dR = ott_antonsen_field(y[0] + 1j * y[1], A, V, 1.0)
        return jnp.stack([jnp.real(dR), jnp.imag(dR)])

    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(rhs),
        diffrax.Tsit5(),
        0.0,
        T1,
        None,
        jnp.stack([jnp.real(R0), jnp.imag(R0)]),
        saveat=diffrax.SaveAt(ts=TS),
        stepsize_controller=diffrax.PIDController(rtol=1e-10, atol=1e-12),
        max_steps=200_000,
        throw=False,
    )
    return classify_order_parameter(TS, sol.ys[:, 0] + 1j * sol.ys[:, 1])


_oa_batch = jax.jit(jax.vmap(_oa_solve))

_X0 = sample_uniform(jax.random.key(42), 16, 2)


def _particles(A, V):
    traj = simulate(AttentionDynamics(A, V), _X0, t1=T1, ts=TS, throw=False)
    return classify_regime(traj)


_particle_batch = jax.jit(jax.vmap(_particles))


def _R0(key):
    k1, k2 = jax.random.split(key)
    r = 0.6 * jnp.sqrt(jax.random.uniform(k1, (BATCH,)))
    return r * jnp.exp(2j * jnp.pi * jax.random.uniform(k2, (BATCH,)))


def _agreement(pred, regimes, label):
    """Claims agree with the classification; few runs undetermined. Returns counts."""
    claims = np.asarray(pred.claims)
    want = np.asarray(pred.regime._value)
    got = np.asarray(regimes._value)
    undetermined = got == int(REGIMES.undetermined._value)
    wrong = claims & ~undetermined & (got != want)
    assert not wrong.any(), (label, np.flatnonzero(wrong), regime_name(regimes)[wrong])
    assert (claims & undetermined).sum() <= 0.1 * claims.sum(), (
        label,
        (claims & undetermined).sum(),
    )
    return int(claims.sum()), int((claims & ~undetermined).sum())


def test_case1_criterion_against_ott_antonsen_and_particles():
    keys = jax.random.split(jax.random.key(1), 3)
    As = jax.random.normal(keys[0], (BATCH, 2, 2))
    Vs = jnp.broadcast_to(jnp.eye(2), (BATCH, 2, 2))
    pred = jax.jit(jax.vmap(case1_criterion))(As, Vs)
    claims, agreed = _agreement(pred, _oa_batch(As, Vs, _R0(keys[1]))[0], "case 1 / OA")
    assert claims >= 50
    kinds = regime_name(pred.regime)[np.asarray(pred.claims)]
    assert {"clustering", "interior"} <= set(kinds)
    print(f"Case 1, OA: {claims} claims of {BATCH}, {agreed} confirmed")
    # particles: the clustering claim holds for n = 16 tokens from uniform starts too
    reg_p, _ = _particle_batch(As, Vs)
    cluster_claims = np.asarray(pred.claims) & (regime_name(pred.regime) == "clustering")
    got = regime_name(reg_p)[cluster_claims]
    assert np.all((got == "clustering") | (got == "undetermined"))
    assert np.mean(got == "clustering") >= 0.9


def test_case2_criterion_against_ott_antonsen_and_particles():
    keys = jax.random.split(jax.random.key(2), 3)
    M = jax.random.normal(keys[0], (BATCH, 2, 2))
    Vs = 0.5 * (M + jnp.swapaxes(M, 1, 2)) - 0.5 * jnp.eye(2)  # shift so both claims occur
    As = jnp.broadcast_to(jnp.eye(2), (BATCH, 2, 2))
    pred = jax.jit(jax.vmap(case2_criterion))(As, Vs)
    assert bool(jnp.all(pred.claims))  # Case 2 is an iff: it always makes a claim
    kinds = regime_name(pred.regime)
    assert {"clustering", "interior"} <= set(kinds)
    claims, agreed = _agreement(pred, _oa_batch(As, Vs, _R0(keys[1]))[0], "case 2 / OA")
    print(f"Case 2, OA: {claims} claims, {agreed} confirmed")
    claims_p, agreed_p = _agreement(pred, _particle_batch(As, Vs)[0], "case 2 / particles")
    print(f"Case 2, particles: {claims_p} claims, {agreed_p} confirmed")


def test_case4_criterion_against_ott_antonsen():
    keys = jax.random.split(jax.random.key(4), 3)
    v = jax.random.uniform(keys[0], (BATCH, 2), minval=-1.5, maxval=1.5)
    As, Vs = jax.vmap(case4_matrices)(v[:, 0], v[:, 1])
    pred = jax.jit(jax.vmap(case4_criterion))(As, Vs)
    kinds = set(regime_name(pred.regime)[np.asarray(pred.claims)])
    assert kinds == {"clustering", "oscillation"}
    claims, agreed = _agreement(pred, _oa_batch(As, Vs, _R0(keys[1]))[0], "case 4 / OA")
    print(f"Case 4, OA: {claims} claims, {agreed} confirmed")


def test_predicates_know_when_they_apply():
    A = jnp.array([[1.0, 2.0], [-3.0, 0.5]])
    eye = jnp.eye(2)
    assert bool(case1_criterion(A, eye).claims)
    assert not bool(case1_criterion(A, 2 * eye).claims)  # V ≠ I
    assert not bool(case2_criterion(eye, A).claims)  # V not symmetric
    assert not bool(case2_criterion(A, eye).claims)  # A ≠ I
    # Case 1 region with no claim: tr A ≤ 0 < det A and sym(A) indefinite
    B = jnp.array([[0.5, -3.0], [1.0, -1.0]])
    p = case1_criterion(B, eye)
    assert not bool(p.claims) and p.regime == REGIMES.undetermined
    # Case 4 family: saddle-node (|v11| = |v12|) makes no claim; outside the family neither
    assert not bool(case4_criterion(*case4_matrices(0.7, 0.7)).claims)
    assert case4_criterion(*case4_matrices(0.2, 1.0)).regime == REGIMES.oscillation
    assert case4_criterion(*case4_matrices(1.0, 0.2)).regime == REGIMES.clustering
    assert not bool(case4_criterion(eye, A).claims)
    # stated_prediction picks the case that applies
    assert stated_prediction(*case4_matrices(0.2, 1.0)).regime == REGIMES.oscillation
    assert stated_prediction(eye, -eye).regime == REGIMES.interior
    assert stated_prediction(A, eye).regime == REGIMES.clustering
    assert not bool(stated_prediction(*case3_matrices()).claims)
    with pytest.raises(ValueError, match="2×2"):
        case1_criterion(jnp.eye(3), jnp.eye(3))


def test_block_embed():
    A3, V3 = case3_matrices()
    E = block_embed(A3, 6)
    assert E.shape == (6, 6)
    np.testing.assert_array_equal(E[2:4, 2:4], A3)
    assert float(jnp.abs(E[0:2, 2:6]).max()) == 0.0
    with pytest.raises(ValueError, match="even"):
        block_embed(A3, 5)


def test_block_embed_and_criteria_refuse_non_integer_sizes_and_complex_matrices():
    M = jnp.array([[0.0, 1.0], [-1.0, 0.0]])
    assert block_embed(M, 4).shape == (4, 4)
    for d in (2.5, 3, True):
        with pytest.raises(ValueError, match="block_embed: d must be an even number >= 2"):
            block_embed(M, d)
    with pytest.raises(ValueError, match="must be a real 2×2 matrix, got dtype complex"):
        case4_criterion(jnp.eye(2) + 0j, M)
