"""``GroupedQueryAttention``: q/k/v/o projections around one paged attention call.

The families whose attention is plain grouped-query attention share it (Jamba,
Bamba, Granite 4.0 H, Mistral / Ministral, Command R7B); each says how positions
enter by overriding ``position(q, k, batch)`` (the default: none, NoPE). Shapes:
``x [T, hidden]`` -> ``q [T, Hq, D]``, ``k, v [T, Hkv, D]`` -> ``out [T, hidden]``.
Parameter names are the checkpoints' (``q_proj`` ... ``o_proj``); after loading q/k/v
run as one GEMM (``qkv_proj``, ``layers/merged_linear.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import nn

from hybridkv.kernels import AttentionOptions
from hybridkv.layouts import layer_name
from hybridkv.models.batch import ForwardBatch
from hybridkv.models.layers.attention import PagedAttention
from hybridkv.models.layers.merged_linear import MergeableProjections


def config_head_dim(config: Any) -> int:
    """``config.head_dim`` where set, else ``hidden_size // num_attention_heads``."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


class GroupedQueryAttention(MergeableProjections):
    """Layer ``index``'s attention with ``options`` (scale, window); ``bias`` on all four
    projections or none."""

    MERGED: ClassVar[Mapping[str, tuple[str, ...]]] = {"qkv_proj": ("q_proj", "k_proj", "v_proj")}

    def __init__(
        self, config: Any, index: int, options: AttentionOptions, bias: bool = False
    ) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config_head_dim(config)
        self.q_proj = nn.Linear(hidden, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=bias)
        self.attn = PagedAttention(layer_name(index), options)

    def position(
        self, q: torch.Tensor, k: torch.Tensor, batch: ForwardBatch
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(q, k)`` with positions applied; none here (NoPE)."""
        return q, k

    def forward(self, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.project(x, "qkv_proj")  # [T, H * D] each, views of one GEMM if merged
        q = q.view(t, self.num_heads, self.head_dim)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        q, k = self.position(q, k, batch)
        out = self.attn(q, k, v, batch)
        return self.o_proj(out.reshape(t, self.num_heads * self.head_dim))
