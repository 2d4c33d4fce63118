"""Jamba (``JambaForCausalLM``): Mamba1 layers interleaved with full attention, some MoE.

Layer ``i`` is an attention layer where the layout reader says so
(``hybridkv.layouts.hf_families.read_jamba``: ``i % attn_layer_period ==
attn_layer_offset`` unless the config lists ``layer_types``), so the model and
the planner's KV cache groups always agree; every other layer is a Mamba1
mixer (``jamba_mixer``). Its feed-forward is a sparse MoE where ``i %
expert_layer_period == expert_layer_offset`` (and ``num_experts > 1``), else a
SwiGLU MLP (``jamba_moe``). Pre-norm residual blocks (``input_layernorm``,
``pre_ff_layernorm``, Llama-style RMSNorm), ``final_layernorm``, no embedding
scale; every norm (the mixer's too) is ``batch.ops.rms_norm``. Attention has no
positional encoding (no RoPE: the Mamba layers carry order), attends causally
over everything, scale ``head_dim ** -0.5`` with ``head_dim = hidden_size //
num_attention_heads``. ``lm_head`` is untied unless ``tie_word_embeddings``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hybridkv.kernels import AttentionOptions
from hybridkv.layouts.hf_families import read_jamba
from hybridkv.models.base import CausalLM
from hybridkv.models.jamba_mixer import JambaMambaMixer
from hybridkv.models.jamba_moe import JambaSparseMoe, jamba_mlp, moe_checkpoint_tensors
from hybridkv.models.layers import GroupedQueryAttention, config_head_dim
from hybridkv.models.layers.hybrid_stack import HybridStack


def is_expert_layer(config: Any, index: int) -> bool:
    """Whether layer ``index`` has the sparse MoE feed-forward."""
    period, offset = config.expert_layer_period, config.expert_layer_offset
    return config.num_experts > 1 and index % period == offset


def jamba_attention(config: Any, index: int) -> GroupedQueryAttention:
    """Jamba's attention: no positions, scale ``head_dim ** -0.5``, no biases."""
    return GroupedQueryAttention(
        config, index, AttentionOptions(scale=config_head_dim(config) ** -0.5)
    )


def jamba_feed_forward(config: Any, index: int) -> nn.Module:
    """The sparse MoE on expert layers, else the SwiGLU MLP."""
    return JambaSparseMoe(config) if is_expert_layer(config, index) else jamba_mlp(config)


class JambaForCausalLM(CausalLM):
    """Jamba on paged KV and Mamba state slots (see the module docstring)."""

    model_types = ("jamba",)
    supports_cuda_graphs = True  # tests/engine/test_step_graphs_families.py

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.model = HybridStack(
            config, read_jamba(config), jamba_attention, JambaMambaMixer, jamba_feed_forward
        )
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()

    def checkpoint_tensors(self, name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        if name == "lm_head.weight":
            return super().checkpoint_tensors(name, tensor)  # ignored when tied
        return moe_checkpoint_tensors(name, tensor)
