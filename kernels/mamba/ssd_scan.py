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

from hybridkv.kernels.backend import Implementations, pinned
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
from hybridkv.kernels.mamba.args import ScanArgs

# The reference precomputes dt * B * x for this many elements at a time.
_REF_SCRATCH_ELEMS = 1 << 24


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


#: The op's implementation per backend (Triton's module loaded at first use).
_IMPLS = Implementations(
    triton="hybridkv.kernels.mamba.ssd_scan_triton:launch", torch=ssd_reference
)


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
    return _IMPLS[pick_backend(backend, x.device, _IMPLS.names)](a)


ssd_scan_fn_ref = pinned(ssd_scan_fn, "torch")
ssd_scan_fn_triton = pinned(ssd_scan_fn, "triton")
