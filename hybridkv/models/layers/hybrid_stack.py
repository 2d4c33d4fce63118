"""The pre-norm hybrid decoder that Jamba and Bamba share (``HybridStack``).

Per layer, one mixer (``self_attn`` or ``mamba``, the checkpoints' names) and one
feed-forward, each behind an RMSNorm (``input_layernorm``, ``pre_ff_layernorm``,
through ``batch.ops.rms_norm``)::

    x = x + mixer(input_layernorm(x))
    x = x + feed_forward(pre_ff_layernorm(x))

and the stack: ``embed_tokens``, the layers, ``final_layernorm``. A family passes
one constructor per part; which layers attend comes from its layout reader, so the
model and the planner's KV cache groups always agree.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from hybridkv.layouts.kinds import LayerKind
from hybridkv.models.batch import ForwardBatch
from hybridkv.models.layers.moe import feed_forward
from hybridkv.models.layers.norms import RMSNorm

#: ``(config, layer index) -> module``: a family's constructor of one part.
Part = Callable[[Any, int], nn.Module]


class HybridLayer(nn.Module):
    """One pre-norm block with an attention or a Mamba mixer (module docstring)."""

    def __init__(
        self, config: Any, self_attn: nn.Module | None, mamba: nn.Module | None, ff: nn.Module
    ) -> None:
        super().__init__()
        if (self_attn is None) == (mamba is None):
            raise ValueError("a hybrid layer has exactly one mixer: self_attn or mamba")
        self.self_attn = self_attn
        self.mamba = mamba
        self.feed_forward = ff
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.pre_ff_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        h = self.input_layernorm(x, batch.ops)
        mixer = self.self_attn if self.self_attn is not None else self.mamba
        assert mixer is not None
        x = x + mixer(h, batch)
        return x + feed_forward(self.feed_forward, self.pre_ff_layernorm(x, batch.ops), batch)


class HybridStack(nn.Module):
    """``embed_tokens``, one ``HybridLayer`` per kind, ``final_layernorm``."""

    def __init__(
        self, config: Any, kinds: Sequence[LayerKind], attention: Part, mamba: Part, ff: Part
    ) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            HybridLayer(
                config,
                attention(config, i) if kind.is_attention else None,
                None if kind.is_attention else mamba(config, i),
                ff(config, i),
            )
            for i, kind in enumerate(kinds)
        )
        self.final_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        x = self.embed_tokens(batch.input_ids)
        for layer in self.layers:
            x = layer(x, batch)
        return self.final_layernorm(x, batch.ops)
