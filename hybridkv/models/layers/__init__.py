"""Building blocks shared by the model families (norms, RoPE, paged attention)."""

from hybridkv.models.layers.attention import PagedAttention
from hybridkv.models.layers.norms import GemmaRMSNorm, RMSNorm
from hybridkv.models.layers.rotary import (
    RopeFrequencies,
    RotaryEmbedding,
    rope_inv_freq,
    rope_parameters,
)

__all__ = [
    "GemmaRMSNorm",
    "PagedAttention",
    "RMSNorm",
    "RopeFrequencies",
    "RotaryEmbedding",
    "rope_inv_freq",
    "rope_parameters",
]
