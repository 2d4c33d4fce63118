"""Jamba's Mamba1 mixer on the engine's state slots (``JambaMambaMixer``).

Per token ``t`` of the flattened batch (``DI = mamba_expand * hidden_size``,
``N = mamba_d_state``, ``R = mamba_dt_rank``, ``W = mamba_d_conv``)::

    x, z   = in_proj(h).chunk(2)                        # [T, DI] each
    x      = silu(causal_conv1d(x) + conv_bias)          # depthwise, width W, with state
    dt, B, C = x_proj(x).split([R, N, N])
    dt, B, C = dt_layernorm(dt), b_layernorm(B), c_layernorm(C)   # Jamba's extra RMS norms
    dt     = dt @ dt_proj.weight.T                       # bias added in the scan
    y      = scan(x, softplus(dt + dt_proj.bias), A = -exp(A_log), B, C) + D * x
    out    = out_proj(y * silu(z))

The conv and the scan run as varlen chunks (``batch.ops.causal_conv1d``,
``batch.ops.selective_scan``; a decode is a chunk of one token): each sequence starts
from its ``initial_state_indices`` slot and the states after the tokens named by
``save_state_indices`` are written into the layer's ``MambaCache`` views
(conv ``[slots, W-1, DI]``, SSM ``[slots, DI, N]``, the shapes of
``Mamba1Layer.state_shapes``). Parameter names are the checkpoint's
(``model.layers.{i}.mamba.in_proj.weight`` ...).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from hybridkv.layouts import layer_name
from hybridkv.models.batch import ForwardBatch
from hybridkv.models.layers import RMSNorm
from hybridkv.models.layers.mlp import check_silu


def dt_rank(config: Any) -> int:
    """``mamba_dt_rank`` with ``"auto"`` resolved as transformers does (``ceil(H / 16)``)."""
    rank = config.mamba_dt_rank
    return math.ceil(config.hidden_size / 16) if rank == "auto" else int(rank)


class JambaMambaMixer(nn.Module):
    """One Mamba1 layer (see the module docstring)."""

    def __init__(self, config: Any, index: int) -> None:
        super().__init__()
        check_silu(config, "Jamba", ", which the Mamba conv also uses")
        if config.mamba_d_conv < 2:
            raise ValueError(f"Jamba: mamba_d_conv must be >= 2, got {config.mamba_d_conv}")
        self.layer_name = layer_name(index)
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.d_inner = config.mamba_expand * hidden
        self.d_state = config.mamba_d_state
        self.dt_rank = dt_rank(config)
        di, n, r, w = self.d_inner, self.d_state, self.dt_rank, config.mamba_d_conv
        self.in_proj = nn.Linear(hidden, 2 * di, bias=config.mamba_proj_bias)
        # Only holds the checkpoint's [DI, 1, W] weight and bias; the kernel runs the conv.
        self.conv1d = nn.Conv1d(di, di, w, groups=di, bias=config.mamba_conv_bias)
        self.x_proj = nn.Linear(di, r + 2 * n, bias=False)
        self.dt_proj = nn.Linear(r, di, bias=True)
        self.A_log = nn.Parameter(torch.empty(di, n))
        self.D = nn.Parameter(torch.empty(di))
        self.out_proj = nn.Linear(di, hidden, bias=config.mamba_proj_bias)
        self.dt_layernorm = RMSNorm(r, eps)
        self.b_layernorm = RMSNorm(n, eps)
        self.c_layernorm = RMSNorm(n, eps)

    def forward(self, h: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """``h [T, hidden]`` -> ``[T, hidden]``; reads and writes the layer's state slots."""
        inputs = batch.mamba[self.layer_name]
        cache, ops = inputs.cache, batch.ops
        slots = (inputs.query_start_loc, inputs.initial_state_indices, inputs.save_state_indices)
        x, z = self.in_proj(h).chunk(2, dim=-1)  # [T, DI] views (unit last stride)
        weight = self.conv1d.weight[:, 0]  # [DI, W]
        x = ops.causal_conv1d(x, weight, self.conv1d.bias, "silu", cache.conv, *slots)
        dt, B, C = self.x_proj(x).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        dt = F.linear(self.dt_layernorm(dt, ops), self.dt_proj.weight)  # [T, DI]
        B, C = self.b_layernorm(B, ops), self.c_layernorm(C, ops)  # [T, N]
        A = -torch.exp(self.A_log.float())  # [DI, N]
        y = ops.selective_scan(
            x, dt, A, B, C, self.D.float(), z, self.dt_proj.bias.float(), True, cache.ssm, *slots
        )
        return self.out_proj(y)
