"""Routed experts' token dispatch, in two forms with the same sums.

- **gathered** (eager steps): per expert, the rows that picked it are found with
  ``nonzero`` and only those run through it. Cheapest in arithmetic (``k`` expert
  rows per token), but ``nonzero`` reads the picks back to the host: a sync per
  expert, which a CUDA graph cannot capture.
- **dense** (steps run from a CUDA graph: ``ForwardBatch.graphed``): every expert
  runs on every row of the step, and ``torch.where`` keeps the rows that picked it.
  Static shapes and no host read, at ``E / k`` times the arithmetic; graphed steps
  are at most ``shapes.MAX_SMALL_TOKENS`` tokens, where reading each expert's weights
  (which both forms do once per expert) dominates on a GPU.

Both add the experts' contributions in the same order (expert order for
``weighted_expert_sum``; a row that did not pick an expert gets exactly zero from
it), so the two forms differ only by the matmuls' own rounding on a different
number of rows.

``RoutedExperts`` marks a feed-forward that takes the form (``forward(x, dense)``);
``feed_forward`` calls any feed-forward with the step's choice.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from hybridkv.models.batch import ForwardBatch

#: ``(expert index, rows [n, H]) -> [n, H]``.
Expert = Callable[[int, torch.Tensor], torch.Tensor]


class RoutedExperts(nn.Module):
    """A routed-experts feed-forward: ``forward(x [T, H], dense) -> [T, H]``."""

    def forward(self, x: torch.Tensor, dense: bool = False) -> torch.Tensor:
        raise NotImplementedError


def feed_forward(ff: nn.Module, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
    """``ff(x)``; routed experts take the dense form in a graphed step."""
    if isinstance(ff, RoutedExperts):
        return ff(x, batch.graphed)
    out: torch.Tensor = ff(x)
    return out


def weighted_expert_sum(
    x: torch.Tensor,
    chosen: torch.Tensor,
    weights: torch.Tensor,
    expert: Expert,
    num_experts: int,
    dense: bool,
) -> torch.Tensor:
    """``out[t] = sum over experts e picked by t (in expert order) of weight * expert(e, x[t])``.

    ``x [T, H]``; ``chosen [T, k]`` distinct expert ids per row; ``weights [T, k]`` in
    ``x``'s dtype. ``dense``: the form without host reads (module docstring).
    """
    out = torch.zeros_like(x)
    if dense:
        for e in range(num_experts):
            picked = chosen == e  # [T, k], at most one True per row
            w = torch.where(picked, weights, 0).sum(dim=-1, keepdim=True)  # [T, 1], exact
            y = expert(e, x) * w
            out += torch.where(picked.any(dim=-1, keepdim=True), y, 0)
        return out
    for e in range(num_experts):
        tokens, slot = torch.nonzero(chosen == e, as_tuple=True)  # [n], [n]
        if tokens.numel() == 0:
            continue
        y = expert(e, x[tokens]) * weights[tokens, slot, None]
        out.index_add_(0, tokens, y)
    return out
