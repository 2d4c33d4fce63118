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
import triton
import triton.language as tl

from hybridkv.kernels.backend import pinned
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
from hybridkv.kernels.mamba._triton_math import silu, softplus
from hybridkv.kernels.mamba.args import SSMStepArgs


@triton.jit
def _ssm_update_kernel(  # type: ignore[no-untyped-def]
    state_ptr, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, dt_bias_ptr, idx_ptr, out_ptr,
    d_inner, d_state,
    stride_s_slot, stride_s_m, stride_x_b, stride_dt_b, stride_A_m,
    stride_B_b, stride_C_b, stride_z_b, stride_out_b,
    DT_SOFTPLUS: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr,
    HAS_DT_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    # One program per (request, block of channels); the whole d_state in registers.
    b = tl.program_id(0).to(tl.int64)
    m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tl.arange(0, BLOCK_N)
    mmask = m < d_inner
    m2 = mmask[:, None] & (n[None, :] < d_state)
    slot = tl.load(idx_ptr + b).to(tl.int64)
    valid = slot >= 0
    m2v = (m[:, None] < tl.where(valid, d_inner, 0)) & (n[None, :] < d_state)
    s_ptrs = state_ptr + tl.maximum(slot, 0) * stride_s_slot + m[:, None] * stride_s_m + n[None, :]
    h = tl.load(s_ptrs, mask=m2v, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + b * stride_x_b + m, mask=mmask, other=0.0).to(tl.float32)
    dt = tl.load(dt_ptr + b * stride_dt_b + m, mask=mmask, other=0.0).to(tl.float32)
    if HAS_DT_BIAS:
        dt += tl.load(dt_bias_ptr + m, mask=mmask, other=0.0).to(tl.float32)
    if DT_SOFTPLUS:
        dt = softplus(dt)
    A = tl.load(A_ptr + m[:, None] * stride_A_m + n[None, :], mask=m2, other=0.0).to(tl.float32)
    B = tl.load(B_ptr + b * stride_B_b + n, mask=n < d_state, other=0.0).to(tl.float32)
    C = tl.load(C_ptr + b * stride_C_b + n, mask=n < d_state, other=0.0).to(tl.float32)
    h = h * tl.exp(dt[:, None] * A) + (dt * x)[:, None] * B[None, :]
    tl.store(s_ptrs, h.to(state_ptr.dtype.element_ty), mask=m2v)
    y = tl.sum(h * C[None, :], axis=1)
    if HAS_D:
        y += x * tl.load(D_ptr + m, mask=mmask, other=0.0).to(tl.float32)
    if HAS_Z:
        y *= silu(tl.load(z_ptr + b * stride_z_b + m, mask=mmask, other=0.0).to(tl.float32))
    y = tl.where(valid, y, 0.0)
    tl.store(out_ptr + b * stride_out_b + m, y.to(out_ptr.dtype.element_ty), mask=mmask)


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


def _launch(a: SSMStepArgs) -> torch.Tensor:
    x, state, z = a.x, a.state, a.z
    batch, d_inner = x.shape
    d_state = a.A.shape[1]
    out = torch.empty((batch, d_inner), dtype=x.dtype, device=x.device)
    if batch == 0:
        return out
    block_n = triton.next_power_of_2(d_state)
    # Keep the [BLOCK_M, BLOCK_N] state tile near 2k fp32 registers per program.
    block_m = min(triton.next_power_of_2(d_inner), max(4, 2048 // block_n))
    grid = (batch, triton.cdiv(d_inner, block_m))
    _ssm_update_kernel[grid](
        state, x, a.dt, a.A, a.B, a.C, *a.optional_ptrs(x), a.state_indices, out,
        d_inner, d_state,
        state.stride(0), state.stride(1), x.stride(0), a.dt.stride(0), a.A.stride(0),
        a.B.stride(0), a.C.stride(0), z.stride(0) if z is not None else 0, out.stride(0),
        **a.kernel_flags(), BLOCK_M=block_m, BLOCK_N=block_n,
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
    name = pick_backend(backend, x.device, mamba_ssm=True)
    if name == "triton":
        return _launch(a)
    if name == "mamba_ssm":
        return _mamba_ssm(a)
    return _reference(a)


selective_state_update_ref = pinned(selective_state_update, "torch")
selective_state_update_triton = pinned(selective_state_update, "triton")
