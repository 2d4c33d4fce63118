"""Triton kernels and launcher of ``ssd_chunk_scan_fn`` (``ssd_chunk_scan.py``).

Imported only when the Triton backend runs the op (``triton`` is optional).

Speed (first and second H200 leases, Q 64, head_dim 64, d_state 128, the rules of
then: all matmuls IEEE fp32, all of d_state in one block, 8 warps): 0.5 TFLOP/s, 4-12x
slower than the sequential kernel. Per (chunk, head) the three matmuls of phase 3
and the one of phase 1 cost ~1.8M multiply-adds (19 GFLOP for 80 heads x 4k
tokens), and IEEE fp32 ``tl.dot`` runs them as FMA loops on CUDA cores; compiled for
sm_90 (``research/kernel_resources.py``, offline) the chunk-state and chunk-scan
kernels held 32 registers and 5-9 KB of local memory per thread. ``C B^T`` is also
recomputed per head though it depends only on the group (a quarter of the
multiply-adds; ``ScanTiles.shared_cb`` computes it once per (chunk, group) in
``_chunk_cb_kernel`` instead).

The rules now (``_choices``; 2026-11-26, after the second lease, not yet timed):
tf32x3 matmuls (about fp32's accuracy, on tensor cores) and d_state in blocks of
32 at 4 warps, which compile to wgmma with no local memory in all three kernels,
on Triton 3.6 and 3.9 (``research/tests/test_kernel_resources.py`` holds that). Every
choice is a ``ScanTiles`` field, swept by ``research/tune_mamba_scan.py``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hybridkv.kernels.backend import interpreter_enabled
from hybridkv.kernels.mamba._common import chunk_layout
from hybridkv.kernels.mamba._triton_math import load_state, save_state, silu, softplus
from hybridkv.kernels.mamba.args import ScanArgs
from hybridkv.kernels.mamba.scan_tiles import ScanTiles
from hybridkv.kernels.mamba.ssd_chunk_scan import MIN_TILE as _MIN_TILE

# The rule's matmuls: three tf32 products (tf32x3), about fp32's accuracy on tensor
# cores. IEEE fp32 dots compiled for sm_90 to FMA loops on CUDA cores with 5-9 KB of
# local memory per thread (``research/kernel_resources.py``); tf32x3 to wgmma with
# none (with the d_state blocks below). Plain tf32 would cost ~1e-3 relative error in
# the states and bf16 more: ScanTiles.precision choices, for the GPU sweep to weigh.
# Under Triton's interpreter tf32x3 runs as fp32, as ieee does.
RULE_PRECISION = "tf32x3"
# The rule's d_state step: all of d_state in one [Q, d_state] tile made the chunk-scan
# kernel's tiles exceed the registers (d_state 128: 255 registers and local memory
# even with tensor cores at 8 warps); steps of 32 compile without local memory at 4
# warps for Q 64 (Bamba 9B and Mamba2 2.7B heads, ``research/kernel_resources.py``).
_RULE_BLOCK_N = 32
# What "bf16" runs as under the interpreter, whose tl.dot multiplies bf16 tiles'
# raw 16-bit patterns as integers: operands rounded to bf16, multiplied in fp32
# (a product of two bf16 values is exact in fp32, so only the summation order differs).
_BF16_ROUNDED = "bf16_rounded"
# Up to this many fp32 elements in a program's largest tile the rule keeps Triton's
# 4 warps; from a [64, 128] tile (the chunk-scan kernel holds several: C, B, the start
# state) 8 warps keep them in registers (64 per thread each instead of 128 with 4).
_FOUR_WARP_ELEMS = 4096
# Arguments that change from call to call with the batch's token and sequence counts:
# no recompile per value (Triton would specialise on divisibility by 16), so that
# one compile serves every batch (the tuning sweep times several on one compile).
_PER_CALL = ["num_chunks"]


@triton.jit
def _dot(a, b, acc, PRECISION: tl.constexpr):  # type: ignore[no-untyped-def]
    """``acc + a @ b`` for fp32 tiles, accumulated in fp32, ``a`` and ``b`` read as
    ``PRECISION`` says (``scan_tiles.PRECISIONS`` or ``_BF16_ROUNDED``)."""
    if PRECISION == "bf16":
        out = tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), acc)
    elif PRECISION == "bf16_rounded":
        a16 = a.to(tl.bfloat16).to(tl.float32)
        out = tl.dot(a16, b.to(tl.bfloat16).to(tl.float32), acc, input_precision="ieee")
    else:
        out = tl.dot(a, b, acc, input_precision=PRECISION)
    return out


@triton.jit
def _chunk_dt(  # type: ignore[no-untyped-def]
    dt_ptr, A_ptr, dt_bias_ptr, h, tok, tmask, stride_dt_t,
    DT_SOFTPLUS: tl.constexpr, HAS_DT_BIAS: tl.constexpr,
):  # fmt: skip
    """``(dt [Q], cum [Q])``: effective dt (0 past the chunk) and cumulative dt * A."""
    dt = tl.load(dt_ptr + tok * stride_dt_t + h, mask=tmask, other=0.0).to(tl.float32)
    if HAS_DT_BIAS:
        dt += tl.load(dt_bias_ptr + h).to(tl.float32)
    if DT_SOFTPLUS:
        dt = softplus(dt)
    dt = tl.where(tmask, dt, 0.0)
    cum = tl.cumsum(dt * tl.load(A_ptr + h).to(tl.float32), axis=0)
    return dt, cum


@triton.jit(do_not_specialize=_PER_CALL)
def _chunk_state_kernel(  # type: ignore[no-untyped-def]
    x_ptr, dt_ptr, A_ptr, B_ptr, dt_bias_ptr, bounds_ptr, states_ptr, dA_sum_ptr,
    num_chunks, n_heads, head_dim, d_state, heads_per_group, n_blocks,
    stride_x_t, stride_x_h, stride_dt_t, stride_B_t, stride_B_g,
    stride_st_c, stride_st_h, stride_st_p,
    DT_SOFTPLUS: tl.constexpr, HAS_DT_BIAS: tl.constexpr, Q: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    # Phase 1, one program per (chunk, head, block of head_dim x block of d_state).
    c = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    p = (tl.program_id(2) // n_blocks) * BLOCK_P + tl.arange(0, BLOCK_P)
    n = (tl.program_id(2) % n_blocks) * BLOCK_N + tl.arange(0, BLOCK_N)
    i = tl.arange(0, Q)
    start = tl.load(bounds_ptr + c).to(tl.int64)
    end = tl.load(bounds_ptr + num_chunks + c).to(tl.int64)
    tok = start + i
    tmask = tok < end
    dt, cum = _chunk_dt(
        dt_ptr, A_ptr, dt_bias_ptr, h, tok, tmask, stride_dt_t, DT_SOFTPLUS, HAS_DT_BIAS
    )
    total = tl.sum(tl.where(i == Q - 1, cum, 0.0), axis=0)  # dt is 0 past the chunk
    w = tl.exp(total - cum) * dt  # [Q]
    g = h // heads_per_group
    xT = tl.load(  # [BLOCK_P, Q]
        x_ptr + tok[None, :] * stride_x_t + h * stride_x_h + p[:, None],
        mask=tmask[None, :] & (p[:, None] < head_dim),
        other=0.0,
    ).to(tl.float32)
    B = tl.load(  # [Q, BLOCK_N]
        B_ptr + tok[:, None] * stride_B_t + g * stride_B_g + n[None, :],
        mask=tmask[:, None] & (n[None, :] < d_state),
        other=0.0,
    ).to(tl.float32)
    contrib = _dot(xT * w[None, :], B, tl.zeros([BLOCK_P, BLOCK_N], tl.float32), PRECISION)
    offs = c * stride_st_c + h * stride_st_h + p[:, None] * stride_st_p + n[None, :]
    tl.store(states_ptr + offs, contrib, mask=(p[:, None] < head_dim) & (n[None, :] < d_state))
    if tl.program_id(2) == 0:
        tl.store(dA_sum_ptr + c * n_heads + h, total)


@triton.jit(do_not_specialize=_PER_CALL)
def _state_passing_kernel(  # type: ignore[no-untyped-def]
    states_ptr, dA_sum_ptr, bounds_ptr, first_ptr, state_ptr, init_ptr, save_ptr,
    num_chunks, n_heads, head_dim, d_state, n_blocks,
    stride_st_c, stride_st_h, stride_st_p, stride_s_slot, stride_s_h, stride_s_p,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    # Phase 2, one program per (sequence, head, block of head_dim x block of d_state),
    # over its chunks.
    s = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    p = (tl.program_id(2) // n_blocks) * BLOCK_P + tl.arange(0, BLOCK_P)
    n = (tl.program_id(2) % n_blocks) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < d_state
    m2 = (p[:, None] < head_dim) & nmask[None, :]
    init = tl.load(init_ptr + s).to(tl.int64)
    s_offs = h * stride_s_h + p[:, None] * stride_s_p + n[None, :]
    st = load_state(state_ptr, init, stride_s_slot, s_offs, p, head_dim, nmask)
    # All of the initial state is read before any save may overwrite it.
    tl.debug_barrier()
    st_offs = h * stride_st_h + p[:, None] * stride_st_p + n[None, :]
    c0 = tl.load(first_ptr + s)
    c1 = tl.load(first_ptr + s + 1)
    for c in range(c0, c1):
        ptrs = states_ptr + c * stride_st_c + st_offs
        contrib = tl.load(ptrs, mask=m2, other=0.0)
        tl.store(ptrs, st, mask=m2)  # what chunk c starts from
        st = tl.exp(tl.load(dA_sum_ptr + c * n_heads + h)) * st + contrib
        last = tl.load(bounds_ptr + num_chunks + c).to(tl.int64) - 1
        save = tl.load(save_ptr + last).to(tl.int64)
        save_state(state_ptr, save, stride_s_slot, s_offs, st, p, head_dim, nmask)


@triton.jit(do_not_specialize=_PER_CALL)
def _chunk_cb_kernel(  # type: ignore[no-untyped-def]
    B_ptr, C_ptr, bounds_ptr, cb_ptr,
    num_chunks, d_state, stride_B_t, stride_B_g, stride_C_t, stride_C_g,
    stride_cb_c, stride_cb_g,
    Q: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    # Shared C B^T, one program per (chunk, group): [Q, Q] over all of d_state in steps
    # of BLOCK_N, summed as the chunk-scan kernel sums it; rows and columns past the
    # chunk's end are 0 (their C and B rows load as 0).
    c = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1).to(tl.int64)
    i = tl.arange(0, Q)
    start = tl.load(bounds_ptr + c).to(tl.int64)
    end = tl.load(bounds_ptr + num_chunks + c).to(tl.int64)
    tok = start + i
    tmask = tok < end
    B_rows = B_ptr + tok[:, None] * stride_B_t + g * stride_B_g
    C_rows = C_ptr + tok[:, None] * stride_C_t + g * stride_C_g
    cb = tl.zeros([Q, Q], tl.float32)
    for n0 in range(0, d_state, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        qn = tmask[:, None] & (n[None, :] < d_state)
        C = tl.load(C_rows + n[None, :], mask=qn, other=0.0).to(tl.float32)  # [Q, BLOCK_N]
        B = tl.load(B_rows + n[None, :], mask=qn, other=0.0).to(tl.float32)
        cb = _dot(C, tl.trans(B), cb, PRECISION)
    tl.store(cb_ptr + c * stride_cb_c + g * stride_cb_g + i[:, None] * Q + i[None, :], cb)


@triton.jit(do_not_specialize=_PER_CALL)
def _chunk_scan_kernel(  # type: ignore[no-untyped-def]
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, dt_bias_ptr,
    bounds_ptr, states_ptr, state_ptr, save_ptr, out_ptr, cb_ptr,
    num_chunks, head_dim, d_state, heads_per_group,
    stride_x_t, stride_x_h, stride_dt_t, stride_B_t, stride_B_g, stride_C_t, stride_C_g,
    stride_z_t, stride_z_h, stride_out_t, stride_out_h,
    stride_st_c, stride_st_h, stride_st_p, stride_s_slot, stride_s_h, stride_s_p,
    stride_cb_c, stride_cb_g,
    DT_SOFTPLUS: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr,
    HAS_DT_BIAS: tl.constexpr, Q: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr, SHARED_CB: tl.constexpr,
):  # fmt: skip
    # Phase 3, one program per (chunk, head, block of head_dim); d_state in steps of BLOCK_N.
    # SHARED_CB: C B^T read from _chunk_cb_kernel's [num_chunks, n_groups, Q, Q] buffer.
    c = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    p = tl.program_id(2) * BLOCK_P + tl.arange(0, BLOCK_P)
    i = tl.arange(0, Q)
    pmask = p < head_dim
    start = tl.load(bounds_ptr + c).to(tl.int64)
    end = tl.load(bounds_ptr + num_chunks + c).to(tl.int64)
    tok = start + i
    tmask = tok < end
    dt, cum = _chunk_dt(
        dt_ptr, A_ptr, dt_bias_ptr, h, tok, tmask, stride_dt_t, DT_SOFTPLUS, HAS_DT_BIAS
    )
    g = h // heads_per_group
    B_rows = B_ptr + tok[:, None] * stride_B_t + g * stride_B_g
    C_rows = C_ptr + tok[:, None] * stride_C_t + g * stride_C_g
    st_rows = states_ptr + c * stride_st_c + h * stride_st_h + p[:, None] * stride_st_p
    # Over d_state: C h0^T (the start state read at each token) and C B^T.
    ch = tl.zeros([Q, BLOCK_P], tl.float32)
    if SHARED_CB:
        cb = tl.load(cb_ptr + c * stride_cb_c + g * stride_cb_g + i[:, None] * Q + i[None, :])
    else:
        cb = tl.zeros([Q, Q], tl.float32)
    for n0 in range(0, d_state, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        nmask = n < d_state
        qn = tmask[:, None] & nmask[None, :]
        C = tl.load(C_rows + n[None, :], mask=qn, other=0.0).to(tl.float32)  # [Q, BLOCK_N]
        h0 = tl.load(st_rows + n[None, :], mask=pmask[:, None] & nmask[None, :], other=0.0)
        ch = _dot(C, tl.trans(h0), ch, PRECISION)
        if not SHARED_CB:
            B = tl.load(B_rows + n[None, :], mask=qn, other=0.0).to(tl.float32)
            cb = _dot(C, tl.trans(B), cb, PRECISION)  # [Q, Q]
    qp = tmask[:, None] & pmask[None, :]
    x = tl.load(x_ptr + tok[:, None] * stride_x_t + h * stride_x_h + p[None, :], mask=qp, other=0.0)
    x = x.to(tl.float32)  # [Q, BLOCK_P]
    # Inter-chunk: the start state decayed to each token.
    y = ch * tl.exp(cum)[:, None]
    # Intra-chunk: causal (C B^T) * exp(cum_i - cum_j) * dt_j, times x.
    causal = i[:, None] >= i[None, :]
    decay = tl.exp(tl.where(causal, cum[:, None] - cum[None, :], float("-inf")))
    y = _dot(cb * decay * dt[None, :], x, y, PRECISION)
    if HAS_D:
        y += tl.load(D_ptr + h).to(tl.float32) * x
    if HAS_Z:
        z_ptrs = z_ptr + tok[:, None] * stride_z_t + h * stride_z_h + p[None, :]
        y *= silu(tl.load(z_ptrs, mask=qp, other=0.0).to(tl.float32))
    o_ptrs = out_ptr + tok[:, None] * stride_out_t + h * stride_out_h + p[None, :]
    tl.store(o_ptrs, y.to(out_ptr.dtype.element_ty), mask=qp)
    # Saves inside the chunk (its last token's save is phase 2's): the k-th one
    # is found by rank, so the loop runs once per save, not once per token.
    inner = tok < end - 1
    slots = tl.load(save_ptr + tok, mask=inner, other=-1).to(tl.int64)
    saving = (slots >= 0).to(tl.int32)
    rank = tl.cumsum(saving, axis=0) - 1
    xT = tl.trans(x)  # [BLOCK_P, Q]
    s_rows = state_ptr + h * stride_s_h + p[:, None] * stride_s_p
    for k in range(tl.sum(saving, axis=0)):
        pick = (saving > 0) & (rank == k)
        at = tl.sum(tl.where(pick, i, 0), axis=0)
        slot = tl.sum(tl.where(pick, slots, 0), axis=0)
        cum_at = tl.sum(tl.where(pick, cum, 0.0), axis=0)
        w = tl.where(i <= at, tl.exp(tl.where(i <= at, cum_at - cum, 0.0)) * dt, 0.0)
        wx = xT * w[None, :]  # [BLOCK_P, Q]
        for n0 in range(0, d_state, BLOCK_N):
            n = n0 + tl.arange(0, BLOCK_N)
            nmask = n < d_state
            pn = pmask[:, None] & nmask[None, :]
            B = tl.load(B_rows + n[None, :], mask=tmask[:, None] & nmask[None, :], other=0.0)
            h0 = tl.load(st_rows + n[None, :], mask=pn, other=0.0)
            st = _dot(wx, B.to(tl.float32), tl.exp(cum_at) * h0, PRECISION)
            tl.store(
                s_rows + slot * stride_s_slot + n[None, :],
                st.to(state_ptr.dtype.element_ty),
                mask=pn,
            )


def _choices(tiles: ScanTiles, q: int, head_dim: int, d_state: int) -> tuple[int, int, str, dict]:
    """``(block_p, block_n, precision, launch options)``: ``tiles`` where set, else the rules.

    Rules (checked for registers and local memory on sm_90 offline, not timed on a
    GPU; ``research/tune_mamba_scan.py`` sweeps them): up to 64 rows of
    ``head_dim`` per program, ``d_state`` in blocks of up to ``_RULE_BLOCK_N``
    (both at least ``tl.dot``'s 16), tf32x3 matmuls (``RULE_PRECISION``), and 8
    warps where a tile exceeds ``[64, 64]`` fp32 (``_FOUR_WARP_ELEMS``), else
    Triton's 4.
    """
    block_n = tiles.block_n or max(_MIN_TILE, min(_RULE_BLOCK_N, triton.next_power_of_2(d_state)))
    block_p = tiles.block_p or max(_MIN_TILE, min(64, triton.next_power_of_2(head_dim)))
    largest = max(q * q, max(q, block_p) * block_n)
    opts = {"num_warps": tiles.num_warps or (8 if largest > _FOUR_WARP_ELEMS else 4)}
    if tiles.num_stages is not None:
        opts["num_stages"] = tiles.num_stages
    precision = tiles.precision or RULE_PRECISION
    if precision == "bf16" and interpreter_enabled():
        precision = _BF16_ROUNDED
    return block_p, block_n, precision, opts


def _shared_cb(
    B: torch.Tensor, C: torch.Tensor, bounds: torch.Tensor, q: int, block_n: int,
    precision: str, opts: dict,
) -> torch.Tensor:  # fmt: skip
    """``C B^T`` per (chunk, group): fp32 ``[num_chunks, n_groups, Q, Q]``, 0 past a
    chunk's end, summed over ``d_state`` in blocks of ``block_n`` as in the chunk scan."""
    num_chunks, (n_groups, d_state) = bounds.shape[1], B.shape[1:]
    cb = torch.empty((num_chunks, n_groups, q, q), dtype=torch.float32, device=B.device)
    _chunk_cb_kernel[(num_chunks, n_groups)](
        B, C, bounds, cb, num_chunks, d_state,
        B.stride(0), B.stride(1), C.stride(0), C.stride(1), cb.stride(0), cb.stride(1),
        Q=q, BLOCK_N=block_n, PRECISION=precision, **opts,
    )  # fmt: skip
    return cb


def launch(a: ScanArgs, q: int, tiles: ScanTiles) -> torch.Tensor:
    x, dt, B, C, z, ssm_state, qsl = a.x, a.dt, a.B, a.C, a.z, a.ssm_state, a.query_start_loc
    num_tokens, n_heads, head_dim = x.shape
    n_groups, d_state = B.shape[1], B.shape[2]
    out = torch.empty((num_tokens, n_heads, head_dim), dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return out
    bounds, first = chunk_layout(qsl, num_tokens, q)
    num_chunks = bounds.shape[1]
    states = torch.empty(
        (num_chunks, n_heads, head_dim, d_state), dtype=torch.float32, device=x.device
    )
    dA_sum = torch.empty((num_chunks, n_heads), dtype=torch.float32, device=x.device)
    block_p, block_n, precision, opts = _choices(tiles, q, head_dim, d_state)
    p_blocks = triton.cdiv(head_dim, block_p)
    n_blocks = triton.cdiv(d_state, block_n)
    D, z_, dt_bias = a.optional_ptrs(a.A)
    flags = a.kernel_flags()
    hpg = n_heads // n_groups
    sts = (states.stride(0), states.stride(1), states.stride(2))
    sss = (ssm_state.stride(0), ssm_state.stride(1), ssm_state.stride(2))
    _chunk_state_kernel[(num_chunks, n_heads, p_blocks * n_blocks)](
        x, dt, a.A, B, dt_bias, bounds, states, dA_sum,
        num_chunks, n_heads, head_dim, d_state, hpg, n_blocks,
        x.stride(0), x.stride(1), dt.stride(0), B.stride(0), B.stride(1), *sts,
        DT_SOFTPLUS=flags["DT_SOFTPLUS"], HAS_DT_BIAS=flags["HAS_DT_BIAS"], Q=q,
        BLOCK_P=block_p, BLOCK_N=block_n, PRECISION=precision, **opts,
    )  # fmt: skip
    _state_passing_kernel[(qsl.shape[0] - 1, n_heads, p_blocks * n_blocks)](
        states, dA_sum, bounds, first, ssm_state, a.initial_state_indices, a.save_state_indices,
        num_chunks, n_heads, head_dim, d_state, n_blocks, *sts, *sss,
        BLOCK_P=block_p, BLOCK_N=block_n, **opts,
    )  # fmt: skip
    cb = _shared_cb(B, C, bounds, q, block_n, precision, opts) if tiles.shared_cb else dA_sum
    cbs = (cb.stride(0), cb.stride(1)) if tiles.shared_cb else (0, 0)
    zs = (z.stride(0), z.stride(1)) if z is not None else (0, 0)
    _chunk_scan_kernel[(num_chunks, n_heads, p_blocks)](
        x, dt, a.A, B, C, D, z_, dt_bias, bounds, states, ssm_state, a.save_state_indices, out,
        cb, num_chunks, head_dim, d_state, hpg,
        x.stride(0), x.stride(1), dt.stride(0), B.stride(0), B.stride(1), C.stride(0),
        C.stride(1), zs[0], zs[1], out.stride(0), out.stride(1), *sts, *sss, *cbs,
        **flags, Q=q, BLOCK_P=block_p, BLOCK_N=block_n, PRECISION=precision,
        SHARED_CB=bool(tiles.shared_cb), **opts,
    )  # fmt: skip
    return out
