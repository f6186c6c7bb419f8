"""Figures for jaxattn runs. matplotlib is imported lazily (Agg backend without a display)."""

from ._trajectory import (
    order_parameter_series as order_parameter_series,
)
from ._trajectory import (
    pca_plane as pca_plane,
)
from ._trajectory import (
    plot_order_parameter as plot_order_parameter,
)
from ._trajectory import (
    plot_order_parameter_plane as plot_order_parameter_plane,
)
from ._trajectory import (
    plot_tokens as plot_tokens,
)
from ._trajectory import (
    save_trajectory_figures as save_trajectory_figures,
)
