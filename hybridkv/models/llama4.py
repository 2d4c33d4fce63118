"""Llama 4 text (``Llama4ForCausalLM``; the text part of ``Llama4ForConditionalGeneration``).

Two kinds of attention layer, chosen per layer by two config fields, as
transformers does:

- ``no_rope_layers[i] == 1`` (1 means the layer *uses* RoPE): RoPE in the
  interleaved form (dimensions ``(2j, 2j+1)`` are rotated as a pair by
  frequency ``j``, the complex-number form of Meta's code, not
  ``rotate_half``), then, if ``use_qk_norm``, a weightless RMS ("L2") norm of
  q and k with ``rms_norm_eps``, after RoPE;
- ``no_rope_layers[i] == 0`` (NoPE): no RoPE, no qk norm, and with
  ``attn_temperature_tuning`` the query of the token at absolute position
  ``p`` is multiplied by ``1 + attn_scale * log1p(floor((p + 1) / floor_scale))``
  (``temperature_scales``);
- ``layer_types[i] == "chunked_attention"`` (the RoPE layers in every shipped
  config): a key is visible when ``k // attention_chunk_size == q //
  attention_chunk_size``; ``full_attention`` layers see the whole prefix. This
  is what ``hybridkv.layouts`` plans (a chunked group and a full group).

Scale ``head_dim ** -0.5``; pre-norm decoder layers (two RMSNorms). The norms,
the L2 qk-norm and the RoPE run on the step's kernel backend
(``batch.ops.rms_norm``, ``batch.ops.rope_pairwise``). Dense SwiGLU MLP
layers and MoE layers (``config.moe_layers``, from ``interleave_moe_layer_step``)
in ``llama4_moe``. Parameter names are the
checkpoint's (``model.layers.{i}.feed_forward.experts.gate_up_proj`` ...); the
multimodal wrapper's ``language_model.*`` names map onto them and its vision
model and projector are ignored on purpose.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import nn

from hybridkv.kernels import AttentionOptions
from hybridkv.kernels.torch_backend import apply_rope_pairwise
from hybridkv.layouts import layer_name
from hybridkv.models.base import IGNORED, CausalLM
from hybridkv.models.batch import ForwardBatch
from hybridkv.models.layers import PagedAttention, RMSNorm, RopeFrequencies, rope_parameters
from hybridkv.models.layers.merged_linear import MergeableProjections
from hybridkv.models.layers.moe import feed_forward
from hybridkv.models.llama4_moe import Llama4MLP, Llama4MoE
from hybridkv.models.loader import CheckpointError

_VISION_PREFIXES = (
    "vision_model.",
    "multi_modal_projector.",
    "model.vision_model.",
    "model.multi_modal_projector.",
)
_TEXT_PREFIXES = (
    ("language_model.model.", "model."),
    ("language_model.lm_head.", "lm_head."),
    ("model.language_model.", "model."),
)
_PER_EXPERT = re.compile(r"\.feed_forward\.experts\.\d+\.")


def layer_types(config: Any) -> list[str]:
    """Per layer ``chunked_attention`` or ``full_attention`` (``layer_types``, else RoPE use)."""
    declared = getattr(config, "layer_types", None)
    if declared:
        return list(declared)
    return ["chunked_attention" if r else "full_attention" for r in config.no_rope_layers]


def moe_layers(config: Any) -> set[int]:
    """Indices of the MoE layers (``moe_layers``, else every ``interleave_moe_layer_step``-th)."""
    listed = getattr(config, "moe_layers", None)
    if listed is not None:
        return set(listed)
    step = config.interleave_moe_layer_step
    return set(range(step - 1, config.num_hidden_layers, step))


def temperature_scales(
    positions: torch.Tensor, floor_scale: float, attn_scale: float
) -> torch.Tensor:
    """Query multipliers ``[T]`` (fp32) of NoPE layers at absolute ``positions`` ``[T]``."""
    steps = torch.floor((positions.float() + 1.0) / floor_scale)
    return torch.log1p(steps) * attn_scale + 1.0


class InterleavedRotary(RopeFrequencies):
    """RoPE on adjacent pairs ``(x[2j], x[2j+1])``, in fp32 (see the module docstring)."""

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 cos and sin ``[T, 1, D / 2]`` (compute once, rotate q and k)."""
        angles = positions.float()[:, None, None] * self.inv_freq.float()[None, None, :]
        return angles.cos(), angles.sin()

    @staticmethod
    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate ``x`` ``[T, H, D]``: pair ``(a, b)`` -> ``(a cos - b sin, a sin + b cos)``
        (the torch reference of ``ops.rope_pairwise``; the model calls the op)."""
        return apply_rope_pairwise(x, cos, sin)


class Llama4Attention(MergeableProjections):
    MERGED: ClassVar[Mapping[str, tuple[str, ...]]] = {"qkv_proj": ("q_proj", "k_proj", "v_proj")}

    def __init__(self, config: Any, index: int) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        bias, hidden = config.attention_bias, config.hidden_size
        self.q_proj = nn.Linear(hidden, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=bias)
        uses_rope = bool(config.no_rope_layers[index])
        self.rotary = (
            InterleavedRotary(self.head_dim, rope_parameters(config)) if uses_rope else None
        )
        self.qk_norm_eps: float | None = (
            config.rms_norm_eps if uses_rope and config.use_qk_norm else None
        )
        tuned = config.attn_temperature_tuning and not uses_rope
        self.temperature = (float(config.floor_scale), float(config.attn_scale)) if tuned else None
        chunked = layer_types(config)[index] == "chunked_attention"
        chunk = config.attention_chunk_size if chunked else None
        options = AttentionOptions(scale=self.head_dim**-0.5, chunk_size=chunk)
        self.attn = PagedAttention(layer_name(index), options)

    def forward(self, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.project(x, "qkv_proj")  # [T, H * D] each, views of one GEMM if merged
        q = q.view(t, self.num_heads, self.head_dim)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        ops = batch.ops
        if self.rotary is not None:
            cos, sin = self.rotary.for_step(batch)
            q, k = ops.rope_pairwise(q, cos, sin), ops.rope_pairwise(k, cos, sin)
        if self.qk_norm_eps is not None:  # weightless ("L2") norm, after RoPE
            q, k = ops.rms_norm(q, None, self.qk_norm_eps), ops.rms_norm(k, None, self.qk_norm_eps)
        if self.temperature is not None:
            scales = temperature_scales(batch.positions, *self.temperature)
            q = (q * scales[:, None, None]).to(q.dtype)
        out = self.attn(q, k, v, batch)
        return self.o_proj(out.reshape(t, self.num_heads * self.head_dim))


class Llama4DecoderLayer(nn.Module):
    def __init__(self, config: Any, index: int, moe: bool) -> None:
        super().__init__()
        eps = config.rms_norm_eps
        self.self_attn = Llama4Attention(config, index)
        self.feed_forward: nn.Module = (
            Llama4MoE(config) if moe else Llama4MLP(config, config.intermediate_size_mlp)
        )
        self.input_layernorm = RMSNorm(config.hidden_size, eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps)

    def forward(self, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x, batch.ops), batch)
        return x + feed_forward(
            self.feed_forward, self.post_attention_layernorm(x, batch.ops), batch
        )


class Llama4Model(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        moe = moe_layers(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            Llama4DecoderLayer(config, i, i in moe) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        x = self.embed_tokens(batch.input_ids)
        for layer in self.layers:
            x = layer(x, batch)
        return self.norm(x, batch.ops)


class Llama4ForCausalLM(CausalLM):
    """Llama 4 text model on paged KV (see the module docstring)."""

    model_types = ("llama4_text",)
    supports_cuda_graphs = True  # tests/engine/test_step_graphs_families.py

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        n = config.num_hidden_layers
        if len(config.no_rope_layers) < n or len(layer_types(config)) != n:
            raise ValueError(
                f"Llama 4 config: no_rope_layers ({len(config.no_rope_layers)}) and "
                f"layer_types ({len(layer_types(config))}) must cover num_hidden_layers={n}"
            )
        self.model = Llama4Model(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()

    def checkpoint_tensors(self, name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        if name.startswith(_VISION_PREFIXES):
            return IGNORED
        for old, new in _TEXT_PREFIXES:
            if name.startswith(old):
                name = new + name[len(old) :]
                break
        if _PER_EXPERT.search(name):
            raise CheckpointError(
                f"{name}: per-expert MoE tensors are not supported; this model reads the "
                "stacked experts.gate_up_proj [E, H, 2I] / experts.down_proj [E, I, H] "
                "that transformers saves"
            )
        if name == "lm_head.weight" and self.config.tie_word_embeddings:
            return IGNORED  # tied to the embeddings, which the checkpoint also holds
        return [(name, tensor)]
