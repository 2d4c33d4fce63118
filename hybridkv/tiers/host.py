"""``HostTier``: hit units in host RAM, under a byte budget.

Each entry is one buffer holding its parts back to back (``BufferPool``:
reused by size, never more than the budget held). Copies run asynchronously
through a ``HostMemory``: ``BytesMemory`` (bytes-like parts, a copy thread;
no torch) or ``TorchHostMemory`` (tensors; on CUDA pinned buffers and a copy
stream, on the CPU a copy thread). Eviction follows the ledger's order:
least recently used, or the caller's ``ranking`` (``ledger.value_per_byte``).

    tier = HostTier(fingerprint, 8 << 30)
    t = tier.store(UnitKey(block_hash, group_id), [k_page, v_page], value=saved)
    ...
    t = tier.load(key, into=[k_dst, v_dst])   # None: a miss
    if t is not None and t.wait(): ...        # False: failed, recompute
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hybridkv.tiers.base import Parts, UnitKey
from hybridkv.tiers.copier import Copier, InlineCopier
from hybridkv.tiers.fingerprint import ModelFingerprint
from hybridkv.tiers.ledger import Ranking
from hybridkv.tiers.ledger_tier import LedgerTier
from hybridkv.tiers.memory import BufferPool, BytesMemory, HostMemory
from hybridkv.tiers.transfer import Completion


class HostTier(LedgerTier):
    """Hit units in host memory (module docstring)."""

    medium = "CPU"

    def __init__(
        self,
        fingerprint: ModelFingerprint,
        budget_bytes: int,
        memory: HostMemory | None = None,
        ranking: Ranking | None = None,
        copier: Copier | None = None,
    ) -> None:
        self._memory: HostMemory = memory if memory is not None else BytesMemory()
        copier = copier if copier is not None else self._memory.make_copier()
        super().__init__(fingerprint, budget_bytes, copier, ranking)
        self._pool = BufferPool(budget_bytes, self._memory.allocate)
        self._entries: dict[UnitKey, tuple[Any, tuple[int, ...]]] = {}  # key -> (buffer, sizes)

    def _measure(self, key: UnitKey, parts: Parts) -> tuple[int, tuple[int, ...]]:
        sizes = self._memory.nbytes(parts)
        return sum(sizes), sizes

    def _begin_store(self, key: UnitKey, parts: Parts, sizes: tuple[int, ...]) -> Completion:
        buf = self._pool.get(sum(sizes))
        try:
            completion = self._memory.begin_store(buf, parts, self._copier)
        except BaseException:
            self._pool.put(buf, sum(sizes))
            raise
        self._entries[key] = (buf, sizes)
        return completion

    def _begin_load(self, key: UnitKey, into: Sequence[Any] | None) -> Completion:
        buf, sizes = self._entries[key]
        return self._memory.begin_load(buf, sizes, into, self._copier)

    def _read_now(self, key: UnitKey) -> Sequence[Any]:
        buf, sizes = self._entries[key]
        parts, error = self._memory.begin_load(buf, sizes, None, InlineCopier()).outcome()
        if error is not None:
            raise error
        return parts

    def _drop(self, key: UnitKey) -> None:
        buf, sizes = self._entries.pop(key)
        self._pool.put(buf, sum(sizes))

    def _check_storage(self, keys: set[UnitKey]) -> None:
        held = set(self._entries)
        assert keys <= held, f"committed entries without a buffer: {keys - held}"
        self._pool.check_integrity(sum(sum(s) for _, s in self._entries.values()))
        assert self._pool.in_use_bytes == self.used_bytes, (
            self._pool.in_use_bytes,
            self.used_bytes,
        )

    @property
    def held_bytes(self) -> int:
        """Host memory this tier holds: entries plus free buffers kept for reuse."""
        return self._pool.held_bytes
