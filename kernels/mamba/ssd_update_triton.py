"""Triton kernels and launcher of ``ssd_state_update`` (``ssd_update.py``).

Imported only when the Triton backend runs the op (``triton`` is optional).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

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


def launch(a: SSMStepArgs) -> torch.Tensor:
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
