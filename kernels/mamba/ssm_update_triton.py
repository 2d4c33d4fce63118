"""Triton kernels and launcher of ``selective_state_update`` (``ssm_update.py``).

Imported only when the Triton backend runs the op (``triton`` is optional).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

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


def launch(a: SSMStepArgs) -> torch.Tensor:
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
