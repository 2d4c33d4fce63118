"""The Mamba2 mixer of Bamba and Granite 4.0 H on the engine's state slots (``Mamba2Mixer``).

Per token ``t`` of the flattened batch (``H = mamba_n_heads``, ``P = mamba_d_head``,
``DI = H * P = mamba_expand * hidden_size``, ``G = mamba_n_groups``,
``N = mamba_d_state``, ``W = mamba_d_conv``)::

    z, xBC, dt = in_proj(h).split([DI, DI + 2 G N, H])
    xBC        = silu(causal_conv1d(xBC) + conv_bias)        # depthwise, width W, with state
    x, B, C    = xBC.split([DI, G N, G N])                   # x [T, H, P], B and C [T, G, N]
    y          = ssd_scan(x, softplus(dt + dt_bias), A = -exp(A_log), B, C) + D * x
    y          = norm(y * silu(z))                           # RMS per group of DI / G channels
    out        = out_proj(y)

The gated norm runs in fp32 and is cast back before its weight multiplies, as
transformers' ``BambaRMSNormGated`` (``GraniteMoeHybridRMSNormGated`` is the same; so
are the two families' mixers). The conv and the scan run as varlen chunks
(``batch.ops.causal_conv1d``, ``batch.ops.ssd_scan``; a decode is a chunk of one
token): each sequence starts from its ``initial_state_indices`` slot, and the
states after the tokens named by ``save_state_indices`` are written into the
layer's ``MambaCache`` views (conv ``[slots, W-1, DI + 2 G N]``, SSM ``[slots, H,
P, N]``: ``Mamba2Layer.state_shapes``). Parameter names are the checkpoint's
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
from hybridkv.models.layers.mlp import check_silu


def check_mamba2_config(config: Any, family: str) -> None:
    """``ValueError`` naming the field for a Mamba2 config this mixer cannot run."""
    check_silu(config, family, ", which the Mamba conv also uses")
    if config.mamba_d_conv < 2:
        raise ValueError(f"{family}: mamba_d_conv must be >= 2, got {config.mamba_d_conv}")
    inner = int(config.mamba_expand * config.hidden_size)
    if config.mamba_n_heads * config.mamba_d_head != inner:
        raise ValueError(
            f"{family}: mamba_n_heads x mamba_d_head ({config.mamba_n_heads} x "
            f"{config.mamba_d_head}) must equal mamba_expand x hidden_size ({inner})"
        )
    if config.mamba_n_heads % config.mamba_n_groups:
        raise ValueError(
            f"{family}: mamba_n_groups {config.mamba_n_groups} must divide mamba_n_heads "
            f"{config.mamba_n_heads}"
        )
    low, high = getattr(config, "time_step_limit", (0.0, math.inf))
    if low > 0.0 or high != math.inf:
        raise ValueError(
            f"{family}: time_step_limit {(low, high)} is not supported (only (0.0, inf): "
            "the scan does not clamp dt)"
        )


class GatedRMSNorm(nn.Module):
    """``weight * rms_norm(y * silu(gate))`` per group of ``group_size`` channels (fp32)."""

    def __init__(self, size: int, group_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.group_size = group_size
        self.eps = eps

    def forward(self, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """``y, gate [T, size]`` -> ``[T, size]`` in ``y``'s dtype times the weight."""
        h = y.float() * F.silu(gate.float())
        groups = h.unflatten(-1, (-1, self.group_size))
        groups = groups * torch.rsqrt(groups.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * groups.flatten(-2).to(y.dtype)


class Mamba2Mixer(nn.Module):
    """One Mamba2 layer (see the module docstring); ``family`` names the model in errors."""

    def __init__(self, config: Any, index: int, family: str) -> None:
        super().__init__()
        check_mamba2_config(config, family)
        self.layer_name = layer_name(index)
        self.n_heads, self.head_dim = config.mamba_n_heads, config.mamba_d_head
        self.n_groups, self.d_state = config.mamba_n_groups, config.mamba_d_state
        self.d_inner = self.n_heads * self.head_dim
        self.conv_dim = self.d_inner + 2 * self.n_groups * self.d_state
        bias = config.mamba_proj_bias
        self.in_proj = nn.Linear(
            config.hidden_size, self.d_inner + self.conv_dim + self.n_heads, bias=bias
        )
        # Only holds the checkpoint's [conv_dim, 1, W] weight and bias; the kernel runs it.
        self.conv1d = nn.Conv1d(
            self.conv_dim,
            self.conv_dim,
            config.mamba_d_conv,
            groups=self.conv_dim,
            bias=config.mamba_conv_bias,
        )
        self.dt_bias = nn.Parameter(torch.ones(self.n_heads))
        self.A_log = nn.Parameter(torch.empty(self.n_heads))
        self.D = nn.Parameter(torch.ones(self.n_heads))
        self.norm = GatedRMSNorm(self.d_inner, self.d_inner // self.n_groups, config.rms_norm_eps)
        self.out_proj = nn.Linear(self.d_inner, config.hidden_size, bias=bias)

    def forward(self, h: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """``h [T, hidden]`` -> ``[T, hidden]``; reads and writes the layer's state slots."""
        inputs = batch.mamba[self.layer_name]
        cache, ops = inputs.cache, batch.ops
        slots = (inputs.query_start_loc, inputs.initial_state_indices, inputs.save_state_indices)
        t = h.shape[0]
        z, xbc, dt = self.in_proj(h).split([self.d_inner, self.conv_dim, self.n_heads], dim=-1)
        weight = self.conv1d.weight[:, 0]  # [conv_dim, W]
        xbc = ops.causal_conv1d(xbc, weight, self.conv1d.bias, "silu", cache.conv, *slots)
        gn = self.n_groups * self.d_state
        x, B, C = xbc.split([self.d_inner, gn, gn], dim=-1)
        A = -torch.exp(self.A_log.float())  # [H]
        y = ops.ssd_scan(
            x.reshape(t, self.n_heads, self.head_dim),
            dt.contiguous(),
            A,
            B.reshape(t, self.n_groups, self.d_state),
            C.reshape(t, self.n_groups, self.d_state),
            self.D.float(),
            None,
            self.dt_bias.float(),
            True,
            cache.ssm,
            *slots,
        )
        return self.out_proj(self.norm(y.reshape(t, self.d_inner), z))
