r"""The regime atlas: one command that maps where attention clusters, rotates or oscillates,
and writes a self-contained report (Markdown + PNG figures next to it + JSON of every number).

Sections (each measured, nothing hard-coded):

1. The four cases of the paper in d = 2: particles, Watanabe–Strogatz and Ott–Antonsen
   side by side (regime, final `|R₂|`, rotation rate, period).
2. Regime maps over three 2-parameter slices (Ott–Antonsen sweeps) with the paper's stated
   boundaries drawn over them and the disagreement rate.
3. A bifurcation diagram of the Case-4 family (fixed points with stability, orbit range,
   saddle-nodes refined by bisection to 1e-8).
4. The Case-4 phase portrait: level sets of the hidden Hamiltonian with OA orbits, its
   conservation and the measured periods; the Case-3 rotation rate against theory.
5. d = 100, n = 200 (LSA and USA): the d = 2 pairs embedded block-diagonally.
6. A gradient-based boundary crossing (`regime_search`).
7. Flow families: Post-LN, Pre-LN, nGPT and causal masking on the same (A, V, β) and
   tokens (regimes, the contraction law of the spread), and the PLGA flow of the shipped
   trained tiny PLDR-LLM layer beside its step-0 layer, swept over two initial laws.
8. The trained operator: that layer's attention as a multi-head particle flow in R^D
   (`A_h = W_q,hᵀ G_h W_k,h/√dk`, `V_h = W_o,h W_v,h`, β = r²), early vs late in training.
9. Multistability (basin fractions); 10. chaos in three tokens.

`run_atlas(quick=True)` is sized for 2 CPU cores (a few minutes); `quick=False` for a GPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import platform
import time
from importlib import resources

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ..sphere import normalise
from ._bifurcation import continuation, saddle_node_on_circle
from ._decay import decay_fits, direction_spread
from ._hamiltonian import (
    case4_centre,
    case4_hamiltonian,
    measured_period,
    measured_rotation_rate,
    rotation_rate_on_circle,
)
from ._ott_antonsen import solve_ott_antonsen
from ._presets import PRESETS
from ._regime_map import regime_map
from ._regimes import classify_order_parameter, classify_tokens, default_gap_floor
from ._search import regime_search
from ._solve import simulate
from ._sweep import REGIME_NAMES, sweep
from ._theory import block_embed, case1_criterion, case2_criterion, case4_criterion
from ._vector_field import AttentionDynamics

__all__ = ["AtlasConfig", "run_atlas", "load_g_lm"]

_I2 = np.eye(2)
_J2 = np.array([[0.0, -1.0], [1.0, 0.0]])


@dataclasses.dataclass(frozen=True)
class AtlasConfig:
    """Sizes of the atlas runs. `AtlasConfig.make(quick)` gives the two built-in sizes."""

    quick: bool
    n_2d: int
    t1_2d: float
    map_grid: int
    n_high: int
    d_high: int
    t1_high: float
    high_dtype: str
    high_rtol: float
    search_iters: int
    # Horizon of the Ott–Antonsen regime maps (natural time units): cells near a boundary
    # converge slowly, and the OA ODE is cheap, so the maps look further than the cases.
    map_t1: float = 400.0
    # Horizon of the slow high-d case (the Case-4 orbit from near-isotropic tokens).
    t1_high_slow: float = 1000.0
    # Flow families: normalisations and causal masking (n tokens in d, seeds, horizon).
    families_n: int = 32
    families_d: int = 3
    families_seeds: int = 2
    families_t1: float = 300.0
    # The PLGA flow of the shipped trained layer and of its step-0 layer.
    plga_n: int = 16
    plga_inits: int = 4
    plga_t1: float = 100.0
    # The trained operator (A_h = W_qᵀ G W_k/√dk, V_h = W_o W_v) as a flow in R^D.
    operator_n: int = 32
    operator_inits: int = 4
    operator_t1: float = 50.0

    @classmethod
    def make(cls, quick: bool):
        if quick:
            return cls(
                quick=True,
                n_2d=256,
                t1_2d=100.0,
                map_grid=16,
                n_high=200,
                d_high=100,
                t1_high=150.0,
                high_dtype="float32",
                high_rtol=1e-5,
                search_iters=40,
                map_t1=400.0,
            )
        return cls(
            quick=False,
            n_2d=2048,
            t1_2d=200.0,
            map_grid=64,
            n_high=200,
            d_high=100,
            t1_high=400.0,
            high_dtype="float64",
            high_rtol=1e-7,
            search_iters=100,
            map_t1=1000.0,
            families_seeds=8,
            families_t1=3000.0,
            plga_n=64,
            plga_inits=16,
            plga_t1=400.0,
            operator_n=64,
            operator_inits=16,
            operator_t1=200.0,
        )


def load_g_lm() -> np.ndarray:
    """The learned energy-curvature tensors `G_LM` of PLDR-LLM v51-110M-1, float32 of shape
    `(layers=5, heads=14, 64, 64)` (see `jaxattn/data/NOTICE.md`)."""
    with resources.as_file(resources.files("jaxattn.data") / "pldr_v51_110m_1_G_LM.npz") as p:
        with np.load(p) as z:
            return np.asarray(z["G_LM"])


class _Progress:
    def __init__(self, total, enabled):
        self.total = total
        self.k = 0
        self.enabled = enabled
        self.t0 = time.perf_counter()
        self.times = {}

    @contextlib.contextmanager
    def section(self, name):
        self.k += 1
        t = time.perf_counter()
        if self.enabled:
            print(f"[atlas {self.k}/{self.total}] {name} ...", flush=True)
        yield
        dt = time.perf_counter() - t
        self.times[name] = dt
        if self.enabled:
            print(
                f"[atlas {self.k}/{self.total}] {name}: done in {dt:.1f} s "
                f"(total {time.perf_counter() - self.t0:.1f} s)",
                flush=True,
            )


def _label(code) -> str:
    return REGIME_NAMES[int(code)]


def _member_numbers(r, i) -> dict:
    """The classifier's headline evidence for member `i` of a sweep result (JSON-ready)."""
    ev = {k: v[i] for k, v in r.evidence.items()}
    return dict(
        regime=_label(r.regime[i]),
        final_order=float(ev["final_order"]),
        drift_rate=float(ev["drift_rate"]),
        rotation_rate=float(ev["rotation_rate"]),
        period=float(ev["period"]),
        num_clusters=int(ev["num_clusters"]),
        antipodal_pairs=int(ev["antipodal_pairs"]),
        num_steps=int(r.num_steps[i]),
        result=int(r.result[i]),
        failed=bool(r.failed[i]),
    )


def _theory_code(pred) -> int | None:
    """Map a `Prediction` to a sweep regime code (None when no claim)."""
    if not bool(pred.claims):
        return None
    return int(pred.regime._value)


def _agrees(measured: int, predicted: int) -> bool:
    # A clustering claim is met by clusters at rest or rotating.
    if predicted == 0:
        return measured in (0, 1)
    return measured == predicted


# ------------------------------------------------------------------------------ sections


def _section_cases(cfg, out, prog_bar):
    names = ["case1", "case2-interior", "case3-rotating", "case4-oscillating", "case4-clustering"]
    presets = [PRESETS[n] for n in names]
    A = np.stack([p.A for p in presets])
    V = np.stack([p.V for p in presets])
    res = {}
    for m in ("particles", "watanabe_strogatz"):
        res[m] = sweep(
            A,
            V,
            1.0,
            7,
            method=m,
            n=cfg.n_2d,
            t1=cfg.t1_2d,
            num_save=401,
            progress=prog_bar,
            dtype=np.float64,
        )
    # Ott–Antonsen from the particles' measured R₂(0) (not the law's R₀: the sample differs
    # from it by O(1/√n)), on the particles' save times, so the curves start together.
    res["ott_antonsen"] = _oa_from_particles(A, V, res["particles"])
    rows, figs = [], []
    for i, p in enumerate(presets):
        row = dict(
            case=p.name,
            description=p.description,
            A=p.A.tolist(),
            V=p.V.tolist(),
            expected=p.expected,
        )
        fig = dict(title=p.name)
        for m, r in res.items():
            row[m] = _member_numbers(r, i)
            fig[m] = dict(ts=r.ts[i], R2=r.R2[i], label=_label(r.regime[i]))
        ws_err = float(np.max(np.abs(res["particles"].R2[i] - res["watanabe_strogatz"].R2[i])))
        row["max_abs_R2_particles_minus_ws"] = ws_err
        rows.append(row)
        figs.append(fig)
    from ..plot._atlas import plot_cases

    path = _figure(plot_cases, figs, os.path.join(out, "figures", "cases_d2.png"))
    timing = {m: dict(seconds=r.seconds, members=len(r.regime)) for m, r in res.items()}
    return dict(rows=rows, n=cfg.n_2d, t1_natural=cfg.t1_2d, timing=timing, figure=path)


@eqx.filter_jit
def _oa_from_particles_batch(A, V, R0, ts, rate, rtol):
    def one(a, v, r0, t, k):
        sol = solve_ott_antonsen(
            a, v, r0, t1=t[-1], ts=t, rtol=rtol, atol=rtol * 1e-2, max_steps=65536, throw=False
        )
        # classify in the member's natural time, as the sweep does
        floor = jnp.maximum(default_gap_floor(t.dtype), 10 * rtol)
        regime, ev = classify_order_parameter(t * k, sol.R, gap_floor=floor)
        return sol.R, regime._value, ev, sol.result._value, sol.num_steps

    return jax.vmap(one)(A, V, R0, ts, rate)


def _oa_from_particles(A, V, particles):
    """Ott–Antonsen runs started at each particle member's measured `R₂(0)`, on its save
    times, with the particle members' time unit; a `SweepResult`-like namespace."""
    from types import SimpleNamespace

    t0 = time.perf_counter()
    dtype = np.asarray(particles.ts).dtype
    R, regime, ev, result, steps = _oa_from_particles_batch(
        jnp.asarray(A, dtype),
        jnp.asarray(V, dtype),
        jnp.asarray(particles.R2[:, 0]),
        jnp.asarray(particles.ts, dtype),
        jnp.asarray(particles.rate, dtype),
        1e-9 if dtype == np.float64 else 1e-6,
    )
    R = np.asarray(R)
    rate = np.asarray(particles.rate, np.float64)
    evidence = {k: np.asarray(getattr(ev, k)) for k in ev.__dataclass_fields__}
    for k in ("final_motion", "drift_rate", "rotation_rate"):
        evidence[k] = evidence[k] * rate
    evidence["period"] = evidence["period"] / rate
    result = np.asarray(result)
    failed = (result != 0) | ~np.all(np.isfinite(R), axis=1)
    return SimpleNamespace(
        R2=R,
        ts=np.asarray(particles.ts),
        regime=np.where(failed, REGIME_NAMES.index("undetermined"), np.asarray(regime)),
        evidence=evidence,
        result=result,
        failed=failed,
        num_steps=np.asarray(steps),
        seconds=time.perf_counter() - t0,
    )


def _case1_A(t, D):
    # A representative with trace t and determinant D: [[t/2, 1], [t²/4 − D, t/2]].
    return np.array([[t / 2, 1.0], [t * t / 4 - D, t / 2]])


def _rot(a):
    return np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])


def _map_slices(g):
    xs = np.linspace(-2.0, 2.0, g)
    slices = []
    # (a) Case 1: tr A vs det A at V = I.
    trs = np.linspace(-3.0, 3.0, g)
    dets = np.linspace(-3.0, 3.0, g)
    A = np.stack([_case1_A(t, D) for D in dets for t in trs])
    V = np.stack([_I2] * len(A))
    claim = "tr A = 0, det A = 0 (clustering claimed if tr A > 0 or det A ≤ 0)"
    bnd = [
        (np.zeros(2), np.array([0.0, 3.0]), claim),
        (np.array([-3.0, 3.0]), np.zeros(2), claim),
    ]
    # neg-def boundary of the symmetric part for this representative: t < 0 and
    # t²/4 > ((1 + t²/4 − D)/2)²  ⇔  D > t²/4 + 1 + t (t < 0) ... drawn as a curve.
    tt = np.linspace(-3.0, 0.0, 200)
    Dn = tt * tt / 4 + 1 + tt
    keep = (Dn >= -3) & (Dn <= 3)
    bnd.append((tt[keep], Dn[keep], "sym(A) negative definite beyond (interior claimed)"))
    slices.append(
        dict(
            key="case1_trA_detA",
            title="Case 1: V = I, A = [[t/2, 1], [t²/4 − D, t/2]]\n(trace t, determinant D)",
            short="Case 1",
            x=trs,
            y=dets,
            xlabel="tr A",
            ylabel="det A",
            A=A,
            V=V,
            criterion=case1_criterion,
            boundaries=bnd,
        )
    )
    # (b) Case 2: eigenvalues of symmetric V at A = I (eigenvectors rotated by 0.4 rad).
    Q = _rot(0.4)
    V = np.stack([Q @ np.diag([l1, l2]) @ Q.T for l2 in xs for l1 in xs])
    A = np.stack([_I2] * len(V))
    claim = "λ_max(V) = 0 (clustering iff λ_max(V) ≥ 0)"
    bnd = [
        (np.array([0.0, 0.0]), np.array([-2.0, 0.0]), claim),
        (np.array([-2.0, 0.0]), np.array([0.0, 0.0]), claim),
    ]
    slices.append(
        dict(
            key="case2_eigenvalues_V",
            title="Case 2: A = I, V = Q diag(λ₁, λ₂) Qᵀ\n(Q: rotation by 0.4 rad)",
            short="Case 2",
            x=xs,
            y=xs,
            xlabel="λ₁",
            ylabel="λ₂",
            A=A,
            V=V,
            criterion=case2_criterion,
            boundaries=bnd,
        )
    )
    # (c) Case 4: entries of V = [[v11, v12], [−v12, −v11]] at A = I.
    V = np.stack([np.array([[a, b], [-b, -a]]) for b in xs for a in xs])
    A = np.stack([_I2] * len(V))
    claim = "|v11| = |v12| (oscillation iff |v11| < |v12|)"
    bnd = [
        (np.array([-2.0, 2.0]), np.array([-2.0, 2.0]), claim),
        (np.array([-2.0, 2.0]), np.array([2.0, -2.0]), claim),
    ]
    slices.append(
        dict(
            key="case4_entries_V",
            title="Case 4: A = I\nV = [[v11, v12], [−v12, −v11]]",
            short="Case 4",
            x=xs,
            y=xs,
            xlabel="v11",
            ylabel="v12",
            A=A,
            V=V,
            criterion=case4_criterion,
            boundaries=bnd,
        )
    )
    return slices


def _section_maps(cfg, out, prog_bar):
    g = cfg.map_grid
    maps, numbers = [], {}
    for s in _map_slices(g):
        r = sweep(
            s["A"],
            s["V"],
            1.0,
            11,
            method="ott_antonsen",
            t1=cfg.map_t1,
            num_save=801,
            chunk_size=g * g,
            progress=prog_bar,
            dtype=np.float64,
            max_steps=65536,
        )
        measured = r.regime.reshape(g, g)
        predicted = [_theory_code(s["criterion"](a, v)) for a, v in zip(s["A"], s["V"])]
        claims = np.array([p is not None for p in predicted]).reshape(g, g)
        disagree = np.zeros((g, g), bool)
        for idx, (p, m) in enumerate(zip(predicted, r.regime)):
            if p is not None and not _agrees(int(m), p):
                disagree.flat[idx] = True
        undetermined = (measured == REGIME_NAMES.index("undetermined")) & claims
        n_claims = int(claims.sum())
        numbers[s["key"]] = dict(
            grid=g,
            x=s["x"].tolist(),
            y=s["y"].tolist(),
            measured=measured.tolist(),
            counts={name: int(np.sum(measured == i)) for i, name in enumerate(REGIME_NAMES)},
            cells_with_claim=n_claims,
            disagreements=int(disagree.sum()),
            disagreement_rate=float(disagree.sum() / max(n_claims, 1)),
            undetermined_where_claimed=int(undetermined.sum()),
            disagreement_rate_decided=float(
                (disagree & ~undetermined).sum() / max(n_claims - int(undetermined.sum()), 1)
            ),
            failed=int(r.failed.sum()),
            seconds=r.seconds,
        )
        maps.append(
            dict(
                title=s["title"],
                x=s["x"],
                y=s["y"],
                measured=measured,
                failed=r.failed.reshape(g, g),
                disagree=disagree,
                claimed=n_claims,
                short=s["short"],
                boundaries=s["boundaries"],
                xlabel=s["xlabel"],
                ylabel=s["ylabel"],
            )
        )
    from ..plot._atlas import plot_regime_maps

    path = _figure(plot_regime_maps, maps, os.path.join(out, "figures", "regime_maps.png"))
    return dict(maps=numbers, figure=path), maps


def _case4_family(v12):
    return lambda p: (_I2, np.array([[p, v12], [-v12, -p]]), 1.0)


def _section_bifurcation(cfg, out, prog_bar):
    fam = _case4_family(1.0)
    ps = np.linspace(-2.0, 2.0, 41 if cfg.quick else 161)
    fps = continuation(fam, ps)
    fixed = []
    for p, fp in zip(ps, fps):
        for R, kind, circ in zip(fp.R, fp.kind, fp.on_circle):
            fixed.append((float(p), complex(R), kind, bool(circ)))
    # Orbit range from OA runs along the same path (one compiled sweep).
    g = cfg.map_grid
    p_orbit = np.linspace(-2.0, 2.0, g * g)
    V = np.stack([fam(p)[1] for p in p_orbit])
    r = sweep(
        np.stack([_I2] * len(V)),
        V,
        1.0,
        11,
        method="ott_antonsen",
        t1=cfg.t1_2d,
        num_save=401,
        chunk_size=g * g,
        progress=prog_bar,
        dtype=np.float64,
        max_steps=65536,
    )
    # |R₂| range over the late window of the members that oscillate (NaN elsewhere)
    late = np.abs(r.R2[:, 200:])
    osc = r.regime == REGIME_NAMES.index("oscillation")
    lo = np.where(osc, np.min(late, 1), np.nan)
    hi = np.where(osc, np.max(late, 1), np.nan)
    folds = []
    for a, b in ((-1.5, -0.5), (0.5, 1.5)):
        p, (plo, phi), it = saddle_node_on_circle(fam, a, b, tol=1e-8)
        folds.append(
            dict(
                value=p,
                bracket=[plo, phi],
                iterations=it,
                expected=float(np.sign(p)),
                error=abs(p - np.sign(p)),
            )
        )
    counts = [int(fp.on_circle.sum()) for fp in fps]
    diagram = dict(
        p=ps,
        fixed=fixed,
        p_orbit=p_orbit,
        orbit_abs_lo=lo,
        orbit_abs_hi=hi,
        folds=[f["value"] for f in folds],
        xlabel="v11 (v12 = 1, A = I)",
        title="Case 4 family (A = I, V = [[v11, 1], [−1, −v11]]): OA fixed points by "
        "stability, orbit range",
    )
    from ..plot._atlas import plot_bifurcation

    path = _figure(plot_bifurcation, diagram, os.path.join(out, "figures", "bifurcation_case4.png"))
    return dict(
        family="A = I, V = [[v11, 1], [-1, -v11]]",
        saddle_nodes=folds,
        circle_equilibria_along_path=dict(p=ps.tolist(), count=counts),
        regimes_along_path={
            name: int(np.sum(r.regime == i)) for i, name in enumerate(REGIME_NAMES)
        },
        figure=path,
    )


@eqx.filter_jit
def _oa_orbits(A, V, R0s, ts):
    def one(R0):
        sol = solve_ott_antonsen(
            A, V, R0, t1=ts[-1], ts=ts, rtol=1e-11, atol=1e-13, max_steps=1 << 18, throw=False
        )
        return sol.R, sol.result._value, sol.num_steps

    return jax.vmap(one)(R0s)


def _section_hamiltonian(cfg, out):
    portraits, numbers = [], {}
    ts = jnp.linspace(0.0, 40.0, 4001, dtype=jnp.float64)
    x = np.linspace(-0.995, 0.995, 240)
    X, Y = np.meshgrid(x, x)
    inside = X**2 + Y**2 < 0.995**2
    for v11, v12 in ((0.2, 1.0), (1.0, 0.2)):
        A = jnp.eye(2, dtype=jnp.float64)
        V = jnp.array([[v11, v12], [-v12, -v11]], jnp.float64)
        R0s = jnp.array([0.3j, -0.5j, 0.5 + 0.2j, -0.2 - 0.8j, 0.7 + 0.0j])
        R, res, steps = _oa_orbits(A, V, R0s, ts)
        R = np.asarray(R)
        H = np.asarray(case4_hamiltonian(R, v11, v12))
        finite = np.abs(R) < 1 - 1e-6
        drift = [
            float(np.max(np.abs(h[f] - h[0])) / abs(h[0])) if f.sum() > 1 else float("nan")
            for h, f in zip(H, finite)
        ]
        key = f"v11={v11},v12={v12}"
        entry = dict(
            H_relative_drift=drift,
            final_abs_R=np.abs(R[:, -1]).tolist(),
            results=np.asarray(res).tolist(),
        )
        if abs(v11) < abs(v12):
            Rc, ev = case4_centre(v11, v12)
            entry["centre"] = [float(np.real(Rc)), float(np.imag(Rc))]
            entry["linear_period"] = float(2 * np.pi / abs(np.imag(ev[0])))
            entry["periods"] = [measured_period(np.asarray(ts), Ri) for Ri in R]
        numbers[key] = entry
        Hg = np.where(inside, np.asarray(case4_hamiltonian(X + 1j * Y, v11, v12)), np.nan)
        portraits.append(
            dict(
                title=f"v11 = {v11}, v12 = {v12}: "
                + ("closed orbits" if abs(v11) < abs(v12) else "clustering"),
                grid=(X, Y, Hg),
                orbits=list(R),
            )
        )
    from ..plot._atlas import plot_phase_portrait

    path = _figure(
        plot_phase_portrait, portraits, os.path.join(out, "figures", "case4_phase_portrait.png")
    )
    # Case 3: rotating clusters, rate measured against the circle integral.
    A3, V3 = PRESETS["case3-rotating"].A, PRESETS["case3-rotating"].V
    # Same shapes as above: one compiled function for every orbit of this section.
    R0s = jnp.array([0.1 + 0.0j, 0.3j, -0.5j, 0.5 + 0.2j, -0.2 - 0.8j])
    R3, _, _ = _oa_orbits(jnp.asarray(A3, jnp.float64), jnp.asarray(V3, jnp.float64), R0s, ts)
    measured = measured_rotation_rate(ts, np.asarray(R3[0]))
    theory = rotation_rate_on_circle(A3, V3)
    return dict(
        hamiltonian="H(R) = (2 v11 Im R + v12 (1 + |R|^2)) / (1 - |R|^2)^2, "
        "integrating factor (1 - |R|^2)^-3",
        orbits=numbers,
        case3_rotation=dict(
            measured=measured, theory=theory, relative_error=abs(measured - theory) / theory
        ),
        figure=path,
    )


def _section_high_d(cfg, out, prog_bar):
    names = ["case1", "case3-rotating", "case4-oscillating", "case4-clustering"]
    d = cfg.d_high
    A = np.stack([np.asarray(block_embed(PRESETS[k].A, d)) for k in names])
    V = np.stack([np.asarray(block_embed(PRESETS[k].V, d)) for k in names])
    dtype = np.dtype(cfg.high_dtype)
    # From uniform tokens Q ≈ I/d, so the Case-4 orbit around the isotropic centre is about
    # d/2 times slower than in d = 2 (period ≈ 120 natural units at d = 100): that case gets
    # its own, longer horizon so that the late window holds several periods.
    slow = {"case4-oscillating"}
    groups = [
        ([i for i, k in enumerate(names) if k not in slow], cfg.t1_high, 201),
        ([i for i, k in enumerate(names) if k in slow], cfg.t1_high_slow, 401),
    ]
    rows, runs, timing = [], [], {}
    for kernel in ("lsa", "usa"):
        timing[kernel] = dict(seconds=0.0, members=len(names))
        found = {}
        for idx, t1, num_save in groups:
            r = sweep(
                A[idx],
                V[idx],
                1.0,
                5,
                method="particles",
                kernel=kernel,
                n=cfg.n_high,
                t1=t1,
                num_save=num_save,
                init="uniform",
                chunk_size=1,
                progress=prog_bar,
                dtype=dtype,
                rtol=cfg.high_rtol,
                atol=cfg.high_rtol * 1e-2,
                score_shift="auto" if kernel == "usa" else 0.0,
            )
            timing[kernel]["seconds"] += r.seconds
            for j, i in enumerate(idx):
                found[i] = (r, j, t1)
        for i, k in enumerate(names):
            r, j, t1 = found[i]
            rows.append(
                dict(
                    case=k,
                    kernel=kernel,
                    d2_expected=PRESETS[k].expected,
                    t1_natural=t1,
                    **_member_numbers(r, j),
                )
            )
            runs.append(
                dict(
                    case=k,
                    kernel=kernel,
                    ts=r.ts[j],
                    order=r.order[j],
                    regime=_label(r.regime[j]),
                    **{
                        e: float(r.evidence[e][j])
                        for e in ("final_gap", "final_motion", "rotation_rate", "period")
                    },
                )
            )
    from ..plot._atlas import plot_high_d

    path = _figure(
        plot_high_d,
        runs,
        os.path.join(out, "figures", "high_d.png"),
        title=f"d = {d}, n = {cfg.n_high}, uniform initial tokens: order ρ per case (ρ = 1: "
        "every token on one line, i.e. one cluster or one antipodal pair)",
    )
    return dict(
        d=d,
        n=cfg.n_high,
        t1_natural=cfg.t1_high,
        t1_natural_slow=cfg.t1_high_slow,
        slow_cases=sorted(slow),
        dtype=cfg.high_dtype,
        embedding="A = I_{d/2} ⊗ A₂, V = I_{d/2} ⊗ V₂",
        rows=rows,
        timing=timing,
        figure=path,
    )


def _section_search(cfg, out, case2_map):
    # Start inside the no-clustering region of Case 2 and climb the order score.
    start = jnp.array([-1.0, -0.5], jnp.float64)
    res = regime_search(
        start,
        lambda p: (jnp.eye(2, dtype=p.dtype), jnp.diag(p)),
        target="clustering",
        learning_rate=0.1,
        max_iters=cfg.search_iters,
        threshold=0.99,
        t1=40.0,
    )
    path_pts = np.asarray(res.history["params"])
    final = np.asarray(res.params)
    pts = np.concatenate([path_pts, final[None]], 0)
    from ..plot._atlas import plot_search

    fig = _figure(
        plot_search,
        dict(path=pts, score=res.history["score"], threshold=0.99, map=case2_map),
        os.path.join(out, "figures", "gradient_search.png"),
    )
    # The regime of the end point, from a fresh sweep member (OA), and theory.
    lam = final
    verdict = sweep(
        np.eye(2),
        np.diag(lam),
        1.0,
        0,
        method="ott_antonsen",
        t1=400.0,
        num_save=401,
        progress=False,
        dtype=np.float64,
    )
    return dict(
        parametrisation="A = I, V = diag(λ₁, λ₂); score = ⟨|R₂|⟩ over t ∈ [20, 40] (OA)",
        start=start.tolist(),
        end=final.tolist(),
        steps=res.steps,
        reached=bool(res.reached),
        score_start=float(res.history["score"][0]),
        score_end=float(res.history["score"][-1]),
        end_lambda_max=float(np.max(final)),
        theory_boundary="λ_max(V) = 0",
        end_regime=_label(verdict.regime[0]),
        figure=fig,
    )


_FAMILIES = (
    ("Post-LN", dict(normalisation="post_ln", causal=False)),
    ("Pre-LN", dict(normalisation="pre_ln", causal=False)),
    ("nGPT", dict(normalisation="ngpt", causal=False)),
    ("Post-LN, causal", dict(normalisation="post_ln", causal=True)),
)


@eqx.filter_jit
def _family_runs(field, x0s, ts, lin):
    """Solve one flow from each initial token set (vmapped) and classify it on the equally
    spaced save times `ts[lin]` (the directions, for Pre-LN states)."""

    def one(x0):
        tr = simulate(
            field, x0, t1=ts[-1], ts=ts, rtol=1e-10, atol=1e-13, max_steps=1 << 20, throw=False
        )
        xs = tr.xs
        regime, ev = classify_tokens(ts[lin], normalise(xs[lin]))
        return xs, regime._value, ev.num_clusters, ev.final_gap, tr.result._value, tr.num_steps

    return jax.vmap(one)(x0s)


def _cap_law(key, n, d, dtype):
    """A spherical cap: `normalise(e₁ + ½ g)`, `g` standard normal (the atlas's concentrated
    initial law)."""
    g = jax.random.normal(key, (n, d), dtype)
    return normalise(jnp.zeros((n, d), dtype).at[:, 0].set(1.0) + 0.5 * g)


def step0_layer(layer):
    """The step-0 (random-initialised) PLGA layer of the training run that made the shipped
    `TrainedLayer`: layer `layer.layer` of `PLDRLLM(config, key=jax.random.key(seed))` with
    the run's own model config and seed (its provenance), in the trained layer's dtype."""
    from ..plga import PLDRLLM, PLDRLLMConfig

    prov = layer.info["provenance"]
    model = PLDRLLM(PLDRLLMConfig(**prov["model_config"]), key=jax.random.key(int(prov["seed"])))
    attn = model.layers[layer.layer].attn
    dtype = layer.G.dtype
    return jax.tree.map(lambda a: a.astype(dtype) if eqx.is_inexact_array(a) else a, attn)


def _section_families(cfg, out, prog_bar):
    from ..plga import load_atlas_layer
    from ..sphere import sample_uniform
    from ._plga_flow import PLGAFlow
    from ._sweep import Integration, Members, Runner

    dtype = jnp.result_type(float)
    n, d, t1 = cfg.families_n, cfg.families_d, cfg.families_t1
    seeds = list(range(cfg.families_seeds))
    lin = np.linspace(0.0, t1, 201)
    ts = np.unique(np.concatenate([lin, np.geomspace(1e-2, t1, 240)]))
    lin_idx = np.searchsorted(ts, lin)
    x0s = jnp.stack([sample_uniform(jax.random.key(s), n, d, dtype=dtype) for s in seeds])
    eye = jnp.eye(d, dtype=dtype)
    rows, curves = [], []
    for name, kw in _FAMILIES:
        field = AttentionDynamics(eye, eye, beta=1.0, kernel="sa", **kw)
        xs, regime, clusters, gap, result, steps = _family_runs(
            field, x0s, jnp.asarray(ts, dtype), jnp.asarray(lin_idx)
        )
        xs = np.asarray(xs)
        per_seed = []
        for i, s in enumerate(seeds):
            spread = direction_spread(xs[i])
            theta = xs[i] / np.linalg.norm(xs[i], axis=-1, keepdims=True)
            mean = np.mean(theta[-1], axis=0)
            consensus = mean / np.linalg.norm(mean)
            fit = decay_fits(ts, spread)
            per_seed.append(
                dict(
                    seed=s,
                    regime=_label(regime[i]),
                    num_clusters=int(clusters[i]),
                    final_gap=float(gap[i]),
                    spread_end=float(spread[-1]),
                    radius_end=float(np.mean(np.linalg.norm(xs[i, -1], axis=-1))),
                    first_token_displacement=float(
                        np.max(np.linalg.norm(theta[:, 0] - theta[0, 0], axis=-1))
                    ),
                    consensus_to_token1=float(np.linalg.norm(consensus - theta[0, 0])),
                    result=int(result[i]),
                    num_steps=int(steps[i]),
                    fit=fit,
                )
            )
            if i == 0:
                curves.append(dict(label=name, ts=ts, spread=spread, fit=fit))
        rows.append(dict(flow=name, **kw, seeds=per_seed))
    # The PLGA flow of the shipped trained layer and of the same run's step-0 layer.
    layer = load_atlas_layer(dtype=dtype)
    attn0 = step0_layer(layer)
    dk = layer.attn.head_dim
    plga_flows = {
        "trained (1000 steps)": layer.plga_flow(),
        "random init (step 0)": PLGAFlow.from_layer(attn0),
    }
    laws = {"uniform": "uniform", "cap": _cap_law}
    plga = dict(
        n=cfg.plga_n,
        inits=cfg.plga_inits,
        t1_natural=cfg.plga_t1,
        dk=dk,
        heads=layer.attn.num_heads,
        beta=1 / np.sqrt(dk),
        V="I (every head)",
        laws={"uniform": "uniform on S^{dk−1}", "cap": "normalise(e₁ + ½ g), g ~ N(0, I)"},
        rows=[],
    )
    for fname, flow in plga_flows.items():
        for law_name, law in laws.items():
            res = sweep(
                Members(
                    flow,
                    seeds=np.arange(cfg.plga_inits),
                    n=cfg.plga_n,
                    d=dk,
                    batched=False,
                    init=law,
                ),
                integration=Integration(cfg.plga_t1, 201, dtype=dtype),
                runner=Runner(progress=prog_bar),
            )
            names = [str(x) for x in res.regime_names]
            plga["rows"].append(
                dict(
                    flow=fname,
                    law=law_name,
                    regimes=names,
                    fractions={r: names.count(r) / len(names) for r in dict.fromkeys(names)},
                    num_clusters=np.asarray(res.evidence["num_clusters"]).tolist(),
                    final_gap=np.asarray(res.evidence["final_gap"]).tolist(),
                    seeds=np.asarray(res.seed).tolist(),
                    rate=np.asarray(res.rate).tolist(),
                    failed=int(np.sum(res.failed)),
                    seconds=res.seconds,
                )
            )
    from ..plot._atlas import plot_flow_families

    path = _figure(
        plot_flow_families,
        curves,
        plga["rows"],
        os.path.join(out, "figures", "flow_families.png"),
    )
    return dict(
        flow=f"softmax (SA), A = V = I, β = 1, d = {d}, n = {n}",
        t1=t1,
        seeds=seeds,
        fit_window="1e-12 < V(t) < 1e-2",
        rows=rows,
        plga=plga,
        figure=path,
    )


def _section_operator(cfg, out, prog_bar):
    from ..plga import load_atlas_layer, operator_regimes
    from ..plga._operator_flow import operator_of_attention

    dtype = jnp.result_type(float)
    layer = load_atlas_layer(dtype=dtype)
    attn0 = step0_layer(layer)
    probe = layer.x_probe
    # The step-0 layer's collapsed G: its G_LM on the shipped probe tokens (the trained
    # model's layer input); β = r² = D, a unit-gain LayerNorm's output (the step-0 input).
    _, ded = attn0(probe, positions=jnp.arange(probe.shape[0]))
    G0 = ded.G_LM if ded.G_LM.ndim == 3 else ded.G_LM[-1]
    D = int(layer.attn.wq.weight.shape[1])
    ops = {
        "step 0 (random init)": operator_of_attention(attn0, G0, beta=float(D), layer=layer.layer),
        "step 1000 (trained)": layer.operator(),
    }
    res = operator_regimes(
        ops,
        layer.layer,
        inits=cfg.operator_inits,
        n=cfg.operator_n,
        t1=cfg.operator_t1,
    )
    from ..plot import plot_operator_regimes

    def draw(path):
        import matplotlib.pyplot as plt

        fig = plot_operator_regimes(
            res,
            title=f"Trained operator of layer {layer.layer} (D = {D}): regimes over "
            f"{cfg.operator_inits} sets of n = {cfg.operator_n} uniform tokens",
            path=path,
        )
        plt.close(fig)
        return path

    path = _figure(draw, os.path.join(out, "figures", "trained_operator.png"))
    return dict(
        construction="A_h = W_q,hᵀ G_h W_k,h / √dk, V_h = W_o,h W_v,h (D × D), β = r²; "
        "heads summed (MultiHeadDynamics) and each head alone (AttentionDynamics), softmax "
        "kernel, Post-LN (tokens on S^{D−1})",
        dropped="the query/key/value/output biases, RoPE, the causal mask, the LayerNorms "
        "around the layer (Post-LN is the projection onto the sphere), the feed-forward "
        "network and the other layer",
        G_trained="mean G_LM over 8 held-out prompts (shipped with the layer)",
        G_step0="the step-0 layer's G_LM on the shipped probe tokens (16 positions)",
        beta={k: float(v.beta) for k, v in ops.items()},
        D=D,
        heads=int(layer.attn.num_heads),
        dk=int(layer.attn.head_dim),
        layer=int(layer.layer),
        n=cfg.operator_n,
        inits=cfg.operator_inits,
        t1_natural=cfg.operator_t1,
        checkpoints=res["checkpoints"],
        source="jaxattn/data/atlas_tiny_plga.npz (experiments/train_atlas_model.py, "
        "1000 steps on the packaged corpus; see NOTICE.md)",
        figure=path,
    )


# ------------------------------------------------------------------------------ report


# A slice where basin fractions split: entries of V around a random pair of the d = 2 LSA
# flow whose Ott–Antonsen ODE has clustering on the circle and a periodic orbit inside the
# disc side by side (found by a sweep of 600 random pairs × 8 initial states).
_MULTI_A = ((-1.722, 0.671), (-0.14, 1.706))
_MULTI_V = ((-0.171, 0.698), (0.821, 0.404))


def _section_multistability(cfg, out, prog_bar):
    g = 10 if cfg.quick else 40
    k = 8 if cfg.quick else 32
    (a11, a12), (a21, a22) = _MULTI_A
    (v11, v12), (v21, v22) = _MULTI_V
    m = regime_map(
        "entries",
        {"v12": np.linspace(v12 - 0.6, v12 + 0.6, g), "v21": np.linspace(v21 - 0.6, v21 + 0.6, g)},
        fixed=dict(a11=a11, a12=a12, a21=a21, a22=a22, v11=v11, v22=v22, beta=1.0),
        method="ott_antonsen",
        inits=k,
        t1=cfg.map_t1,
        num_save=801,
        progress=prog_bar,
    )
    m.save(os.path.join(out, "multistability"))
    from ..plot import plot_regime_map

    def draw(path):
        import matplotlib.pyplot as plt

        ax = plot_regime_map(
            m,
            title=f"Basin fractions, A = {[list(r) for r in _MULTI_A]}, V = [[{v11}, v12], "
            f"[v21, {v22}]] (Ott–Antonsen, {k} initial R₂(0) per cell)",
        )
        ax.figure.savefig(path, dpi=130, bbox_inches="tight")
        plt.close(ax.figure)
        return path

    path = _figure(draw, os.path.join(out, "figures", "multistability.png"))
    top = np.max(m.fractions, axis=-1)
    split = m.multistable
    pairs = {}
    for cell in zip(*np.nonzero(split)):
        names = tuple(
            REGIME_NAMES[i]
            for i in np.argsort(m.fractions[cell])[::-1][:2]
            if m.fractions[cell][i] > 0
        )
        pairs[" + ".join(names)] = pairs.get(" + ".join(names), 0) + 1
    return dict(
        A=[list(r) for r in _MULTI_A],
        V_fixed=dict(v11=v11, v22=v22),
        axes={name: [float(v[0]), float(v[-1]), len(v)] for name, v in m.axes},
        inits=k,
        cells=int(m.dominant.size),
        multistable_cells=int(split.sum()),
        coexisting=pairs,
        min_dominant_fraction=float(np.min(top)),
        failed_members=int(m.failed.sum()),
        seconds=m.seconds,
        figure=path,
        folder=os.path.join(out, "multistability"),
    )


def _section_chaos(cfg, out):
    from ..plot import plot_chaos
    from ._chaos import chaos_section

    c = chaos_section(quick=cfg.quick)

    def draw(path):
        import matplotlib.pyplot as plt

        plt.close(plot_chaos(c, path))
        return path

    path = _figure(draw, os.path.join(out, "figures", "chaos.png"))
    return dict(
        flow=c["flow"],
        t1=c["t1"],
        transient=c["transient"],
        num_renorm=c["num_renorm"],
        exponents=np.asarray(c["exponents"]).tolist(),
        uncertainty=np.asarray(c["uncertainty"]).tolist(),
        chaotic=np.asarray(c["chaotic"]).tolist(),
        sum=np.asarray(c["sum"]).tolist(),
        section=c["section"],
        poincare_points=int(np.asarray(c["poincare"]).shape[0]),
        seconds=c["seconds"],
        figure=path,
    )


def _complex(re, im, nd=4) -> str:
    """`a + b i` / `a − b i`, with a rounding-sized part shown as 0 (no "-0.0000")."""
    re, im = (0.0 if abs(x) < 0.5 * 10.0**-nd else float(x) for x in (re, im))
    sign = "−" if im < 0 else "+"
    return f"{re:.{nd}f} {sign} {abs(im):.{nd}f} i"


def _fmt(x, nd=4):
    if x is None:
        return "–"
    if isinstance(x, float):
        if np.isnan(x):
            return "–"
        return f"{x:.{nd}g}"
    return str(x)


# Figures that could not be drawn in the current `run_atlas` call (reset by it).
_FIGURE_ERRORS: list = []


def _figure(plot, *args, **kwargs):
    """Draw one atlas figure. A plotting failure (a blocked path, a full disk, a broken
    backend) is recorded — `report["figure_errors"]`, a note in `atlas.md`, exit code 3 of
    `jaxattn atlas` — and never raised: the computed numbers must survive it. Returns the
    figure's path either way (the intended path when it failed)."""
    try:
        return plot(*args, **kwargs)
    except Exception as err:  # noqa: BLE001 - any plotting failure is reported, not raised
        path = next((a for a in args if isinstance(a, str) and a.endswith(".png")), None)
        _FIGURE_ERRORS.append(
            dict(figure=path, plot=plot.__name__, error=f"{type(err).__name__}: {err}")
        )
        try:
            import matplotlib.pyplot as plt

            plt.close("all")
        except Exception:  # noqa: BLE001
            pass
        return path


def _write_markdown(report, out):
    lines = []
    w = lines.append
    cfg = report["config"]
    w("# jaxattn regime atlas\n")
    w(
        f"Mode: **{'quick' if cfg['quick'] else 'full'}** · "
        f"total time **{report['seconds']:.1f} s** · "
        f"devices: {report['environment']['devices']} · jax {report['environment']['jax']} · "
        f"written {report['environment']['date']}\n"
    )
    w(
        "Every number below is measured by this run and stored in `atlas.json`. Regimes: Type 1 "
        "convergent antipodal clusters, Type 2 rotating clusters, Type 3 oscillation, convergence "
        "without clustering (interior), undetermined. Particle and Watanabe–Strogatz runs are "
        "classified from their tokens (`classify_tokens`), Ott–Antonsen runs from R₂ "
        "(`classify_order_parameter`), by the same rate-based rules, applied in each member's "
        "natural time unit (t·β‖A‖‖V‖ for LSA). Clusters: groups of final tokens within a chordal "
        "distance of 1e-3 (pairs: antipodal pairs among them).\n"
    )
    s = report["cases"]
    w("## 1. The four cases in d = 2 (particles, Watanabe–Strogatz, Ott–Antonsen)\n")
    w(
        f"n = {s['n']} particles from a wrapped-Cauchy sample with |R₂(0)| ≈ 0.1 "
        "(Watanabe–Strogatz from the same tokens, Ott–Antonsen from the particles' measured "
        "R₂(0), so all three start together); horizon "
        f"{s['t1_natural']} natural time units (each member's t·β‖A‖‖V‖); the rates, periods "
        "and figure time axes are in physical time. d arg R₂/dt is the mean drift over the "
        "last third of the late window (for a non-uniform rotation the period is the sharper "
        "measure: 2π/period is the mean rotation rate of R₂).\n"
    )
    w(
        "| case | expected | particles | WS | OA | final abs R₂ (particles) | d arg R₂/dt "
        "| period | clusters (pairs) | max abs(R₂ particles − R₂ WS) |"
    )
    w("|---|---|---|---|---|---|---|---|---|---|")
    for r in s["rows"]:
        p = r["particles"]
        w(
            f"| {r['case']} | {r['expected']} | {p['regime']} | "
            f"{r['watanabe_strogatz']['regime']} | "
            f"{r['ott_antonsen']['regime']} | {_fmt(p['final_order'])} | "
            f"{_fmt(p['drift_rate'])} | {_fmt(p['period'])} | "
            f"{p['num_clusters']} ({p['antipodal_pairs']}) | "
            f"{_fmt(r['max_abs_R2_particles_minus_ws'], 2)} |"
        )
    w(f"\n![cases](figures/{os.path.basename(s['figure'])})\n")
    m = report["maps"]
    w("## 2. Regime maps with the paper's stated boundaries\n")
    w(
        f"Ott–Antonsen sweeps (one compiled function per slice shape), horizon {cfg['map_t1']} "
        "natural time units. A cell disagrees when the "
        "stated criterion makes a claim (Case 1: clustering if tr A > 0 or det A ≤ 0, interior if "
        "sym(A) < 0; Case 2: clustering iff λ_max(V) ≥ 0; Case 4: oscillation iff |v11| < |v12|) "
        "and the measured regime differs (a clustering claim is met by Type 1 or Type 2).\n"
    )
    w(
        "| slice | grid | cells with a claim | disagreements | rate | of which undetermined "
        "| rate among decided |"
    )
    w("|---|---|---|---|---|---|---|")
    for k, v in m["maps"].items():
        w(
            f"| {k} | {v['grid']}×{v['grid']} | {v['cells_with_claim']} | {v['disagreements']} | "
            f"{v['disagreement_rate']:.3f} | {v['undetermined_where_claimed']} | "
            f"{v['disagreement_rate_decided']:.3f} |"
        )
    w(f"\n![maps](figures/{os.path.basename(m['figure'])})\n")
    b = report["bifurcation"]
    w("## 3. Bifurcation diagram (Case-4 family)\n")
    w(
        f"Family {b['family']}. Fixed points of the OA ODE by Newton's method (optimistix) with "
        "Jacobian stability; two-cluster equilibria live on |R₂| = 1. Saddle-nodes on the circle "
        "refined by bisection:\n"
    )
    for f in b["saddle_nodes"]:
        w(
            f"- v11* = {f['value']:.10f} (bracket width {f['bracket'][1] - f['bracket'][0]:.1e}, "
            f"{f['iterations']} bisections; |v11* − v12·sign| = {f['error']:.1e})"
        )
    w(f"\n![bifurcation](figures/{os.path.basename(b['figure'])})\n")
    h = report["hamiltonian"]
    w("## 4. Case 4: the hidden Hamiltonian; Case 3: rotation rate\n")
    w(
        f"Conserved quantity: `{h['hamiltonian']}` (derived analytically; verified along OA "
        "solutions).\n"
    )
    for k, v in h["orbits"].items():
        drift = max((d for d in v["H_relative_drift"] if d is not None), default=float("nan"))
        line = (
            f"- {k}: max relative drift of H along 5 orbits (while |R₂| < 1 − 1e-6) "
            f"{drift:.1e}; final abs R₂ {[_fmt(x, 6) for x in v['final_abs_R']]}"
        )
        if "periods" in v:
            line += (
                f"; periods {[_fmt(p, 6) for p in v['periods']]}; linear period at the "
                f"centre {v['linear_period']:.4f} (centre R = {_complex(*v['centre'])})"
            )
        w(line)
    c3 = h["case3_rotation"]
    w(
        f"- Case 3 (A = diag(2, 1), V = I + J): rotation rate of arg R₂ measured "
        f"{c3['measured']:.8f}, theory 2π/∮dψ/g(ψ) = {c3['theory']:.8f} (relative error "
        f"{c3['relative_error']:.1e})."
    )
    w(f"\n![phase portrait](figures/{os.path.basename(h['figure'])})\n")
    hd = report["high_d"]
    w(f"## 5. d = {hd['d']}, n = {hd['n']}: the d = 2 behaviours in high dimension\n")
    w(
        f"Embedding {hd['embedding']}, uniform initial tokens, horizon {hd['t1_natural']} natural "
        f"time units ({hd['t1_natural_slow']} for {', '.join(hd['slow_cases'])}: from "
        f"near-isotropic tokens its orbit is about d/2 times slower than in d = 2), {hd['dtype']}. "
        "Classifier: `classify_tokens` — clustering gap 1 − ρ² "
        "of Q = XᵀX/n and the tokens' mean angular speed; it does not use d = 2.\n"
    )
    w(
        "| case | kernel | d = 2 regime | measured | order ρ | token angular speed | period "
        "| clusters (pairs) | steps |"
    )
    w("|---|---|---|---|---|---|---|---|---|")
    for r in hd["rows"]:
        w(
            f"| {r['case']} | {r['kernel']} | {r['d2_expected']} | {r['regime']} | "
            f"{_fmt(r['final_order'])} | {_fmt(r['rotation_rate'])} | {_fmt(r['period'])} | "
            f"{r['num_clusters']} ({r['antipodal_pairs']}) | {r['num_steps']} |"
        )
    w(f"\n![high d](figures/{os.path.basename(hd['figure'])})\n")
    se = report["search"]
    w("## 6. Gradient-based boundary crossing\n")
    w(
        f"{se['parametrisation']}. Adam from λ = {se['start']} (score {se['score_start']:.3f}) "
        f"to λ = {[round(x, 5) for x in se['end']]} (score {se['score_end']:.3f}) in "
        f"{se['steps']} gradient steps through the diffrax solve; λ_max at the end "
        f"{se['end_lambda_max']:.5f} (stated boundary: {se['theory_boundary']}); regime of the "
        f"end point: {se['end_regime']}.\n"
    )
    w(f"![search](figures/{os.path.basename(se['figure'])})\n")
    ff = report["flow_families"]
    w("## 7. Flow families: normalisation, causal masking, the PLGA flow\n")
    w(
        f"The same flow — {ff['flow']} — and the same initial tokens (uniform on the sphere, "
        f"seeds {ff['seeds']}) under Post-LN (the flow on the sphere), Pre-LN (the residual "
        "stream's radius evolves, attention reads the directions), nGPT (normalised updates) "
        "and Post-LN with a causal mask (token k attends to j ≤ k), to t = "
        f"{ff['t1']:g}. The spread of the directions V(t) = 1 − |mean θ|² is fitted over "
        f"{ff['fit_window']} by an exponential (rate λ) and a power law (exponent p) "
        "(`decay_fits`); the higher R² names the law (near one cluster Post-LN gives "
        "V ~ e^(−2t), Pre-LN V ~ t^(−2)). Regimes by `classify_tokens` on the directions at "
        "equally spaced times of the second half of the run; 'token 1 moved' is "
        "max_t |θ₁(t) − θ₁(0)|, 'consensus to token 1' the distance of the final mean "
        "direction to token 1's initial position θ₁(0).\n"
    )
    w(
        "| flow | seed | regime | clusters | law | λ (R²) | p (R²) | V(t₁) | mean radius "
        "| token 1 moved | consensus to token 1 |"
    )
    w("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in ff["rows"]:
        for x in r["seeds"]:
            f = x["fit"]
            law = f.get("law", "–")
            lam = f"{f['exp_rate']:.4g} ({f['exp_r2']:.4f})" if "law" in f else "–"
            pw = f"{f['power_exponent']:.4g} ({f['power_r2']:.4f})" if "law" in f else "–"
            w(
                f"| {r['flow']} | {x['seed']} | {x['regime']} | {x['num_clusters']} | {law} | "
                f"{lam} | {pw} | {_fmt(x['spread_end'], 2)} | {_fmt(x['radius_end'])} | "
                f"{_fmt(x['first_token_displacement'], 2)} | "
                f"{_fmt(x['consensus_to_token1'], 2)} |"
            )
    pg = ff["plga"]
    w(
        f"\nThe PLGA flow (`PLGAFlow`): softmax attention on S^(dk−1) (dk = {pg['dk']}, "
        f"{pg['heads']} heads, V = {pg['V']}, β = 1/√dk) whose bilinear forms G_LM(D) the "
        "layer's metric learner regenerates from the tokens' own density operator "
        "D = Σ θθᵀ at every instant. Layers: the shipped trained layer "
        "(`load_atlas_layer`, 1000 training steps) and the step-0 layer of the same training "
        f"run (same config and seed). {pg['inits']} seeds per initial law, n = {pg['n']} "
        f"tokens, horizon {pg['t1_natural']:g} natural time units, through "
        "`sweep(Members(flow, ...))`. Laws: "
        + "; ".join(f"{k}: {v}" for k, v in pg["laws"].items())
        + ".\n"
    )
    w("| layer | law | regime fractions | clusters | failed |")
    w("|---|---|---|---|---|")
    for r in pg["rows"]:
        fr = ", ".join(f"{k} {v:.2f}" for k, v in r["fractions"].items())
        w(f"| {r['flow']} | {r['law']} | {fr} | {r['num_clusters']} | {r['failed']} |")
    w(f"\n![flow families](figures/{os.path.basename(ff['figure'])})\n")
    op = report["trained_operator"]
    w("## 8. The trained operator as a multi-head flow (tiny PLDR-LLM, early vs late)\n")
    w(
        f"Layer {op['layer']} of the tiny PLDR-LLM ({op['source']}) read as a particle flow "
        f"in its own residual-stream dimension D = {op['D']}: {op['construction']}. "
        f"Dropped: {op['dropped']}. G_h late: {op['G_trained']}; early: {op['G_step0']}. "
        f"β = r²: late {op['beta']['step 1000 (trained)']:.2f} (the RMS norm of the layer's "
        f"input on held-out prompts), early {op['beta']['step 0 (random init)']:.0f} (= D, a "
        f"unit-gain LayerNorm). {op['inits']} sets of n = {op['n']} tokens uniform on "
        f"S^(D−1) per flow, horizon {op['t1_natural']:g} natural time units "
        "(`operator_regimes`). This replaces the earlier section that used the v51 G_LM "
        "heads as A with V = I, where every head clustered trivially.\n"
    )
    w("| checkpoint | flow | regime fractions | failed | clusters (median) | ‖A‖₂ | ‖V‖₂ |")
    w("|---|---|---|---|---|---|---|")
    for cp in op["checkpoints"]:
        for name, f in cp["flows"].items():
            fr = ", ".join(f"{k} {v:.2f}" for k, v in f["fractions"].items())
            w(
                f"| {cp['label']} | {name} | {fr} | {f['failed']} | "
                f"{_fmt(f['num_clusters_median'])} | {f['A_norm']:.3g} | {f['V_norm']:.3g} |"
            )
    w(f"\n![trained operator](figures/{os.path.basename(op['figure'])})\n")
    ms = report["multistability"]
    w("## 9. Multistability: basin fractions\n")
    w(
        f"A = {ms['A']}, V = [[{ms['V_fixed']['v11']}, v12], [v21, {ms['V_fixed']['v22']}]], "
        f"β = 1, Ott–Antonsen, {ms['inits']} initial states R₂(0) drawn uniformly in the disc "
        f"of radius 0.9 per cell (`regime_map(..., init='disc')`), {ms['cells']} cells. "
        f"Cells where no regime holds ≥ 90 % of the initial states: "
        f"**{ms['multistable_cells']}** (coexisting regimes: {ms['coexisting'] or 'none'}); "
        f"smallest dominant share {ms['min_dominant_fraction']:.2f}; failed members "
        f"{ms['failed_members']}. The map is saved in `{ms['folder']}` "
        "(`RegimeMap.load`).\n"
    )
    w(f"![multistability](figures/{os.path.basename(ms['figure'])})\n")
    ch = report["chaos"]
    w("## 10. Chaos in three tokens\n")
    w(
        f"USA, d = 2, n = 3, A = {ch['flow']['A']}, V = {ch['flow']['V']}, β = "
        f"{ch['flow']['beta']}: Lyapunov spectrum (all three exponents of the flow on the "
        f"3-torus) over t ∈ [{ch['transient']:g}, {ch['t1']:g}] from "
        f"{len(ch['exponents'])} random starts, QR every {ch['t1'] / ch['num_renorm']:g} time "
        f"units. Poincaré section: {ch['section']} ({ch['poincare_points']} points).\n"
    )
    w("| start | λ₁ ± σ₁ | λ₂ ± σ₂ | λ₃ ± σ₃ | Σλ | chaotic (λ₁ > max(3σ₁, 1e-3)) |")
    w("|---|---|---|---|---|---|")
    for i, (lam, sig) in enumerate(zip(ch["exponents"], ch["uncertainty"])):
        cells = " | ".join(f"{a:.4f} ± {b:.4f}" for a, b in zip(lam, sig))
        w(f"| {i} | {cells} | {ch['sum'][i]:.4f} | {ch['chaotic'][i]} |")
    w(f"\n![chaos](figures/{os.path.basename(ch['figure'])})\n")
    w("## Timings\n")
    for k, v in report["section_seconds"].items():
        w(f"- {k}: {v:.1f} s")
    w("")
    path = os.path.join(out, "atlas.md")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return path


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    if isinstance(x, (np.floating, float)):
        x = float(x)
        return x if np.isfinite(x) else None
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.bool_,)):
        return bool(x)
    if isinstance(x, complex):
        return [x.real, x.imag]
    return x


def run_atlas(
    *,
    quick: bool = False,
    out_dir: str = "atlas",
    progress: bool = True,
    sections: tuple | None = None,
) -> dict:
    """Run every section of the atlas and write `atlas.md`, `atlas.json` and `figures/`.

    **Arguments:** `quick` (sized for 2 CPU cores) or the full, GPU-sized run; `out_dir`;
    `progress` (section lines and sweep progress bars); `sections` (names to run, for
    tests; default all: `cases, maps, bifurcation, hamiltonian, high_d, search,
    flow_families, trained_operator, multistability, chaos`).

    **Returns:** the report dictionary (also written to `atlas.json`).

    The caller chooses the floating precision (`jax_enable_x64`); the `jaxattn atlas`
    command turns float64 on for its own process. The d = 2 sections always run in float64
    when it is enabled; the high-d sections use `float32` in quick mode (with the USA score
    shift) and float64 in full mode.
    """
    cfg = AtlasConfig.make(quick)
    if not jax.config.jax_enable_x64:
        cfg = dataclasses.replace(cfg, high_dtype="float32")
    all_sections = (
        "cases",
        "maps",
        "bifurcation",
        "hamiltonian",
        "high_d",
        "search",
        "flow_families",
        "trained_operator",
        "multistability",
        "chaos",
    )
    sections = all_sections if sections is None else tuple(sections)
    os.makedirs(os.path.join(out_dir, "figures"), exist_ok=True)
    _FIGURE_ERRORS.clear()
    prog = _Progress(len(sections), progress)
    t0 = time.perf_counter()
    report: dict = dict(config=dataclasses.asdict(cfg))
    case2_map = None
    if "cases" in sections:
        with prog.section("four cases in d = 2 (particles, WS, OA)"):
            report["cases"] = _section_cases(cfg, out_dir, progress)
    if "maps" in sections or "search" in sections:
        with prog.section("regime maps with theory overlaid"):
            report["maps"], maps = _section_maps(cfg, out_dir, progress)
            case2_map = maps[1]
    if "bifurcation" in sections:
        with prog.section("bifurcation diagram (Case 4)"):
            report["bifurcation"] = _section_bifurcation(cfg, out_dir, progress)
    if "hamiltonian" in sections:
        with prog.section("hidden Hamiltonian (Case 4), rotation rate (Case 3)"):
            report["hamiltonian"] = _section_hamiltonian(cfg, out_dir)
    if "high_d" in sections:
        with prog.section(f"d = {cfg.d_high}, n = {cfg.n_high} (LSA and USA)"):
            report["high_d"] = _section_high_d(cfg, out_dir, progress)
    if "search" in sections:
        with prog.section("gradient-based boundary crossing"):
            report["search"] = _section_search(cfg, out_dir, case2_map)
    if "flow_families" in sections:
        with prog.section("flow families: normalisations, causal masking, the PLGA flow"):
            report["flow_families"] = _section_families(cfg, out_dir, progress)
    if "trained_operator" in sections:
        with prog.section("the trained operator (tiny PLDR-LLM layer) as a multi-head flow"):
            report["trained_operator"] = _section_operator(cfg, out_dir, progress)
    if "multistability" in sections:
        with prog.section("multistability: basin fractions on a slice where they split"):
            report["multistability"] = _section_multistability(cfg, out_dir, progress)
    if "chaos" in sections:
        with prog.section("chaos in three tokens (Lyapunov spectrum, Poincaré section)"):
            report["chaos"] = _section_chaos(cfg, out_dir)
    report["section_seconds"] = dict(prog.times)
    report["seconds"] = time.perf_counter() - t0
    report["environment"] = dict(
        jax=jax.__version__,
        devices=[str(d) for d in jax.devices()],
        backend=jax.default_backend(),
        x64=bool(jax.config.jax_enable_x64),
        python=platform.python_version(),
        cpu_count=os.cpu_count(),
        date=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    )
    report["figure_errors"] = list(_FIGURE_ERRORS)
    report = _jsonable(report)
    with open(os.path.join(out_dir, "atlas.json"), "w") as f:
        json.dump(report, f, indent=1)
    if set(all_sections) <= set(sections):
        report["markdown"] = _write_markdown(report, out_dir)
        if report["figure_errors"]:
            with open(report["markdown"], "a") as f:
                f.write("\n## Figures that could not be drawn\n\n")
                for e in report["figure_errors"]:
                    f.write(f"- `{e['figure']}` ({e['plot']}): {e['error']}\n")
    return report
