"""Power Law Graph Attention (PLGA) and the PLDR-LLM decoder.

Sources: Gokden, *Power law graph attention: exact generalization of scaled dot-product
attention, empirical collapse at inference* (2026); PLDR-LLM, arXiv 2410.16703 and 2502.13502.
"""

from ._attention import (
    DeductiveOutputs as DeductiveOutputs,
    PowerLawGraphAttention as PowerLawGraphAttention,
    masked_softmax as masked_softmax,
    potential_power as potential_power,
)
from ._metric_learner import (
    LayerNorm as LayerNorm,
    Linear as Linear,
    MetricLearner as MetricLearner,
    SwiGLU as SwiGLU,
    init_params as init_params,
)
from ._model import (
    CONFIGS as CONFIGS,
    PLDRLLM as PLDRLLM,
    DecoderLayer as DecoderLayer,
    PLDRLLMConfig as PLDRLLMConfig,
)
from ._rope import apply_rope as apply_rope, rope_angles as rope_angles
from ._weights import (
    from_reference as from_reference,
    reference_keys as reference_keys,
    infer_config as infer_config,
    save_reference as save_reference,
    to_reference as to_reference,
)
from ._cache import (
    DecodeCache as DecodeCache,
    decode_step as decode_step,
    generate as generate,
    prefill as prefill,
)
