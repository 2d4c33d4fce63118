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

from hybridkv.kernels.backend import Implementations, pinned
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
from hybridkv.kernels.mamba.args import ScanArgs

# The reference precomputes exp(dt * A) and dt * B * x for this many elements
# at a time (a slice of token positions), bounding its scratch memory.
_REF_SCRATCH_ELEMS = 1 << 24


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


#: The op's implementation per backend (Triton's module loaded at first use).
_IMPLS = Implementations(
    triton="hybridkv.kernels.mamba.ssm_scan_triton:launch", torch=ssm_reference
)


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
    return _IMPLS[pick_backend(backend, x.device, _IMPLS.names)](a)


selective_scan_fn_ref = pinned(selective_scan_fn, "torch")
selective_scan_fn_triton = pinned(selective_scan_fn, "triton")
