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
from hybridkv.layouts import layer_name
from hybridkv.layouts.hf_families import read_jamba
from hybridkv.models.base import IGNORED, CausalLM
from hybridkv.models.batch import ForwardBatch
from hybridkv.models.jamba_mixer import JambaMambaMixer
from hybridkv.models.jamba_moe import JambaMLP, JambaSparseMoe, moe_checkpoint_tensors
from hybridkv.models.layers import PagedAttention, RMSNorm


def head_dim(config: Any) -> int:
    """``config.head_dim`` where set, else ``hidden_size // num_attention_heads``."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def is_expert_layer(config: Any, index: int) -> bool:
    """Whether layer ``index`` has the sparse MoE feed-forward."""
    period, offset = config.expert_layer_period, config.expert_layer_offset
    return config.num_experts > 1 and index % period == offset


class JambaAttention(nn.Module):
    def __init__(self, config: Any, index: int) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = head_dim(config)
        hidden = config.hidden_size
        self.q_proj = nn.Linear(hidden, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=False)
        self.attn = PagedAttention(layer_name(index), AttentionOptions(scale=self.head_dim**-0.5))

    def forward(self, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        t = x.shape[0]
        q = self.q_proj(x).view(t, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(t, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(t, self.num_kv_heads, self.head_dim)
        out = self.attn(q, k, v, batch)  # [T, Hq, D]
        return self.o_proj(out.reshape(t, self.num_heads * self.head_dim))


class JambaDecoderLayer(nn.Module):
    """One pre-norm block: attention or Mamba mixer, then MLP or MoE."""

    def __init__(self, config: Any, index: int, attention: bool) -> None:
        super().__init__()
        eps = config.rms_norm_eps
        self.self_attn = JambaAttention(config, index) if attention else None
        self.mamba = None if attention else JambaMambaMixer(config, index)
        self.feed_forward: nn.Module = (
            JambaSparseMoe(config) if is_expert_layer(config, index) else JambaMLP(config)
        )
        self.input_layernorm = RMSNorm(config.hidden_size, eps)
        self.pre_ff_layernorm = RMSNorm(config.hidden_size, eps)

    def forward(self, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        h = self.input_layernorm(x, batch.ops)
        if self.self_attn is not None:
            h = self.self_attn(h, batch)
        else:
            assert self.mamba is not None
            h = self.mamba(h, batch)
        x = x + h
        return x + self.feed_forward(self.pre_ff_layernorm(x, batch.ops))


class JambaModel(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        kinds = read_jamba(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            JambaDecoderLayer(config, i, kind.is_attention) for i, kind in enumerate(kinds)
        )
        self.final_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        x = self.embed_tokens(batch.input_ids)
        for layer in self.layers:
            x = layer(x, batch)
        return self.final_layernorm(x, batch.ops)


class JambaForCausalLM(CausalLM):
    """Jamba on paged KV and Mamba state slots (see the module docstring)."""

    model_types = ("jamba",)

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.model = JambaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()

    def checkpoint_tensors(self, name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        if name == "lm_head.weight" and self.config.tie_word_embeddings:
            return IGNORED  # tied to the embeddings, which the checkpoint also holds
        return moe_checkpoint_tensors(name, tensor)
