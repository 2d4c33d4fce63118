"""Triton kernels and launcher of ``causal_conv1d_fn`` (``conv_prefill.py``).

Imported only when the Triton backend runs the op (``triton`` is optional).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hybridkv.kernels.mamba._triton_math import conv_kernel_flags, load_state, silu
from hybridkv.kernels.mamba.args import ConvPrefillArgs

_BLOCK_D = 128  # channels per program (the ring buffer is [W - 1, BLOCK_D] registers)


@triton.jit
def _conv_prefill_kernel(  # type: ignore[no-untyped-def]
    x_ptr, w_ptr, bias_ptr, state_ptr, qsl_ptr, init_ptr, save_ptr, out_ptr,
    dim,
    stride_x_t, stride_w_c, stride_w_k, stride_s_slot, stride_s_row, stride_out_t,
    W: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_D: tl.constexpr,
    HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
):  # fmt: skip
    # One program per (sequence, block of channels). The ring buffer row r holds
    # the input at the latest position p with p = r (mod W - 1); history
    # positions are -(W - 1) .. -1, so the initial state's row r lands in row r.
    s = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    cmask = cols < dim
    rows = tl.arange(0, BLOCK_W)
    m2 = (rows[:, None] < W - 1) & cmask[None, :]
    start = tl.load(qsl_ptr + s).to(tl.int64)
    end = tl.load(qsl_ptr + s + 1).to(tl.int64)
    init = tl.load(init_ptr + s).to(tl.int64)
    offs = rows[:, None] * stride_s_row + cols[None, :]
    ring = load_state(state_ptr, init, stride_s_slot, offs, rows, W - 1, cmask)
    # All of the initial state is read before any save may overwrite it.
    tl.debug_barrier()
    w_last = tl.load(w_ptr + cols * stride_w_c + (W - 1) * stride_w_k, mask=cmask, other=0.0)
    w_last = w_last.to(tl.float32)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    sdt = state_ptr.dtype.element_ty
    for t in range(start, end):
        lm = (t - start) % (W - 1)
        # Row r holds position p = l - (W - 1) + k with k = (r - l) mod (W - 1).
        k = (rows - lm + (W - 1)) % (W - 1)
        w_ptrs = w_ptr + cols[None, :] * stride_w_c + k[:, None] * stride_w_k
        w_ring = tl.load(w_ptrs, mask=m2, other=0.0)
        x = tl.load(x_ptr + t * stride_x_t + cols, mask=cmask, other=0.0).to(tl.float32)
        acc = tl.sum(ring * w_ring.to(tl.float32), axis=0) + x * w_last
        if HAS_BIAS:
            acc += bias
        if SILU:
            acc = silu(acc)
        tl.store(out_ptr + t * stride_out_t + cols, acc.to(out_ptr.dtype.element_ty), mask=cmask)
        ring = tl.where(rows[:, None] == lm, x[None, :], ring)
        # State after token l: positions l - W + 2 .. l; row r goes to state row
        # j = (r - l - 1) mod (W - 1).
        save = tl.load(save_ptr + t).to(tl.int64)
        j = (rows - (lm + 1) % (W - 1) + (W - 1)) % (W - 1)
        s_ptrs = state_ptr + tl.maximum(save, 0) * stride_s_slot + j[:, None] * stride_s_row
        tl.store(
            s_ptrs + cols[None, :],
            ring.to(sdt),
            mask=m2 & (cols[None, :] < tl.where(save >= 0, dim, 0)),
        )


def launch(a: ConvPrefillArgs) -> torch.Tensor:
    x, weight, conv_state = a.x, a.weight, a.conv_state
    num_tokens, dim = x.shape
    out = torch.empty((num_tokens, dim), dtype=x.dtype, device=x.device)
    num_seqs = a.query_start_loc.shape[0] - 1
    if num_tokens == 0:
        return out
    block_d = min(_BLOCK_D, triton.next_power_of_2(dim))
    grid = (num_seqs, triton.cdiv(dim, block_d))
    _conv_prefill_kernel[grid](
        x, weight, a.bias if a.bias is not None else weight, conv_state,
        a.query_start_loc, a.initial_state_indices, a.save_state_indices, out,
        dim,
        x.stride(0), weight.stride(0), weight.stride(1),
        conv_state.stride(0), conv_state.stride(1), out.stride(0),
        **conv_kernel_flags(a, block_d),
    )  # fmt: skip
    return out
