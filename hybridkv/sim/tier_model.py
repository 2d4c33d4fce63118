"""``TieredCache``: the host-RAM and disk tiers of ``hybridkv simulate``.

Below the device pool sit a host tier and, optionally, a disk tier
(``TierIndex`` each), holding hit units keyed ``(block hash, group)`` in real
unit bytes (a group's block over its layers, a Mamba state unpadded). How
units get there is the policy's:

- ``write_through`` (``lru``, vLLM's ``OffloadingConnector``): each block is
  written to every tier as the device caches it (``BlockStored``), plain LRU
  in every tier; a hit touches the tier that serves it.
- demotion (``hybrid``): what the device pool evicts (``TakeLog``, the
  engine's store batches: ``_demote_batch``) is stored in the host with the
  value the policy gives it (``CachePolicy.demotion_value``, as in the
  engine): its value class, scaled
  from per page to per unit byte, and ranked as on the device (``TierIndex``:
  recency plus value). A block released ``evict_first`` (no kept point needs
  it) is offered as ``SPARE``: the host takes it only into spare room (free
  bytes or older spare units', never a valued unit's) and evicts it first
  (``hybridkv/tiers/spare.py``). On the device such a block is reused first
  and displaces nothing; demoted at the lowest class it pushed kept units out
  of a full tier (on gemma-3-27b's windows, most of what the pool evicts).
  What the host evicts goes to disk with its class, spare units excepted, and
  so does a valued unit the host has no room for (its batch's units in flight);
  a disk entry's bytes and class count its file header, as the engine's do
  (``on_disk``). KV blocks and Mamba states share the host's bytes by that
  ranking alone, with no fixed split.

``admit`` finds a request's hit across device and tiers at its first
admission by the coordinator's rule (``tiered_hit_length``): a fixed point
over the groups, each group's hit being the longest end whose needed blocks
(``first_needed_block``: all blocks for full attention, the window's for
sliding, the chunk's for chunked, the state at the end for Mamba) are each on
the device or in a tier. So a tier hit is always whole: no hit point is
reported whose units are not all somewhere. Tokens up to the device-and-host
fixed point are *host* hit tokens, beyond it up to the fixed point with disk
too *disk* hit tokens. The units to load are the needed blocks of that hit not
on the device; their load time is ``(host + disk bytes) / host_to_device +
disk bytes / disk_to_host`` (the device profile's links, one copy at a time).
A loaded unit stays where it was (a copy): under ``hybrid`` it comes back to
the host when the device evicts it again. The host's copy moves to spare room
(``TierIndex.touch``) only once the device holds the unit: when the load has
passed (``landed``), as the engine's request runs only after its loads land.
A request preempted while its load passes (the simulator models a load as
the chunks it replaces) leaves the host's copies valued, so its resume finds
them; moved at admission, they were spare and mostly evicted by then.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import NamedTuple

from hybridkv.coordinators.tiered_hit import Present, tiered_hit_length
from hybridkv.core.block import KVCacheBlock
from hybridkv.core.events import BlockStored, KVCacheEvent
from hybridkv.managers.base import SingleTypeKVCacheManager
from hybridkv.policy import class_shift, tier_value_class
from hybridkv.sim.devices import DeviceProfile
from hybridkv.sim.tier_eviction import TakenBatch
from hybridkv.sim.tier_index import TierIndex
from hybridkv.specs import MambaSpec
from hybridkv.specs.config import KVCacheConfig
from hybridkv.tiers.base import UnitKey
from hybridkv.tiers.entry_file import header_length
from hybridkv.tiers.spare import is_spare


def unit_bytes(config: KVCacheConfig) -> list[int]:
    """Bytes of one block's unit per group: its real page (a Mamba state unpadded)
    over every layer of the group."""
    out = []
    for group in config.kv_cache_groups:
        spec = group.kv_cache_spec
        page = spec.state_size_bytes if isinstance(spec, MambaSpec) else spec.page_size_bytes
        out.append(page * len(group.layer_names))
    return out


class TierLoad(NamedTuple):
    """A tier hit: tokens ``[device_hit, total)`` are loaded, not computed."""

    device_hit: int
    total: int
    host_tokens: int
    disk_tokens: int
    host_bytes: int
    disk_bytes: int
    seconds: float
    #: Host units the hit loads, to move to spare room once it lands (``landed``).
    host_units: tuple[tuple[bytes, int], ...] = ()


class TieredCache:
    """The tiers under one replay's device pool (module docstring).

    ``managers`` / ``device_cached``: the device's groups and prefix index
    (read only); ``page_bytes``: one device block id's bytes; ``weight``: the
    device free set's value weight (0: LRU in every tier; ``tier_weight``)."""

    def __init__(
        self,
        config: KVCacheConfig,
        managers: Sequence[SingleTypeKVCacheManager],
        device_cached: Sequence[Mapping[bytes, object]],
        page_bytes: int,
        device: DeviceProfile,
        host_bytes: int,
        disk_bytes: int | None,
        write_through: bool,
        weight: float,
    ) -> None:
        self.managers = managers
        self.device_cached = device_cached
        self.device = device
        self.write_through = write_through
        self.unit_bytes = unit_bytes(config)
        self.page_bytes = page_bytes
        #: Half-octave classes a unit gains per byte against a device page.
        self.class_shift = [class_shift(page_bytes, u) for u in self.unit_bytes]
        #: Parts of a group's unit (one per layer): the disk entry's header has a size each.
        self._parts = [len(g.layer_names) for g in config.kv_cache_groups]
        self.kind_of = {
            i: "mamba" if isinstance(g.kv_cache_spec, MambaSpec) else "kv"
            for i, g in enumerate(config.kv_cache_groups)
        }
        # Under demotion a host hit's unit is on the device until it is demoted again.
        self.host = TierIndex("host", host_bytes, weight, hits_to_spare=not write_through)
        self.disk = TierIndex("disk", disk_bytes, weight) if disk_bytes is not None else None
        self.tiers = [t for t in (self.host, self.disk) if t is not None]
        self.demoted = 0  # units the device evicted that went to the host

    # -- what reaches the tiers -------------------------------------------------

    def sync(self, events: Iterable[KVCacheEvent], taken: list[TakenBatch]) -> None:
        """Write through the blocks the device cached (``write_through``) or demote
        the blocks it evicted (else, ``taken``: ``TakeLog``'s batches, emptied)."""
        if self.write_through:
            for event in events:
                if isinstance(event, BlockStored):
                    nbytes = self.unit_bytes[event.group_id]
                    for h in event.block_hashes:
                        key = (h, event.group_id)
                        self.host.store(key, nbytes, 0)
                        if self.disk is not None:
                            self.disk.store(key, self.on_disk(key, 0)[0], 0)
        else:
            for batch in taken:
                self._demote_batch(batch)
        taken.clear()

    def _demote_batch(self, batch: TakenBatch) -> None:
        """Store one batch of demoted units in the host as the engine's ``Demotion``
        does: a unit stored by the batch is in flight until the batch ends, so no
        later unit of it evicts it (``pinned``), and one the host has no room for
        goes to disk (a valued one). Then the host's valued victims, in eviction
        order, and those go to disk (the engine's spills, one batch). Even a
        unit whose hash the device caches again by now (a duplicate, or
        recomputed by the request that evicted it) is stored: the engine stores
        it at the take."""
        host, shift, unit_bytes = self.host, self.class_shift, self.unit_bytes
        pinned: set[tuple[bytes, int]] = set()
        spills: list[tuple[Hashable, int, float]] = []
        overflow: list[tuple[Hashable, int, float]] = []
        for gid, h, value in batch:
            self.demoted += 1
            key, nbytes = (h, gid), unit_bytes[gid]
            cls = None if is_spare(value) else tier_value_class(value) + shift[gid]
            fresh = key not in host
            victims = host.store(key, nbytes, cls, pinned)
            if victims is None:
                if cls is not None:
                    overflow.append((key, nbytes, cls))
                continue
            if fresh:
                pinned.add(key)
            spills += [(v, u.nbytes, u.cls) for v, u in victims if u.cls is not None]
        disk = self.disk
        if disk is not None:  # one batch: in flight together, as the host's
            written: set[Hashable] = set()
            for unit, _, unit_cls in spills + overflow:
                fresh = unit not in disk
                stored = disk.store(unit, *self.on_disk(unit, unit_cls), written)  # type: ignore[arg-type]
                if fresh and stored is not None:
                    written.add(unit)

    def on_disk(self, key: tuple[bytes, int], cls: float) -> tuple[int, float]:
        """``(bytes, class)`` of a unit of host class ``cls`` as an entry of the
        engine's disk tier: its bytes with the entry file's header
        (``tiers/entry_file.header_length``), and its class shifted to those bytes
        as the disk's rule classifies it (``policy.unit_class``)."""
        h, gid = key
        nbytes = self.unit_bytes[gid] + header_length(UnitKey(h, gid), self._parts[gid])
        return nbytes, cls - self.class_shift[gid] + class_shift(self.page_bytes, nbytes)

    def _demote(self, tier: TierIndex, key: tuple[bytes, int], gid: int, cls: float | None) -> bool:
        """Store ``key`` in ``tier`` (``cls`` None: spare); the host's valued
        victims go to disk, its spare ones nowhere. False if the tier refused it."""
        victims = tier.store(key, self.unit_bytes[gid], cls)
        if victims and tier is self.host and self.disk is not None and not self.write_through:
            for victim, unit in victims:
                if unit.cls is not None:
                    self.disk.store(victim, *self.on_disk(victim, unit.cls))  # type: ignore[arg-type]
        return victims is not None

    def store_host(self, key: tuple[bytes, int], gid: int, cls: float | None) -> bool:
        """Store a unit in the host (a swap, ``sim/tier_swap.py``), with value class
        ``cls`` (None: spare, into spare room only); under demotion the host's
        valued victims go to disk. False if refused."""
        return self._demote(self.host, key, gid, cls)

    # -- hits -------------------------------------------------------------------

    def admit(
        self,
        block_hashes: list[bytes],
        max_length: int,
        device_hit: int,
        own: Sequence[Sequence[KVCacheBlock]] = (),
    ) -> TierLoad | None:
        """A request's first admission with ``device_hit`` tokens from the device:
        its tier hit (None: none), the units it loads touched. ``own``: its block
        tables per group, just allocated: the blocks it is about to compute are
        cached on the device already, and are no hit."""
        host, disk = self.host, self.disk
        on_device, in_host, anywhere = self._presence(own, device_hit)
        managers = self.managers
        host_total = tiered_hit_length(managers, block_hashes, max_length, in_host)
        total = host_total
        if disk is not None:
            total = tiered_hit_length(managers, block_hashes, max_length, anywhere)
        if total <= device_hit:
            return None
        host_total = max(host_total, device_hit)
        host_b = disk_b = 0
        later = host.hits_to_spare  # the device does not hold the units yet
        host_units = []
        for m in managers:
            bs, gid = m.block_size, m.group_id
            hashes = m.group_hashes(block_hashes)
            nbytes = self.unit_bytes[gid]
            for i in range(m.first_needed_block(total), total // bs):
                key = (hashes[i], gid)
                if on_device(gid, i, hashes[i]):
                    continue
                if key in host:
                    if later:
                        host_units.append(key)
                    else:
                        host.touch(key)
                    host_b += nbytes
                else:
                    assert disk is not None, "a hit unit must be somewhere"
                    disk.touch(key)
                    disk_b += nbytes
        dev = self.device
        seconds = (host_b + disk_b) / dev.host_to_device_bandwidth
        seconds += disk_b / dev.disk_to_host_bandwidth
        return TierLoad(
            device_hit,
            total,
            host_total - device_hit,
            total - host_total,
            host_b,
            disk_b,
            seconds,
            tuple(host_units),
        )

    def landed(self, load: TierLoad) -> None:
        """``load`` has passed: the device holds its units, so the host's copies
        (those still held) are hits now (``TierIndex.touch``: to spare room)."""
        host = self.host
        for key in load.host_units:
            if key in host:
                host.touch(key)

    def _presence(
        self, own: Sequence[Sequence[KVCacheBlock]], device_hit: int
    ) -> tuple[Present, Present, Present]:
        """``(on the device, there or in the host, anywhere)`` for a request whose
        block tables are ``own`` and whose device hit is ``device_hit`` tokens:
        its own blocks past the hit, about to be computed, are no hit."""
        cached, host, disk = self.device_cached, self.host, self.disk
        sizes = [m.block_size for m in self.managers]

        def on_device(gid: int, i: int, h: bytes) -> bool:
            b = cached[gid].get(h)
            if b is None:
                return False
            table = own[gid] if gid < len(own) else ()
            return i >= len(table) or table[i] is not b or (i + 1) * sizes[gid] <= device_hit

        def in_host(gid: int, i: int, h: bytes) -> bool:
            return (h, gid) in host or on_device(gid, i, h)

        def anywhere(gid: int, i: int, h: bytes) -> bool:
            return in_host(gid, i, h) or (disk is not None and (h, gid) in disk)

        return on_device, in_host, anywhere

    def missing_units(
        self,
        block_hashes: list[bytes],
        length: int,
        own: Sequence[Sequence[KVCacheBlock]] = (),
        device_hit: int = 0,
    ) -> list[tuple[int, int]]:
        """``(group, block index)`` of every unit a hit of ``length`` tokens needs
        that neither the device (``own`` blocks past ``device_hit`` aside) nor a
        tier holds (a whole hit: none)."""
        anywhere = self._presence(own, device_hit)[2]
        out = []
        for m in self.managers:
            bs, gid = m.block_size, m.group_id
            hashes = m.group_hashes(block_hashes)
            if length // bs > len(hashes):
                out.append((gid, len(hashes)))
                continue
            out += [
                (gid, i)
                for i in range(m.first_needed_block(length), length // bs)
                if not anywhere(gid, i, hashes[i])
            ]
        return out

    def check_integrity(self) -> None:
        for tier in self.tiers:
            tier.check_integrity()
