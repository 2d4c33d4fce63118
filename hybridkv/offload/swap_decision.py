"""The swap decision, shared by the engine (``swap.py``) and the simulator
(``hybridkv/sim/tier_swap.py``): one code path, no torch.

``plan_swap`` is called once the preempted request's blocks are freed (so each
block carries the value the policy released it with) and before its computed
count is reset:

- ``may_swap(mode)``: ``preemption_mode`` checked; ``"recompute"`` never swaps.
- ``swap_point``: the longest hit of the request's computed tokens (one short
  of all its tokens) whose units are each present (on the device or in a
  tier), by the coordinator's rule (``tiered_hit_length``); a Mamba group's
  point is its last kept state. ``swap_units``: the units a hit at that point
  needs, per group (every full-attention block, the window's, the chunk's,
  the Mamba state at it).
- Each unit's ``Fate`` if the pool reused its block before the resume
  (``device_fate``):

  - ``IN_TIER``: a tier holds it already;
  - ``KEPT``: on the device, and its reuse loses nothing: a running request
    still holds the block (its own release will value it), or the policy
    demotes it when the pool reuses it (``CachePolicy.demotion_value`` not
    None: with its value, or ``SPARE`` into the host's spare room, which is
    where a swap copy would go). Whether the block survives until the resume
    does not matter: if the pool reuses it first, demotion makes then the copy
    a swap would make now, and if not, nothing was copied for nothing;
  - ``LOST``: on the device, free, and not demoted on reuse
    (``demotion_value`` None: under ``lru``, a unit written through when it
    was computed that the host's LRU has dropped since).

- **The default (None) copies only ``LOST`` units**, and only when the cost
  model finds ``2 * load(their bytes)`` (out now, back on resume,
  ``LoadCost.load_cheaper``) below recomputing the tokens they keep: the swap
  point less the hit without them. The copies are stored as ``SPARE``
  (``tiers/spare.py``): into the host's free bytes or older spare units'
  bytes, never in place of a valued unit (a full host skips them). With
  nothing ``LOST`` there is nothing to save (``UNNEEDED``). Measured on the
  Mooncake trace (``benchmarks/results/tiers-sim.md``, "Swap preemption"):
  copying every unit lost hit rate, because a resumed request finds its
  blocks still on the device and the copies pushed demoted units out of the
  host.
- **``"swap"``** copies every unit no tier holds, valued ``point / units``
  (prefill tokens its resume saves per unit), whatever the link: vLLM's
  "always swap", and this project's default before the rule above.

    swap point P:   | u0 | u1 | u2 | u3 |      fates: u0 IN_TIER, u1 KEPT,
    default copies:                 u3          u2 KEPT, u3 LOST (as SPARE)
    "swap" copies:    u1   u2   u3              (valued P / 4 each)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

from hybridkv.coordinators.tiered_hit import Present, tiered_hit_length
from hybridkv.core.block import KVCacheBlock
from hybridkv.core.request import Request
from hybridkv.managers.base import SingleTypeKVCacheManager
from hybridkv.offload.load_cost import LoadCost
from hybridkv.policy.base import CachePolicy
from hybridkv.tiers.spare import SPARE

#: ``SchedulerConfig.preemption_mode`` values (None: the rule decides).
PREEMPTION_MODES = ("swap", "recompute")

#: One unit of a swap point: ``(group, block index, block hash)``.
Unit = tuple[int, int, bytes]


class Fate(Enum):
    """What becomes of a swap point's unit if the pool reuses its block before
    the resume (module docstring)."""

    IN_TIER = "in a tier"
    KEPT = "kept on reuse"
    LOST = "lost on reuse"


#: ``(group, block index, hash) -> Fate`` of a present unit, by the caller's state.
FateOf = Callable[[int, int, bytes], Fate]


class Decision(Enum):
    """A swap plan's outcome: copy, or the reason it copies nothing."""

    SWAP = "swap"
    UNNEEDED = "nothing lost on reuse"
    DECLINED = "recompute is cheaper"


@dataclass(frozen=True, slots=True)
class SwapPlan:
    """One preemption's swap decision (``plan_swap``).

    ``copies``: the units to store in the host now, with ``value`` (``SPARE``:
    spare room only); ``weighed_bytes`` / ``saved_tokens``: what the cost model
    compared (two copies of those bytes against recomputing those tokens)."""

    decision: Decision
    point: int
    copies: tuple[Unit, ...]
    value: float
    weighed_bytes: int
    saved_tokens: int


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
) -> list[Unit]:
    """``(group, block index, hash)`` of every unit a hit at ``point`` needs."""
    out = []
    for m in managers:
        view = m.group_hashes(hashes)
        for i in range(m.first_needed_block(point), point // m.block_size):
            out.append((m.group_id, i, view[i]))
    return out


def device_fate(block: KVCacheBlock, policy: CachePolicy) -> Fate:
    """``KEPT`` or ``LOST`` for a unit cached on the device as ``block`` and held
    by no tier (module docstring). Read-only."""
    if block.ref_cnt > 0 or policy.demotion_value(block) is not None:
        return Fate.KEPT
    return Fate.LOST


def plan_swap(
    managers: Sequence[SingleTypeKVCacheManager],
    request: Request,
    mode: str | None,
    present: Present,
    fate: FateOf,
    unit_bytes: Sequence[int],
    cost: LoadCost,
) -> SwapPlan | None:
    """The swap decision for the freed ``request`` (hasher bound; module
    docstring): None under ``"recompute"`` or with no swap point. ``present``:
    a unit is on the device or in a tier; ``fate``: a present unit's ``Fate``;
    ``unit_bytes``: a unit's bytes per group. Read-only."""
    if not may_swap(mode):
        return None
    point = swap_point(managers, request, present)
    if point == 0:
        return None
    hashes = request.live_block_hashes
    units = swap_units(managers, hashes, point)
    fates = [fate(*u) for u in units]
    if mode == "swap":
        copies = tuple(u for u, f in zip(units, fates, strict=True) if f is not Fate.IN_TIER)
        weighed = sum(unit_bytes[g] for g, _, _ in units)
        value = point / max(1, len(units))
        return SwapPlan(Decision.SWAP, point, copies, value, weighed, point)
    lost = tuple(u for u, f in zip(units, fates, strict=True) if f is Fate.LOST)
    if not lost:
        return SwapPlan(Decision.UNNEEDED, point, (), SPARE, 0, 0)
    gone = {(g, i) for g, i, _ in lost}

    def kept(gid: int, i: int, h: bytes) -> bool:
        return (gid, i) not in gone and present(gid, i, h)

    saved = point - tiered_hit_length(managers, hashes, point, kept)
    weighed = sum(unit_bytes[g] for g, _, _ in lost)
    if not cost.load_cheaper(weighed, saved, copies=2):
        return SwapPlan(Decision.DECLINED, point, (), SPARE, weighed, saved)
    return SwapPlan(Decision.SWAP, point, lost, SPARE, weighed, saved)


def estimated_saving(plan: SwapPlan, cost: LoadCost) -> float | None:
    """``recompute(saved tokens) - 2 * load(weighed bytes)`` as ``cost`` estimates
    it now (None: no recompute figure yet). Not what a replay realizes."""
    recompute = cost.recompute_seconds(plan.saved_tokens)
    if recompute is None:
        return None
    return recompute - 2 * cost.load_seconds(plan.weighed_bytes)
