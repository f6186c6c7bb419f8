"""Figures for jaxattn runs. matplotlib is imported when a figure is drawn; importing this
package never changes the matplotlib backend."""

from ._audits import plot_cache_fidelity as plot_cache_fidelity
from ._audits import (
    plot_order_parameter_over_training as plot_order_parameter_over_training,
)
from ._audits import plot_singular_spectra as plot_singular_spectra
from ._chaos import plot_chaos as plot_chaos
from ._mechanism import plot_concentration as plot_concentration
from ._mechanism import plot_contraction as plot_contraction
from ._mechanism import plot_mechanism_over_training as plot_mechanism_over_training
from ._mechanism import plot_operator_regimes as plot_operator_regimes
from ._mechanism import plot_twirl as plot_twirl
from ._regime_map import (
    FAILED_COLOUR as FAILED_COLOUR,
)
from ._regime_map import (
    REGIME_COLOURS as REGIME_COLOURS,
)
from ._regime_map import (
    plot_regime_map as plot_regime_map,
)
from ._regime_map import (
    regime_colour as regime_colour,
)
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
