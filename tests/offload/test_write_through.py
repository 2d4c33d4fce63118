"""``lru`` writes each computed block through to the host tier; ``hybrid`` demotes.

Under ``lru`` the step that computed a request's tokens stores every full block
in the host tier (``TieredCache.after_step``), asynchronously: with the copies
held back, the tier holds nothing yet and the pool's reuse of those blocks
waits for them (``PendingStores``), so the host gets the computed bytes, never
what the next owner writes. The partial last block is not stored. A block of a
prefix hit that the host dropped is stored again at the hit's first step; one
it holds is only touched. Under ``hybrid`` nothing is written through, and the
pool's reuse demotes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from factories import admit, toks
from tier_helpers import blocked_until_opened, compute, computed, fill, tiered_manager

from hybridkv import Request
from hybridkv.offload import BlockBytes
from hybridkv.tiers import UnitKey
from hybridkv.tiers.memory import HostMemory

MAX_LEN = 64
#: ``conftest.host_memory``: ``(block_bytes, budget bytes) -> the host tier's memory``.
MakeMemory = Callable[[BlockBytes, int], HostMemory]


def _host_bytes(tiers: object, key: UnitKey) -> bytes:
    t = tiers.host.load(key)  # type: ignore[attr-defined]
    assert t is not None and t.wait()
    return b"".join(bytes(np.asarray(p)) for p in t.result)  # tensors or arrays


def test_lru_writes_computed_blocks_through_and_reuse_waits_for_the_copies(
    host_memory: MakeMemory,
) -> None:
    kv, _, tiers, copier = tiered_manager("tiny-gemma3", max_len=MAX_LEN, make_memory=host_memory)
    r = Request("a", toks(MAX_LEN - 5))  # a partial last block
    admit(kv, r)
    want = fill(kv, tiers, r)
    copier.gate.clear()
    computed(tiers, r)
    assert tiers.stats.written_through == len(want) == len(tiers.pending)
    assert tiers.host.keys() == []  # in flight: not a tier entry yet
    tiers.check_integrity()
    kv.free(r)
    pool = kv.block_pool
    blocks = blocked_until_opened(copier, lambda: pool.get_new_blocks(pool.num_free_blocks))
    assert tiers.pending.waited > 0 and len(tiers.pending) == 0
    for b in blocks:  # the next owner writes them
        for gid in range(len(kv.kv_cache_config.kv_cache_groups)):
            for p in tiers.block_bytes.parts(gid, b.block_id):
                p.fill_(0xAB)
    held = {(k.group_id, k.block_hash) for k in tiers.host.keys()}  # noqa: SIM118 (a list)
    assert held == set(want)  # every full block, not the partial one
    for gid, h in want:
        assert _host_bytes(tiers, UnitKey(h, gid)) == want[(gid, h)]
    assert tiers.stats.demoted == 0
    pool.free_blocks(blocks)
    tiers.check_integrity()
    tiers.close()


def test_a_steps_blocks_of_every_request_are_one_batch(host_memory: MakeMemory) -> None:
    kv, _, tiers, _ = tiered_manager("tiny-gemma3", max_len=MAX_LEN, make_memory=host_memory)
    rs = [Request("a", toks(40)), Request("b", toks(40, start=1000))]
    want: dict[Any, bytes] = {}
    for r in rs:
        admit(kv, r)
        want |= fill(kv, tiers, r, seed=len(want))
    tiers.after_step([(r, 0, r.num_tokens) for r in rs], 80, 80, 0.0)
    tiers.pending.wait_all()
    groups = {gid for gid, _ in want}
    assert tiers.stats.written_through == tiers.host.stats.stores == len(want)
    # one transfer per group, both requests' units, all in one call: rows (one gather
    # per layer) over a SlabMemory, parts (``store_parts``: the CUDA path's shape) else
    assert tiers.host.copies.store.calls == 1
    assert tiers.host.copies.store.batches == len(groups) > 1
    for gid, h in want:
        assert _host_bytes(tiers, UnitKey(h, gid)) == want[(gid, h)]
    for r in rs:
        kv.free(r)
    tiers.check_integrity()
    tiers.close()


def test_a_failed_store_keeps_nothing_and_the_reuse_goes_on(host_memory: MakeMemory) -> None:
    kv, _, tiers, copier = tiered_manager("tiny-gemma3", max_len=MAX_LEN, make_memory=host_memory)
    r = Request("a", toks(MAX_LEN - 8))
    admit(kv, r)
    want = fill(kv, tiers, r)
    copier.fail = True  # every copy raises
    computed(tiers, r)
    kv.free(r)
    pool = kv.block_pool
    pool.free_blocks(pool.get_new_blocks(pool.num_free_blocks))  # waits for the failed stores
    assert len(tiers.pending) == 0
    assert tiers.host.keys() == [] and tiers.host.used_bytes == 0
    assert tiers.host.stats.store_failures == len(want) and tiers.host.stats.stores == 0
    tiers.check_integrity()
    tiers.close()


def test_a_hit_block_the_host_dropped_is_stored_again(host_memory: MakeMemory) -> None:
    kv, _, tiers, _ = tiered_manager("tiny-gemma3", max_len=MAX_LEN, make_memory=host_memory)
    prompt = toks(MAX_LEN - 8)
    want = compute(kv, tiers, Request("a", prompt))
    tiers.pending.wait_all()
    b = Request("b", [*prompt, 1, 2, 3, 4])
    hit, _ = admit(kv, b)  # a device hit on a's blocks
    assert hit > 0
    mine = {
        (g, blk.block_hash)
        for g, table in enumerate(kv.get_blocks("b").blocks)
        for blk in table
        if blk.block_hash is not None and not blk.is_null
    }
    dropped = min(mine & set(want))  # a block of b's hit
    assert tiers.host.evict(UnitKey(dropped[1], dropped[0]))
    stores = tiers.host.stats.stores
    computed(tiers, b)  # its first step: the hit's blocks are offered too
    tiers.pending.wait_all()
    held = {(k.group_id, k.block_hash) for k in tiers.host.keys()}  # noqa: SIM118 (a list)
    assert dropped in held and mine <= held
    # One store for the dropped block and one per new block; the others were touched.
    assert tiers.host.stats.stores - stores == len(mine - set(want)) + 1
    tiers.check_integrity()
    tiers.close()


def test_hybrid_demotes_on_reuse_and_writes_nothing_through() -> None:
    kv, _, tiers, _ = tiered_manager("tiny-gemma3", policy="hybrid", max_len=MAX_LEN)
    assert not kv.policy.writes_through
    r = Request("a", toks(MAX_LEN - 8))
    admit(kv, r)
    fill(kv, tiers, r)
    computed(tiers, r)
    assert tiers.stats.written_through == 0 and len(tiers.pending) == 0
    kv.free(r)
    pool = kv.block_pool
    pool.free_blocks(pool.get_new_blocks(pool.num_free_blocks))
    assert tiers.stats.demoted > 0 and tiers.host.keys()
    tiers.check_integrity()
    tiers.close()
