"""Power Law Graph Attention (PLGA) and the PLDR-LLM decoder.

Sources: Gokden, *Power law graph attention: exact generalization of scaled dot-product
attention, empirical collapse at inference* (2026); PLDR-LLM, arXiv 2410.16703 and 2502.13502.
"""

from ._attention import DeductiveOutputs as DeductiveOutputs
from ._attention import PowerLawGraphAttention as PowerLawGraphAttention
from ._attention import ScoreOverflow as ScoreOverflow
from ._attention import check_score_overflow as check_score_overflow
from ._attention import format_score_overflow as format_score_overflow
from ._attention import masked_softmax as masked_softmax
from ._attention import potential_power as potential_power
from ._attention import score_overflow as score_overflow
from ._audits import cache_fidelity as cache_fidelity
from ._audits import energy_curvature_audit as energy_curvature_audit
from ._audits import invariance_audit as invariance_audit
from ._audits import invariance_order_parameter as invariance_order_parameter
from ._audits import noncausality_audit as noncausality_audit
from ._audits import perron_frobenius_audit as perron_frobenius_audit
from ._audits import rank_one_audit as rank_one_audit
from ._audits import rope_commutant_projection as rope_commutant_projection
from ._audits import rope_commutant_residual as rope_commutant_residual
from ._cache import DecodeCache as DecodeCache
from ._cache import decode_step as decode_step
from ._cache import generate as generate
from ._cache import prefill as prefill
from ._collapse import CollapsedPLDRLLM as CollapsedPLDRLLM
from ._collapse import collapse as collapse
from ._collapse import collapse_error as collapse_error
from ._mechanism import ConcentrationAudit as ConcentrationAudit
from ._mechanism import ContractionAudit as ContractionAudit
from ._mechanism import TwirlAudit as TwirlAudit
from ._mechanism import concentration_audit as concentration_audit
from ._mechanism import contraction_audit as contraction_audit
from ._mechanism import density_concentration as density_concentration
from ._mechanism import layer_densities as layer_densities
from ._mechanism import mechanism_audits as mechanism_audits
from ._mechanism import row_map_spectral_norm as row_map_spectral_norm
from ._mechanism import twirl_audit as twirl_audit
from ._metric_learner import LayerNorm as LayerNorm
from ._metric_learner import Linear as Linear
from ._metric_learner import MetricLearner as MetricLearner
from ._metric_learner import SwiGLU as SwiGLU
from ._metric_learner import init_params as init_params
from ._model import CONFIGS as CONFIGS
from ._model import PLDRLLM as PLDRLLM
from ._model import DecoderLayer as DecoderLayer
from ._model import PLDRLLMConfig as PLDRLLMConfig
from ._operator_flow import TrainedOperator as TrainedOperator
from ._operator_flow import operator_regimes as operator_regimes
from ._operator_flow import trained_operator as trained_operator
from ._operator_flow import trained_operator_flow as trained_operator_flow
from ._rope import apply_rope as apply_rope
from ._rope import rope_angles as rope_angles
from ._weights import from_reference as from_reference
from ._weights import infer_config as infer_config
from ._weights import reference_keys as reference_keys
from ._weights import save_reference as save_reference
from ._weights import to_reference as to_reference
