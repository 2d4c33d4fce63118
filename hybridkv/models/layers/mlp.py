"""``SwiGLU``: the gated MLP of the Llama-style families, ``down(silu(gate(x)) * up(x))``.

Parameter names are the checkpoints' (``gate_proj``, ``up_proj``, ``down_proj``).
``check_silu`` refuses a config whose ``hidden_act`` is not the silu these
families (and the Mamba convs) hard-code.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F


def check_silu(config: Any, family: str, why: str = "") -> None:
    """``ValueError`` naming ``config.hidden_act`` unless it is ``"silu"``; ``why``:
    what else uses it, added to the message."""
    if config.hidden_act != "silu":
        raise ValueError(
            f"{family}: hidden_act {config.hidden_act!r} is not supported (only silu{why})"
        )


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))``; ``bias`` on all three projections or none."""

    def __init__(self, hidden: int, intermediate: int, bias: bool = False) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.up_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
