"""``PendingStores``: copies out of device blocks that have not landed yet.

A write-through or swap store (``write_through.py``, ``swap.py``) copies a
device block into the host tier asynchronously, while the next steps run.
Nothing writes a full, computed block again except the pool handing it out
for reuse (``BlockPool.on_take``), so that is where such a store is waited
for: ``before_reuse`` orders the reuse after every store still reading a
taken block (``StreamOrder.after``: on CUDA the current stream waits on the
copy's event, elsewhere the host waits). ``poll`` drops the stores that have
landed. The tier entry is pinned by its own transfer until it settles, so a
store in flight is never evicted.

    block ids --> [Transfer, ...]     (each one store still reading that block)
"""

from __future__ import annotations

from hybridkv.core.block import KVCacheBlock
from hybridkv.offload.stream_order import StreamOrder
from hybridkv.tiers import Transfer


class PendingStores:
    """Stores still reading device blocks, by block id (module docstring)."""

    def __init__(self, order: StreamOrder) -> None:
        self.order = order
        self._by_block: dict[int, list[Transfer]] = {}
        #: Stores still in flight that a reuse had to be ordered after (a batch's
        #: one transfer once per reuse call, however many of its blocks it takes).
        self.waited = 0

    def __len__(self) -> int:
        return sum(len(ts) for ts in self._by_block.values())

    def add(self, block: KVCacheBlock, transfer: Transfer) -> None:
        """``transfer`` reads ``block`` (a no-op if it is done already)."""
        if not transfer.done():
            self._by_block.setdefault(block.block_id, []).append(transfer)

    def add_many(self, blocks: list[KVCacheBlock], transfer: Transfer) -> None:
        """``transfer`` reads every block of ``blocks`` (a row batch's one transfer;
        a no-op if it is done already: one check for them all)."""
        if not transfer.done():
            for b in blocks:
                self._by_block.setdefault(b.block_id, []).append(transfer)

    def before_reuse(self, blocks: list[KVCacheBlock]) -> None:
        """``blocks`` are about to be handed out: order that after their stores."""
        if not self._by_block:
            return
        ordered: set[Transfer] = set()  # (a group's batch reads many of the blocks)
        for b in blocks:
            pending = self._by_block.pop(b.block_id, None)
            if pending is None:
                continue
            for t in pending:
                if t not in ordered and not t.done():
                    ordered.add(t)
                    self.waited += 1
                    self.order.after(t)  # a failed store is the tier's (counted there)

    def poll(self) -> None:
        """Forget the stores that have landed."""
        for bid in [bid for bid, ts in self._by_block.items() if all(t.done() for t in ts)]:
            del self._by_block[bid]

    def wait_all(self) -> None:
        """Block until every pending store has settled (before ``persist`` / close)."""
        for ts in self._by_block.values():
            for t in ts:
                t.wait()
        self._by_block.clear()

    def check_integrity(self, blocks: list[KVCacheBlock]) -> None:
        """Every block with a pending store is a real block (``blocks``: the pool's)."""
        for bid in self._by_block:
            assert 0 < bid < len(blocks), f"a store reads block {bid}, not a pool block"
