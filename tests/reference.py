"""Helpers for the state-machine test (``test_state_machine.py``): the config
generator and hash-free reference models.

The reference recomputes prefix hits from plain token prefixes, with no block
hashes, no right-to-left scan and no fixed point, so a bug in the hashing, a
per-kind hit rule or the cross-group intersection shows up as a disagreement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import hypothesis.strategies as st

from hybridkv import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheManager,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
)

KINDS = ("full", "sliding", "chunked", "mamba")


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class GroupDesc:
    """One KV cache group: its kind, block size and window / chunk size."""

    kind: str
    block_size: int
    param: int = 0  # sliding window W or attention chunk size C

    def first_needed(self, length: int) -> int:
        """First token that the query at position ``length`` reads (naive rule)."""
        if self.kind == "full":
            return 0
        if self.kind == "sliding":
            return max(0, length - self.param + 1)
        if self.kind == "chunked":
            return length // self.param * self.param
        return max(0, length - 1)  # mamba: only the state at ``length``

    def first_needed_block(self, length: int) -> int:
        return self.first_needed(length) // self.block_size

    def hybrid_positions(
        self, computed: int, table_len: int, tail: int, step: int
    ) -> tuple[set[int], set[int]]:
        """Under ``hybrid``: the entries that must be real (what the query reads;
        for Mamba the state read and the running state) and those that may be
        (from where the last ``tail`` tokens' hit points start; hit points are
        multiples of ``step``, every group's block size)."""
        n = max(0, computed - tail)
        may = set(range(self.first_needed_block(n - n % step), table_len))
        if self.kind == "mamba":
            must = {table_len - 1} | ({self.first_needed_block(computed)} if computed else set())
        else:
            must = set(range(self.first_needed_block(computed), table_len))
        return must, may

    def real_positions(self, computed: int, table_len: int, caching: bool) -> set[int]:
        """Table entries holding a real block after an allocation at ``computed``
        tokens: the ones a query there still reads (and, for Mamba without
        prefix caching, only the state read and the last entry)."""
        first = self.first_needed_block(computed)
        if self.kind == "mamba" and not caching:
            return {table_len - 1} | ({first} if computed else set())
        return set(range(first, table_len))

    def spec(self) -> KVCacheSpec:
        bs = self.block_size
        attn = dict(block_size=bs, num_kv_heads=1, head_size=4, dtype="float32")
        if self.kind == "full":
            return FullAttentionSpec(**attn)
        if self.kind == "sliding":
            return SlidingWindowSpec(**attn, sliding_window=self.param)
        if self.kind == "chunked":
            return ChunkedLocalAttentionSpec(**attn, attention_chunk_size=self.param)
        return MambaSpec(block_size=bs, shapes=((2,),), dtypes=("float32",))


VOCAB = 4
MAX_PROMPT = 24


@dataclass(frozen=True)
class Config:
    groups: list[GroupDesc]
    num_blocks: int
    hash_algo: str
    enable_caching: bool
    max_model_len: int
    prefixes: list[list[int]]
    max_suffix: int = 12  # a request is a shared prefix plus 1..max_suffix tokens
    cache_policy: str = "lru"
    hybrid_tail_tokens: int = 0
    hybrid_value_weight: float = 0.0
    hybrid_tail_align: int | None = 0


@st.composite
def configs(
    draw: st.DrawFn, pressure: bool = False, policy: str | None = None, roomier: bool = False
) -> Config:
    """Random configs. ``pressure``: a sliding-window group first (and at most one
    other), tiny pools, prefix caching on and long shared prefixes, so that requests
    share window blocks that one of them stops reading while the pool is full.
    ``policy``: the cache policy (default: drawn; ``lru`` under pressure).
    ``roomier`` (with ``pressure``): pools of 10-20 blocks, so that requests
    admitted with a hit run past its window (and retain blocks for it) before
    the pool runs out (``hybrid``'s shedding)."""
    groups = []
    if pressure:
        groups.append(GroupDesc("sliding", draw(st.sampled_from([1, 2])), draw(st.integers(2, 6))))
    for _ in range(draw(st.integers(0, 1) if pressure else st.integers(1, 3))):
        kind = draw(st.sampled_from(KINDS))
        param = draw(st.integers(1, 9)) if kind in ("sliding", "chunked") else 0
        groups.append(GroupDesc(kind, draw(st.sampled_from([1, 2, 4])), param))
    tokens = st.lists(st.integers(0, VOCAB - 1), min_size=8 if pressure else 2, max_size=16)
    blocks = st.integers(4, 12) if pressure else st.integers(6, 16) | st.integers(6, 48)
    tail = st.sampled_from([0, 4, 8])
    if roomier:
        blocks, tail = st.integers(10, 20), st.just(0)
    return Config(
        groups=groups,
        num_blocks=draw(blocks),  # small: evictions
        hash_algo=draw(st.sampled_from(["sha256", "xxhash"])),
        enable_caching=pressure or draw(st.sampled_from([True, True, True, False])),
        max_model_len=draw(st.sampled_from([64, 24, 32])),
        prefixes=draw(st.lists(tokens, min_size=1, max_size=3)),
        max_suffix=3 if pressure else 12,
        # The exact-None accounting (pressure) models lru's release rules.
        cache_policy=policy or ("lru" if pressure else draw(st.sampled_from(["lru", "hybrid"]))),
        hybrid_tail_tokens=draw(tail),
        hybrid_value_weight=draw(st.sampled_from([0.0, 0.5, 3.0])),
        hybrid_tail_align=draw(st.sampled_from([None, 0, 8, 16])),
    )


PrefixKey = tuple[str | None, str | None, tuple[int, ...]]


class NaiveStore:
    """Per group, the token prefixes (with salt and LoRA) whose last block some
    request computed since the last reset.

    Only blocks a request computed itself count, not the positions a prefix
    hit let it skip: a hit may be valid with nothing cached before it (a
    chunked group at a chunk boundary needs no block at all; a sliding group
    only the window), and nobody ever wrote KV for those skipped blocks.
    Counting them would let the reference promise hits no cache can give.
    """

    def __init__(self, groups: list[GroupDesc]) -> None:
        self.groups = groups
        self.prefixes: list[set[PrefixKey]] = [set() for _ in groups]
        self.step = math.lcm(*(g.block_size for g in groups))

    def clear(self) -> None:
        for s in self.prefixes:
            s.clear()

    def add_computed(
        self, salt: str | None, lora: str | None, tokens: list[int], start: int, end: int
    ) -> None:
        """A request computed tokens ``[start, end)``: every full block of each
        group that holds computed tokens is now cached (``start`` is a hit
        length, a multiple of every block size)."""
        for g, d in enumerate(self.groups):
            bs = d.block_size
            for i in range(start // bs, end // bs):
                self.prefixes[g].add((salt, lora, tuple(tokens[: (i + 1) * bs])))

    def valid(self, salt: str | None, lora: str | None, tokens: list[int], length: int) -> bool:
        """Every group has every block its query at ``length`` reads."""
        for g, d in enumerate(self.groups):
            bs = d.block_size
            store = self.prefixes[g]
            for i in range(d.first_needed_block(length), length // bs):
                if (salt, lora, tuple(tokens[: (i + 1) * bs])) not in store:
                    return False
        return True

    def longest_hit(self, salt: str | None, lora: str | None, tokens: list[int]) -> int:
        """Largest aligned ``L <= len(tokens) - 1`` valid for every group."""
        length = (len(tokens) - 1) // self.step * self.step
        while length > 0 and not self.valid(salt, lora, tokens, length):
            length -= self.step
        return length


#: A cached block's key: (group, salt, LoRA, the token prefix up to the block's end).
BlockKey = tuple[int, str | None, str | None, tuple[int, ...]]


def usable_keys(groups: list[GroupDesc], cached: set[BlockKey]) -> set[BlockKey]:
    """The cached keys that some valid prefix hit uses (``hybrid``'s "usable").

    A hit point is a prefix ``p`` (a positive multiple of every block size) of
    a cached key's token prefix, under its salt and LoRA. A hit at ``p`` is
    valid iff every group has cached every block from ``first_needed_block(p)``
    up to ``p``; it then uses exactly those blocks. A cached block no valid hit
    uses is *dead*: keeping it serves no request (its own key may still be the
    prefix of a hit point: a sliding block whose full-attention prefix is gone).
    Every non-empty needed range ends at ``p``, so no valid point that uses a
    block is missed by taking points from cached prefixes only.
    """
    step = math.lcm(*(d.block_size for d in groups))
    points = {
        (salt, lora, prefix[:p])
        for _, salt, lora, prefix in cached
        for p in range(step, len(prefix) + 1, step)
    }
    usable: set[BlockKey] = set()
    for salt, lora, tokens in points:
        length = len(tokens)
        needed = [
            (g, salt, lora, tokens[: (i + 1) * d.block_size])
            for g, d in enumerate(groups)
            for i in range(d.first_needed_block(length), length // d.block_size)
        ]
        if all(k in cached for k in needed):
            usable.update(needed)
    return usable


def snapshot(kv: KVCacheManager, request_ids: list[str]) -> tuple[object, ...]:
    """Everything an out-of-blocks ``allocate_slots`` must leave untouched."""
    pool = kv.block_pool
    blocks = tuple(
        (b.ref_cnt, b.block_hash, b.group_id, None if b.token_ids is None else tuple(b.token_ids))
        for b in pool.blocks
    )
    queue = tuple(b.block_id for b in pool.policy)
    tables = tuple(kv.get_block_ids(rid) for rid in request_ids)
    return blocks, queue, pool.num_free_blocks, tables, pool.num_cached_blocks()


def check_hybrid_release(
    old_queue: list[int],
    new_queue: list[int],
    released: list[tuple[int, int, int, bool]],
    keys: dict[int, float],
) -> None:
    """``hybrid`` (cost-aware free set): released blocks that are hashless go
    to the head; the others are either at the head too (needed by no kept
    point) or ranked among the keyed free blocks. The free blocks before keep
    their relative order, and the keyed part of the queue (``keys``: block id
    -> eviction key of blocks outside the evict-first queue) is in key order."""
    ids = {e[2] for e in released}
    hashless = {e[2] for e in released if not e[3]}
    assert sorted(new_queue) == sorted(old_queue + list(ids)), "free set != old + released"
    assert [b for b in new_queue if b not in ids] == old_queue, "old free blocks reordered"
    k = next((i for i, b in enumerate(new_queue) if b not in ids), len(new_queue))
    assert hashless <= set(new_queue[:k]), (new_queue[:k], hashless)
    keyed = [keys[b] for b in new_queue if b in keys]
    assert keyed == sorted(keyed), "keyed free blocks are not in key order"
    assert new_queue[len(new_queue) - len(keyed) :] == [b for b in new_queue if b in keys], (
        "an evict-first block sits behind a keyed one"
    )


def check_release_order(
    old_queue: list[int],
    new_queue: list[int],
    released: list[tuple[int, int, int, bool]],
) -> None:
    """Check the free queue after a request's blocks were released (``lru``).

    ``released``: (group, position, block id, hashed) of every block whose ref
    count dropped to 0. vLLM 0.33's order: each group in turn (group order), its
    blocks by position, last first, one release per group; hashed blocks go to the
    tail in that order, each group's hashless ones to the head in that order, so a
    later group's hashless blocks come before an earlier group's.
    """
    groups = sorted({e[0] for e in released})
    order = {g: sorted((e for e in released if e[0] == g), key=lambda e: -e[1]) for g in groups}
    head = [e[2] for g in reversed(groups) for e in order[g] if not e[3]]
    tail = [e[2] for g in groups for e in order[g] if e[3]]
    assert new_queue == head + old_queue + tail, (head, tail)
