"""``TakeLog``: what the device pool evicts, noted for demotion.

``hybridkv simulate --host-memory`` under ``hybrid`` demotes what the device
pool evicts, as the engine does (``offload/demotion.py``), and through the same
hook: the pool's ``BlockPool.on_take``, called with the blocks
``get_new_blocks`` hands out before any cached one leaves the index, each still
with its key and the class of its value (``free_class``). ``TakeLog`` is that
hook: it notes ``(group, hash, value)`` of each keyed block, the value being
the cache policy's ``demotion_value`` (the engine's own decision: under
``hybrid`` the class of the run's value, ``SPARE`` for a run released
``evict_first``, which a tier takes only into spare room; None: not demoted).
It changes no decision.

Each take is noted as the engine's ``Demotion`` stores it: the demoted units
as one batch, each group's together (groups in the order they first appear),
then the spare ones as a second batch, the same way. A batch's units are in
flight together in the engine's host, so none of them evicts another
(``TieredCache.sync``). Units the policy does not demote (None) are left out.

The free set is the policy's own, not wrapped: the policy finds it as in the
engine (``policy.make_policy`` hands the reuse horizon a ``CostAwareEvictionPolicy``
only). Until 2026-11-28 the simulator wrapped the free set instead, which hid
it from the policy: every ``hybrid`` replay with a tier ran without the reuse
horizon the engine has (``tests/offload/test_tier_reach_engine_sim.py``).
"""

from __future__ import annotations

from collections.abc import Callable

from hybridkv.core.block import KVCacheBlock
from hybridkv.tiers.spare import is_spare

#: A demoted unit: its group, hash and demotion value (``SPARE``: spare room only).
Taken = tuple[int, bytes, float]
#: The units of one store batch, in the engine's order.
TakenBatch = list[Taken]


class TakeLog:
    """``BlockPool.on_take``: the keyed blocks each take hands out that the policy
    demotes (``value_of``: ``CachePolicy.demotion_value``) are appended to ``sink``
    as store batches (module docstring)."""

    __slots__ = ("sink", "value_of")

    def __init__(
        self, sink: list[TakenBatch], value_of: Callable[[KVCacheBlock], float | None]
    ) -> None:
        self.sink = sink
        self.value_of = value_of

    def __call__(self, blocks: list[KVCacheBlock]) -> None:
        value_of = self.value_of
        valued: dict[int, list[Taken]] = {}
        spare: dict[int, list[Taken]] = {}
        for b in blocks:
            h = b.block_hash
            if h is None:
                continue
            value = value_of(b)
            if value is None:
                continue
            gid = b.group_id
            assert gid is not None
            (spare if is_spare(value) else valued).setdefault(gid, []).append((gid, h, value))
        for batch in (valued, spare):
            if batch:
                self.sink.append([unit for units in batch.values() for unit in units])
