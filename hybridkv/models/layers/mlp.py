"""``SwiGLU``: the gated MLP of the Llama-style families, ``down(silu(gate(x)) * up(x))``.

Parameter names are the checkpoints' (``gate_proj``, ``up_proj``, ``down_proj``); after
loading gate/up run as one GEMM (``gate_up_proj``, ``layers/merged_linear.py``).
``check_silu`` refuses a config whose ``hidden_act`` is not the silu these
families (and the Mamba convs) hard-code.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import nn
from torch.nn import functional as F

from hybridkv.models.layers.merged_linear import MergeableProjections


def check_silu(config: Any, family: str, why: str = "") -> None:
    """``ValueError`` naming ``config.hidden_act`` unless it is ``"silu"``; ``why``:
    what else uses it, added to the message."""
    if config.hidden_act != "silu":
        raise ValueError(
            f"{family}: hidden_act {config.hidden_act!r} is not supported (only silu{why})"
        )


class SwiGLU(MergeableProjections):
    """``down(silu(gate(x)) * up(x))``; ``bias`` on all three projections or none."""

    MERGED: ClassVar[Mapping[str, tuple[str, ...]]] = {"gate_up_proj": ("gate_proj", "up_proj")}

    def __init__(self, hidden: int, intermediate: int, bias: bool = False) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.up_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.project(x, "gate_up_proj")  # [T, I] each
        return self.down_proj(F.silu(gate) * up)
