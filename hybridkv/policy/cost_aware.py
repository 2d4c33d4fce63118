"""``CostAwareEvictionPolicy``: recency combined with recompute saved per byte.

The ``hybrid`` cache policy's free set (Marconi, MLSys 2025, scores prefix
cache entries by recency plus FLOP efficiency; this is the same idea on a
paged block pool). Each released block comes with a *value*: the prefill
tokens a hit saves per page the block's hit unit holds
(``hybridkv.policy.retention.UnitValues``). The block's eviction key is::

    key = released_blocks_so_far / pool_size + weight * class(value)
    class(value) = floor(2 * log2(value)) / 2        (half-octave classes)

and the free block with the smallest key is reused first. ``weight`` trades
recency for efficiency: doubling a unit's value keeps it as long as a unit
released ``weight`` pool turnovers later. Blocks released ``evict_first``
(no kept hit point needs them) and hashless blocks are reused before every
keyed block, newest first (as under LRU).

Keys only grow within a class, so each class is an LRU queue (O(1) release
and hit removal) and the next block to reuse is the smallest of the class
heads: ``take`` costs O(number of classes) per block.

With a reuse horizon (``reuse``, ``hybridkv.policy.reuse_horizon``; the
``hybrid`` policy measures it, in this free set's ``clock``), a block of a
positive class released more than the horizon ago loses its bonus: its key
falls back to ``released / pool``. Those are the oldest of their class, its
head run, so each class stays in key order.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Iterator

from hybridkv.core.block import KVCacheBlock
from hybridkv.core.eviction import EvictionPolicy
from hybridkv.core.free_queue import FreeKVCacheBlockQueue
from hybridkv.core.free_stack import FreeBlockStack
from hybridkv.policy.reuse_horizon import ReuseHorizon

#: ``value`` of blocks released without one (ranked like a unit saving one
#: token per page).
NEUTRAL_VALUE = 1.0
#: Key of blocks in the evict-first queue (``free_class`` None).
_NO_CLASS = None


def value_class(value: float) -> int:
    """Half-octave class of a positive value (``floor(2 * log2(value))``)."""
    if not value > 0:
        raise ValueError(f"value must be > 0, got {value!r}")
    return math.floor(2 * math.log2(value))


def class_shift(page_bytes: int, unit_bytes: int) -> int:
    """Half-octave classes a tier unit of ``unit_bytes`` gains against a device
    page of ``page_bytes``: a value per page is worth more per byte in a unit
    smaller than the page (a Mamba state unpadded, one group's layers)."""
    return math.floor(2 * math.log2(page_bytes / unit_bytes))


def tier_value_class(value: float) -> float:
    """Half-octaves of a positive value a tier ranks (``2 * log2(value)``), not
    floored: a class's own value (``released_value``, what the device demotes)
    gives that class exactly, a value between classes (a returning unit's factor
    rescaled to the host's bonus, ``HybridPolicy.demotion_value``; a swap's share
    of a point) its fraction, so a host keeps any share of a one-class bonus."""
    if not value > 0:
        raise ValueError(f"value must be > 0, got {value!r}")
    c = 2 * math.log2(value)
    k = round(c)
    return float(k) if abs(c - k) < 1e-9 else c  # 2 ** (k / 2) round-trips to k


def unit_class(value: float | None, unit_bytes: int, page_bytes: int) -> float:
    """A tier unit's value class (``tiers.ranking``): the half-octaves of its value
    per device page (None: ``NEUTRAL_VALUE``; ``tier_value_class``), shifted to
    its own bytes."""
    return tier_value_class(NEUTRAL_VALUE if value is None else value) + class_shift(
        page_bytes, unit_bytes
    )


def released_value(block: KVCacheBlock) -> float | None:
    """The value a free block was released with, to its half-octave class
    (the class's lower bound); None for an evict-first or hashless block."""
    cls = block.free_class
    return None if cls is _NO_CLASS else 2.0 ** (cls / 2)


class CostAwareEvictionPolicy(EvictionPolicy):
    """Free blocks ordered by recency plus value (module docstring)."""

    def __init__(
        self,
        blocks: list[KVCacheBlock],
        weight: float = 1.0,
        reuse: ReuseHorizon | None = None,
    ) -> None:
        """``weight``: pool turnovers one value doubling is worth (the ``hybrid``
        policy passes its layout's, ``HybridTuning.value_weight``); ``reuse``:
        the reuse horizon past which a bonus is dropped (None: never dropped)."""
        if not weight >= 0:
            raise ValueError(f"weight must be >= 0, got {weight!r}")
        self.weight = weight
        self.ranks_by_value = weight > 0
        self.first = FreeBlockStack(blocks)  # evict-first and hashless blocks
        for b in blocks:
            b.free_class = _NO_CLASS
        self.classes: dict[int, FreeKVCacheBlockQueue] = {}
        self.span = max(1, len(blocks))
        self.clock = 0  # keyed blocks released so far
        self._free = len(blocks)
        #: Ages (in ``clock`` ticks) past which bonuses drop (fed by the policy).
        self.reuse = reuse if weight > 0 else None

    @property
    def num_free_blocks(self) -> int:
        return self._free

    def release(
        self,
        blocks: Iterable[KVCacheBlock],
        *,
        evict_first: bool = False,
        value: float | None = None,
    ) -> None:
        first = self.first
        if evict_first:
            blocks = blocks if isinstance(blocks, list) else list(blocks)
            for b in blocks:
                b.free_class = _NO_CLASS
            first.extendleft(blocks)
            self._free += len(blocks)
            return
        cls = value_class(NEUTRAL_VALUE if value is None else value)
        q = self.classes.get(cls)
        if q is None:
            q = self.classes[cls] = FreeKVCacheBlockQueue([])
        bonus = self.weight * cls / 2
        span = self.span
        clock = self.clock
        blocks = blocks if isinstance(blocks, list) else list(blocks)
        if None in [b.block_hash for b in blocks]:  # hashless ones go first, one by one
            keyed = []
            for b in blocks:
                if b.block_hash is None:
                    b.free_class = _NO_CLASS
                    first.appendleft(b)
                    continue
                clock += 1
                b.free_class = cls
                b.evict_key = clock / span + bonus
                keyed.append(b)
        else:  # the common case: every block keyed
            keyed = blocks
            for tick, b in enumerate(blocks, clock + 1):
                b.free_class = cls
                b.evict_key = tick / span + bonus
            clock += len(blocks)
        q.extend(keyed)
        self.clock = clock
        self._free += len(blocks)

    def remove(self, block: KVCacheBlock) -> None:
        cls = block.free_class
        (self.first if cls is _NO_CLASS else self.classes[cls]).remove(block)
        self._free -= 1

    def _expiry(self) -> float | None:
        """Blocks of a positive class released (in turnovers) before this have
        lost their bonus; None: no horizon (yet)."""
        horizon = None if self.reuse is None else self.reuse.horizon
        return None if horizon is None else (self.clock - horizon) / self.span

    def _key(self, block: KVCacheBlock, cls: int, expiry: float | None) -> float:
        """``block``'s key now: its bonus dropped when released before ``expiry``."""
        key = block.evict_key
        if expiry is not None and cls > 0:
            released = key - self.weight * cls / 2
            if released < expiry:
                return released
        return key

    def take(self, n: int) -> list[KVCacheBlock]:
        if n > self._free:
            raise ValueError(f"asked for {n} blocks, {self._free} free")
        first = self.first
        k = min(n, first.num_free_blocks)
        out = first.popleft_n(k) if k else []
        classes = self.classes
        expiry = self._expiry()
        while len(out) < n:
            # The class whose head has the smallest (key, class), and the
            # runner-up key: one pass, no sort (this runs per allocation).
            best = limit = math.inf
            best_cls = 0
            q = None
            for cls, cq in classes.items():
                if not cq.num_free_blocks:
                    continue
                head = cq.head.next_free
                key = head.evict_key  # type: ignore[union-attr]
                if expiry is not None and cls > 0:
                    key = self._key(head, cls, expiry)  # type: ignore[arg-type]
                if key < best or (key == best and cls < best_cls):
                    limit = best
                    best, best_cls, q = key, cls, cq
                elif key < limit:
                    limit = key
            assert q is not None
            if expiry is not None and best < q.head.next_free.evict_key:  # type: ignore[union-attr]
                # An expired head: its class's expired run, keyed by release alone,
                # up to the runner-up (one block at least: float rounding).
                bonus = self.weight * best_cls / 2
                run = q.popleft_keyed(n - len(out), min(limit, expiry) + bonus)
                out += run or q.popleft_keyed(1, math.inf)
                continue
            # Pop the run of q's head up to the runner-up's key, at most what is missing.
            out += q.popleft_keyed(n - len(out), limit)
        self._free -= n
        return out

    def __iter__(self) -> Iterator[KVCacheBlock]:
        """The free blocks in the order ``take`` reuses them (equal keys: lower class first)."""
        yield from self.first
        expiry = self._expiry()
        yield from heapq.merge(
            *self.classes.values(),
            key=lambda b: (self._key(b, b.free_class or 0, expiry), b.free_class),
        )

    def check_integrity(self) -> None:
        self.first.check_integrity()
        total = self.first.num_free_blocks
        for b in self.first:
            assert b.free_class is _NO_CLASS, f"{b} in the evict-first queue has a class"
        for cls, q in self.classes.items():
            q.check_integrity()
            total += q.num_free_blocks
            last = -math.inf
            for b in q:
                assert b.free_class == cls, f"{b} is in class {cls}'s queue, says {b.free_class}"
                assert b.evict_key >= last, f"class {cls}: keys not in order at {b}"
                last = b.evict_key
        assert total == self._free, f"free count {self._free} != {total} queued"
        if self.reuse is not None:
            self.reuse.check_integrity()
