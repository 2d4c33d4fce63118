"""The swap decision, shared by the engine (``swap.py``) and the simulator
(``hybridkv/sim/tier_swap.py``): one code path, no torch.

- ``may_swap(mode)``: ``preemption_mode`` checked; ``"recompute"`` never swaps.
- ``swap_point``: the longest hit of a preempted request's computed tokens
  (one short of all its tokens) whose units are each present (on the device
  or in a tier), by the coordinator's rule (``tiered_hit_length``); a Mamba
  group's point is its last kept state.
- ``swap_units``: the units a hit at that point needs, per group (every
  full-attention block, the window's, the chunk's, the Mamba state at it).
- ``worth_swapping``: ``"swap"`` always; None when ``LoadCost`` finds two
  copies of those bytes (out now, back on resume) cheaper than recomputing
  the point's tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

from hybridkv.coordinators.tiered_hit import Present, tiered_hit_length
from hybridkv.core.request import Request
from hybridkv.managers.base import SingleTypeKVCacheManager
from hybridkv.offload.load_cost import LoadCost

#: ``SchedulerConfig.preemption_mode`` values (None: the cost model decides).
PREEMPTION_MODES = ("swap", "recompute")


def may_swap(mode: str | None) -> bool:
    """False for ``"recompute"``; ``ValueError`` for a value not in
    ``PREEMPTION_MODES`` (or None)."""
    if mode not in (None, *PREEMPTION_MODES):
        raise ValueError(f"preemption_mode must be None or one of {PREEMPTION_MODES}")
    return mode != "recompute"


def swap_point(
    managers: Sequence[SingleTypeKVCacheManager], request: Request, present: Present
) -> int:
    """The swap point of ``request`` (hasher bound): the longest hit of at most
    its computed tokens, and one short of all of them, whose units are each
    ``present`` (on the device or in a tier)."""
    limit = min(request.num_computed_tokens, request.num_tokens - 1)
    return tiered_hit_length(managers, request.live_block_hashes, limit, present)


def swap_units(
    managers: Sequence[SingleTypeKVCacheManager], hashes: list[bytes], point: int
) -> list[tuple[int, int, bytes]]:
    """``(group, block index, hash)`` of every unit a hit at ``point`` needs."""
    out = []
    for m in managers:
        view = m.group_hashes(hashes)
        for i in range(m.first_needed_block(point), point // m.block_size):
            out.append((m.group_id, i, view[i]))
    return out


def worth_swapping(mode: str | None, cost: LoadCost, nbytes: int, point: int) -> bool:
    """Swap ``nbytes`` of units saving ``point`` tokens? Always with ``"swap"``;
    with None when ``2 * load(nbytes)`` (out now, back on resume) is below
    ``recompute(point)`` (``LoadCost.load_cheaper``)."""
    return mode == "swap" or cost.load_cheaper(nbytes, point, copies=2)
