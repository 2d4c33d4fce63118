"""Llama 4 feed-forward blocks: the dense SwiGLU MLP and the mixture of experts.

``Llama4MLP``: ``down(silu(gate(x)) * up(x))`` (``layers.SwiGLU``, gate/up as one GEMM
once loaded); dense layers use ``intermediate_size_mlp``, the MoE's shared expert
``intermediate_size``.

``Llama4MoE`` (layers listed in ``config.moe_layers``): a router picks the
top-``num_experts_per_tok`` experts per token from its logits and scores each
pick with ``sigmoid(logit)`` (no softmax, no renormalisation). The score scales
the expert's *input*, not its output: ``expert_e(score * x)``; with SwiGLU
experts the two differ. The output is ``shared_expert(x) + sum of the picks``.

Expert weights are stacked over experts exactly as transformers saves them:
``experts.gate_up_proj`` ``[E, H, 2I]`` (gate columns first, then up) and
``experts.down_proj`` ``[E, I, H]``, applied as ``x @ W`` (not ``nn.Linear``'s
``x @ W.T``). Tokens are grouped per expert with index tensors: the only
Python loop is over the experts; each pick's output lands in its own row, and
the picks of a token are summed in pick order. In a graphed step every expert runs
on every token instead (``dense``, ``layers/moe.py``), each token's input scaled by
its score for that expert (zero where it did not pick it), and ``torch.where``
places the output in the pick's row: the same rows, summed in the same order.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from hybridkv.models.layers.mlp import SwiGLU, check_silu
from hybridkv.models.layers.moe import RoutedExperts


class Llama4MLP(SwiGLU):
    """SwiGLU MLP of width ``intermediate_size``, no biases."""

    def __init__(self, config: Any, intermediate_size: int) -> None:
        check_silu(config, "Llama 4")
        super().__init__(config.hidden_size, intermediate_size)


class Llama4Experts(nn.Module):
    """The routed experts' stacked weights (checkpoint layout, see the module docstring)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        e, h, i = config.num_local_experts, config.hidden_size, config.intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(e, h, 2 * i))
        self.down_proj = nn.Parameter(torch.empty(e, i, h))

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert ``e`` on already-scaled inputs ``x`` ``[n, H]`` -> ``[n, H]``."""
        gate, up = (x @ self.gate_up_proj[e]).chunk(2, dim=-1)  # [n, I] each
        return (up * F.silu(gate)) @ self.down_proj[e]


class Llama4MoE(RoutedExperts):
    """Sigmoid top-k routed experts plus a shared expert (see the module docstring)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        check_silu(config, "Llama 4")
        self.num_experts = config.num_local_experts
        self.top_k = config.num_experts_per_tok
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(
                f"Llama 4: num_experts_per_tok={self.top_k} must be in "
                f"[1, num_local_experts={self.num_experts}]"
            )
        self.router = nn.Linear(config.hidden_size, self.num_experts, bias=False)
        self.experts = Llama4Experts(config)
        self.shared_expert = Llama4MLP(config, config.intermediate_size)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Picked experts ``[T, k]`` (int64) and their scores ``[T, k]`` in ``x``'s dtype."""
        logits = self.router(x)  # [T, E]
        top, picked = torch.topk(logits, self.top_k, dim=-1)
        return picked, torch.sigmoid(top.float()).to(x.dtype)

    def forward(self, x: torch.Tensor, dense: bool = False) -> torch.Tensor:
        """``x`` ``[T, H]`` -> ``[T, H]``; ``dense``: the graphed form (module docstring)."""
        picked, scores = self.route(x)
        t, h, k = x.shape[0], x.shape[1], self.top_k
        if dense:
            picks = x.new_zeros(t, k, h)
            for e in range(self.num_experts):
                mine = picked == e  # [T, k], at most one True per row
                score = torch.where(mine, scores, 0).sum(dim=-1, keepdim=True)  # [T, 1], exact
                y = self.experts.expert(e, x * score)  # [T, H]
                picks = torch.where(mine[:, :, None], y[:, None, :], picks)
            return self.shared_expert(x) + picks.sum(dim=1)
        flat_expert = picked.reshape(-1)  # [T * k], row t * k + j is token t's j-th pick
        flat_token = torch.arange(t, device=x.device).repeat_interleave(k)
        flat_score = scores.reshape(-1, 1)
        flat = x.new_empty(flat_expert.shape[0], h)  # every row is written once
        for e in range(self.num_experts):
            rows = (flat_expert == e).nonzero().squeeze(1)
            flat[rows] = self.experts.expert(e, x[flat_token[rows]] * flat_score[rows])
        return self.shared_expert(x) + flat.view(t, k, h).sum(dim=1)
