"""Tokens as interacting particles: the attention flow on the sphere and its reductions."""

from ._solve import (
    RESULTS as RESULTS,
    simulate as simulate,
    SphereProjection as SphereProjection,
    Trajectory as Trajectory,
)
from ._vector_field import AttentionDynamics as AttentionDynamics, KERNELS as KERNELS
from ._circle import (
    angles_from_tokens as angles_from_tokens,
    angular_velocity as angular_velocity,
    complex_coefficients as complex_coefficients,
    doubled_phase_forcing as doubled_phase_forcing,
    kuramoto_daido as kuramoto_daido,
    kuramoto_daido_coupling as kuramoto_daido_coupling,
    KuramotoDaido as KuramotoDaido,
    order_parameter as order_parameter,
    tokens_from_angles as tokens_from_angles,
)
from ._ott_antonsen import (
    DiscProjection as DiscProjection,
    ott_antonsen_field as ott_antonsen_field,
    OttAntonsenSolution as OttAntonsenSolution,
    sample_wrapped_cauchy as sample_wrapped_cauchy,
    solve_ott_antonsen as solve_ott_antonsen,
)
from ._watanabe_strogatz import (
    cross_ratio as cross_ratio,
    solve_watanabe_strogatz as solve_watanabe_strogatz,
    watanabe_strogatz_constants as watanabe_strogatz_constants,
    watanabe_strogatz_reconstruct as watanabe_strogatz_reconstruct,
    WatanabeStrogatzConstants as WatanabeStrogatzConstants,
    WatanabeStrogatzSolution as WatanabeStrogatzSolution,
)
from ._regimes import (
    classify_order_parameter as classify_order_parameter,
    classify_regime as classify_regime,
    cluster_structure as cluster_structure,
    clustering_gap as clustering_gap,
    regime_name as regime_name,
    RegimeEvidence as RegimeEvidence,
    REGIMES as REGIMES,
)
from ._theory import (
    block_embed as block_embed,
    case1_criterion as case1_criterion,
    case1_matrices as case1_matrices,
    case2_criterion as case2_criterion,
    case2_matrices as case2_matrices,
    case3_matrices as case3_matrices,
    case4_criterion as case4_criterion,
    case4_matrices as case4_matrices,
    Prediction as Prediction,
    stated_prediction as stated_prediction,
)
from ._presets import Preset as Preset, preset as preset, PRESETS as PRESETS
from ._sweep import (
    classify_moments as classify_moments,
    REGIME_NAMES as REGIME_NAMES,
    sweep as sweep,
    SweepResult as SweepResult,
)
from ._bifurcation import (
    continuation as continuation,
    find_transitions as find_transitions,
    fixed_points as fixed_points,
    FixedPoints as FixedPoints,
    refine_transition as refine_transition,
    saddle_node_on_circle as saddle_node_on_circle,
)
from ._hamiltonian import (
    case4_hamiltonian as case4_hamiltonian,
    measured_rotation_rate as measured_rotation_rate,
    rotation_rate_on_circle as rotation_rate_on_circle,
)
from ._search import (
    regime_score as regime_score,
    regime_search as regime_search,
    SearchResult as SearchResult,
)
from ._atlas import run_atlas as run_atlas
