"""Jamba's feed-forward blocks: the SwiGLU MLP and the sparse MoE over such MLPs.

``JambaSparseMoe``: router logits ``x @ router.weight.T``, softmax in fp32,
top-``num_experts_per_tok`` experts per token with their probabilities as
weights (not renormalised, as transformers' Jamba), cast back to the
activations' dtype; ``out = sum_k w_k * expert_k(x)``. Tokens are gathered
per expert (a loop over experts, never over tokens), or, in a graphed step, every
expert runs on every token (``layers/moe.py``).

Checkpoint formats (``moe_checkpoint_tensors``): transformers up to at least
5.23 saves one MLP per expert (``feed_forward.experts.{e}.gate_proj.weight``
...), the parameter names here. Its in-memory fused form
(``experts.gate_up_proj [E, 2I, H]`` with gate rows first, ``experts.down_proj
[E, H, I]``) is split per expert.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

from hybridkv.models.layers import SwiGLU
from hybridkv.models.layers.moe import RoutedExperts, weighted_expert_sum

_FUSED = re.compile(r"^(.*\.feed_forward\.experts)\.(gate_up_proj|down_proj)$")


def jamba_mlp(config: Any) -> SwiGLU:
    """Jamba's SwiGLU MLP (also each expert of the MoE)."""
    return SwiGLU(config.hidden_size, config.intermediate_size)


class JambaSparseMoe(RoutedExperts):
    """Top-k softmax-routed experts (see the module docstring)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.top_k = config.num_experts_per_tok
        if not 1 <= self.top_k <= config.num_experts:
            raise ValueError(
                f"Jamba: num_experts_per_tok={self.top_k} must be in [1, num_experts="
                f"{config.num_experts}]"
            )
        self.router = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.experts = nn.ModuleList(jamba_mlp(config) for _ in range(config.num_experts))

    def forward(self, x: torch.Tensor, dense: bool = False) -> torch.Tensor:
        """``x [T, H]`` -> ``[T, H]``; ``dense``: the graphed form (``layers/moe.py``)."""
        probs = torch.softmax(self.router(x).float(), dim=-1)  # [T, E]
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)  # [T, k]
        experts = self.experts
        return weighted_expert_sum(
            x, chosen, weights.to(x.dtype), lambda e, rows: experts[e](rows), len(experts), dense
        )


def moe_checkpoint_tensors(name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """Per-expert parameter names for a fused expert tensor; other names unchanged."""
    m = _FUSED.match(name)
    if m is None:
        return [(name, tensor)]
    prefix, kind = m.groups()
    out: list[tuple[str, torch.Tensor]] = []
    for e, w in enumerate(tensor.unbind(0)):
        if kind == "down_proj":  # [H, I]
            out.append((f"{prefix}.{e}.down_proj.weight", w))
        else:  # [2I, H]: gate rows, then up rows
            gate, up = w.chunk(2, dim=0)
            out.append((f"{prefix}.{e}.gate_proj.weight", gate))
            out.append((f"{prefix}.{e}.up_proj.weight", up))
    return out
