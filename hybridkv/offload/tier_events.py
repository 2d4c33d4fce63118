"""KV cache events for the tiers under the device pool: each tier is a ``medium``.

With KV cache events on, a router mirrors which keys each replica holds and
where. The device pool's own events say what enters and leaves its index
(``medium`` None: the publisher's, "GPU" on CUDA). ``TierEvents`` adds, for
every group kind alike, a ``BlockStored`` when a unit enters a tier and a
``BlockRemoved`` when it leaves, with the tier's medium on the wire: "CPU" for
the host tier and "STORAGE" for the disk tier (vLLM's names: its
``Medium.CPU`` / ``Medium.STORAGE``).

A tier's ``BlockStored`` is a full event, not a placeholder: the block's parent
hash, its tokens, block size and LoRA name, remembered from the device event
that cached the key (``BlockPool.on_stored``) until the key is in neither the
device index nor a tier. Rules:

- a unit is announced in a tier once its store has landed (a demotion: right
  away, it waits for it; a write-through or swap store into the host, and a
  disk store: at the next ``flush``, or just before its removal, so a removal
  never precedes its store);
- a store that refreshes a unit the tier already holds says nothing;
- a unit whose key has no remembered event (one stored before events were
  turned on, or found on disk after a restart) is not announced, so that no
  event is a placeholder.

The shared store (medium "STORE") evicts on its own and tells no one: a
landed write is announced (``written_to_store``), and its ``BlockRemoved``
follows when the store tier finds the object gone (``store_left``: lazily,
``tiers/store_watch.py``). Only keys announced here get one.
"""

from __future__ import annotations

from hybridkv.core.block_pool import BlockPool
from hybridkv.core.events import BlockRemoved, BlockStored
from hybridkv.tiers import Transfer, UnitKey

#: The wire medium of each tier (``TierStore.medium``), as vLLM names them; the
#: store that replicas share (``MooncakeTier``) has no vLLM name: "STORE".
WIRE_MEDIUM = {"CPU": "CPU", "DISK": "STORAGE", "STORE": "STORE"}


class _Meta:
    """What a key's ``BlockStored`` carries besides its hash."""

    __slots__ = ("block_size", "lora_name", "parent", "token_ids")

    def __init__(
        self, parent: bytes | None, token_ids: list[int], block_size: int, lora_name: str | None
    ) -> None:
        self.parent = parent
        self.token_ids = token_ids
        self.block_size = block_size
        self.lora_name = lora_name


class TierEvents:
    """The tiers' events, appended to the pool's queue (module docstring)."""

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        self._meta: dict[tuple[int, bytes], _Meta] = {}
        #: Units announced per tier medium ("CPU", "DISK").
        self._held: dict[str, set[UnitKey]] = {"CPU": set(), "DISK": set()}
        #: Stores not announced yet: (medium, key) -> its transfer.
        self._pending: dict[tuple[str, UnitKey], Transfer] = {}
        #: Units queued for the disk tier whose store has not begun (a host eviction's spill).
        self._queued: set[UnitKey] = set()
        #: Units announced in the shared store and not reported gone since.
        self._in_store: set[UnitKey] = set()
        pool.on_stored = self.remember

    def remember(
        self,
        hashes: list[bytes],
        parent: bytes | None,
        token_ids: list[int],
        block_size: int,
        lora_name: str | None,
        group_id: int,
    ) -> None:
        """``BlockPool.on_stored``: keep each new device key's event fields."""
        for i, h in enumerate(hashes):
            tokens = list(token_ids[i * block_size : (i + 1) * block_size])
            self._meta[(group_id, h)] = _Meta(parent, tokens, block_size, lora_name)
            parent = h

    def stored(self, key: UnitKey, medium: str) -> None:
        """``key`` landed in the ``medium`` tier (a new entry there)."""
        meta = self._meta.get((key.group_id, key.block_hash))
        held = self._held[medium]
        if meta is None or key in held:
            return
        held.add(key)
        self._announce(key, meta, medium)

    def _announce(self, key: UnitKey, meta: _Meta, medium: str) -> None:
        self.pool.events.append(
            BlockStored(
                block_hashes=[key.block_hash],
                parent_block_hash=meta.parent,
                token_ids=meta.token_ids,
                block_size=meta.block_size,
                lora_name=meta.lora_name,
                group_id=key.group_id,
                medium=WIRE_MEDIUM[medium],
            )
        )

    def queued(self, key: UnitKey) -> None:
        """``key`` is queued for the disk tier or the store (its fields are kept meanwhile)."""
        self._queued.add(key)

    def written_to_store(self, key: UnitKey, landed: bool) -> None:
        """A write of ``key`` to the shared store (``queued`` before) ended; a landed
        one is a ``BlockStored`` with the store's medium, unless announced there
        already. Its fields are not kept: its ``BlockRemoved`` needs none."""
        self._queued.discard(key)
        meta = self._meta.get((key.group_id, key.block_hash))
        if landed and meta is not None and key not in self._in_store:
            self._in_store.add(key)
            self._announce(key, meta, "STORE")
        self.forget(key)

    def store_left(self, key: UnitKey) -> None:
        """The store tier found ``key`` gone (``MooncakeTier.take_gone``): a
        ``BlockRemoved`` with the store's medium if it was announced there."""
        if key in self._in_store:
            self._in_store.discard(key)
            self.pool.events.append(
                BlockRemoved(block_hashes=[key.block_hash], group_id=key.group_id, medium="STORE")
            )

    def unqueued(self, keys: list[UnitKey]) -> None:
        """Queued disk stores that will not happen (the write failed)."""
        for key in keys:
            self._queued.discard(key)
            self.forget(key)

    def storing_on_disk(self, key: UnitKey, transfer: Transfer) -> None:
        """A store into the disk tier began (announced once it lands: ``flush``)."""
        self._queued.discard(key)
        self.storing(key, transfer, "DISK")

    def storing(self, key: UnitKey, transfer: Transfer, medium: str) -> None:
        """A store into the ``medium`` tier began (announced once it lands: ``flush``)."""
        self._pending[medium, key] = transfer

    def flush(self, wait: bool = False) -> None:
        """Announce the stores that have landed (``wait``: all of them, once they
        settle); drop the failed ones (their fields too, unless something holds them)."""
        for (medium, key), transfer in list(self._pending.items()):
            if wait:
                transfer.wait()
            if transfer.done():
                del self._pending[medium, key]
                if transfer.error is None:
                    self.stored(key, medium)
                else:
                    self.forget(key)

    def removed(self, key: UnitKey, medium: str) -> None:
        """``LedgerTier.on_removed``: ``key`` left the ``medium`` tier."""
        if self._pending.pop((medium, key), None) is not None:
            self.stored(key, medium)  # an entry that left was committed: announce it first
        held = self._held[medium]
        if key in held:
            held.discard(key)
            self.pool.events.append(
                BlockRemoved(
                    block_hashes=[key.block_hash],
                    group_id=key.group_id,
                    medium=WIRE_MEDIUM[medium],
                )
            )
        self.forget(key)

    def forget(self, key: UnitKey, leaving: bool = False) -> None:
        """Drop ``key``'s remembered fields once nothing holds it: no tier (nor a store
        on its way to one) and no device block. ``leaving``: the key's device block is
        about to be reused (still in the index), so only another block of the same
        key (a duplicate) keeps it on the device."""
        gid, h = key.group_id, key.block_hash
        on_device = self.pool.duplicates.get((gid, h)) if leaving else h in self.pool.cached[gid]
        if on_device or self._holds(key):
            return
        self._meta.pop((gid, h), None)

    def _holds(self, key: UnitKey) -> bool:
        """A tier holds ``key`` or will (announced, being stored or queued)."""
        return (
            any((medium, key) in self._pending for medium in self._held)
            or key in self._queued
            or any(key in held for held in self._held.values())
        )

    def check_integrity(self) -> None:
        """Every announced unit has its remembered fields."""
        for medium, held in self._held.items():
            for key in held:
                assert (key.group_id, key.block_hash) in self._meta, f"{medium}: {key} lost"
