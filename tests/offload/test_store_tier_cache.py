"""The store tier under two managers (two replicas), byte for byte.

Replica A computes a request (its blocks filled with known bytes) and frees it:
the blocks the policy values are written to the store (``StoreWrites``), each a
``BlockStored`` with the store's medium carrying the device event's fields.
Replica B (its own pool and buffers, the store alone under them) then restores
the same hit A's device would give, holding exactly A's bytes. Blocks the policy
does not value are never written.
"""

from __future__ import annotations

from typing import Any

import pytest
from factories import admit, hit_len, toks
from tier_helpers import fill, store_replica

from hybridkv import KVCacheManager, Request
from hybridkv.core.block import KVCacheBlock
from hybridkv.core.events import BlockStored
from hybridkv.offload import TieredCache
from hybridkv.planning import KVCacheBuffers
from hybridkv.tiers import MooncakeTier

MAX_LEN = 64


def _replica(
    name: str, client: MooncakeTier, events: bool = False
) -> tuple[KVCacheManager, KVCacheBuffers, TieredCache]:
    return store_replica(name, client, MAX_LEN, events=events)


def _compute(kv: KVCacheManager, tiers: TieredCache, r: Request) -> dict[Any, bytes]:
    """Fill ``r``'s blocks, free it, wait for the store writes; cached bytes by key."""
    admit(kv, r)
    out = fill(kv, tiers, r)
    kv.free(r)
    assert tiers.store_writes is not None
    tiers.store_writes.settle(wait=True)
    return out


@pytest.mark.parametrize("name", ["tiny-gemma3", "tiny-jamba", "tiny-llama4"])
def test_replica_b_restores_replica_a_s_bytes(name: str, store_clients: list[MooncakeTier]) -> None:
    kv_a, _, tiers_a = _replica(name, store_clients[0], events=True)
    kv_b, _, tiers_b = _replica(name, store_clients[1])
    prompt = toks(MAX_LEN - 8)
    kv_a.take_events()
    want = _compute(kv_a, tiers_a, Request("a", prompt))
    later = Request("b", [*prompt, 1, 2])
    expected = hit_len(kv_a, later)
    assert expected > 0 and hit_len(kv_b, later) == 0

    assert tiers_a.store is not None and tiers_a.store.stats.stores == len(want)
    stored = [e for e in kv_a.take_events() if isinstance(e, BlockStored)]
    device = {(e.group_id, h): e for e in stored if e.medium is None for h in e.block_hashes}
    store = [e for e in stored if e.medium == "STORE"]
    assert {(e.group_id, e.block_hashes[0]) for e in store} == set(want)
    for e in store:  # full events: the device event's fields, no placeholder
        d = device[e.group_id, e.block_hashes[0]]
        i = d.block_hashes.index(e.block_hashes[0])
        parent = d.parent_block_hash if i == 0 else d.block_hashes[i - 1]
        assert e.parent_block_hash == parent
        assert e.token_ids == d.token_ids[i * d.block_size : (i + 1) * d.block_size]

    assert tiers_b.prepare(later, wait=True)
    blocks, hit = kv_b.get_computed_blocks(later)
    assert hit == expected and tiers_b.stats.store_hit_tokens == expected
    assert tiers_b.stats.loads_store > 0 and tiers_b.stats.load_failures == 0
    for gid, table in enumerate(blocks.blocks):
        for b in table:
            if not b.is_null:
                parts = tiers_b.block_bytes.parts(gid, b.block_id)
                assert b"".join(bytes(p.numpy()) for p in parts) == want[(gid, b.block_hash)]
    for kv, tiers in ((kv_a, tiers_a), (kv_b, tiers_b)):
        kv.check_integrity()
        tiers.check_integrity()
        tiers.close()


def test_only_what_the_policy_values_is_written(store_clients: list[MooncakeTier]) -> None:
    """``CachePolicy.store_value`` decides: a policy that values group 0 only gets
    group 0's units written, and no other."""
    kv, _, tiers = _replica("tiny-gemma3", store_clients[0])

    def group_0_only(block: KVCacheBlock) -> float | None:
        return 1.0 if block.group_id == 0 else None

    kv.policy.store_value = group_0_only  # type: ignore[method-assign]
    want = _compute(kv, tiers, Request("a", toks(MAX_LEN - 8, start=5000)))
    assert tiers.store is not None
    written = set(tiers.store.keys())
    assert written == {k for k in tiers.store.keys() if k.group_id == 0}  # noqa: SIM118
    assert {(k.group_id, k.block_hash) for k in written} == {k for k in want if k[0] == 0}
    assert any(k[0] != 0 for k in want)  # there was another group to leave out
    tiers.close()


def test_a_block_freed_again_soon_is_not_copied_again(store_clients: list[MooncakeTier]) -> None:
    """A hot prefix freed by request after request is copied once per
    ``rewrite_seconds``; after that it is offered again (the store may have lost it),
    and the store tier does not resend what the store still has."""
    kv, _, tiers = _replica("tiny-llama4", store_clients[0])
    assert tiers.store_writes is not None and tiers.store is not None
    prompt = toks(MAX_LEN - 8, start=9000)
    want = _compute(kv, tiers, Request("a", prompt))
    first = tiers.stats.store_writes
    assert first == len(want)
    _compute(kv, tiers, Request("b", prompt))  # hits A's blocks on the device, frees them
    assert tiers.stats.store_writes == first  # within the window: not copied again
    tiers.store_writes.rewrite_seconds = 0.0
    _compute(kv, tiers, Request("c", prompt))
    again = tiers.stats.store_writes - first
    assert again > 0  # offered again...
    assert tiers.store.store_stats.already_there == again  # ...and not resent
    tiers.check_integrity()
    tiers.close()
