"""Building blocks shared by the model families (norms, RoPE, paged attention,
grouped-query attention, the SwiGLU MLP)."""

from hybridkv.models.layers.attention import PagedAttention
from hybridkv.models.layers.gqa import GroupedQueryAttention, config_head_dim
from hybridkv.models.layers.mlp import SwiGLU, check_silu
from hybridkv.models.layers.norms import GemmaRMSNorm, RMSNorm
from hybridkv.models.layers.rotary import (
    RopeFrequencies,
    RotaryEmbedding,
    rope_inv_freq,
    rope_parameters,
)

__all__ = [
    "GemmaRMSNorm",
    "GroupedQueryAttention",
    "PagedAttention",
    "RMSNorm",
    "RopeFrequencies",
    "RotaryEmbedding",
    "SwiGLU",
    "check_silu",
    "config_head_dim",
    "rope_inv_freq",
    "rope_parameters",
]
