"""``PagedAttention``: write a layer's new K/V into its pages, then attend.

The layer finds its inputs in the step's ``ForwardBatch`` by name, writes
``k``/``v`` at the slots the manager gave out (``batch.ops.cache_write``) and
runs ``batch.ops.attention`` over the group's block tables. Its window, chunk,
softcap and scale are fixed per layer (``AttentionOptions``). Gemma's layers call
``forward_qk_norm_rope`` instead: q and k normed and rotated and k/v written by one
``batch.ops.qk_norm_rope_cache`` (one kernel on ``triton``), then attention.
"""

from __future__ import annotations

import torch
from torch import nn

from hybridkv.kernels import AttentionOptions, QKNormRope
from hybridkv.models.batch import ForwardBatch


class PagedAttention(nn.Module):
    """Attention of one layer over its paged KV cache."""

    def __init__(self, layer_name: str, options: AttentionOptions) -> None:
        super().__init__()
        self.layer_name = layer_name
        self.options = options

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        batch: ForwardBatch,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``q`` ``[T, Hq, D]``, ``k``/``v`` ``[T, Hkv, D]`` -> ``[T, Hq, D]``."""
        inputs = batch.attention[self.layer_name]
        cache = inputs.cache
        ops = batch.ops
        ops.cache_write(k, v, cache.key, cache.value, inputs.slot_mapping)
        return ops.attention(q, cache.key, cache.value, inputs.metadata, self.options, sinks=sinks)

    def forward_qk_norm_rope(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: ForwardBatch,
        norm: QKNormRope,
    ) -> torch.Tensor:  # fmt: skip
        """``forward`` for q/k before their per-head norms and RoPE (``norm``): ``q``
        ``[T, Hq, D]``, ``k``/``v`` ``[T, Hkv, D]`` -> ``[T, Hq, D]``."""
        inputs = batch.attention[self.layer_name]
        cache = inputs.cache
        ops = batch.ops
        q = ops.qk_norm_rope_cache(q, k, v, norm, cache.key, cache.value, inputs.slot_mapping)
        return ops.attention(q, cache.key, cache.value, inputs.metadata, self.options)
