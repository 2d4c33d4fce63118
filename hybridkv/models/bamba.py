"""Bamba (``BambaForCausalLM``): Mamba2 layers interleaved with full attention.

Layer ``i`` is an attention layer where the layout reader says so
(``hybridkv.layouts.hf_families.read_bamba``: the config's ``layer_types``, else
``attn_layer_indices``), so the model and the planner's KV cache groups always
agree; every other layer is a Mamba2 mixer (``mamba2_mixer``). Every layer's
feed-forward is a SwiGLU MLP (``mlp_bias``). Pre-norm residual blocks
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
from torch.nn import functional as F

from hybridkv.kernels import AttentionOptions
from hybridkv.layouts import layer_name
from hybridkv.layouts.hf_families import read_bamba
from hybridkv.models.base import IGNORED, CausalLM
from hybridkv.models.batch import ForwardBatch
from hybridkv.models.layers import PagedAttention, RMSNorm
from hybridkv.models.layers.rotary import RotaryEmbedding, rope_parameters
from hybridkv.models.mamba2_mixer import Mamba2Mixer


class BambaAttention(nn.Module):
    """Grouped-query attention with partial RoPE (see the module docstring)."""

    def __init__(self, config: Any, index: int) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or hidden // self.num_heads
        params = rope_parameters(config)
        factor = float(params.get("partial_rotary_factor", 1.0))
        self.rotary_dim = int(self.head_dim * factor)
        if self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.head_dim:
            raise ValueError(
                f"Bamba: partial_rotary_factor {factor} gives {self.rotary_dim} rotary "
                f"dimensions of head_dim {self.head_dim}; need an even count in (0, head_dim]"
            )
        self.rotary = RotaryEmbedding(self.rotary_dim, params)
        bias = config.attention_bias
        self.q_proj = nn.Linear(hidden, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=bias)
        self.attn = PagedAttention(layer_name(index), AttentionOptions(scale=self.head_dim**-0.5))

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        rd = self.rotary_dim
        if rd == self.head_dim:
            return RotaryEmbedding.rotate(x, cos, sin)
        return torch.cat((RotaryEmbedding.rotate(x[..., :rd], cos, sin), x[..., rd:]), dim=-1)

    def forward(self, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        t = x.shape[0]
        q = self.q_proj(x).view(t, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(t, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(t, self.num_kv_heads, self.head_dim)
        cos, sin = self.rotary.for_step(batch, q.dtype)
        out = self.attn(self._rope(q, cos, sin), self._rope(k, cos, sin), v, batch)
        return self.o_proj(out.reshape(t, self.num_heads * self.head_dim))


class BambaMLP(nn.Module):
    """``down(silu(gate(x)) * up(x))``."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        hidden, inter, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = nn.Linear(hidden, inter, bias=bias)
        self.up_proj = nn.Linear(hidden, inter, bias=bias)
        self.down_proj = nn.Linear(inter, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class BambaDecoderLayer(nn.Module):
    """One pre-norm block: attention or Mamba2 mixer, then the MLP."""

    def __init__(self, config: Any, index: int, attention: bool) -> None:
        super().__init__()
        eps = config.rms_norm_eps
        self.self_attn = BambaAttention(config, index) if attention else None
        self.mamba = None if attention else Mamba2Mixer(config, index, "Bamba")
        self.feed_forward = BambaMLP(config)
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


class BambaModel(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        if config.hidden_act != "silu":
            raise ValueError(f"Bamba: hidden_act {config.hidden_act!r} is not supported (silu)")
        kinds = read_bamba(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            BambaDecoderLayer(config, i, kind.is_attention) for i, kind in enumerate(kinds)
        )
        self.final_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        x = self.embed_tokens(batch.input_ids)
        for layer in self.layers:
            x = layer(x, batch)
        return self.final_layernorm(x, batch.ops)


class BambaForCausalLM(CausalLM):
    """Bamba on paged KV and Mamba2 state slots (see the module docstring)."""

    model_types = ("bamba",)

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.model = BambaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()

    def checkpoint_tensors(self, name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        if name == "lm_head.weight" and self.config.tie_word_embeddings:
            return IGNORED  # tied to the embeddings, which the checkpoint also holds
        return [(name, tensor)]
