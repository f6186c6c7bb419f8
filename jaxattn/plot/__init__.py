"""Figures for jaxattn runs. matplotlib is imported lazily (Agg backend without a display)."""

from ._trajectory import (
    order_parameter_series as order_parameter_series,
    pca_plane as pca_plane,
    plot_order_parameter as plot_order_parameter,
    plot_order_parameter_plane as plot_order_parameter_plane,
    plot_tokens as plot_tokens,
    save_trajectory_figures as save_trajectory_figures,
)
