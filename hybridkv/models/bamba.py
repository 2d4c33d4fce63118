"""Bamba (``BambaForCausalLM``): Mamba2 layers interleaved with full attention.

Layer ``i`` is an attention layer where the layout reader says so
(``hybridkv.layouts.hf_families.read_bamba``: the config's ``layer_types``, else
``attn_layer_indices``), so the model and the planner's KV cache groups always
agree; every other layer is a Mamba2 mixer (``mamba2_mixer``). Every layer's
feed-forward is a SwiGLU MLP (``layers.SwiGLU``, ``mlp_bias``). Pre-norm residual blocks
(``input_layernorm``, ``pre_ff_layernorm``, Llama-style RMSNorm through
``batch.ops.rms_norm``), ``final_layernorm``, no embedding scale. Attention:
``head_dim`` from the config (else ``hidden_size // num_attention_heads``), scale
``head_dim ** -0.5``, causal over everything, RoPE in the ``rotate_half`` form on
the first ``partial_rotary_factor x head_dim`` dimensions of q and k (cos and sin
in fp32, cast to the activations' dtype, as transformers does), the rest passed
through. ``lm_head`` is untied unless ``tie_word_embeddings``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hybridkv.kernels import AttentionOptions
from hybridkv.layouts.hf_families import read_bamba
from hybridkv.models.base import CausalLM
from hybridkv.models.batch import ForwardBatch
from hybridkv.models.layers import GroupedQueryAttention, SwiGLU, check_silu, config_head_dim
from hybridkv.models.layers.hybrid_stack import HybridStack
from hybridkv.models.layers.rotary import RotaryEmbedding, rope_parameters
from hybridkv.models.mamba2_mixer import Mamba2Mixer


class BambaAttention(GroupedQueryAttention):
    """Grouped-query attention with partial RoPE (see the module docstring)."""

    def __init__(self, config: Any, index: int) -> None:
        scale = config_head_dim(config) ** -0.5
        super().__init__(config, index, AttentionOptions(scale=scale), config.attention_bias)
        params = rope_parameters(config)
        factor = float(params.get("partial_rotary_factor", 1.0))
        self.rotary_dim = int(self.head_dim * factor)
        if self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.head_dim:
            raise ValueError(
                f"Bamba: partial_rotary_factor {factor} gives {self.rotary_dim} rotary "
                f"dimensions of head_dim {self.head_dim}; need an even count in (0, head_dim]"
            )
        self.rotary = RotaryEmbedding(self.rotary_dim, params)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        rd = self.rotary_dim
        if rd == self.head_dim:
            return RotaryEmbedding.rotate(x, cos, sin)
        return torch.cat((RotaryEmbedding.rotate(x[..., :rd], cos, sin), x[..., rd:]), dim=-1)

    def position(
        self, q: torch.Tensor, k: torch.Tensor, batch: ForwardBatch
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.rotary.for_step(batch, q.dtype)
        return self._rope(q, cos, sin), self._rope(k, cos, sin)


def bamba_mixer(config: Any, index: int) -> Mamba2Mixer:
    return Mamba2Mixer(config, index, "Bamba")


def bamba_mlp(config: Any, index: int) -> SwiGLU:
    return SwiGLU(config.hidden_size, config.intermediate_size, config.mlp_bias)


class BambaForCausalLM(CausalLM):
    """Bamba on paged KV and Mamba2 state slots (see the module docstring)."""

    model_types = ("bamba",)
    supports_cuda_graphs = True  # tests/engine/test_step_graphs_families.py

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        check_silu(config, "Bamba")
        self.model = HybridStack(config, read_bamba(config), BambaAttention, bamba_mixer, bamba_mlp)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()
