"""``ComputedStores``: a running request's blocks written to the shared store as
soon as a step computes them, not when the request frees them.

A conversation's next turn is sent the moment the previous turn's reply ends; on
another replica (round-robin routing) it looks the prefix up in the store before a
write made at the free would have landed. So after each step
(``TieredCache.after_step``: tokens ``[first, end)`` of a request computed, its hit
too at its first step) the policy says which of the computed blocks the store gets
now (``CachePolicy.store_on_compute``: under ``lru`` every full block, under
``hybrid`` the blocks a hit at one of the request's kept points within its prompt
needs), and ``StoreWrites`` writes them with the same rule against rewrites as the
freed blocks', so the free later writes only what was not written yet. The bytes
are copied at once and put from the store tier's thread: the step does not wait
for the network.

    a step computes tokens [s, e) of a request; P: a kept point of its prompt
    group g's blocks | ... | s//bs | ... | e//bs - 1 | e//bs (partial) |
    written now:       those in [s//bs, e//bs) that a hit at P needs
                       (full attention: every one below P; a window: the
                       last ones below P; a Mamba group: the state at P)

Null entries (a window's skipped blocks, Mamba entries without a state) and the
partial last block (no hash) are never written.
"""

from __future__ import annotations

from hybridkv.cache_manager.kv_cache_manager import KVCacheManager
from hybridkv.core.block import KVCacheBlock
from hybridkv.core.request import Request
from hybridkv.managers.points import in_spans, kept_spans
from hybridkv.offload.store_writes import StoreWrites, Valuation


class ComputedStores:
    """Writes a step's computed blocks to the store (module docstring)."""

    def __init__(self, manager: KVCacheManager, writes: StoreWrites) -> None:
        self.managers = manager.coordinator.managers
        self.policy = manager.policy
        self.writes = writes

    def computed(self, request: Request, first: int, end: int) -> None:
        """``request``'s tokens ``[first, end)`` are computed (or were its hit, for
        ``first`` 0): write the full blocks among them the policy wants shared now."""
        rid = request.request_id
        state = self.managers[0].states.get(rid)
        if state is None:  # freed in the step (finished): the free wrote its blocks
            return
        decision = self.policy.store_on_compute(rid, state.kept, request.num_prompt_tokens)
        if decision is None:
            return
        value = decision.value

        def valued(_: KVCacheBlock) -> float:
            return value

        blocks: list[tuple[KVCacheBlock, Valuation]] = []
        for m in self.managers:
            st = m.states.get(rid)
            if st is None:
                continue
            bs = m.block_size
            spans = None
            if decision.points is not None:
                spans = kept_spans(decision.points, m.first_needed_block, bs)
            lo = first // bs
            for i, b in enumerate(st.blocks[lo : end // bs], start=lo):
                if b.is_null or b.block_hash is None:
                    continue
                if spans is None or in_spans(spans, i):
                    blocks.append((b, valued))
        if blocks:
            self.writes.write(blocks)
