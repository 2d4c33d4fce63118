"""``ssd_state_update``: one Mamba2 (multi-head SSD) decode step.

For request ``b`` with slot ``s = state_indices[b]``, head ``h`` of group
``g = h // (n_heads // n_groups)``::

    dt  = softplus(dt[b, h] + dt_bias[h]) (or without softplus)   # scalar per head
    st  = state[s, h] * exp(dt * A[h]) + dt * x[b, h][:, None] * B[b, g][None, :]
    out[b, h] = st @ C[b, g] + D[h] * x[b, h];  out *= silu(z[b, h]) if z is given
    state[s, h] <- st                                             # [head_dim, d_state]

``s < 0`` marks a padding row: ``out[b] = 0`` and no state is touched.
``backend="mamba_ssm"`` runs mamba-ssm's ``selective_state_update`` through
its tied-head format (dt, A, D, dt_bias broadcast over head_dim with stride 0).
"""

from __future__ import annotations

import torch

from hybridkv.kernels.backend import Implementations, pinned
from hybridkv.kernels.mamba._common import (
    check_float,
    check_groups,
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
    check_float("x", a.x, (None, None, None), dev)
    batch, n_heads, head_dim = a.x.shape
    n_groups, d_state = check_groups(a.B, batch, n_heads, dev)
    check_state("state", a.state, (n_heads, head_dim, d_state), dev)
    check_float("dt", a.dt, (batch, n_heads), dev)
    check_float("A", a.A, (n_heads,), dev)
    check_float("C", a.C, (batch, n_groups, d_state), dev)
    check_ssm_optionals(a, (n_heads,), (batch, n_heads, head_dim))
    check_indices("state_indices", a.state_indices, batch, dev)


def _reference(a: SSMStepArgs) -> torch.Tensor:
    x, state = a.x, a.state
    out = torch.zeros(x.shape, dtype=x.dtype, device=x.device)
    idx = a.state_indices.long()
    valid = idx >= 0
    if not bool(valid.any()):
        return out
    slots = idx[valid]
    rep = x.shape[1] // a.B.shape[1]
    xv = x[valid].float()  # [n, H, P]
    dtv = effective_dt(a.dt[valid], a.dt_bias, a.dt_softplus)  # [n, H]
    Bh = a.B[valid].float().repeat_interleave(rep, dim=1)  # [n, H, N]
    Ch = a.C[valid].float().repeat_interleave(rep, dim=1)
    dA = torch.exp(dtv * a.A.float())  # [n, H]
    st = state[slots].float()  # [n, H, P, N]
    st = st * dA[:, :, None, None] + (dtv[:, :, None] * xv)[..., None] * Bh[:, :, None, :]
    state[slots] = st.to(state.dtype)
    y = torch.einsum("nhpk,nhk->nhp", st, Ch)
    y = skip_and_gate(y, xv, a.D, None if a.z is None else a.z[valid])
    out[valid] = y.to(x.dtype)
    return out


def _mamba_ssm(a: SSMStepArgs) -> torch.Tensor:
    batch, n_heads, head_dim = a.x.shape
    d_state = a.B.shape[2]
    # Tied-head format: per-head scalars broadcast over head_dim (and d_state for A)
    # with stride 0.
    zeros = a.A.new_zeros(n_heads)
    D = a.D if a.D is not None else zeros
    dt_bias = a.dt_bias if a.dt_bias is not None else zeros
    return mamba_ssm_step(
        a,
        a.dt[:, :, None].expand(batch, n_heads, head_dim),
        a.A[:, None, None].expand(n_heads, head_dim, d_state),
        D[:, None].expand(n_heads, head_dim),
        dt_bias[:, None].expand(n_heads, head_dim),
    )


#: The op's implementation per backend (Triton's module loaded at first use).
_IMPLS = Implementations(
    triton="hybridkv.kernels.mamba.ssd_update_triton:launch", torch=_reference, mamba_ssm=_mamba_ssm
)


def ssd_state_update(
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
    """One Mamba2 decode step; updates ``state`` in place.

    Args::

        state:         [num_slots, n_heads, head_dim, d_state] view (fp16/bf16/fp32)
        x:             [B, n_heads, head_dim]   fp16/bf16/fp32
        dt:            [B, n_heads]
        A:             [n_heads]                (one scalar per head)
        B, C:          [B, n_groups, d_state]   (n_groups divides n_heads)
        D, dt_bias:    [n_heads] or None
        z:             [B, n_heads, head_dim] or None (gate: out *= silu(z))
        dt_softplus:   apply softplus to dt + dt_bias
        state_indices: [B] int32/int64, slot per request (< 0: padding row)
        backend:       None, "triton", "torch" or "mamba_ssm" (CUDA only)

    Returns ``out [B, n_heads, head_dim]`` in ``x.dtype``.
    """
    a = SSMStepArgs(x, dt, A, B, C, D, z, dt_bias, dt_softplus, state, state_indices)
    _check(a)
    return _IMPLS[pick_backend(backend, x.device, _IMPLS.names)](a)


ssd_state_update_ref = pinned(ssd_state_update, "torch")
ssd_state_update_triton = pinned(ssd_state_update, "triton")
