"""``KVCacheBlock``: the metadata of one page (preallocated, never recreated)."""

from __future__ import annotations


class KVCacheBlock:
    """One block id's bookkeeping.

    - ``ref_cnt``: how many live requests hold the block in a block table.
    - ``block_hash`` / ``group_id``: set while the block is in the prefix cache
      (the cache key is ``(block_hash, group_id)``); ``None`` otherwise.
    - ``token_ids``: the block's token ids, recorded when it was cached if the
      pool checks them on hits (a non-cryptographic hash); else None.
    - ``prev_free`` / ``next_free``: intrusive links of the free queue.
    - ``free_class`` / ``evict_key``: where a cost-aware policy queued the
      free block (``hybridkv.policy.cost_aware``).
    """

    __slots__ = (
        "block_hash",
        "block_id",
        "evict_key",
        "free_class",
        "group_id",
        "is_null",
        "next_free",
        "prev_free",
        "ref_cnt",
        "token_ids",
    )

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: bytes | None = None
        self.group_id: int | None = None
        self.token_ids: list[int] | None = None
        self.prev_free: KVCacheBlock | None = None
        self.next_free: KVCacheBlock | None = None
        self.is_null = False
        self.free_class: int | None = None
        self.evict_key = 0.0

    def __repr__(self) -> str:
        h = self.block_hash.hex()[:8] if self.block_hash is not None else None
        return f"KVCacheBlock(id={self.block_id}, ref={self.ref_cnt}, hash={h})"


def num_leading_nulls(blocks: list[KVCacheBlock], null: KVCacheBlock) -> int:
    """How many entries of ``blocks`` come before the first that is not ``null``
    (a window's prefix hit is mostly leading null blocks: counted in C)."""
    k = blocks.count(null)
    if k and blocks[:k].count(null) != k:  # nulls past a real block too: walk
        k = next(i for i, b in enumerate(blocks) if b is not null)
    return k
