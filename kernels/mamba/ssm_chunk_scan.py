"""``selective_chunk_scan_fn``: the Mamba1 varlen prefill scan, parallel within chunks.

Same contract, arguments and torch reference as ``selective_scan_fn`` (read
its docstring); only the Triton path differs. Mamba1's decay
``exp(dt_t[m] A[m, n])`` differs per (channel, state) element, so SSD's matmul
form does not apply; instead each sequence is cut into chunks of ``Q`` tokens
(as in ``ssd_chunk_scan``, see ``_common.chunk_layout``) and::

    1. chunk state   (chunk, channel block): the chunk's contribution to the
       state at its end, sum_j exp(A (S - cum_j)) dt_j x_j B_j with
       cum = cumsum(dt) and S its last entry (a reduction, no scan), and S;
    2. state passing (sequence, channel block): h_{k+1} = exp(A S_k) h_k +
       contribution_k over the sequence's chunks from its initial slot; writes
       h_k over contribution_k and saves h_{k+1} at a chunk's last token;
    3. chunk scan    (chunk, channel block): the states of all Q tokens at once,
       h_t = exp(A cum_t) h_k + scan_t, where scan is ``tl.associative_scan``
       over (exp(dt A), dt x B) pairs; y_t = h_t C_t, D skip, silu(z) gate, and
       a save slot on any other token of the chunk gets h_t.

The chunk-by-channel-by-state block ``[Q, BLOCK_M, BLOCK_N]`` lives in
registers, so ``BLOCK_M`` shrinks as ``Q`` and ``d_state`` grow. Math is fp32.
"""

from __future__ import annotations

import torch

from hybridkv.kernels.backend import Implementations, pinned
from hybridkv.kernels.mamba._common import check_chunk_size, pick_backend
from hybridkv.kernels.mamba.args import ScanArgs
from hybridkv.kernels.mamba.ssm_scan import check_ssm_args, ssm_reference

# 32 tokens x 16 channels x 16 states (Mamba1's usual d_state): 8k fp32 per tensor in
# the chunk scan; a longer chunk halves the state-passing loop but spills registers.
DEFAULT_CHUNK_SIZE = 32


def _reference(a: ScanArgs, chunk_size: int) -> torch.Tensor:
    return ssm_reference(a)  # the sequential reference: same states, no chunks


#: The op's implementation per backend (Triton's module loaded at first use).
_IMPLS = Implementations(
    triton="hybridkv.kernels.mamba.ssm_chunk_scan_triton:launch",
    torch=_reference,
)


def selective_chunk_scan_fn(
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
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    backend: str | None = None,
) -> torch.Tensor:
    """``selective_scan_fn`` (same arguments, checks, saves and result) in chunked form.

    ``chunk_size`` (a power of two >= 2) is the Triton kernels' chunk ``Q``;
    the torch backend is ``selective_scan_fn``'s reference, whose result does
    not depend on it. Returns ``y [T, d_inner]`` in ``x.dtype`` and writes
    every save into ``ssm_state``.
    """
    a = ScanArgs(
        x, dt, A, B, C, D, z, dt_bias, dt_softplus,
        ssm_state, query_start_loc, initial_state_indices, save_state_indices,
    )  # fmt: skip
    check_ssm_args(a)
    check_chunk_size(chunk_size, 2, "a scan over at least two tokens")
    return _IMPLS[pick_backend(backend, x.device, _IMPLS.names)](a, chunk_size)


selective_chunk_scan_fn_ref = pinned(selective_chunk_scan_fn, "torch")
selective_chunk_scan_fn_triton = pinned(selective_chunk_scan_fn, "triton")
