"""Granite 4.0 H (``GraniteMoeHybridForCausalLM``): Mamba2 layers, attention, MoE.

Layer ``i`` is an attention layer where the layout reader says so
(``hybridkv.layouts.hf_families.read_granitemoehybrid``: the config's ``layer_types``),
every other layer is the Mamba2 mixer Bamba uses too (``mamba2_mixer``). Per block
(``input_layernorm``, ``post_attention_layernorm``: Llama-style RMSNorm through
``batch.ops.rms_norm``)::

    x = x + residual_multiplier * mixer_or_attention(norm(x))
    h = norm(x)
    x = x + residual_multiplier * (moe(h) + shared_mlp(h))      # shared_mlp(h) alone
                                                                # when num_local_experts = 0

The embeddings are scaled by ``embedding_multiplier``, the logits divided by
``logits_scaling``; the final norm is ``model.norm``. Attention: scale
``attention_multiplier`` (not ``head_dim ** -0.5``), causal over everything, RoPE
(``rotate_half`` over the whole head) only when ``position_embedding_type`` is
``"rope"``, none when it is ``"nope"`` or unset (Granite 4.0 H's NoPE). MoE (``granite_moe``):
top-k of the router's logits, softmax over those k. ``lm_head`` is untied unless
``tie_word_embeddings``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hybridkv.kernels import AttentionOptions
from hybridkv.layouts.hf_families import read_granitemoehybrid
from hybridkv.models.base import CausalLM
from hybridkv.models.batch import ForwardBatch
from hybridkv.models.granite_moe import GraniteMoE, GraniteSharedMLP
from hybridkv.models.layers import GroupedQueryAttention, RMSNorm
from hybridkv.models.layers.rotary import RotaryEmbedding, rope_parameters
from hybridkv.models.mamba2_mixer import Mamba2Mixer

#: ``position_embedding_type`` values: RoPE over the whole head, or no positions
#: (Granite 4.0 H's checkpoints say ``"nope"``; unset means the same).
POSITION_TYPES = ("rope", "nope", None)


class GraniteAttention(GroupedQueryAttention):
    """Grouped-query attention, optional RoPE (see the module docstring)."""

    def __init__(self, config: Any, index: int) -> None:
        kind = getattr(config, "position_embedding_type", None)
        if kind not in POSITION_TYPES:
            raise ValueError(
                f"Granite: position_embedding_type {kind!r} is not supported ('rope', 'nope' "
                "or unset)"
            )
        options = AttentionOptions(scale=float(config.attention_multiplier))
        super().__init__(config, index, options, config.attention_bias)
        rope = kind == "rope"
        self.rotary = RotaryEmbedding(self.head_dim, rope_parameters(config)) if rope else None

    def position(
        self, q: torch.Tensor, k: torch.Tensor, batch: ForwardBatch
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.rotary is None:
            return q, k
        cos, sin = self.rotary.for_step(batch, q.dtype)
        return RotaryEmbedding.rotate(q, cos, sin), RotaryEmbedding.rotate(k, cos, sin)


class GraniteDecoderLayer(nn.Module):
    """One pre-norm block with scaled residuals (see the module docstring)."""

    def __init__(self, config: Any, index: int, attention: bool) -> None:
        super().__init__()
        eps = config.rms_norm_eps
        self.self_attn = GraniteAttention(config, index) if attention else None
        self.mamba = None if attention else Mamba2Mixer(config, index, "Granite")
        self.block_sparse_moe = GraniteMoE(config) if config.num_local_experts > 0 else None
        self.shared_mlp = GraniteSharedMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps)
        self.residual_multiplier = float(config.residual_multiplier)

    def forward(self, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        h = self.input_layernorm(x, batch.ops)
        if self.self_attn is not None:
            h = self.self_attn(h, batch)
        else:
            assert self.mamba is not None
            h = self.mamba(h, batch)
        x = x + h * self.residual_multiplier
        h = self.post_attention_layernorm(x, batch.ops)
        ff = self.shared_mlp(h)
        if self.block_sparse_moe is not None:
            ff = self.block_sparse_moe(h, batch.graphed) + ff
        return x + ff * self.residual_multiplier


class GraniteModel(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        kinds = read_granitemoehybrid(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            GraniteDecoderLayer(config, i, kind.is_attention) for i, kind in enumerate(kinds)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.embedding_multiplier = float(config.embedding_multiplier)

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        x = self.embed_tokens(batch.input_ids) * self.embedding_multiplier
        for layer in self.layers:
            x = layer(x, batch)
        return self.norm(x, batch.ops)


class GraniteMoeHybridForCausalLM(CausalLM):
    """Granite 4.0 H on paged KV and Mamba2 state slots (see the module docstring)."""

    model_types = ("granitemoehybrid",)
    supports_cuda_graphs = True  # tests/engine/test_step_graphs_families.py

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.model = GraniteModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.logits_scaling = float(config.logits_scaling)
        self.tie_weights()

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden) / self.logits_scaling
