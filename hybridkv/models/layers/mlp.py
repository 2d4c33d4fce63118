"""``SwiGLU``: the gated MLP of the Llama-style families, ``down(silu(gate(x)) * up(x))``.

Parameter names are the checkpoints' (``gate_proj``, ``up_proj``, ``down_proj``).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))``; ``bias`` on all three projections or none."""

    def __init__(self, hidden: int, intermediate: int, bias: bool = False) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.up_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
