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
