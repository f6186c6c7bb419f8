"""jaxattn: the dynamics of attention in JAX.

- `jaxattn.dynamics`: tokens as interacting particles on the sphere (LSA / USA / SA), the
  d = 2 Kuramoto–Daido, Watanabe–Strogatz and Ott–Antonsen reductions, regimes, sweeps.
- `jaxattn.plga`: Power Law Graph Attention and the PLDR-LLM decoder, training, caches and
  collapse audits.
- `jaxattn.sphere`: geometry of S^{d-1}.

Importing jaxattn changes no global JAX setting (float64 is the caller's choice:
`jax.config.update("jax_enable_x64", True)`; faster CPU compiles and solver loops too:
`jaxattn.prefer_fast_cpu_compiles()` and `jaxattn.prefer_fast_cpu_loops()` before anything
runs).
"""

from . import dynamics as dynamics
from . import sphere as sphere
from ._xla_flags import prefer_fast_cpu_compiles as prefer_fast_cpu_compiles
from ._xla_flags import prefer_fast_cpu_loops as prefer_fast_cpu_loops

__version__ = "0.1.0"
