"""Triton kernels and launcher of ``ssd_scan_fn`` (``ssd_scan.py``).

Imported only when the Triton backend runs the op (``triton`` is optional).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hybridkv.kernels.mamba._triton_math import load_state, save_state, silu, softplus
from hybridkv.kernels.mamba.args import ScanArgs


@triton.jit
def _ssd_scan_kernel(  # type: ignore[no-untyped-def]
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, dt_bias_ptr,
    state_ptr, qsl_ptr, init_ptr, save_ptr, out_ptr,
    head_dim, d_state, heads_per_group,
    stride_x_t, stride_x_h, stride_dt_t, stride_B_t, stride_B_g, stride_C_t, stride_C_g,
    stride_z_t, stride_z_h, stride_s_slot, stride_s_h, stride_s_p, stride_out_t, stride_out_h,
    DT_SOFTPLUS: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr,
    HAS_DT_BIAS: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    # One program per (sequence, head, block of head_dim), walking its tokens in order.
    s = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    p = tl.program_id(2) * BLOCK_P + tl.arange(0, BLOCK_P)
    n = tl.arange(0, BLOCK_N)
    pmask = p < head_dim
    nmask = n < d_state
    g = h // heads_per_group
    start = tl.load(qsl_ptr + s).to(tl.int64)
    end = tl.load(qsl_ptr + s + 1).to(tl.int64)
    init = tl.load(init_ptr + s).to(tl.int64)
    offs = h * stride_s_h + p[:, None] * stride_s_p + n[None, :]
    st = load_state(state_ptr, init, stride_s_slot, offs, p, head_dim, nmask)
    # All of the initial state is read before any save may overwrite it.
    tl.debug_barrier()
    A = tl.load(A_ptr + h).to(tl.float32)
    if HAS_D:
        D = tl.load(D_ptr + h).to(tl.float32)
    if HAS_DT_BIAS:
        dt_bias = tl.load(dt_bias_ptr + h).to(tl.float32)
    for t in range(start, end):
        x = tl.load(x_ptr + t * stride_x_t + h * stride_x_h + p, mask=pmask, other=0.0)
        x = x.to(tl.float32)
        dt = tl.load(dt_ptr + t * stride_dt_t + h).to(tl.float32)
        if HAS_DT_BIAS:
            dt += dt_bias
        if DT_SOFTPLUS:
            dt = softplus(dt)
        B = tl.load(B_ptr + t * stride_B_t + g * stride_B_g + n, mask=nmask, other=0.0)
        C = tl.load(C_ptr + t * stride_C_t + g * stride_C_g + n, mask=nmask, other=0.0)
        st = st * tl.exp(dt * A) + (dt * x)[:, None] * B.to(tl.float32)[None, :]
        y = tl.sum(st * C.to(tl.float32)[None, :], axis=1)
        if HAS_D:
            y += D * x
        if HAS_Z:
            z = tl.load(z_ptr + t * stride_z_t + h * stride_z_h + p, mask=pmask, other=0.0)
            y *= silu(z.to(tl.float32))
        o_ptrs = out_ptr + t * stride_out_t + h * stride_out_h + p
        tl.store(o_ptrs, y.to(out_ptr.dtype.element_ty), mask=pmask)
        save = tl.load(save_ptr + t).to(tl.int64)
        save_state(state_ptr, save, stride_s_slot, offs, st, p, head_dim, nmask)


def launch(a: ScanArgs) -> torch.Tensor:
    x, dt, A, B, C, z, ssm_state = a.x, a.dt, a.A, a.B, a.C, a.z, a.ssm_state
    num_tokens, n_heads, head_dim = x.shape
    n_groups, d_state = B.shape[1], B.shape[2]
    out = torch.empty((num_tokens, n_heads, head_dim), dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return out
    block_n = triton.next_power_of_2(d_state)
    block_p = min(
        triton.next_power_of_2(head_dim), max(4, 4096 // block_n)
    )  # ~4k fp32 state registers
    grid = (a.query_start_loc.shape[0] - 1, n_heads, triton.cdiv(head_dim, block_p))
    zs = (z.stride(0), z.stride(1)) if z is not None else (0, 0)
    _ssd_scan_kernel[grid](
        x, dt, A, B, C, *a.optional_ptrs(A),
        ssm_state, a.query_start_loc, a.initial_state_indices, a.save_state_indices, out,
        head_dim, d_state, n_heads // n_groups,
        x.stride(0), x.stride(1), dt.stride(0), B.stride(0), B.stride(1), C.stride(0), C.stride(1),
        zs[0], zs[1], ssm_state.stride(0), ssm_state.stride(1), ssm_state.stride(2),
        out.stride(0), out.stride(1),
        **a.kernel_flags(), BLOCK_P=block_p, BLOCK_N=block_n,
    )  # fmt: skip
    return out
