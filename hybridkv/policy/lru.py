"""``LruPolicy``: every computed block is cached; the least recently used goes first.

vLLM 0.33's decisions, block for block: running requests hold only what their
next query reads, nothing is kept for later beyond the prefix cache itself, and
a freed request's tables return one group at a time, in group order, each tail
first (one ``free_blocks`` call per group: the pool puts each call's hashless
blocks at the head of the free queue, so a later group's go before an earlier
one's). ``tests/test_lru_is_vllm.py`` holds worked examples.

With tiers under the pool it writes through, as vLLM's ``OffloadingConnector``
does: each block is stored in the host tier once computed (``writes_through``),
so nothing is demoted when the pool reuses a block (``demotion_value`` None);
a store shared by replicas gets each block as it is computed too (``store_on_compute``).
"""

from __future__ import annotations

from hybridkv.core.block import KVCacheBlock
from hybridkv.policy.base import CachePolicy, ComputeStores, ReleaseRun, Tables


class LruPolicy(CachePolicy):
    """Recency only (module docstring)."""

    name = "lru"
    keeps_points = False
    writes_through = True

    def release(
        self,
        request_id: str,
        tables: Tables,
        block_hashes: list[bytes] | None,
        num_tokens: int | None,
    ) -> list[ReleaseRun]:
        """One run per group, in group order, each its table's tail first
        (skipped blocks, already released, excluded)."""
        return [ReleaseRun(st.blocks[st.num_skipped :][::-1]) for _, st in tables]

    def demotion_value(self, block: KVCacheBlock) -> float | None:
        """None: a block was written through when computed, nothing is demoted."""
        return None

    def store_value(self, block: KVCacheBlock) -> float | None:
        """1.0: every freed block is written to a shared store (plain LRU there)."""
        return 1.0

    def store_on_compute(
        self, request_id: str, kept: tuple[int, ...], num_prompt_tokens: int
    ) -> ComputeStores:
        """Every full block, as it is computed (the store's write-through)."""
        return ComputeStores(None, 1.0)

    def check_integrity(self, live: set[str]) -> None:
        """Nothing to check: the policy keeps no state."""
