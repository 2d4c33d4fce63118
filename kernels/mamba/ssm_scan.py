"""``selective_scan_fn``: the Mamba1 selective scan over a varlen prefill chunk.

Sequence ``s`` owns tokens ``[query_start_loc[s], query_start_loc[s+1])``. It
starts from ``ssm_state[initial_state_indices[s]]`` (zeros when ``< 0``) and,
token by token (the math of ``selective_state_update``)::

    dt_t = softplus(dt[t] + dt_bias) (or without softplus)          # [d_inner]
    h    = h * exp(dt_t[:, None] * A) + (dt_t * x[t])[:, None] * B[t][None, :]
    y[t] = h @ C[t] + D * x[t];  y[t] *= silu(z[t]) if z is given
    save_state_indices[t] = slot >= 0  ->  ssm_state[slot] <- h

All initial states are read before any save is written (a save may target the
sequence's own initial slot). The Triton kernel is a sequential scan (grid:
sequence x channel block, the state in registers); ``ssm_chunk_scan`` has
a chunked form (parallel scans within chunks). The torch reference loops over token positions,
vectorised over every sequence and channel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hybridkv.kernels.backend import pinned
from hybridkv.kernels.mamba._common import (
    check_float,
    check_ssm_optionals,
    check_state,
    check_varlen,
    effective_dt,
    gather_initial,
    pad,
    pick_backend,
    save_steps,
    skip_and_gate,
    varlen,
)
from hybridkv.kernels.mamba._triton_math import silu, softplus
from hybridkv.kernels.mamba.args import ScanArgs

# The reference precomputes exp(dt * A) and dt * B * x for this many elements
# at a time (a slice of token positions), bounding its scratch memory.
_REF_SCRATCH_ELEMS = 1 << 24


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
    m2i = (m[:, None] < tl.where(init >= 0, d_inner, 0)) & nmask[None, :]
    offs = m[:, None] * stride_s_m + n[None, :]
    h = tl.load(state_ptr + tl.maximum(init, 0) * stride_s_slot + offs, mask=m2i, other=0.0)
    h = h.to(tl.float32)
    # All of the initial state is read before any save may overwrite it.
    tl.debug_barrier()
    A = tl.load(A_ptr + m[:, None] * stride_A_m + n[None, :], mask=m2, other=0.0).to(tl.float32)
    if HAS_D:
        D = tl.load(D_ptr + m, mask=mmask, other=0.0).to(tl.float32)
    if HAS_DT_BIAS:
        dt_bias = tl.load(dt_bias_ptr + m, mask=mmask, other=0.0).to(tl.float32)
    sdt = state_ptr.dtype.element_ty
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
        s_ptrs = state_ptr + tl.maximum(save, 0) * stride_s_slot + offs
        tl.store(
            s_ptrs, h.to(sdt), mask=(m[:, None] < tl.where(save >= 0, d_inner, 0)) & nmask[None, :]
        )


def check_ssm_args(a: ScanArgs) -> None:
    """Shapes, dtypes and devices of a Mamba1 scan (shared with ``ssm_chunk_scan``)."""
    dev = a.x.device
    check_float("x", a.x, (None, None), dev)
    num_tokens, d_inner = a.x.shape
    check_float("A", a.A, (d_inner, None), dev)
    d_state = a.A.shape[1]
    check_float("dt", a.dt, (num_tokens, d_inner), dev)
    check_float("B", a.B, (num_tokens, d_state), dev)
    check_float("C", a.C, (num_tokens, d_state), dev)
    check_ssm_optionals(a, (d_inner,), (num_tokens, d_inner))
    check_state("ssm_state", a.ssm_state, (d_inner, d_state), dev)
    check_varlen(a.query_start_loc, a.initial_state_indices, a.save_state_indices, num_tokens, dev)


def _launch(a: ScanArgs) -> torch.Tensor:
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


def ssm_reference(a: ScanArgs) -> torch.Tensor:
    """The torch reference (shared with ``ssm_chunk_scan``): a loop over positions."""
    x, ssm_state = a.x, a.ssm_state
    num_tokens, d_inner = x.shape
    d_state = a.A.shape[1]
    v = varlen(a.query_start_loc, a.save_state_indices, num_tokens)
    h = gather_initial(ssm_state, a.initial_state_indices)  # [S, d_inner, d_state], before saves
    dtf = effective_dt(a.dt, a.dt_bias, a.dt_softplus)
    xf = x.float()
    dtp, dtxp = pad(dtf, v), pad(dtf * xf, v)  # [S, L, d_inner]
    Bp, Cp = pad(a.B, v), pad(a.C, v)  # [S, L, d_state]
    Af = a.A.float()
    steps = save_steps(v)
    saved = h.new_empty((v.save_tokens.numel(), d_inner, d_state))
    ys = h.new_empty((v.num_seqs, v.max_len, d_inner))
    span = max(1, _REF_SCRATCH_ELEMS // max(1, h.numel()))
    for l0 in range(0, v.max_len, span):
        l1 = min(l0 + span, v.max_len)
        dA = torch.exp(dtp[:, l0:l1, :, None] * Af)  # [S, Lc, d_inner, d_state]
        dBx = dtxp[:, l0:l1, :, None] * Bp[:, l0:l1, None, :]
        for i in range(l1 - l0):
            h = torch.addcmul(dBx[:, i], h, dA[:, i])
            ys[:, l0 + i] = torch.bmm(h, Cp[:, l0 + i, :, None])[..., 0]
            if l0 + i in steps:
                seqs, rows = steps[l0 + i]
                saved[rows] = h[seqs]
    y = ys[v.seq, v.pos]  # [T, d_inner]
    y = skip_and_gate(y, xf, a.D, a.z)
    if v.save_tokens.numel():
        ssm_state[v.save_slots] = saved.to(ssm_state.dtype)
    return y.to(x.dtype).contiguous()  # einsum may hand back a transposed layout


def selective_scan_fn(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    z: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    dt_softplus: bool,
    ssm_state: torch.Tensor,
    query_start_loc: torch.Tensor,
    initial_state_indices: torch.Tensor,
    save_state_indices: torch.Tensor,
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """Mamba1 selective scan over a varlen chunk, from cached states, saving checkpoints.

    Args (``S`` sequences, ``T`` tokens, back to back)::

        x, dt:                 [T, d_inner]   fp16/bf16/fp32
        A:                     [d_inner, d_state]
        B, C:                  [T, d_state]
        D, dt_bias:            [d_inner] or None
        z:                     [T, d_inner] or None (gate: y *= silu(z))
        dt_softplus:           apply softplus to dt + dt_bias
        ssm_state:             [num_slots, d_inner, d_state] view
        query_start_loc:       [S+1] int32/int64, 0 = q[0] <= ... <= q[S] = T
        initial_state_indices: [S] slot to start from (< 0: zeros)
        save_state_indices:    [T] slot to receive the state after token t (< 0: none)

    Returns ``y [T, d_inner]`` in ``x.dtype``; writes the saves into ``ssm_state``.
    """
    a = ScanArgs(
        x, dt, A, B, C, D, z, dt_bias, dt_softplus,
        ssm_state, query_start_loc, initial_state_indices, save_state_indices,
    )  # fmt: skip
    check_ssm_args(a)
    if pick_backend(backend, x.device) == "triton":
        return _launch(a)
    return ssm_reference(a)


selective_scan_fn_ref = pinned(selective_scan_fn, "torch")
selective_scan_fn_triton = pinned(selective_scan_fn, "triton")
