"""Triton kernels and launcher of ``selective_scan_fn`` (``ssm_scan.py``).

Imported only when the Triton backend runs the op (``triton`` is optional).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hybridkv.kernels.mamba._triton_math import load_state, save_state, silu, softplus
from hybridkv.kernels.mamba.args import ScanArgs


@triton.jit
def _ssm_scan_kernel(  # type: ignore[no-untyped-def]
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, dt_bias_ptr,
    state_ptr, qsl_ptr, init_ptr, save_ptr, out_ptr,
    d_inner, d_state,
    stride_x_t, stride_dt_t, stride_A_m, stride_B_t, stride_C_t, stride_z_t,
    stride_s_slot, stride_s_m, stride_out_t,
    DT_SOFTPLUS: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr,
    HAS_DT_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    # One program per (sequence, block of channels), walking its tokens in order.
    s = tl.program_id(0).to(tl.int64)
    m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tl.arange(0, BLOCK_N)
    mmask = m < d_inner
    nmask = n < d_state
    m2 = mmask[:, None] & nmask[None, :]
    start = tl.load(qsl_ptr + s).to(tl.int64)
    end = tl.load(qsl_ptr + s + 1).to(tl.int64)
    init = tl.load(init_ptr + s).to(tl.int64)
    offs = m[:, None] * stride_s_m + n[None, :]
    h = load_state(state_ptr, init, stride_s_slot, offs, m, d_inner, nmask)
    # All of the initial state is read before any save may overwrite it.
    tl.debug_barrier()
    A = tl.load(A_ptr + m[:, None] * stride_A_m + n[None, :], mask=m2, other=0.0).to(tl.float32)
    if HAS_D:
        D = tl.load(D_ptr + m, mask=mmask, other=0.0).to(tl.float32)
    if HAS_DT_BIAS:
        dt_bias = tl.load(dt_bias_ptr + m, mask=mmask, other=0.0).to(tl.float32)
    for t in range(start, end):
        x = tl.load(x_ptr + t * stride_x_t + m, mask=mmask, other=0.0).to(tl.float32)
        dt = tl.load(dt_ptr + t * stride_dt_t + m, mask=mmask, other=0.0).to(tl.float32)
        if HAS_DT_BIAS:
            dt += dt_bias
        if DT_SOFTPLUS:
            dt = softplus(dt)
        B = tl.load(B_ptr + t * stride_B_t + n, mask=nmask, other=0.0).to(tl.float32)
        C = tl.load(C_ptr + t * stride_C_t + n, mask=nmask, other=0.0).to(tl.float32)
        h = h * tl.exp(dt[:, None] * A) + (dt * x)[:, None] * B[None, :]
        y = tl.sum(h * C[None, :], axis=1)
        if HAS_D:
            y += D * x
        if HAS_Z:
            y *= silu(tl.load(z_ptr + t * stride_z_t + m, mask=mmask, other=0.0).to(tl.float32))
        tl.store(out_ptr + t * stride_out_t + m, y.to(out_ptr.dtype.element_ty), mask=mmask)
        save = tl.load(save_ptr + t).to(tl.int64)
        save_state(state_ptr, save, stride_s_slot, offs, h, m, d_inner, nmask)


def launch(a: ScanArgs) -> torch.Tensor:
    x, dt, A, B, C, z, ssm_state = a.x, a.dt, a.A, a.B, a.C, a.z, a.ssm_state
    num_tokens, d_inner = x.shape
    d_state = A.shape[1]
    out = torch.empty((num_tokens, d_inner), dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return out
    block_n = triton.next_power_of_2(d_state)
    block_m = min(
        triton.next_power_of_2(d_inner), max(4, 2048 // block_n)
    )  # ~2k fp32 state registers
    grid = (a.query_start_loc.shape[0] - 1, triton.cdiv(d_inner, block_m))
    _ssm_scan_kernel[grid](
        x, dt, A, B, C, *a.optional_ptrs(x),
        ssm_state, a.query_start_loc, a.initial_state_indices, a.save_state_indices, out,
        d_inner, d_state,
        x.stride(0), dt.stride(0), A.stride(0), B.stride(0), C.stride(0),
        z.stride(0) if z is not None else 0,
        ssm_state.stride(0), ssm_state.stride(1), out.stride(0),
        **a.kernel_flags(), BLOCK_M=block_m, BLOCK_N=block_n,
    )  # fmt: skip
    return out
