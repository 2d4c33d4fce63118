"""Mamba state snapshots: the one place that says which states exist and where.

A Mamba group's block table holds one *state snapshot* per entry: entry ``i``
is the state after the tokens up to the end of block ``i`` (the last, partial
entry: after the computed tokens). Three parties must agree on it:

- the manager (``managers/mamba.py``) decides which entries get a real block
  (``snapshot_entries``); the others stay null: not written, not reserved;
- the model runner (``engine/runner.py``) reads the state at
  ``resume_entry(start)`` and writes a snapshot after every token that ends a
  block or the step, wherever the entry is real (``save_slots``);
- the planner (``planning/grouping.py``) sizes a request's share
  (``SNAPSHOT_BLOCKS_PER_REQUEST``) and the one-step reserve of snapshots
  (``snapshot_reserve_blocks``).

The scheduler (``engine/scheduler.py``, ``defer_pending_hits``) only needs the
consequence: a snapshot is written at the end of the step that computes it, so
a request cannot hit it in that same step. ("Snapshot", not "checkpoint":
``models/`` uses checkpoint for model weights.)

Which entries are real, per cache policy:

- no prefix caching: only the running state (the last entry);
- ``lru``: every entry a step crosses (each block boundary is cached);
- ``hybrid`` (``policy/retention.py``): the running state, the boundaries in
  the last ``tail`` tokens (from a hit boundary on; with a learned alignment,
  ``policy/tail_alignment.py``, only those on its grid and the last hit
  boundary), and the request's kept points (hit, branch point, prompt end,
  snapshot floor).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from hybridkv.managers.points import tail_points

if TYPE_CHECKING:
    import torch

#: A request holds its running state and the snapshot it resumed from (or is
#: writing) in each Mamba group.
SNAPSHOT_BLOCKS_PER_REQUEST = 2


def resume_entry(start: int, block_size: int) -> int:
    """Table entry holding the state before token ``start`` (-1: fresh, none)."""
    return (start - 1) // block_size if start > 0 else -1


def snapshot_entries(
    have: int,
    required: int,
    num_tokens: int,
    *,
    block_size: int,
    caching: bool,
    hybrid: bool,
    kept: Sequence[int] = (),
    tail: int = 0,
    step: int | None = None,
    align: int = 0,
) -> list[int]:
    """Entries in ``[have, required)`` that get a real state block (ascending).

    ``required`` entries cover ``num_tokens`` tokens; ``have`` exist already.
    ``step``: the hit step (the lcm of every group's block size; default
    ``block_size``): ``hybrid``'s tail starts at the last hit boundary at or
    before ``num_tokens - tail``; with ``align`` (``tail_alignment``) it keeps
    the aligned tail's points (``tail_points`` of the last hit boundary, the
    candidate end).
    See the module docstring for each policy.
    """
    if required <= have:
        return []
    if not caching:
        return [required - 1]
    if not hybrid:
        return list(range(have, required))
    bs = block_size
    step = step or bs
    if align:  # the aligned tail of the last hit boundary
        end = num_tokens // step * step
        pts = tail_points(end, tail, step, align)
        real = {required - 1, *(p // bs - 1 for p in pts)}
    else:
        first = max(have, (num_tokens - tail) // step * step // bs - 1)
        real = {required - 1, *range(first, num_tokens // bs)}
    real.update(p // bs - 1 for p in kept)
    return sorted(j for j in real if have <= j < required)


def save_slots(
    positions: torch.Tensor, slots: torch.Tensor, query_ends: torch.Tensor, block_size: int
) -> torch.Tensor:
    """Per token, the state slot that receives the state after it (-1: none).

    ``positions``: each token's position; ``slots``: the block id of its table
    entry (0 = the null block: no snapshot kept there); ``query_ends``: the
    flat index one past each sequence's last token. A token saves its state
    when it ends a block or its sequence's step, and its entry is real.
    (The engine's runner calls this; torch is imported here, not with the module.)
    """
    import torch

    last = torch.zeros(positions.shape[0], dtype=torch.bool)
    last[query_ends - 1] = True
    keep = ((positions + 1) % block_size == 0) | last
    return torch.where(keep & (slots != 0), slots, -1).to(torch.int32)


def snapshot_reserve_blocks(block_sizes: Sequence[int], max_num_batched_tokens: int) -> int:
    """Blocks set aside once for the snapshots one step writes, over all requests.

    A step computes at most ``max_num_batched_tokens`` tokens, so it crosses
    at most that many / ``block_size`` boundaries per Mamba group, whichever
    requests they belong to (this bound holds under every policy; ``hybrid``
    writes fewer). They are transient: cached, hence free, once written.
    """
    return sum(-(-max_num_batched_tokens // bs) for bs in block_sizes)
