"""Granite 4.0 H's feed-forward blocks: the shared MLP and the sparse MoE.

``GraniteSharedMLP``: ``output_linear(silu(a) * b)`` with ``a, b =
input_linear(x).chunk(2)`` (``shared_intermediate_size`` each).

``GraniteMoE``: router logits ``x @ router.layer.weight.T`` in fp32, the top
``num_experts_per_tok`` of them per token, softmax over those k (cast back to the
activations' dtype) as the weights; expert ``e`` is ``output_linear[e] @ (silu(a) * b)``
with ``a, b = (input_linear[e] @ x).chunk(2)``; ``out = sum_k w_k expert_k(x)``.
Tokens are gathered per expert (a loop over experts, never over tokens), or, in a
graphed step, every expert runs on every token (``layers/moe.py``). The
parameter names and shapes are the checkpoints' (``block_sparse_moe.input_linear.weight
[E, 2I, H]``, ``output_linear.weight [E, H, I]``, ``router.layer.weight [E, H]``), which
transformers 5 also writes.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from hybridkv.models.layers.moe import RoutedExperts, weighted_expert_sum


class GraniteSharedMLP(nn.Module):
    """The dense MLP every layer has (see the module docstring)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        hidden, inter = config.hidden_size, config.shared_intermediate_size
        self.input_linear = nn.Linear(hidden, 2 * inter, bias=False)
        self.output_linear = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.input_linear(x).chunk(2, dim=-1)
        return self.output_linear(F.silu(a) * b)


class _ExpertWeights(nn.Module):
    """``weight [E, out, in]``: one linear map per expert, stacked as in the checkpoint."""

    def __init__(self, experts: int, out_features: int, in_features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(experts, out_features, in_features))


class _Router(nn.Module):
    """``layer``: the router's ``[E, H]`` linear map (named as in the checkpoint)."""

    def __init__(self, hidden: int, experts: int) -> None:
        super().__init__()
        self.layer = nn.Linear(hidden, experts, bias=False)


class GraniteMoE(RoutedExperts):
    """Top-k routed experts (see the module docstring)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.num_experts = config.num_local_experts
        self.top_k = config.num_experts_per_tok
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(
                f"Granite: num_experts_per_tok={self.top_k} must be in [1, num_local_experts="
                f"{self.num_experts}]"
            )
        hidden, inter = config.hidden_size, config.intermediate_size
        self.router = _Router(hidden, self.num_experts)
        self.input_linear = _ExpertWeights(self.num_experts, 2 * inter, hidden)
        self.output_linear = _ExpertWeights(self.num_experts, hidden, inter)

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert ``e`` on rows ``x [n, H]`` -> ``[n, H]``."""
        a, b = F.linear(x, self.input_linear.weight[e]).chunk(2, dim=-1)
        return F.linear(F.silu(a) * b, self.output_linear.weight[e])

    def forward(self, x: torch.Tensor, dense: bool = False) -> torch.Tensor:
        """``x [T, H]`` -> ``[T, H]``; ``dense``: the graphed form (``layers/moe.py``)."""
        logits = F.linear(x, self.router.layer.weight).float()  # [T, E]
        top, chosen = logits.topk(self.top_k, dim=-1)  # [T, k]
        weights = torch.softmax(top, dim=-1).to(x.dtype)
        return weighted_expert_sum(x, chosen, weights, self.expert, self.num_experts, dense)
