"""Shedding: under pressure, a running request gives up kept points before anyone is preempted.

Under ``hybrid`` a running request *retains* the blocks its kept points need
once its window has moved past them (``RequestBlockState.retained``): the
window or chunk before its admission hit ``H``, before its branch point
``F``, a Mamba state at a floor point, ... When every free block is gone, the
scheduler preempts a request, which costs its progress and its place in the
batch. Shedding comes first: the newest live request that retains blocks
drops every kept point behind its window and releases what they held
(evict-first: no kept point needs them any more, so the allocation that ran
short reuses them at once). Its other kept points, and its own running
window, are untouched: when it is the request stepping, its window may pass
one of them in the same step, which then retains blocks again. At ``free``
it keeps what its remaining points and its end need (``retention.FinalPoints``).
The policy only decides (``make_room`` returns a ``Shed``); the coordinator
applies it (``SingleTypeKVCacheManager.shed``).

Only one request sheds per allocation, the newest holding such blocks (a
scheduler preempts the newest first too): each shed loses hits for good, and
shedding from every running request lost hits where a resumed request re-hits
most of what its preemption freed (``docs/hybrid-caching.md``).

Admission never sheds: a new request waits rather than take kept points from
running ones.

**Alone, a request never fails for what ``hybrid`` holds.** The planner's
minimum memory holds one request of ``max_model_len`` tokens by what ``lru``
holds (``planning/grouping.py``: a window and one step per sliding group);
``hybrid`` holds more: its retained blocks and its *tail* (what the last hit
boundary ``tail`` tokens before its end needs, ``Hold.tail``: with a tail
longer than the request, a sliding group's whole table). When the request
stepping is the only live one (a scheduler preempted every other) and
shedding does not make room, it gives up every kept point and its tail for
good (``Shed.holds_tail`` False): it then holds what ``lru`` would, which the
plan holds. Without that it preempted itself and was stuck (re-admitted, it
held as much again): at the minimum ``hybrid`` may hit less, never wedge.
"""

from __future__ import annotations

from collections.abc import Sequence

from hybridkv.managers.base import RequestBlockState, SingleTypeKVCacheManager
from hybridkv.policy.base import Shed


def sheddable_blocks(managers: Sequence[SingleTypeKVCacheManager], request_id: str) -> int:
    """Blocks shedding would return to the free set: the request's retained
    blocks that nobody else holds."""
    return sum(1 for m in managers for _, b in m.states[request_id].retained if b.ref_cnt == 1)


def shed_plan(managers: Sequence[SingleTypeKVCacheManager], request_id: str) -> Shed:
    """The request drops its kept points whose hit needs a block behind its
    window in some group, and releases every block it retains (all of them
    belong to such points). Its other kept points stay, in every group."""
    states = [m.states[request_id] for m in managers]
    behind = {
        p
        for m, st in zip(managers, states, strict=True)
        if m.has_skips
        for p in st.kept
        if m.first_needed_block(p) < st.num_skipped
    }
    return Shed(request_id, tuple(p for p in states[0].kept if p not in behind))


def make_room(
    managers: Sequence[SingleTypeKVCacheManager], short: int, request_id: str
) -> Shed | None:
    """The newest live request that retains blocks sheds (``shed_plan``) if
    that returns at least ``short`` blocks; else ``request_id``, the request
    stepping, if it is alone (``alone_plan``); else None. Read-only: the
    coordinator applies the ``Shed``."""
    for rid in reversed(managers[0].states):
        n = sheddable_blocks(managers, rid)
        if n:
            if n >= short:
                return shed_plan(managers, rid)
            break
    return alone_plan(managers, request_id)


def alone_plan(managers: Sequence[SingleTypeKVCacheManager], request_id: str) -> Shed | None:
    """The request stepping is the only live one: it keeps no point and gives
    its tail up (module docstring); None when others live (the scheduler
    preempts them first) or it holds nothing beyond ``lru``'s already."""
    states = managers[0].states
    if len(states) != 1 or request_id not in states:
        return None
    if not states[request_id].holds_tail and not sheddable_blocks(managers, request_id):
        return None
    return Shed(request_id, (), holds_tail=False)


def held_end(
    managers: Sequence[SingleTypeKVCacheManager],
    states: Sequence[RequestBlockState],
    end: int,
    free_period: int,
) -> int:
    """The end ``E`` a freed request that gave its tail up still holds a hit at:
    ``end`` (a hit boundary) if every block its hit needs is in the tables; else
    only free points can be hit (they need nothing outside full attention): the
    last one at or below ``end``, 0 without. No other boundary below ``end`` can:
    its hit needs blocks from an earlier first needed block on, released since."""
    for m, st in zip(managers, states, strict=True):
        if m.has_skips and any(
            b.is_null for b in st.blocks[m.first_needed_block(end) : end // m.block_size]
        ):
            return end - end % free_period if free_period else 0
    return end
