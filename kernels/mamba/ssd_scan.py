"""``ssd_scan_fn``: the Mamba2 (multi-head SSD) scan over a varlen prefill chunk.

Our name for what vLLM calls ``mamba_chunk_scan_combined``; the contract is
that of ``selective_scan_fn`` with Mamba2's shapes. Sequence ``s`` owns tokens
``[query_start_loc[s], query_start_loc[s+1])``, starts from
``ssm_state[initial_state_indices[s]]`` (zeros when ``< 0``) and, token by
token, for head ``h`` of group ``g = h // (n_heads // n_groups)``::

    dt_t    = softplus(dt[t, h] + dt_bias[h]) (or without softplus)   # scalar
    st      = st * exp(dt_t * A[h]) + dt_t * x[t, h][:, None] * B[t, g][None, :]
    y[t, h] = st @ C[t, g] + D[h] * x[t, h];  y[t, h] *= silu(z[t, h]) if z is given
    save_state_indices[t] = slot >= 0  ->  ssm_state[slot] <- st (all heads)

All initial states are read before any save is written (a save may target the
sequence's own initial slot). The Triton kernel is a sequential scan (grid:
sequence x head x head_dim block, the state in registers); ``ssd_chunk_scan``
has the chunked SSD form (matmuls within chunks) of the same op. The torch reference
loops over token positions, vectorised over every sequence and head.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hybridkv.kernels.backend import pinned
from hybridkv.kernels.mamba._common import (
    check_float,
    check_groups,
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

# The reference precomputes dt * B * x for this many elements at a time.
_REF_SCRATCH_ELEMS = 1 << 24


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
    m2i = (p[:, None] < tl.where(init >= 0, head_dim, 0)) & nmask[None, :]
    offs = h * stride_s_h + p[:, None] * stride_s_p + n[None, :]
    st = tl.load(state_ptr + tl.maximum(init, 0) * stride_s_slot + offs, mask=m2i, other=0.0)
    st = st.to(tl.float32)
    # All of the initial state is read before any save may overwrite it.
    tl.debug_barrier()
    A = tl.load(A_ptr + h).to(tl.float32)
    if HAS_D:
        D = tl.load(D_ptr + h).to(tl.float32)
    if HAS_DT_BIAS:
        dt_bias = tl.load(dt_bias_ptr + h).to(tl.float32)
    sdt = state_ptr.dtype.element_ty
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
        s_ptrs = state_ptr + tl.maximum(save, 0) * stride_s_slot + offs
        tl.store(
            s_ptrs,
            st.to(sdt),
            mask=(p[:, None] < tl.where(save >= 0, head_dim, 0)) & nmask[None, :],
        )


def check_ssd_args(a: ScanArgs) -> None:
    """Shapes, dtypes and devices of a Mamba2 scan (shared with ``ssd_chunk_scan``)."""
    dev = a.x.device
    check_float("x", a.x, (None, None, None), dev)
    num_tokens, n_heads, head_dim = a.x.shape
    n_groups, d_state = check_groups(a.B, num_tokens, n_heads, dev)
    check_float("dt", a.dt, (num_tokens, n_heads), dev)
    check_float("A", a.A, (n_heads,), dev)
    check_float("C", a.C, (num_tokens, n_groups, d_state), dev)
    check_ssm_optionals(a, (n_heads,), (num_tokens, n_heads, head_dim))
    check_state("ssm_state", a.ssm_state, (n_heads, head_dim, d_state), dev)
    check_varlen(a.query_start_loc, a.initial_state_indices, a.save_state_indices, num_tokens, dev)


def _launch(a: ScanArgs) -> torch.Tensor:
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


def ssd_reference(a: ScanArgs) -> torch.Tensor:
    """The torch reference (shared with ``ssd_chunk_scan``): a loop over positions."""
    x, ssm_state = a.x, a.ssm_state
    num_tokens, n_heads, head_dim = x.shape
    rep = n_heads // a.B.shape[1]
    v = varlen(a.query_start_loc, a.save_state_indices, num_tokens)
    st = gather_initial(ssm_state, a.initial_state_indices)  # [S, H, P, N], before saves
    dtf = effective_dt(a.dt, a.dt_bias, a.dt_softplus)
    xf = x.float()
    dAp = torch.exp(pad(dtf * a.A.float(), v))  # [S, L, H]
    dtxp = pad(dtf[:, :, None] * xf, v)  # [S, L, H, P]
    Bp = pad(a.B, v).repeat_interleave(rep, dim=2)  # [S, L, H, N]
    Cp = pad(a.C, v).repeat_interleave(rep, dim=2)
    steps = save_steps(v)
    saved = st.new_empty((v.save_tokens.numel(), *st.shape[1:]))
    ys = st.new_empty((v.num_seqs, v.max_len, n_heads, head_dim))
    span = max(1, _REF_SCRATCH_ELEMS // max(1, st.numel()))
    for l0 in range(0, v.max_len, span):
        l1 = min(l0 + span, v.max_len)
        dBx = dtxp[:, l0:l1, :, :, None] * Bp[:, l0:l1, :, None, :]  # [S, Lc, H, P, N]
        for i in range(l1 - l0):
            st = torch.addcmul(dBx[:, i], st, dAp[:, l0 + i, :, None, None])
            ys[:, l0 + i] = torch.matmul(st, Cp[:, l0 + i, :, :, None])[..., 0]
            if l0 + i in steps:
                seqs, rows = steps[l0 + i]
                saved[rows] = st[seqs]
    y = ys[v.seq, v.pos]  # [T, H, P]
    y = skip_and_gate(y, xf, a.D, a.z)
    if v.save_tokens.numel():
        ssm_state[v.save_slots] = saved.to(ssm_state.dtype)
    return y.to(x.dtype).contiguous()  # einsum may hand back a transposed layout


def ssd_scan_fn(
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
    """Mamba2 SSD scan over a varlen chunk, from cached states, saving checkpoints.

    Args (``S`` sequences, ``T`` tokens, back to back)::

        x:                     [T, n_heads, head_dim]   fp16/bf16/fp32
        dt:                    [T, n_heads]
        A:                     [n_heads]                (one scalar per head)
        B, C:                  [T, n_groups, d_state]   (n_groups divides n_heads)
        D, dt_bias:            [n_heads] or None
        z:                     [T, n_heads, head_dim] or None (gate: y *= silu(z))
        dt_softplus:           apply softplus to dt + dt_bias
        ssm_state:             [num_slots, n_heads, head_dim, d_state] view
        query_start_loc:       [S+1] int32/int64, 0 = q[0] <= ... <= q[S] = T
        initial_state_indices: [S] slot to start from (< 0: zeros)
        save_state_indices:    [T] slot to receive the state after token t (< 0: none)

    Returns ``y [T, n_heads, head_dim]`` in ``x.dtype``; writes the saves into ``ssm_state``.
    """
    a = ScanArgs(
        x, dt, A, B, C, D, z, dt_bias, dt_softplus,
        ssm_state, query_start_loc, initial_state_indices, save_state_indices,
    )  # fmt: skip
    check_ssd_args(a)
    if pick_backend(backend, x.device) == "triton":
        return _launch(a)
    return ssd_reference(a)


ssd_scan_fn_ref = pinned(ssd_scan_fn, "torch")
ssd_scan_fn_triton = pinned(ssd_scan_fn, "triton")
