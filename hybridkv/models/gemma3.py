"""Gemma 3 text (``Gemma3ForCausalLM``; the text part of ``Gemma3ForConditionalGeneration``).

Sliding-window and full-attention layers (``config.layer_types``), each with
its own RoPE base (local / global ``rope_parameters``); q/k RMS norms before
RoPE (with the k/v cache write, one ``ops.qk_norm_rope_cache``); scale
``query_pre_attn_scalar ** -0.5``; optional attention and final logit softcaps;
embeddings scaled by ``sqrt(hidden_size)``; four norms per layer (Gemma's
``1 + weight``); GeGLU MLP (tanh GELU).

One forward path for every kernel backend: each layer takes the residual
``x`` and ``y = input_layernorm(x)``, and each residual add is one
``ops.add_rms_norm`` with the norms around it (the next layer's input norm,
or the final norm, computed at the end of the layer before). A backend may
fuse that step and update ``x`` in place (``native``); the torch reference
computes exactly what transformers' modules compute. Parameter names are the
checkpoint's (``model.layers.{i}.self_attn.q_proj.weight`` ...); the
multimodal wrapper's ``model.language_model.*`` names map onto them and its
vision tower and projector are ignored on purpose.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import nn

from hybridkv.kernels import AttentionOptions, KernelBackend, QKNormRope
from hybridkv.layouts import layer_name
from hybridkv.models.base import IGNORED, CausalLM
from hybridkv.models.batch import ForwardBatch
from hybridkv.models.layers import (
    GemmaRMSNorm,
    PagedAttention,
    RotaryEmbedding,
    rope_parameters,
)
from hybridkv.models.layers.merged_linear import MergeableProjections

_VISION_PREFIXES = (
    "model.vision_tower.",
    "model.multi_modal_projector.",
    "vision_tower.",
    "multi_modal_projector.",
)
_TEXT_PREFIXES = (
    ("model.language_model.", "model."),
    ("language_model.model.", "model."),
    ("language_model.lm_head.", "lm_head."),
)


class Gemma3Attention(MergeableProjections):
    MERGED: ClassVar[Mapping[str, tuple[str, ...]]] = {"qkv_proj": ("q_proj", "k_proj", "v_proj")}

    def __init__(self, config: Any, index: int) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        layer_type = config.layer_types[index]
        bias = config.attention_bias
        hidden = config.hidden_size
        self.q_proj = nn.Linear(hidden, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=bias)
        self.q_norm = GemmaRMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(self.head_dim, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(self.head_dim, rope_parameters(config, layer_type))
        sliding = layer_type == "sliding_attention"
        options = AttentionOptions(
            scale=config.query_pre_attn_scalar**-0.5,
            sliding_window=config.sliding_window if sliding else None,
            softcap=config.attn_logit_softcapping,
        )
        self.attn = PagedAttention(layer_name(index), options)

    def forward(self, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.project(x, "qkv_proj")  # [T, H * D] each, views of one GEMM if merged
        q = q.view(t, self.num_heads, self.head_dim)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        cos, sin = self.rotary.for_step(batch, q.dtype)
        q_scale, k_scale = self.q_norm.scale_fp32(), self.k_norm.scale_fp32()
        norm = QKNormRope(q_scale, k_scale, cos, sin, self.q_norm.eps)
        out = self.attn.forward_qk_norm_rope(q, k, v, batch, norm)
        return self.o_proj(out.reshape(t, self.num_heads * self.head_dim))


class Gemma3MLP(MergeableProjections):
    MERGED: ClassVar[Mapping[str, tuple[str, ...]]] = {"gate_up_proj": ("gate_proj", "up_proj")}

    def __init__(self, config: Any) -> None:
        super().__init__()
        if config.hidden_activation != "gelu_pytorch_tanh":
            raise ValueError(
                f"Gemma 3: hidden_activation {config.hidden_activation!r} is not supported "
                "(only gelu_pytorch_tanh)"
            )
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, ops: KernelBackend) -> torch.Tensor:
        gate, up = self.project(x, "gate_up_proj")
        return self.down_proj(ops.gelu_tanh_mul(gate, up))


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, config: Any, index: int) -> None:
        super().__init__()
        eps = config.rms_norm_eps
        self.self_attn = Gemma3Attention(config, index)
        self.mlp = Gemma3MLP(config)
        self.input_layernorm = GemmaRMSNorm(config.hidden_size, eps)
        self.post_attention_layernorm = GemmaRMSNorm(config.hidden_size, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(config.hidden_size, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(config.hidden_size, eps)

    def forward(
        self, x: torch.Tensor, y: torch.Tensor, batch: ForwardBatch, next_norm: GemmaRMSNorm
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` the residual, ``y = input_layernorm(x)`` -> the new residual and
        ``next_norm`` of it (the next layer's input norm, or the final norm)."""
        ops = batch.ops
        eps = self.post_attention_layernorm.eps
        h = self.self_attn(y, batch)
        x, y = ops.add_rms_norm(
            x,
            h,
            self.post_attention_layernorm.scale_fp32(),
            self.pre_feedforward_layernorm.scale_fp32(),
            eps,
        )
        h = self.mlp(y, ops)
        x, y = ops.add_rms_norm(
            x, h, self.post_feedforward_layernorm.scale_fp32(), next_norm.scale_fp32(), eps
        )
        return x, y


class Gemma3Model(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            Gemma3DecoderLayer(config, i) for i in range(config.num_hidden_layers)
        )
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.embed_scale = config.hidden_size**0.5

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        x = self.embed_tokens(batch.input_ids)
        x = x * torch.tensor(self.embed_scale, dtype=torch.float32).to(x.dtype)
        layers: list[Gemma3DecoderLayer] = list(self.layers)  # type: ignore[arg-type]
        first = layers[0].input_layernorm
        x, y = batch.ops.add_rms_norm(x, None, None, first.scale_fp32(), first.eps)
        for i, layer in enumerate(layers):
            nxt = layers[i + 1].input_layernorm if i + 1 < len(layers) else self.norm
            x, y = layer(x, y, batch, nxt)
        return y


class Gemma3ForCausalLM(CausalLM):
    """Gemma 3 text model on paged KV (see the module docstring)."""

    model_types = ("gemma3_text",)
    supports_cuda_graphs = True

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.model = Gemma3Model(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.final_softcap = config.final_logit_softcapping
        self.tie_weights()

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden)
        if self.final_softcap is not None:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits

    def checkpoint_tensors(self, name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        if name.startswith(_VISION_PREFIXES):
            return IGNORED
        for old, new in _TEXT_PREFIXES:
            if name.startswith(old):
                name = new + name[len(old) :]
                break
        if name == "lm_head.weight" and self.config.tie_word_embeddings:
            return IGNORED  # tied to the embeddings, which the checkpoint also holds
        return [(name, tensor)]
