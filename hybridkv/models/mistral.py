"""Mistral and Ministral (``MistralForCausalLM``, ``MinistralForCausalLM``): Llama
layers, each attending to a sliding window or to everything.

Which layers slide comes from the layout reader
(``hybridkv.layouts.hf_families.read_mistral`` / ``read_ministral``: the config's
``layer_types`` when given, else every layer slides when ``sliding_window`` is set),
so the model and the planner's KV cache groups always agree; a sliding layer attends
to its last ``sliding_window`` tokens, itself included. Per block: pre-norm
(``input_layernorm``, ``post_attention_layernorm``, Llama-style RMSNorm through
``batch.ops.rms_norm``), attention without biases, scale ``head_dim ** -0.5``, RoPE
in the ``rotate_half`` form over the whole head (``rope_parameters``: default,
linear or llama3 scaling), a SwiGLU MLP; ``model.norm`` last. ``lm_head`` is untied
unless ``tie_word_embeddings``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hybridkv.kernels import AttentionOptions
from hybridkv.layouts.hf_families import READERS
from hybridkv.layouts.kinds import SlidingWindowLayer
from hybridkv.models.base import CausalLM
from hybridkv.models.batch import ForwardBatch
from hybridkv.models.layers import (
    GroupedQueryAttention,
    RMSNorm,
    SwiGLU,
    check_silu,
    config_head_dim,
)
from hybridkv.models.layers.rotary import RotaryEmbedding, rope_parameters


class MistralAttention(GroupedQueryAttention):
    """Grouped-query attention with RoPE over the whole head, sliding or full."""

    def __init__(self, config: Any, index: int, sliding_window: int | None) -> None:
        scale = config_head_dim(config) ** -0.5
        super().__init__(
            config, index, AttentionOptions(scale=scale, sliding_window=sliding_window)
        )
        self.rotary = RotaryEmbedding(self.head_dim, rope_parameters(config))

    def position(
        self, q: torch.Tensor, k: torch.Tensor, batch: ForwardBatch
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.rotary.for_step(batch, q.dtype)
        return RotaryEmbedding.rotate(q, cos, sin), RotaryEmbedding.rotate(k, cos, sin)


class MistralDecoderLayer(nn.Module):
    def __init__(self, config: Any, index: int, sliding_window: int | None) -> None:
        super().__init__()
        eps = config.rms_norm_eps
        self.self_attn = MistralAttention(config, index, sliding_window)
        self.mlp = SwiGLU(config.hidden_size, config.intermediate_size)
        self.input_layernorm = RMSNorm(config.hidden_size, eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps)

    def forward(self, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x, batch.ops), batch)
        return x + self.mlp(self.post_attention_layernorm(x, batch.ops))


class MistralModel(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        check_silu(config, config.model_type)
        kinds = READERS[config.model_type](config)
        windows = [k.sliding_window if isinstance(k, SlidingWindowLayer) else None for k in kinds]
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            MistralDecoderLayer(config, i, w) for i, w in enumerate(windows)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        x = self.embed_tokens(batch.input_ids)
        for layer in self.layers:
            x = layer(x, batch)
        return self.norm(x, batch.ops)


class MistralForCausalLM(CausalLM):
    """Mistral or Ministral on paged KV (see the module docstring)."""

    model_types = ("mistral", "ministral")
    supports_cuda_graphs = True  # tests/engine/test_step_graphs_families.py

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.model = MistralModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()
