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
import triton
import triton.language as tl

from hybridkv.kernels.backend import pinned
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
from hybridkv.kernels.mamba._triton_math import silu, softplus
from hybridkv.kernels.mamba.args import SSMStepArgs


@triton.jit
def _ssd_update_kernel(  # type: ignore[no-untyped-def]
    state_ptr, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, dt_bias_ptr, idx_ptr, out_ptr,
    head_dim, d_state, heads_per_group,
    stride_s_slot, stride_s_h, stride_s_p,
    stride_x_b, stride_x_h, stride_dt_b, stride_B_b, stride_B_g, stride_C_b, stride_C_g,
    stride_z_b, stride_z_h, stride_out_b, stride_out_h,
    DT_SOFTPLUS: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr,
    HAS_DT_BIAS: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    # One program per (request, head, block of head_dim).
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    p = tl.program_id(2) * BLOCK_P + tl.arange(0, BLOCK_P)
    n = tl.arange(0, BLOCK_N)
    pmask = p < head_dim
    nmask = n < d_state
    g = h // heads_per_group
    slot = tl.load(idx_ptr + b).to(tl.int64)
    valid = slot >= 0
    m2v = (p[:, None] < tl.where(valid, head_dim, 0)) & nmask[None, :]
    s_ptrs = state_ptr + tl.maximum(slot, 0) * stride_s_slot + h * stride_s_h
    s_ptrs += p[:, None] * stride_s_p + n[None, :]
    st = tl.load(s_ptrs, mask=m2v, other=0.0).to(tl.float32)
    dt = tl.load(dt_ptr + b * stride_dt_b + h).to(tl.float32)
    if HAS_DT_BIAS:
        dt += tl.load(dt_bias_ptr + h).to(tl.float32)
    if DT_SOFTPLUS:
        dt = softplus(dt)
    dA = tl.exp(dt * tl.load(A_ptr + h).to(tl.float32))
    x = tl.load(x_ptr + b * stride_x_b + h * stride_x_h + p, mask=pmask, other=0.0)
    x = x.to(tl.float32)
    B = tl.load(B_ptr + b * stride_B_b + g * stride_B_g + n, mask=nmask, other=0.0)
    C = tl.load(C_ptr + b * stride_C_b + g * stride_C_g + n, mask=nmask, other=0.0)
    st = st * dA + (dt * x)[:, None] * B.to(tl.float32)[None, :]
    tl.store(s_ptrs, st.to(state_ptr.dtype.element_ty), mask=m2v)
    y = tl.sum(st * C.to(tl.float32)[None, :], axis=1)
    if HAS_D:
        y += x * tl.load(D_ptr + h).to(tl.float32)
    if HAS_Z:
        z = tl.load(z_ptr + b * stride_z_b + h * stride_z_h + p, mask=pmask, other=0.0)
        y *= silu(z.to(tl.float32))
    y = tl.where(valid, y, 0.0)
    o_ptrs = out_ptr + b * stride_out_b + h * stride_out_h + p
    tl.store(o_ptrs, y.to(out_ptr.dtype.element_ty), mask=pmask)


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


def _launch(a: SSMStepArgs) -> torch.Tensor:
    x, dt, state, B, C, z = a.x, a.dt, a.state, a.B, a.C, a.z
    batch, n_heads, head_dim = x.shape
    n_groups, d_state = B.shape[1], B.shape[2]
    out = torch.empty((batch, n_heads, head_dim), dtype=x.dtype, device=x.device)
    if batch == 0:
        return out
    block_n = triton.next_power_of_2(d_state)
    # Keep the [BLOCK_P, BLOCK_N] state tile near 4k fp32 registers per program.
    block_p = min(triton.next_power_of_2(head_dim), max(4, 4096 // block_n))
    grid = (batch, n_heads, triton.cdiv(head_dim, block_p))
    zs = (z.stride(0), z.stride(1)) if z is not None else (0, 0)
    _ssd_update_kernel[grid](
        state, x, dt, a.A, B, C, *a.optional_ptrs(a.A), a.state_indices, out,
        head_dim, d_state, n_heads // n_groups,
        state.stride(0), state.stride(1), state.stride(2),
        x.stride(0), x.stride(1), dt.stride(0), B.stride(0), B.stride(1), C.stride(0), C.stride(1),
        zs[0], zs[1], out.stride(0), out.stride(1),
        **a.kernel_flags(), BLOCK_P=block_p, BLOCK_N=block_n,
    )  # fmt: skip
    return out


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
    name = pick_backend(backend, x.device, mamba_ssm=True)
    if name == "triton":
        return _launch(a)
    if name == "mamba_ssm":
        return _mamba_ssm(a)
    return _reference(a)


ssd_state_update_ref = pinned(ssd_state_update, "torch")
ssd_state_update_triton = pinned(ssd_state_update, "triton")
