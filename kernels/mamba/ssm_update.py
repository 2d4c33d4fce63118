"""``selective_state_update``: one Mamba1 decode step on per-request SSM states.

For request ``b`` with slot ``s = state_indices[b]`` (math as mamba-ssm's
``selective_state_update_ref``)::

    dt  = softplus(dt[b] + dt_bias) if dt_softplus else dt[b] + dt_bias   # [d_inner]
    h   = state[s] * exp(dt[:, None] * A) + (dt * x[b])[:, None] * B[b][None, :]
    out = h @ C[b] + D * x[b];  out *= silu(z[b]) if z is given
    state[s] <- h

``s < 0`` marks a padding row: ``out[b] = 0`` and no state is touched.
mamba-ssm's Triton kernel runs with ``backend="mamba_ssm"`` (CUDA only).
"""

from __future__ import annotations

import torch

from hybridkv.kernels.backend import Implementations, pinned
from hybridkv.kernels.mamba._common import (
    check_float,
    check_indices,
    check_ssm_optionals,
    check_state,
    effective_dt,
    mamba_ssm_step,
    pick_backend,
    skip_and_gate,
)
from hybridkv.kernels.mamba.args import SSMStepArgs


def _check(a: SSMStepArgs) -> None:
    dev = a.x.device
    check_float("x", a.x, (None, None), dev)
    batch, d_inner = a.x.shape
    check_float("A", a.A, (d_inner, None), dev)
    d_state = a.A.shape[1]
    check_state("state", a.state, (d_inner, d_state), dev)
    check_float("dt", a.dt, (batch, d_inner), dev)
    check_float("B", a.B, (batch, d_state), dev)
    check_float("C", a.C, (batch, d_state), dev)
    check_ssm_optionals(a, (d_inner,), (batch, d_inner))
    check_indices("state_indices", a.state_indices, batch, dev)


def _reference(a: SSMStepArgs) -> torch.Tensor:
    x, state = a.x, a.state
    out = torch.zeros(x.shape, dtype=x.dtype, device=x.device)
    idx = a.state_indices.long()
    valid = idx >= 0
    if not bool(valid.any()):
        return out
    slots = idx[valid]
    xv = x[valid].float()  # [n, d_inner]
    dtv = effective_dt(a.dt[valid], a.dt_bias, a.dt_softplus)
    h = state[slots].float()  # [n, d_inner, d_state]
    h = (
        h * torch.exp(dtv[:, :, None] * a.A.float())
        + (dtv * xv)[:, :, None] * a.B[valid].float()[:, None, :]
    )
    state[slots] = h.to(state.dtype)
    y = torch.einsum("nmk,nk->nm", h, a.C[valid].float())
    y = skip_and_gate(y, xv, a.D, None if a.z is None else a.z[valid])
    out[valid] = y.to(x.dtype)
    return out


def _mamba_ssm(a: SSMStepArgs) -> torch.Tensor:
    zeros = a.x.new_zeros(a.x.shape[1])
    D = a.D if a.D is not None else zeros
    dt_bias = a.dt_bias if a.dt_bias is not None else zeros
    return mamba_ssm_step(a, a.dt, a.A, D, dt_bias)


#: The op's implementation per backend (Triton's module loaded at first use).
_IMPLS = Implementations(
    triton="hybridkv.kernels.mamba.ssm_update_triton:launch", torch=_reference, mamba_ssm=_mamba_ssm
)


def selective_state_update(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
    *,
    state_indices: torch.Tensor,
    backend: str | None = None,
) -> torch.Tensor:
    """One Mamba1 decode step; updates ``state`` in place.

    Args::

        state:         [num_slots, d_inner, d_state] view (fp16/bf16/fp32)
        x, dt:         [B, d_inner]   fp16/bf16/fp32
        A:             [d_inner, d_state]
        B, C:          [B, d_state]
        D, dt_bias:    [d_inner] or None
        z:             [B, d_inner] or None (gate: out *= silu(z))
        dt_softplus:   apply softplus to dt + dt_bias
        state_indices: [B] int32/int64, slot per request (< 0: padding row)
        backend:       None, "triton", "torch" or "mamba_ssm" (CUDA only)

    Returns ``out [B, d_inner]`` in ``x.dtype``.
    """
    a = SSMStepArgs(x, dt, A, B, C, D, z, dt_bias, dt_softplus, state, state_indices)
    _check(a)
    return _IMPLS[pick_backend(backend, x.device, _IMPLS.names)](a)


selective_state_update_ref = pinned(selective_state_update, "torch")
selective_state_update_triton = pinned(selective_state_update, "triton")
