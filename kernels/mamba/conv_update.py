"""``causal_conv1d_update``: one decode step of Mamba's depthwise causal conv.

For request ``b`` with slot ``s = conv_state_indices[b]`` (``W = weight.shape[1]``)::

    window = [conv_state[s, 0], ..., conv_state[s, W - 2], x[b]]   # W inputs, oldest first
    out[b, c] = act(sum_k window[k, c] * weight[c, k] + bias[c])
    conv_state[s] <- window[1:]                                    # the last W - 1 inputs

``s < 0`` marks a padding row: ``out[b] = 0`` and no state is touched.
"""

from __future__ import annotations

import torch

from hybridkv.kernels.backend import Implementations, pinned
from hybridkv.kernels.mamba._common import (
    check_conv,
    check_indices,
    pick_backend,
)
from hybridkv.kernels.mamba.args import ConvStepArgs


def _check(a: ConvStepArgs) -> None:
    batch = check_conv(a)
    check_indices("conv_state_indices", a.conv_state_indices, batch, a.x.device)


def _reference(a: ConvStepArgs) -> torch.Tensor:
    x, conv_state = a.x, a.conv_state
    out = torch.zeros(x.shape, dtype=x.dtype, device=x.device)
    idx = a.conv_state_indices.long()
    valid = idx >= 0
    if not bool(valid.any()):
        return out
    slots = idx[valid]
    window = torch.cat([conv_state[slots].float(), x[valid].float()[:, None]], dim=1)  # [n, W, dim]
    y = torch.einsum("nkc,ck->nc", window, a.weight.float())
    if a.bias is not None:
        y = y + a.bias.float()
    if a.activation == "silu":
        y = torch.nn.functional.silu(y)
    out[valid] = y.to(x.dtype)
    conv_state[slots] = window[:, 1:].to(conv_state.dtype)
    return out


#: The op's implementation per backend (Triton's module loaded at first use).
_IMPLS = Implementations(
    triton="hybridkv.kernels.mamba.conv_update_triton:launch", torch=_reference
)


def causal_conv1d_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    *,
    conv_state_indices: torch.Tensor,
    backend: str | None = None,
) -> torch.Tensor:
    """One decode step of the depthwise causal conv; updates ``conv_state`` in place.

    Args (``W`` = conv width, ``dim`` = conv channels)::

        x:                  [B, dim]              fp16/bf16/fp32, new input per request
        conv_state:         [num_slots, W-1, dim] view, the last W-1 inputs, oldest first
        weight:             [dim, W]
        bias:               [dim] or None
        activation:         None or "silu"
        conv_state_indices: [B] int32/int64, slot per request (< 0: padding row)

    Returns ``out [B, dim]`` in ``x.dtype``. Raises ``ValueError`` on bad
    arguments and ``KernelBackendError`` if ``backend`` cannot run here.
    """
    a = ConvStepArgs(x, conv_state, weight, bias, activation, conv_state_indices)
    _check(a)
    return _IMPLS[pick_backend(backend, x.device, _IMPLS.names)](a)


causal_conv1d_update_ref = pinned(causal_conv1d_update, "torch")
causal_conv1d_update_triton = pinned(causal_conv1d_update, "triton")
