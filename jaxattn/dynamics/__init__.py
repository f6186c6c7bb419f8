"""Tokens as interacting particles: the attention flow on the sphere and its reductions."""

from ._atlas import run_atlas as run_atlas
from ._bifurcation import (
    FixedPoints as FixedPoints,
)
from ._bifurcation import (
    continuation as continuation,
)
from ._bifurcation import (
    find_transitions as find_transitions,
)
from ._bifurcation import (
    fixed_points as fixed_points,
)
from ._bifurcation import (
    refine_transition as refine_transition,
)
from ._bifurcation import (
    saddle_node_on_circle as saddle_node_on_circle,
)
from ._chaos import (
    chaos_section as chaos_section,
)
from ._chaos import (
    poincare_section as poincare_section,
)
from ._circle import (
    KuramotoDaido as KuramotoDaido,
)
from ._circle import (
    angles_from_tokens as angles_from_tokens,
)
from ._circle import (
    angular_velocity as angular_velocity,
)
from ._circle import (
    complex_coefficients as complex_coefficients,
)
from ._circle import (
    doubled_phase_forcing as doubled_phase_forcing,
)
from ._circle import (
    kuramoto_daido as kuramoto_daido,
)
from ._circle import (
    kuramoto_daido_coupling as kuramoto_daido_coupling,
)
from ._circle import (
    order_parameter as order_parameter,
)
from ._circle import (
    tokens_from_angles as tokens_from_angles,
)
from ._decay import decay_fits as decay_fits
from ._decay import direction_spread as direction_spread
from ._families import (
    MultiHeadDynamics as MultiHeadDynamics,
)
from ._families import (
    PeriodicMatrix as PeriodicMatrix,
)
from ._families import (
    TimeVaryingDynamics as TimeVaryingDynamics,
)
from ._families import (
    homogenised_ott_antonsen_field as homogenised_ott_antonsen_field,
)
from ._families import (
    solve_homogenised_ott_antonsen as solve_homogenised_ott_antonsen,
)
from ._hamiltonian import (
    case4_hamiltonian as case4_hamiltonian,
)
from ._hamiltonian import (
    measured_rotation_rate as measured_rotation_rate,
)
from ._hamiltonian import (
    rotation_rate_on_circle as rotation_rate_on_circle,
)
from ._lyapunov import (
    LyapunovSpectrum as LyapunovSpectrum,
)
from ._lyapunov import (
    OttAntonsenFlow as OttAntonsenFlow,
)
from ._lyapunov import (
    chaos_verdict as chaos_verdict,
)
from ._lyapunov import (
    lyapunov_spectrum as lyapunov_spectrum,
)
from ._lyapunov import (
    lyapunov_spectrum_ott_antonsen as lyapunov_spectrum_ott_antonsen,
)
from ._ott_antonsen import (
    DiscProjection as DiscProjection,
)
from ._ott_antonsen import (
    OttAntonsenSolution as OttAntonsenSolution,
)
from ._ott_antonsen import (
    ott_antonsen_field as ott_antonsen_field,
)
from ._ott_antonsen import (
    sample_wrapped_cauchy as sample_wrapped_cauchy,
)
from ._ott_antonsen import (
    solve_ott_antonsen as solve_ott_antonsen,
)
from ._plga_flow import PLGAFlow as PLGAFlow
from ._presets import PRESETS as PRESETS
from ._presets import Preset as Preset
from ._presets import preset as preset
from ._regime_map import FAMILIES as FAMILIES
from ._regime_map import Family as Family
from ._regime_map import RegimeMap as RegimeMap
from ._regime_map import basin_fractions as basin_fractions
from ._regime_map import parse_axis as parse_axis
from ._regime_map import regime_map as regime_map
from ._regimes import (
    REGIMES as REGIMES,
)
from ._regimes import (
    RegimeEvidence as RegimeEvidence,
)
from ._regimes import (
    classify_order_parameter as classify_order_parameter,
)
from ._regimes import (
    classify_regime as classify_regime,
)
from ._regimes import (
    classify_tokens as classify_tokens,
)
from ._regimes import (
    cluster_structure as cluster_structure,
)
from ._regimes import (
    clustering_gap as clustering_gap,
)
from ._regimes import (
    decision_margin as decision_margin,
)
from ._regimes import (
    default_gap_floor as default_gap_floor,
)
from ._regimes import (
    regime_name as regime_name,
)
from ._search import (
    MAX_GRADIENT_TOL as MAX_GRADIENT_TOL,
)
from ._search import (
    SearchResult as SearchResult,
)
from ._search import (
    regime_score as regime_score,
)
from ._search import (
    regime_search as regime_search,
)
from ._solve import (
    RESULTS as RESULTS,
)
from ._solve import (
    SphereProjection as SphereProjection,
)
from ._solve import (
    Trajectory as Trajectory,
)
from ._solve import check_flow as check_flow
from ._solve import memory_available as memory_available
from ._solve import memory_estimate as memory_estimate
from ._solve import (
    simulate as simulate,
)
from ._solve import usa_score_shift as usa_score_shift
from ._sweep import FAILED as FAILED
from ._sweep import NOT_RUN as NOT_RUN
from ._sweep import REGIME_NAMES as REGIME_NAMES
from ._sweep import Integration as Integration
from ._sweep import Judge as Judge
from ._sweep import Members as Members
from ._sweep import Runner as Runner
from ._sweep import SweepResult as SweepResult
from ._sweep import attention_members as attention_members
from ._sweep import environment_record as environment_record
from ._sweep import regime_label as regime_label
from ._sweep import sweep as sweep
from ._theory import (
    Prediction as Prediction,
)
from ._theory import (
    block_embed as block_embed,
)
from ._theory import (
    case1_criterion as case1_criterion,
)
from ._theory import (
    case1_matrices as case1_matrices,
)
from ._theory import (
    case2_criterion as case2_criterion,
)
from ._theory import (
    case2_matrices as case2_matrices,
)
from ._theory import (
    case3_matrices as case3_matrices,
)
from ._theory import (
    case4_criterion as case4_criterion,
)
from ._theory import (
    case4_matrices as case4_matrices,
)
from ._theory import (
    stated_prediction as stated_prediction,
)
from ._tsit5 import UnrolledTsit5 as UnrolledTsit5
from ._vector_field import KERNELS as KERNELS
from ._vector_field import NORMALISATIONS as NORMALISATIONS
from ._vector_field import AttentionDynamics as AttentionDynamics
from ._watanabe_strogatz import (
    WatanabeStrogatzConstants as WatanabeStrogatzConstants,
)
from ._watanabe_strogatz import (
    WatanabeStrogatzSolution as WatanabeStrogatzSolution,
)
from ._watanabe_strogatz import (
    cross_ratio as cross_ratio,
)
from ._watanabe_strogatz import (
    solve_watanabe_strogatz as solve_watanabe_strogatz,
)
from ._watanabe_strogatz import (
    watanabe_strogatz_constants as watanabe_strogatz_constants,
)
from ._watanabe_strogatz import (
    watanabe_strogatz_reconstruct as watanabe_strogatz_reconstruct,
)
