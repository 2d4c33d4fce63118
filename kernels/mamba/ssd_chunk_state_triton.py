"""Phases 0-2 of ``ssd_chunk_scan_fn``'s Triton path: per-chunk dt, chunk states, state passing.

Imported only by ``ssd_chunk_scan_triton.py`` (``triton`` is optional). Layout of the
scratch buffers, all fp32 and contiguous, ``C`` = the chunk bound, ``H`` = heads::

    dts, cums   [C, H, Q]     effective dt (0 past the chunk's end) and cumulative dt * A
    dA_sum      [C, H]        the chunk's log decay: cums[c, h, Q - 1]
    end_save    [C]           int64: the save slot of the chunk's last token (-1: none)
    states      [C, H, P, N]  chunk c's own contribution, then (after phase 2) its start state

Phase 0 (``_chunk_cumsum_kernel``) computes dt once per (chunk, head), so that the
chunk-state and chunk-scan kernels can walk a chunk in ``BLOCK_K`` positions (a
cumulative sum cannot be sliced out of registers): chunks of 128 or 256 tokens need
no ``[Q, Q]`` tile. Phase 2 walks each sequence's chunks with everything it loads
independent of the running state (``end_save`` saves it a dependent index load per
chunk), one chunk ahead, over blocks of ``PASS_BLOCK`` elements of the flattened
``P x N`` state so that its grid fills the GPU (``research/mamba_scan_bytes.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hybridkv.kernels.mamba._triton_math import softplus
from hybridkv.kernels.mamba.args import ScanArgs

# Arguments that change from call to call with the batch's token and sequence counts:
# no recompile per value (Triton would specialise on divisibility by 16).
PER_CALL = ["num_chunks"]


@triton.jit
def dot(a, b, acc, PRECISION: tl.constexpr):  # type: ignore[no-untyped-def]
    """``acc + a @ b`` for fp32 tiles, accumulated in fp32, ``a`` and ``b`` read as
    ``PRECISION`` says (``scan_tiles.PRECISIONS`` or ``"bf16_rounded"``: operands
    rounded to bf16 and multiplied in fp32, what ``"bf16"`` runs as under the interpreter)."""
    if PRECISION == "bf16":
        out = tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), acc)
    elif PRECISION == "bf16_rounded":
        a16 = a.to(tl.bfloat16).to(tl.float32)
        out = tl.dot(a16, b.to(tl.bfloat16).to(tl.float32), acc, input_precision="ieee")
    else:
        out = tl.dot(a, b, acc, input_precision=PRECISION)
    return out


@triton.jit(do_not_specialize=PER_CALL)
def _chunk_cumsum_kernel(  # type: ignore[no-untyped-def]
    dt_ptr, A_ptr, dt_bias_ptr, bounds_ptr, save_ptr, dts_ptr, cums_ptr, dA_sum_ptr,
    end_save_ptr, num_chunks, n_heads, stride_dt_t,
    DT_SOFTPLUS: tl.constexpr, HAS_DT_BIAS: tl.constexpr, Q: tl.constexpr,
):  # fmt: skip
    # Phase 0, one program per (chunk, head): dts, cums, dA_sum; head 0 writes end_save.
    c = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    i = tl.arange(0, Q)
    start = tl.load(bounds_ptr + c).to(tl.int64)
    end = tl.load(bounds_ptr + num_chunks + c).to(tl.int64)
    tmask = start + i < end
    dt = tl.load(dt_ptr + (start + i) * stride_dt_t + h, mask=tmask, other=0.0).to(tl.float32)
    if HAS_DT_BIAS:
        dt += tl.load(dt_bias_ptr + h).to(tl.float32)
    if DT_SOFTPLUS:
        dt = softplus(dt)
    dt = tl.where(tmask, dt, 0.0)
    cum = tl.cumsum(dt * tl.load(A_ptr + h).to(tl.float32), axis=0)
    row = (c * n_heads + h) * Q
    tl.store(dts_ptr + row + i, dt)
    tl.store(cums_ptr + row + i, cum)
    tl.store(dA_sum_ptr + c * n_heads + h, tl.sum(tl.where(i == Q - 1, cum, 0.0), axis=0))
    if h == 0:
        slot = tl.load(save_ptr + tl.maximum(end - 1, 0), mask=end > start, other=-1)
        tl.store(end_save_ptr + c, slot.to(tl.int64))


@triton.jit(do_not_specialize=PER_CALL)
def _chunk_state_kernel(  # type: ignore[no-untyped-def]
    x_ptr, B_ptr, bounds_ptr, dts_ptr, cums_ptr, dA_sum_ptr, states_ptr,
    num_chunks, n_heads, head_dim, d_state, heads_per_group, n_blocks,
    stride_x_t, stride_x_h, stride_B_t, stride_B_g, stride_st_c, stride_st_h, stride_st_p,
    Q: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    # Phase 1, one program per (chunk, head, block of head_dim x block of d_state): the
    # chunk's contribution sum_j exp(dA_sum - cum_j) dt_j x_j B_j^T, BLOCK_K positions a
    # step. Empty chunks (past the real count) write nothing: phase 2 never reads them.
    c = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    p = (tl.program_id(2) // n_blocks) * BLOCK_P + tl.arange(0, BLOCK_P)
    n = (tl.program_id(2) % n_blocks) * BLOCK_N + tl.arange(0, BLOCK_N)
    start = tl.load(bounds_ptr + c).to(tl.int64)
    end = tl.load(bounds_ptr + num_chunks + c).to(tl.int64)
    if start >= end:
        return
    total = tl.load(dA_sum_ptr + c * n_heads + h)
    g = h // heads_per_group
    row = (c * n_heads + h) * Q
    acc = tl.zeros([BLOCK_P, BLOCK_N], tl.float32)
    for k0 in range(0, end - start, BLOCK_K):
        j = k0 + tl.arange(0, BLOCK_K)
        tok = start + j
        kmask = tok < end
        w = tl.exp(total - tl.load(cums_ptr + row + j)) * tl.load(dts_ptr + row + j)  # [BLOCK_K]
        xT = tl.load(  # [BLOCK_P, BLOCK_K]
            x_ptr + tok[None, :] * stride_x_t + h * stride_x_h + p[:, None],
            mask=kmask[None, :] & (p[:, None] < head_dim),
            other=0.0,
        ).to(tl.float32)
        B = tl.load(  # [BLOCK_K, BLOCK_N]
            B_ptr + tok[:, None] * stride_B_t + g * stride_B_g + n[None, :],
            mask=kmask[:, None] & (n[None, :] < d_state),
            other=0.0,
        ).to(tl.float32)
        acc = dot(xT * w[None, :], B, acc, PRECISION)
    offs = c * stride_st_c + h * stride_st_h + p[:, None] * stride_st_p + n[None, :]
    tl.store(states_ptr + offs, acc, mask=(p[:, None] < head_dim) & (n[None, :] < d_state))


@triton.jit(do_not_specialize=PER_CALL)
def _state_passing_kernel(  # type: ignore[no-untyped-def]
    states_ptr, dA_sum_ptr, end_save_ptr, first_ptr, state_ptr, init_ptr,
    n_heads, head_dim, d_state, stride_st_c, stride_st_h, stride_s_slot, stride_s_h, stride_s_p,
    PASS_BLOCK: tl.constexpr,
):  # fmt: skip
    # Phase 2, one program per (sequence, head, PASS_BLOCK elements of the flattened
    # head_dim x d_state state; the scratch rows are contiguous), over its chunks:
    # h_0 = initial slot (or zeros), h_{k+1} = exp(dA_sum_k) h_k + contribution_k;
    # writes h_k over contribution_k and saves h_{k+1} where end_save_k says.
    s = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    e = tl.program_id(2).to(tl.int64) * PASS_BLOCK + tl.arange(0, PASS_BLOCK)
    numel = head_dim * d_state
    emask = e < numel
    s_offs = h * stride_s_h + (e // d_state) * stride_s_p + e % d_state
    init = tl.load(init_ptr + s).to(tl.int64)
    init_ptrs = state_ptr + tl.maximum(init, 0) * stride_s_slot + s_offs
    st = tl.load(init_ptrs, mask=e < tl.where(init >= 0, numel, 0), other=0.0).to(tl.float32)
    # All of the initial state is read before any save may overwrite it.
    tl.debug_barrier()
    st_rows = states_ptr + h * stride_st_h + e
    c0 = tl.load(first_ptr + s)
    c1 = tl.load(first_ptr + s + 1)
    # One chunk ahead: chunk c + 1's loads (its contribution, decay and save slot) are
    # issued before chunk c's are used, so a step waits for no fresh round trip.
    nxt = tl.load(st_rows + c0 * stride_st_c, mask=e < tl.where(c0 < c1, numel, 0), other=0.0)
    nxt_dA = tl.load(dA_sum_ptr + c0 * n_heads + h, mask=c0 < c1, other=0.0)
    nxt_slot = tl.load(end_save_ptr + c0, mask=c0 < c1, other=-1)
    for c in range(c0, c1):
        contrib, dA, slot = nxt, nxt_dA, nxt_slot
        more = c + 1 < c1
        nxt = tl.load(st_rows + (c + 1) * stride_st_c, mask=e < tl.where(more, numel, 0), other=0.0)
        nxt_dA = tl.load(dA_sum_ptr + (c + 1) * n_heads + h, mask=more, other=0.0)
        nxt_slot = tl.load(end_save_ptr + c + 1, mask=more, other=-1)
        tl.store(st_rows + c * stride_st_c, st, mask=emask)  # what chunk c starts from
        st = tl.exp(dA) * st + contrib
        ptrs = state_ptr + tl.maximum(slot, 0) * stride_s_slot + s_offs
        tl.store(ptrs, st.to(state_ptr.dtype.element_ty), mask=e < tl.where(slot >= 0, numel, 0))


def chunk_dt(
    a: ScanArgs, bounds: torch.Tensor, q: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Phase 0 for the chunks of ``bounds`` (``chunk_layout``): ``(dts, cums, dA_sum,
    end_save)`` as laid out in the module docstring."""
    num_chunks, n_heads = bounds.shape[1], a.dt.shape[1]
    f32 = {"dtype": torch.float32, "device": a.dt.device}
    dts, cums = torch.empty((2, num_chunks, n_heads, q), **f32)
    dA_sum = torch.empty((num_chunks, n_heads), **f32)
    end_save = torch.empty((num_chunks,), dtype=torch.int64, device=a.dt.device)
    flags = a.kernel_flags()
    _chunk_cumsum_kernel[(num_chunks, n_heads)](
        a.dt, a.A, a.optional_ptrs(a.A)[2], bounds, a.save_state_indices, dts, cums, dA_sum,
        end_save, num_chunks, n_heads, a.dt.stride(0),
        DT_SOFTPLUS=flags["DT_SOFTPLUS"], HAS_DT_BIAS=flags["HAS_DT_BIAS"], Q=q,
    )  # fmt: skip
    return dts, cums, dA_sum, end_save
