"""``ssd_chunk_scan_fn``: the Mamba2 varlen prefill scan in chunked (SSD) form.

Same contract, arguments and torch reference as ``ssd_scan_fn`` (read its
docstring): only the Triton path differs. Instead of one program walking a
sequence token by token, each sequence is cut into chunks of ``Q`` tokens
counted from its own first token (the last chunk may be shorter; chunks never
straddle two sequences), and four launches do the work::

    seq s:  |  chunk 0  |  chunk 1  |  chunk 2  | c3 |      (Q tokens each)
            h0 -------> h1 -------> h2 -------> h3 --> h4   (state between chunks)

    0. dt            (chunk, head): effective dt and within-chunk cumulative dA
       (cum[i] = sum_{j<=i} dt_j A) into fp32 buffers, the chunk's log decay
       cum[-1] (dA_sum) and the save slot of its last token;
    1. chunk state   (chunk, head, P block x N block): the chunk's own contribution
       to the state at its end, sum_j exp(cum[-1] - cum[j]) dt_j x_j B_j^T (a
       [P, Q] @ [Q, N] matmul, ``block_k`` positions a step);
    2. state passing (sequence, head, block of the flattened P x N state): h0 =
       initial slot (or zeros), h_{k+1} = exp(cum_k[-1]) h_k + contribution_k, a
       loop over the sequence's chunks; writes h_k over contribution_k (what chunk k
       starts from) and saves h_{k+1} where the chunk's last token has a save slot;
    3. chunk scan    (chunk, head, P block x ``block_m`` rows):
       y_i = exp(cum[i]) C_i h_k  +  sum_{j<=i} (C_i . B_j) exp(cum[i]-cum[j]) dt_j x_j
       (the second term is the masked [Q, Q] @ [Q, P] matmul, ``block_k`` columns a
       step up to the block's last row), then D skip and silu(z) gate; a save slot
       on any other token of the chunk gets
       exp(cum[i]) h_k + sum_{j<=i} exp(cum[i]-cum[j]) dt_j x_j B_j^T.

    Above chunk 64 a fifth launch computes C B^T once per (chunk, group) for phase 3
    (``ScanTiles.shared_cb``).

Checkpoints therefore need no alignment between chunks and KV blocks: a
sequence that resumes mid-block saves its block boundaries wherever they fall
(chunk ends cost nothing extra, others one [P, Q] @ [Q, N] matmul each). The
chunk layout needs no host sync: chunk ``c`` of the batch is found on the
device from ``query_start_loc``, over a grid sized by the bound
``sum_s ceil(len_s / Q) <= (T + S (Q - 1)) // Q``; chunks past the real count
are empty and do nothing. Math is fp32 (``tl.dot`` as three tf32 products, about
fp32's accuracy, unless ``ScanTiles.precision`` says otherwise); the per-chunk states
live in an fp32 scratch buffer ``[chunks, heads, P, N]``. ``tiles=ScanTiles(...)``
(``scan_tiles.py``) overrides the launcher's chunk, block, warp, stage and
precision choices for one call (tuning: ``research/tune_mamba_scan.py``).
"""

from __future__ import annotations

import torch

from hybridkv.kernels.backend import Implementations, pinned
from hybridkv.kernels.mamba._common import check_chunk_size, pick_backend
from hybridkv.kernels.mamba.args import ScanArgs
from hybridkv.kernels.mamba.scan_tiles import ScanTiles, check_tiles
from hybridkv.kernels.mamba.ssd_scan import check_ssd_args, ssd_reference

DEFAULT_CHUNK_SIZE = 64  # mamba-ssm tiles its chunks in 64-token blocks too
# tl.dot's smallest tile is 16 on every GPU: the chunk, P and N blocks are at least that.
MIN_TILE = 16


def _reference(a: ScanArgs, chunk_size: int, tiles: ScanTiles) -> torch.Tensor:
    return ssd_reference(a)  # the sequential reference: same states, no chunks or tiles


#: The op's implementation per backend (Triton's module loaded at first use).
_IMPLS = Implementations(
    triton="hybridkv.kernels.mamba.ssd_chunk_scan_triton:launch",
    torch=_reference,
)


def ssd_chunk_scan_fn(
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
    chunk_size: int | None = None,
    backend: str | None = None,
    tiles: ScanTiles | None = None,
) -> torch.Tensor:
    """``ssd_scan_fn`` (same arguments, checks, saves and result) in chunked SSD form.

    ``chunk_size`` (a power of two >= 16; ``DEFAULT_CHUNK_SIZE`` when neither it
    nor ``tiles.chunk_size`` is given, ``ValueError`` when both are) is the
    Triton kernels' chunk ``Q``; ``tiles`` overrides the Triton launcher's
    other choices. The torch backend is ``ssd_scan_fn``'s reference, whose
    result depends on neither. Returns ``y [T, n_heads, head_dim]`` in
    ``x.dtype`` and writes every save into ``ssm_state``.
    """
    a = ScanArgs(
        x, dt, A, B, C, D, z, dt_bias, dt_softplus,
        ssm_state, query_start_loc, initial_state_indices, save_state_indices,
    )  # fmt: skip
    check_ssd_args(a)
    t = check_tiles(tiles)
    if chunk_size is not None and t.chunk_size is not None:
        raise ValueError(
            f"chunk_size: given twice ({chunk_size} and tiles.chunk_size={t.chunk_size}); "
            "pass one of them"
        )
    q = chunk_size if chunk_size is not None else t.chunk_size
    q = DEFAULT_CHUNK_SIZE if q is None else q
    check_chunk_size(q, MIN_TILE, "tl.dot's smallest tile")
    return _IMPLS[pick_backend(backend, x.device, _IMPLS.names)](a, q, t)


ssd_chunk_scan_fn_ref = pinned(ssd_chunk_scan_fn, "torch")
ssd_chunk_scan_fn_triton = pinned(ssd_chunk_scan_fn, "triton")
