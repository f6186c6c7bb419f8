"""Fixed points, saddle-node refinement, the Case-4 hidden Hamiltonian and the Case-3
rotation rate, each against a closed form or a conserved quantity."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxattn.dynamics import _bifurcation as bif
from jaxattn.dynamics import _hamiltonian as ham
from jaxattn.dynamics import solve_ott_antonsen
from jaxattn.dynamics._ott_antonsen import ott_antonsen_field

I2 = np.eye(2)
J2 = np.array([[0.0, -1.0], [1.0, 0.0]])


def case4(p, v12=1.0):
    return I2, np.array([[p, v12], [-v12, -p]]), 1.0


def test_integrating_factor_makes_the_flow_hamiltonian(getkey):
    # (1-|R|^2)^-3 dR/dt = (beta/4)(dH/dy - i dH/dx) at random points and parameters.
    for _ in range(5):
        v11, v12, beta = np.asarray(jax.random.normal(getkey(), (3,)))
        beta = abs(beta) + 0.1
        R = 0.8 * jnp.exp(2j * jnp.pi * jax.random.uniform(getkey())) * jax.random.uniform(getkey())
        A, V, _ = case4(v11, v12)
        F = ott_antonsen_field(R, jnp.asarray(A), jnp.asarray(V), beta)
        gx, gy = jax.grad(lambda y: ham.case4_hamiltonian(y[0] + 1j * y[1], v11, v12))(
            jnp.stack([jnp.real(R), jnp.imag(R)])
        )
        lhs = ham.case4_integrating_factor(R) * F
        rhs = 0.25 * beta * (gy - 1j * gx)
        assert abs(lhs - rhs) < 1e-12 * (1 + abs(rhs))


def test_hamiltonian_conserved_and_orbit_closed():
    o = ham.case4_orbit(0.3, 1.0, 0.4 + 0.1j, t1=40.0, num_save=4001)
    assert o["H_drift"] < 1e-9
    assert np.isfinite(o["period"]) and 3.5 < o["period"] < 5.0
    # The orbit returns: after one measured period R is back where it was.
    k = int(round(o["period"] / (o["ts"][1] - o["ts"][0])))
    assert np.max(np.abs(o["R"][k:] - o["R"][:-k])) < 2e-2  # grid-rounded period


def test_small_orbits_have_the_linear_period():
    Rc, ev = ham.case4_centre(0.3, 1.0)
    assert abs(np.real(ev[0])) < 1e-10  # a centre
    omega = abs(np.imag(ev[0]))
    o = ham.case4_orbit(0.3, 1.0, complex(Rc) + 1e-3, t1=30.0, num_save=6001)
    assert abs(o["period"] - 2 * np.pi / omega) < 1e-4


def test_clustering_when_v11_exceeds_v12():
    o = ham.case4_orbit(1.0, 0.3, 0.2j, t1=40.0, num_save=401)
    assert o["final_abs_R"] > 1 - 1e-9
    assert ham.case4_regime(1.0, 0.3) == "clustering"
    assert ham.case4_regime(0.3, 1.0) == "oscillation"


def test_fixed_points_of_case4_and_stability():
    fp = bif.fixed_points(*case4(0.3))
    assert fp.kind == ["centre"] and not fp.on_circle.any()
    Rc, _ = ham.case4_centre(0.3, 1.0)
    assert abs(fp.R[0] - complex(Rc)) < 1e-10
    fp = bif.fixed_points(*case4(1.5))
    assert sorted(fp.kind) == ["sink", "source"] and fp.on_circle.all()
    # A = -I + small rotation, V = I: interior sink at R = 0 (no clustering).
    fp = bif.fixed_points(-I2 + 0.2 * J2, I2)
    interior = [k for k, c in zip(fp.kind, fp.on_circle) if not c]
    assert interior == ["sink"] and abs(fp.R[~fp.on_circle][0]) < 1e-12


def test_saddle_node_refined_to_1e_8():
    p, (lo, hi), it = bif.saddle_node_on_circle(lambda p: case4(p, 1.0), 0.5, 1.5)
    assert hi - lo <= 1e-8 and lo <= 1.0 <= hi and abs(p - 1.0) < 1e-8
    # A different v12: the fold sits at v11 = v12.
    p, (lo, hi), _ = bif.saddle_node_on_circle(lambda p: case4(p, 0.7), 0.1, 2.0)
    assert lo <= 0.7 <= hi
    with pytest.raises(ValueError, match="no bracket"):
        bif.refine_transition(lambda p: True, 0.0, 1.0)


def test_continuation_counts_change_at_the_fold():
    ps = [0.5, 0.9, 1.1, 1.5]
    fps = bif.continuation(lambda p: case4(p), ps)
    counts = [int(f.on_circle.sum()) for f in fps]
    assert counts == [0, 0, 2, 2]
    labels = ["oscillation" if c == 0 else "clustering" for c in counts]
    assert bif.find_transitions(ps, labels) == [(0.9, 1.1, "oscillation", "clustering")]


def test_case3_rotation_rate_matches_circle_integral():
    A, V = np.diag([2.0, 1.0]), I2 + J2
    theory = ham.rotation_rate_on_circle(A, V)
    assert abs(theory - 2 * np.sqrt(2)) < 1e-9  # g(ψ) has mean-inverse 1/(2√2)
    ts = jnp.linspace(0.0, 100.0, 10001)
    sol = solve_ott_antonsen(
        A, V, 0.1 + 0j, t1=100.0, ts=ts, rtol=1e-11, atol=1e-13, max_steps=100000
    )
    assert sol.successful
    assert abs(ham.measured_rotation_rate(ts, sol.R) - theory) < 1e-5


def test_fixed_points_in_float32_on_a_zero_field_and_bad_input():
    # Case 4 (v11 = 0.5 < v12 = 1): one centre at R = −0.181i (float64). float32 finds it
    # too with its own default tolerances (the float64 ones were out of its reach: none).
    V4 = np.array([[0.5, 1.0], [-1.0, -0.5]])
    ref = bif.fixed_points(np.eye(2), V4)
    f32 = bif.fixed_points(np.eye(2, dtype=np.float32), V4.astype(np.float32))
    assert len(ref.R) == len(f32.R) == 1 and ref.kind == f32.kind == ["centre"]
    assert abs(f32.R[0] - ref.R[0]) < 1e-6
    # a zero field fixes every point: the seeds are returned, not an empty set
    zero = bif.fixed_points(np.zeros((2, 2)), np.zeros((2, 2)))
    assert len(zero.R) == 7 * 32 - 31 and set(zero.kind) == {"degenerate"}
    for beta in (0.0, -1.0):
        with pytest.raises(ValueError, match="fixed_points: beta is an inverse temperature"):
            bif.fixed_points(np.eye(2), V4, beta)
    with pytest.raises(ValueError, match="fixed_points: A and V must be float32 or float64"):
        bif.fixed_points(np.eye(2, dtype=np.float16), V4.astype(np.float16))
    with pytest.raises(ValueError, match="extra_seeds must be a 1-d array"):
        bif.fixed_points(np.eye(2), V4, extra_seeds=0.3)


def test_refine_transition_orders_its_bracket_and_refuses_non_numbers():
    p, (lo, hi), _ = bif.refine_transition(lambda q: q > 1.0, 2.0, 0.5, tol=1e-10)
    assert lo < hi and abs(p - 1.0) < 1e-10
    # through the saddle-node of the Case-4 family, bracket given high end first
    fam = lambda q: (np.eye(2), np.array([[q, 1.0], [-1.0, -q]]), 1.0)  # noqa: E731
    assert abs(bif.saddle_node_on_circle(fam, 2.0, 0.5)[0] - 1.0) < 1e-7
    with pytest.raises(ValueError, match="refine_transition: lo must be a finite number"):
        bif.refine_transition(lambda q: q > 1.0, float("nan"), 2.0)
    with pytest.raises(ValueError, match="lo and hi are the same point"):
        bif.refine_transition(lambda q: q > 1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="circle_extrema: V has non-finite entries"):
        bif.saddle_node_on_circle(lambda q: (np.eye(2), np.full((2, 2), np.nan), 1.0), 0.5, 2.0)


def test_fixed_points_settings_and_predicates_that_are_not_one_bool():
    V4 = np.array([[0.5, 1.0], [-1.0, -0.5]])
    for kw, name in ((dict(num_radii=0), "num_radii"), (dict(tol=-1.0), "tol")):
        with pytest.raises(ValueError, match=f"fixed_points: {name} must be"):
            bif.fixed_points(np.eye(2), V4, **kw)
    with pytest.raises(ValueError, match=r"extra_seeds must be finite, got 1 NaN"):
        bif.fixed_points(np.eye(2), V4, extra_seeds=[np.nan])
    with pytest.raises(ValueError, match=r"predicate\(0.0\) must return one bool"):
        bif.refine_transition(lambda p: np.array([p > 0.3, True]), 0.0, 1.0)
    with pytest.raises(ValueError, match=r"must return one bool, got array\(nan\)"):
        bif.refine_transition(lambda p: np.nan, 0.0, 1.0)
