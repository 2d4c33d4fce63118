"""Cohere 2 (``Cohere2ForCausalLM``: Command R7B): sliding layers with RoPE, full
layers without positions, attention and MLP in parallel.

Which layers slide comes from the layout reader
(``hybridkv.layouts.hf_families.read_cohere2``: the config's ``layer_types``, else
three sliding layers then one full), so the model and the planner's KV cache groups
always agree. Per block, one norm feeds both branches::

    h = layer_norm(x)
    x = x + attention(h) + mlp(h)

``layer_norm`` subtracts the mean (Cohere's LayerNorm: weight, no bias, fp32, the
weight applied before the cast back). Attention: scale ``head_dim ** -0.5``; a
sliding layer attends to its last ``sliding_window`` tokens with RoPE on adjacent
pairs ``(x[2j], x[2j+1])`` (``batch.ops.rope_pairwise``, as Llama 4's); a full layer
uses no positional encoding. SwiGLU MLP, ``model.norm`` last, logits times
``logit_scale``; ``lm_head`` is tied to the embeddings unless
``tie_word_embeddings`` is false.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hybridkv.kernels import AttentionOptions
from hybridkv.layouts.hf_families import read_cohere2
from hybridkv.layouts.kinds import SlidingWindowLayer
from hybridkv.models.base import CausalLM
from hybridkv.models.batch import ForwardBatch
from hybridkv.models.layers import (
    GroupedQueryAttention,
    SwiGLU,
    check_silu,
    config_head_dim,
    rope_parameters,
)
from hybridkv.models.llama4 import InterleavedRotary


class CohereLayerNorm(nn.Module):
    """``weight * (x - mean) / sqrt(var + eps)`` over the last dimension, in fp32."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h - h.mean(-1, keepdim=True)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * h).to(x.dtype)


class Cohere2Attention(GroupedQueryAttention):
    """Sliding with pairwise RoPE, or full with no positions (see the module docstring)."""

    def __init__(self, config: Any, index: int, sliding_window: int | None) -> None:
        options = AttentionOptions(
            scale=config_head_dim(config) ** -0.5, sliding_window=sliding_window
        )
        super().__init__(config, index, options, config.attention_bias)
        self.rotary = (
            InterleavedRotary(self.head_dim, rope_parameters(config)) if sliding_window else None
        )

    def position(
        self, q: torch.Tensor, k: torch.Tensor, batch: ForwardBatch
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.rotary is None:
            return q, k
        cos, sin = self.rotary.for_step(batch)
        return batch.ops.rope_pairwise(q, cos, sin), batch.ops.rope_pairwise(k, cos, sin)


class Cohere2DecoderLayer(nn.Module):
    """One parallel block (see the module docstring)."""

    def __init__(self, config: Any, index: int, sliding_window: int | None) -> None:
        super().__init__()
        self.self_attn = Cohere2Attention(config, index, sliding_window)
        self.mlp = SwiGLU(config.hidden_size, config.intermediate_size)
        self.input_layernorm = CohereLayerNorm(config.hidden_size, config.layer_norm_eps)

    def forward(self, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        h = self.input_layernorm(x)
        return x + self.self_attn(h, batch) + self.mlp(h)


class Cohere2Model(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        check_silu(config, "Cohere 2")
        kinds = read_cohere2(config)
        windows = [k.sliding_window if isinstance(k, SlidingWindowLayer) else None for k in kinds]
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            Cohere2DecoderLayer(config, i, w) for i, w in enumerate(windows)
        )
        self.norm = CohereLayerNorm(config.hidden_size, config.layer_norm_eps)

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        x = self.embed_tokens(batch.input_ids)
        for layer in self.layers:
            x = layer(x, batch)
        return self.norm(x)


class Cohere2ForCausalLM(CausalLM):
    """Command R7B on paged KV (see the module docstring)."""

    model_types = ("cohere2",)
    supports_cuda_graphs = True  # tests/engine/test_step_graphs_families.py

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.model = Cohere2Model(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.logit_scale = float(config.logit_scale)
        self.tie_weights()

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden) * self.logit_scale
