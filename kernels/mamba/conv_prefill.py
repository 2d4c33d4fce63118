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

from hybridkv.kernels.backend import Implementations, pinned
from hybridkv.kernels.mamba._common import (
    check_conv,
    check_varlen,
    pick_backend,
    varlen,
)
from hybridkv.kernels.mamba.args import ConvPrefillArgs


def _check(a: ConvPrefillArgs) -> None:
    num_tokens = check_conv(a)
    check_varlen(
        a.query_start_loc, a.initial_state_indices, a.save_state_indices, num_tokens, a.x.device
    )


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


#: The op's implementation per backend (Triton's module loaded at first use).
_IMPLS = Implementations(
    triton="hybridkv.kernels.mamba.conv_prefill_triton:launch", torch=_reference
)


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
    return _IMPLS[pick_backend(backend, x.device, _IMPLS.names)](a)


causal_conv1d_fn_ref = pinned(causal_conv1d_fn, "torch")
causal_conv1d_fn_triton = pinned(causal_conv1d_fn, "triton")
