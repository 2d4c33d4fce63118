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
from torch.nn import functional as F

from hybridkv.kernels import AttentionOptions
from hybridkv.layouts import layer_name
from hybridkv.layouts.hf_families import READERS
from hybridkv.layouts.kinds import SlidingWindowLayer
from hybridkv.models.base import IGNORED, CausalLM
from hybridkv.models.batch import ForwardBatch
from hybridkv.models.layers import PagedAttention, RMSNorm
from hybridkv.models.layers.rotary import RotaryEmbedding, rope_parameters


class MistralAttention(nn.Module):
    def __init__(self, config: Any, index: int, sliding_window: int | None) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or hidden // self.num_heads
        self.rotary = RotaryEmbedding(self.head_dim, rope_parameters(config))
        self.q_proj = nn.Linear(hidden, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=False)
        options = AttentionOptions(scale=self.head_dim**-0.5, sliding_window=sliding_window)
        self.attn = PagedAttention(layer_name(index), options)

    def forward(self, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        t = x.shape[0]
        q = self.q_proj(x).view(t, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(t, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(t, self.num_kv_heads, self.head_dim)
        cos, sin = self.rotary.for_step(batch, q.dtype)
        q, k = RotaryEmbedding.rotate(q, cos, sin), RotaryEmbedding.rotate(k, cos, sin)
        out = self.attn(q, k, v, batch)
        return self.o_proj(out.reshape(t, self.num_heads * self.head_dim))


class MistralMLP(nn.Module):
    """``down(silu(gate(x)) * up(x))``."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        hidden, inter = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MistralDecoderLayer(nn.Module):
    def __init__(self, config: Any, index: int, sliding_window: int | None) -> None:
        super().__init__()
        eps = config.rms_norm_eps
        self.self_attn = MistralAttention(config, index, sliding_window)
        self.mlp = MistralMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps)

    def forward(self, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x, batch.ops), batch)
        return x + self.mlp(self.post_attention_layernorm(x, batch.ops))


class MistralModel(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        if config.hidden_act != "silu":
            raise ValueError(
                f"{config.model_type}: hidden_act {config.hidden_act!r} is not supported (silu)"
            )
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

    def checkpoint_tensors(self, name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        if name == "lm_head.weight" and self.config.tie_word_embeddings:
            return IGNORED  # tied to the embeddings, which the checkpoint also holds
        return [(name, tensor)]
