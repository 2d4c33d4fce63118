"""A modeled host tier for ``hybridkv simulate --host-memory``: counted, not replayed.

What the device pool evicts is demoted to a host-tier index: an
``EntryLedger`` of hit units keyed ``(block hash, group)``, sized in real
unit bytes (a group's block over its layers) under the host budget, least
recently used out. The index is fed by the manager's KV events: each
``BlockRemoved`` key (a cached block the pool evicted) is stored, and a
unit already held is touched.

At each lookup of a request (``ShadowTieredManager.get_computed_blocks``,
before the allocation that follows it), its hit across device *and* host is
found by the coordinator's rule: a fixed point over the groups, each group's
hit being the longest end whose needed blocks (``first_needed_block``: all
blocks for full attention, the window's for sliding, the state at the end for
Mamba) are all on the device or in the index. At its first admission, the
tokens past the device hit of its last lookup are the request's *host hit*;
the units they read are touched.

A shadow, not a replay: the host-hit tokens are still computed in the replay,
so the device pool ends up holding the same blocks as a load would have left
there, but the modeled TTFT and throughput include no host tier (no loads, no
saved prefill), and what the host would demote on its own eviction (disk) is not
modeled. Demotion is not steered by the cache policy yet (every evicted unit is
offered, LRU in the host): ``docs/tiers.md`` says what the next slice wires.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hybridkv.cache_manager.kv_cache_blocks import KVCacheBlocks
from hybridkv.cache_manager.kv_cache_manager import KVCacheManager
from hybridkv.coordinators.tiered_hit import tiered_hit_length
from hybridkv.core.events import BlockRemoved, KVCacheEvent
from hybridkv.core.request import Request
from hybridkv.managers.base import SingleTypeKVCacheManager
from hybridkv.specs import MambaSpec
from hybridkv.specs.config import KVCacheConfig
from hybridkv.tiers.ledger import EntryLedger


def unit_bytes(config: KVCacheConfig) -> list[int]:
    """Bytes of one block's unit per group: its real page (a Mamba state unpadded)
    over every layer of the group."""
    out = []
    for group in config.kv_cache_groups:
        spec = group.kv_cache_spec
        page = spec.state_size_bytes if isinstance(spec, MambaSpec) else spec.page_size_bytes
        out.append(page * len(group.layer_names))
    return out


class ShadowTieredManager(KVCacheManager):
    """The replay's manager with a host-tier model watching its lookups: each
    ``get_computed_blocks`` first demotes what the pool evicted since the last
    one, then notes the hit across device and host (``HostTierModel.lookup``).
    Decisions are ``KVCacheManager``'s own."""

    host: HostTierModel | None = None

    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int]:
        blocks, hit = super().get_computed_blocks(request)
        if self.host is not None:
            self.host.demote(self.take_events())
            self.host.lookup(
                request.request_id, request.live_block_hashes, request.num_tokens - 1, hit
            )
        return blocks, hit


class HostTierModel:
    """The host-tier index of one replay (module docstring)."""

    def __init__(
        self,
        config: KVCacheConfig,
        managers: Sequence[SingleTypeKVCacheManager],
        device_cached: Sequence[Mapping[bytes, object]],
        budget_bytes: int,
    ) -> None:
        self.index = EntryLedger(budget_bytes)
        self.unit_bytes = unit_bytes(config)
        self.managers = managers
        self.device_cached = device_cached
        self.hit_tokens = 0
        self.demoted = 0
        self.too_big = 0  # units larger than the whole host budget
        self._pending: dict[str, tuple[int, int, list[bytes]]] = {}

    def demote(self, events: Sequence[KVCacheEvent]) -> None:
        """Store every unit the device pool evicted (touch one already held)."""
        index = self.index
        for event in events:
            if not isinstance(event, BlockRemoved):
                continue
            nbytes = self.unit_bytes[event.group_id]
            for block_hash in event.block_hashes:
                key = (block_hash, event.group_id)
                if key in index:
                    index.touch(key)
                elif index.reserve(key, nbytes) is None:
                    self.too_big += 1
                else:
                    index.commit(key)
                    self.demoted += 1

    def present(self, group_id: int, block_hash: bytes) -> bool:
        return block_hash in self.device_cached[group_id] or (block_hash, group_id) in self.index

    def lookup(self, request_id: str, block_hashes: list[bytes], max_length: int, hit: int) -> None:
        """A device lookup found ``hit`` tokens: note what device and host together
        would hit now (the request may still not be admitted this step)."""
        total = tiered_hit_length(self.managers, block_hashes, max_length, self.present)
        self._pending[request_id] = (max(0, total - hit), total, block_hashes)

    def admit(self, request_id: str) -> int:
        """The request's first admission: its host-hit tokens from its last lookup
        (counted in ``hit_tokens``); the units they read are touched."""
        found = self._pending.pop(request_id, None)
        if found is None:
            return 0
        extra, total, block_hashes = found
        if extra:
            self.hit_tokens += extra
            for m in self.managers:
                bs, gid = m.block_size, m.group_id
                hashes = m.group_hashes(block_hashes)
                for i in range(m.first_needed_block(total), total // bs):
                    if (hashes[i], gid) in self.index:
                        self.index.touch((hashes[i], gid))
        return extra

    def check_integrity(self) -> None:
        self.index.check_integrity()
        assert not self.index.pinned_keys(), "the host index pins nothing"
