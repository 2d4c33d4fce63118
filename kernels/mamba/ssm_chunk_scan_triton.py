"""Triton kernels and launcher of ``selective_chunk_scan_fn`` (``ssm_chunk_scan.py``).

Imported only when the Triton backend runs the op (``triton`` is optional).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hybridkv.kernels.mamba._common import chunk_layout
from hybridkv.kernels.mamba._triton_math import load_state, save_state, silu, softplus
from hybridkv.kernels.mamba.args import ScanArgs

_BLOCK_ELEMS = 8192


# Arguments that change from call to call with the batch's token count: not
# specialised (Triton would compile one binary per "equal to 1" / "divisible by
# 16" / neither), so one compile serves every batch.
_PER_CALL = ["num_chunks"]


@triton.jit
def _chunk_dt(  # type: ignore[no-untyped-def]
    dt_ptr, dt_bias_ptr, tok, tmask, m, mmask, stride_dt_t,
    DT_SOFTPLUS: tl.constexpr, HAS_DT_BIAS: tl.constexpr,
):  # fmt: skip
    """Effective ``dt [Q, BLOCK_M]``, 0 outside the chunk and the channels."""
    qm = tmask[:, None] & mmask[None, :]
    dt = tl.load(dt_ptr + tok[:, None] * stride_dt_t + m[None, :], mask=qm, other=0.0)
    dt = dt.to(tl.float32)
    if HAS_DT_BIAS:
        dt += tl.load(dt_bias_ptr + m, mask=mmask, other=0.0).to(tl.float32)[None, :]
    if DT_SOFTPLUS:
        dt = softplus(dt)
    return tl.where(qm, dt, 0.0)


@triton.jit
def _linear_recurrence(a1, b1, a2, b2):  # type: ignore[no-untyped-def]
    # (a1, b1) then (a2, b2): h -> a2 (a1 h + b1) + b2.
    return a1 * a2, a2 * b1 + b2


@triton.jit(do_not_specialize=_PER_CALL)
def _chunk_state_kernel(  # type: ignore[no-untyped-def]
    x_ptr, dt_ptr, A_ptr, B_ptr, dt_bias_ptr, bounds_ptr, states_ptr, dtsum_ptr,
    num_chunks, d_inner, d_state,
    stride_x_t, stride_dt_t, stride_A_m, stride_B_t, stride_st_c, stride_st_m,
    DT_SOFTPLUS: tl.constexpr, HAS_DT_BIAS: tl.constexpr, Q: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    # Phase 1, one program per (chunk, block of channels).
    c = tl.program_id(0).to(tl.int64)
    m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tl.arange(0, BLOCK_N)
    mmask = m < d_inner
    nmask = n < d_state
    m2 = mmask[:, None] & nmask[None, :]
    tok = tl.load(bounds_ptr + c).to(tl.int64) + tl.arange(0, Q)
    tmask = tok < tl.load(bounds_ptr + num_chunks + c)
    dt = _chunk_dt(
        dt_ptr, dt_bias_ptr, tok, tmask, m, mmask, stride_dt_t, DT_SOFTPLUS, HAS_DT_BIAS
    )  # [Q, BLOCK_M]
    cum = tl.cumsum(dt, axis=0)
    total = tl.sum(dt, axis=0)  # [BLOCK_M]
    qm = tmask[:, None] & mmask[None, :]
    x = tl.load(x_ptr + tok[:, None] * stride_x_t + m[None, :], mask=qm, other=0.0)
    x = x.to(tl.float32)  # [Q, BLOCK_M]
    qn = tmask[:, None] & nmask[None, :]
    B = tl.load(B_ptr + tok[:, None] * stride_B_t + n[None, :], mask=qn, other=0.0).to(tl.float32)
    A = tl.load(A_ptr + m[:, None] * stride_A_m + n[None, :], mask=m2, other=0.0).to(tl.float32)
    decay = tl.exp(A[None, :, :] * (total[None, :] - cum)[:, :, None])  # [Q, BLOCK_M, BLOCK_N]
    contrib = tl.sum(decay * (dt * x)[:, :, None] * B[:, None, :], axis=0)
    tl.store(states_ptr + c * stride_st_c + m[:, None] * stride_st_m + n[None, :], contrib, mask=m2)
    tl.store(dtsum_ptr + c * d_inner + m, total, mask=mmask)


@triton.jit(do_not_specialize=_PER_CALL)
def _state_passing_kernel(  # type: ignore[no-untyped-def]
    states_ptr, dtsum_ptr, A_ptr, bounds_ptr, first_ptr, state_ptr, init_ptr, save_ptr,
    num_chunks, d_inner, d_state,
    stride_A_m, stride_st_c, stride_st_m, stride_s_slot, stride_s_m,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    # Phase 2, one program per (sequence, block of channels), over its chunks.
    s = tl.program_id(0).to(tl.int64)
    m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tl.arange(0, BLOCK_N)
    mmask = m < d_inner
    nmask = n < d_state
    m2 = mmask[:, None] & nmask[None, :]
    A = tl.load(A_ptr + m[:, None] * stride_A_m + n[None, :], mask=m2, other=0.0).to(tl.float32)
    init = tl.load(init_ptr + s).to(tl.int64)
    s_offs = m[:, None] * stride_s_m + n[None, :]
    h = load_state(state_ptr, init, stride_s_slot, s_offs, m, d_inner, nmask)
    # All of the initial state is read before any save may overwrite it.
    tl.debug_barrier()
    st_offs = m[:, None] * stride_st_m + n[None, :]
    for c in range(tl.load(first_ptr + s), tl.load(first_ptr + s + 1)):
        ptrs = states_ptr + c * stride_st_c + st_offs
        contrib = tl.load(ptrs, mask=m2, other=0.0)
        tl.store(ptrs, h, mask=m2)  # what chunk c starts from
        total = tl.load(dtsum_ptr + c * d_inner + m, mask=mmask, other=0.0)
        h = tl.exp(A * total[:, None]) * h + contrib
        save = tl.load(save_ptr + tl.load(bounds_ptr + num_chunks + c) - 1).to(tl.int64)
        save_state(state_ptr, save, stride_s_slot, s_offs, h, m, d_inner, nmask)


@triton.jit(do_not_specialize=_PER_CALL)
def _chunk_scan_kernel(  # type: ignore[no-untyped-def]
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, dt_bias_ptr,
    bounds_ptr, states_ptr, state_ptr, save_ptr, out_ptr,
    num_chunks, d_inner, d_state,
    stride_x_t, stride_dt_t, stride_A_m, stride_B_t, stride_C_t, stride_z_t, stride_out_t,
    stride_st_c, stride_st_m, stride_s_slot, stride_s_m,
    DT_SOFTPLUS: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr,
    HAS_DT_BIAS: tl.constexpr, Q: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    # Phase 3, one program per (chunk, block of channels).
    c = tl.program_id(0).to(tl.int64)
    m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tl.arange(0, BLOCK_N)
    i = tl.arange(0, Q)
    mmask = m < d_inner
    nmask = n < d_state
    m2 = mmask[:, None] & nmask[None, :]
    tok = tl.load(bounds_ptr + c).to(tl.int64) + i
    end = tl.load(bounds_ptr + num_chunks + c).to(tl.int64)
    tmask = tok < end
    qm = tmask[:, None] & mmask[None, :]
    qn = tmask[:, None] & nmask[None, :]
    dt = _chunk_dt(
        dt_ptr, dt_bias_ptr, tok, tmask, m, mmask, stride_dt_t, DT_SOFTPLUS, HAS_DT_BIAS
    )  # [Q, BLOCK_M]
    x = tl.load(x_ptr + tok[:, None] * stride_x_t + m[None, :], mask=qm, other=0.0)
    x = x.to(tl.float32)
    B = tl.load(B_ptr + tok[:, None] * stride_B_t + n[None, :], mask=qn, other=0.0).to(tl.float32)
    C = tl.load(C_ptr + tok[:, None] * stride_C_t + n[None, :], mask=qn, other=0.0).to(tl.float32)
    A = tl.load(A_ptr + m[:, None] * stride_A_m + n[None, :], mask=m2, other=0.0).to(tl.float32)
    h0 = tl.load(
        states_ptr + c * stride_st_c + m[:, None] * stride_st_m + n[None, :], mask=m2, other=0.0
    )
    # h_t from zeros at the chunk start, then the start state decayed to t.
    dA = tl.exp(dt[:, :, None] * A[None, :, :])  # [Q, BLOCK_M, BLOCK_N]
    dBx = (dt * x)[:, :, None] * B[:, None, :]
    _, h = tl.associative_scan((dA, dBx), 0, _linear_recurrence)
    h += tl.exp(tl.cumsum(dt, axis=0)[:, :, None] * A[None, :, :]) * h0[None, :, :]
    y = tl.sum(h * C[:, None, :], axis=2)  # [Q, BLOCK_M]
    if HAS_D:
        y += tl.load(D_ptr + m, mask=mmask, other=0.0).to(tl.float32)[None, :] * x
    if HAS_Z:
        z = tl.load(z_ptr + tok[:, None] * stride_z_t + m[None, :], mask=qm, other=0.0)
        y *= silu(z.to(tl.float32))
    o_ptrs = out_ptr + tok[:, None] * stride_out_t + m[None, :]
    tl.store(o_ptrs, y.to(out_ptr.dtype.element_ty), mask=qm)
    # Saves inside the chunk (its last token's save is phase 2's), one loop trip each.
    slots = tl.load(save_ptr + tok, mask=tok < end - 1, other=-1).to(tl.int64)
    saving = (slots >= 0).to(tl.int32)
    rank = tl.cumsum(saving, axis=0) - 1
    s_offs = m[:, None] * stride_s_m + n[None, :]
    for k in range(tl.sum(saving, axis=0)):
        pick = (saving > 0) & (rank == k)
        slot = tl.sum(tl.where(pick, slots, 0), axis=0)
        h_at = tl.sum(tl.where(pick[:, None, None], h, 0.0), axis=0)
        tl.store(
            state_ptr + slot * stride_s_slot + s_offs, h_at.to(state_ptr.dtype.element_ty), mask=m2
        )


def launch(a: ScanArgs, q: int) -> torch.Tensor:
    x, dt, A, B, C, z, ssm_state, qsl = (
        a.x,
        a.dt,
        a.A,
        a.B,
        a.C,
        a.z,
        a.ssm_state,
        a.query_start_loc,
    )
    num_tokens, d_inner = x.shape
    d_state = A.shape[1]
    out = torch.empty((num_tokens, d_inner), dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return out
    bounds, first = chunk_layout(qsl, num_tokens, q)
    num_chunks = bounds.shape[1]
    states = torch.empty((num_chunks, d_inner, d_state), dtype=torch.float32, device=x.device)
    dtsum = torch.empty((num_chunks, d_inner), dtype=torch.float32, device=x.device)
    block_n = triton.next_power_of_2(d_state)
    block_m = min(triton.next_power_of_2(d_inner), max(1, _BLOCK_ELEMS // (q * block_n)))
    m_blocks = triton.cdiv(d_inner, block_m)
    D, z_, dt_bias = a.optional_ptrs(x)
    flags = a.kernel_flags()
    sts, sss = (states.stride(0), states.stride(1)), (ssm_state.stride(0), ssm_state.stride(1))
    _chunk_state_kernel[(num_chunks, m_blocks)](
        x, dt, A, B, dt_bias, bounds, states, dtsum, num_chunks, d_inner, d_state,
        x.stride(0), dt.stride(0), A.stride(0), B.stride(0), *sts,
        DT_SOFTPLUS=flags["DT_SOFTPLUS"], HAS_DT_BIAS=flags["HAS_DT_BIAS"], Q=q,
        BLOCK_M=block_m, BLOCK_N=block_n,
    )  # fmt: skip
    _state_passing_kernel[(qsl.shape[0] - 1, m_blocks)](
        states, dtsum, A, bounds, first, ssm_state, a.initial_state_indices,
        a.save_state_indices, num_chunks, d_inner, d_state, A.stride(0), *sts, *sss,
        BLOCK_M=block_m, BLOCK_N=block_n,
    )  # fmt: skip
    _chunk_scan_kernel[(num_chunks, m_blocks)](
        x, dt, A, B, C, D, z_, dt_bias, bounds, states, ssm_state, a.save_state_indices, out,
        num_chunks, d_inner, d_state,
        x.stride(0), dt.stride(0), A.stride(0), B.stride(0), C.stride(0),
        z.stride(0) if z is not None else 0, out.stride(0), *sts, *sss,
        **flags, Q=q, BLOCK_M=block_m, BLOCK_N=block_n,
    )  # fmt: skip
    return out
