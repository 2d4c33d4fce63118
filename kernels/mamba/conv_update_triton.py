"""Triton kernels and launcher of ``causal_conv1d_update`` (``conv_update.py``).

Imported only when the Triton backend runs the op (``triton`` is optional).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hybridkv.kernels.mamba._triton_math import conv_kernel_flags, silu
from hybridkv.kernels.mamba.args import ConvStepArgs

# Channels per program: wide enough to coalesce, small enough to keep the
# [W - 1, BLOCK_D] window in registers.
_BLOCK_D = 128


@triton.jit
def _conv_update_kernel(  # type: ignore[no-untyped-def]
    x_ptr, w_ptr, bias_ptr, state_ptr, idx_ptr, out_ptr,
    dim,
    stride_x_b, stride_w_c, stride_w_k, stride_s_slot, stride_s_row, stride_out_b,
    W: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_D: tl.constexpr,
    HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
):  # fmt: skip
    # One program per (request, block of channels).
    b = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    cmask = cols < dim
    slot = tl.load(idx_ptr + b).to(tl.int64)
    valid = slot >= 0
    rows = tl.arange(0, BLOCK_W)
    rmask = rows < W - 1
    # (The interpreter rejects masks broadcast from a scalar bool: fold `valid` into limits.)
    m2 = (rows[:, None] < tl.where(valid, W - 1, 0)) & cmask[None, :]
    s_ptrs = state_ptr + tl.maximum(slot, 0) * stride_s_slot + rows[:, None] * stride_s_row
    s_ptrs += cols[None, :]
    past = tl.load(s_ptrs, mask=m2, other=0.0).to(tl.float32)  # [BLOCK_W, BLOCK_D]
    # Every thread has read the old window before anyone shifts it.
    tl.debug_barrier()
    w_past = tl.load(
        w_ptr + cols[None, :] * stride_w_c + rows[:, None] * stride_w_k,
        mask=rmask[:, None] & cmask[None, :],
        other=0.0,
    ).to(tl.float32)
    w_last = tl.load(w_ptr + cols * stride_w_c + (W - 1) * stride_w_k, mask=cmask, other=0.0)
    x = tl.load(x_ptr + b * stride_x_b + cols, mask=cmask, other=0.0).to(tl.float32)
    acc = tl.sum(past * w_past, axis=0) + x * w_last.to(tl.float32)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    if SILU:
        acc = silu(acc)
    acc = tl.where(valid, acc, 0.0)
    tl.store(out_ptr + b * stride_out_b + cols, acc.to(out_ptr.dtype.element_ty), mask=cmask)
    # Shift: old row r (r >= 1) becomes row r - 1; x becomes row W - 2.
    sdt = state_ptr.dtype.element_ty
    tl.store(s_ptrs - stride_s_row, past.to(sdt), mask=m2 & (rows[:, None] >= 1))
    last = state_ptr + tl.maximum(slot, 0) * stride_s_slot + (W - 2) * stride_s_row + cols
    tl.store(last, x.to(sdt), mask=cols < tl.where(valid, dim, 0))


def launch(a: ConvStepArgs) -> torch.Tensor:
    x, weight, conv_state = a.x, a.weight, a.conv_state
    batch, dim = x.shape
    out = torch.empty((batch, dim), dtype=x.dtype, device=x.device)
    if batch == 0:
        return out
    block_d = min(_BLOCK_D, triton.next_power_of_2(dim))
    grid = (batch, triton.cdiv(dim, block_d))
    _conv_update_kernel[grid](
        x, weight, a.bias if a.bias is not None else weight, conv_state, a.conv_state_indices, out,
        dim,
        x.stride(0), weight.stride(0), weight.stride(1),
        conv_state.stride(0), conv_state.stride(1), out.stride(0),
        **conv_kernel_flags(a, block_d),
    )  # fmt: skip
    return out
