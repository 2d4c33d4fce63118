"""``causal_conv1d_fn``: Mamba's depthwise causal conv over a varlen prefill chunk.

Sequence ``s`` owns tokens ``[query_start_loc[s], query_start_loc[s+1])`` of
``x``. Its history is ``conv_state[initial_state_indices[s]]`` (the ``W - 1``
inputs before the chunk, oldest first; zeros when the index is ``< 0``)
followed by its tokens; with ``W = weight.shape[1]``::

    ext = [history (W - 1 rows), x[tokens of s]]
    out[t] = act(sum_k ext[l + k] * weight[:, k] + bias)          # l: t's position in s
    save_state_indices[t] = slot >= 0  ->  conv_state[slot] <- ext[l + 1 : l + W]

A save is the state *after* token ``t`` (a block-boundary checkpoint, or the
final state at a sequence's last token). All initial states are read before
any save is written, so a save may target the sequence's own initial slot.

The Triton kernel walks the tokens of a sequence in order (grid: sequence x
channel block) keeping the last ``W - 1`` inputs in registers as a ring
buffer; every token's conv is independent, so a token-parallel GPU kernel is
future work.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hybridkv.kernels.backend import pinned
from hybridkv.kernels.mamba._common import (
    check_conv,
    check_varlen,
    conv_kernel_flags,
    pick_backend,
    varlen,
)
from hybridkv.kernels.mamba._triton_math import silu
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
    i_ptrs = state_ptr + tl.maximum(init, 0) * stride_s_slot + rows[:, None] * stride_s_row
    ring = tl.load(
        i_ptrs + cols[None, :],
        mask=(rows[:, None] < tl.where(init >= 0, W - 1, 0)) & cmask[None, :],
        other=0.0,
    ).to(tl.float32)
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


def _check(a: ConvPrefillArgs) -> None:
    num_tokens = check_conv(a)
    check_varlen(
        a.query_start_loc, a.initial_state_indices, a.save_state_indices, num_tokens, a.x.device
    )


def _launch(a: ConvPrefillArgs) -> torch.Tensor:
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


def _reference(a: ConvPrefillArgs) -> torch.Tensor:
    x, conv_state = a.x, a.conv_state
    num_tokens, dim = x.shape
    wm1 = a.weight.shape[1] - 1
    v = varlen(a.query_start_loc, a.save_state_indices, num_tokens)
    dev = x.device
    # ext: every sequence's W - 1 history rows, then its tokens, back to back.
    tok_pos = torch.arange(num_tokens, device=dev) + (v.seq + 1) * wm1  # [T]
    ext = torch.zeros((num_tokens + v.num_seqs * wm1, dim), dtype=torch.float32, device=dev)
    ext[tok_pos] = x.float()
    init = a.initial_state_indices.long()
    has = torch.nonzero(init >= 0).flatten()
    if has.numel():
        first = a.query_start_loc.long()[has] + has * wm1  # [n] first history row
        rows = first[:, None] + torch.arange(wm1, device=dev)  # [n, W-1]
        ext[rows] = conv_state[init[has]].float()  # read before any save below
    taps = tok_pos[:, None] - wm1 + torch.arange(wm1 + 1, device=dev)  # [T, W]
    y = torch.einsum("tkc,ck->tc", ext[taps], a.weight.float())
    if a.bias is not None:
        y = y + a.bias.float()
    if a.activation == "silu":
        y = torch.nn.functional.silu(y)
    if v.save_tokens.numel():
        rows = tok_pos[v.save_tokens][:, None] - wm1 + 1 + torch.arange(wm1, device=dev)
        conv_state[v.save_slots] = ext[rows].to(conv_state.dtype)
    return y.to(x.dtype).contiguous()  # einsum may hand back a transposed layout


def causal_conv1d_fn(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None,
    conv_state: torch.Tensor,
    query_start_loc: torch.Tensor,
    initial_state_indices: torch.Tensor,
    save_state_indices: torch.Tensor,
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """Causal conv over a varlen chunk, from cached states, saving checkpoints.

    Args (``W`` = conv width, ``S`` sequences, ``T`` tokens)::

        x:                     [T, dim]              fp16/bf16/fp32, sequences back to back
        weight:                [dim, W]
        bias:                  [dim] or None
        activation:            None or "silu"
        conv_state:            [num_slots, W-1, dim] view (inputs, oldest first)
        query_start_loc:       [S+1] int32/int64, 0 = q[0] <= ... <= q[S] = T
        initial_state_indices: [S] slot to start from (< 0: zeros)
        save_state_indices:    [T] slot to receive the state after token t (< 0: none)

    Returns ``out [T, dim]`` in ``x.dtype``; writes the saves into ``conv_state``.
    """
    a = ConvPrefillArgs(
        x, conv_state, weight, bias, activation,
        query_start_loc, initial_state_indices, save_state_indices,
    )  # fmt: skip
    _check(a)
    if pick_backend(backend, x.device) == "triton":
        return _launch(a)
    return _reference(a)


causal_conv1d_fn_ref = pinned(causal_conv1d_fn, "torch")
causal_conv1d_fn_triton = pinned(causal_conv1d_fn, "triton")
