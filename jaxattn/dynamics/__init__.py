"""Tokens as interacting particles: the attention flow on the sphere and its reductions."""

from ._solve import (
    RESULTS as RESULTS,
    simulate as simulate,
    SphereProjection as SphereProjection,
    Trajectory as Trajectory,
)
from ._vector_field import AttentionDynamics as AttentionDynamics, KERNELS as KERNELS
