"""A running request's blocks reach the store when a step computes them
(``ComputedStores``, ``CachePolicy.store_on_compute``), byte for byte.

Replica A computes a request's prompt (its blocks filled with known bytes, the
step told to the tiers) and does not free it. Replica B then hits the prefix from
the store while A's request still runs: under ``lru`` every full block, under
``hybrid`` up to A's prompt-end kept point, holding exactly A's bytes. When A's
request ends, the free writes only what the compute did not write.
"""

from __future__ import annotations

import pytest
from factories import admit, toks
from tier_helpers import computed, fill, store_replica

from hybridkv import KVCacheManager, Request
from hybridkv.offload import TieredCache
from hybridkv.tiers import MooncakeTier

MAX_LEN = 64


def _replica(name: str, policy: str, client: MooncakeTier) -> tuple[KVCacheManager, TieredCache]:
    kv, _, tiers = store_replica(name, client, MAX_LEN, policy)
    return kv, tiers


def _expected_hit(kv: KVCacheManager, r: Request, policy: str) -> int:
    """What B hits while A's ``r`` runs: ``lru`` every full block of the prompt a
    hit can use (``hit_step``), ``hybrid`` A's last kept point in its prompt."""
    managers = kv.coordinator.managers
    if policy == "lru":
        step = max(m.block_size for m in managers)
        return r.num_prompt_tokens - r.num_prompt_tokens % step
    kept = managers[0].states[r.request_id].kept
    return max(p for p in kept if p <= r.num_prompt_tokens)


@pytest.mark.parametrize(
    ("name", "policy"),
    [
        ("tiny-gemma3", "lru"),
        ("tiny-gemma3", "hybrid"),
        ("tiny-jamba", "hybrid"),
        ("tiny-llama4", "hybrid"),
    ],
)
def test_replica_b_hits_while_replica_a_s_request_runs(
    name: str, policy: str, store_clients: list[MooncakeTier]
) -> None:
    kv_a, tiers_a = _replica(name, policy, store_clients[0])
    kv_b, tiers_b = _replica(name, policy, store_clients[1])
    prompt = toks(MAX_LEN - 8, start=1000 + 100 * len(policy) + len(name))
    a = Request("a", prompt)
    admit(kv_a, a)
    want = fill(kv_a, tiers_a, a)
    assert tiers_a.store_writes is not None
    tiers_a.store_writes.settle(wait=True)
    assert tiers_a.stats.store_writes == 0  # nothing before the step is told

    computed(tiers_a, a)  # the step ran; ``a`` still runs (not freed)
    tiers_a.store_writes.settle(wait=True)
    written = tiers_a.stats.store_writes
    assert written > 0

    later = Request("b", [*prompt, 1, 2])
    expected = _expected_hit(kv_a, a, policy)
    assert expected > 0
    assert tiers_b.prepare(later, wait=True)
    blocks, hit = kv_b.get_computed_blocks(later)
    assert hit == expected and tiers_b.stats.store_hit_tokens == expected
    assert tiers_b.stats.load_failures == 0
    for gid, table in enumerate(blocks.blocks):
        for b in table:
            if not b.is_null:
                parts = tiers_b.block_bytes.parts(gid, b.block_id)
                assert b"".join(bytes(p.numpy()) for p in parts) == want[(gid, b.block_hash)]

    kv_a.free(a)  # the free writes only what the compute did not
    tiers_a.store_writes.settle(wait=True)
    assert tiers_a.store is not None
    assert tiers_a.stats.store_writes == len(set(tiers_a.store.keys()))
    if policy == "lru":
        assert tiers_a.stats.store_writes == written  # every block was written at compute
    for kv, tiers in ((kv_a, tiers_a), (kv_b, tiers_b)):
        kv.check_integrity()
        tiers.check_integrity()
        tiers.close()


def test_a_policy_that_shares_nothing_at_compute_writes_at_the_free(
    store_clients: list[MooncakeTier],
) -> None:
    """``store_on_compute`` None (``CachePolicy``'s default): the step writes
    nothing; the free writes what ``store_value`` values, as before."""
    kv, tiers = _replica("tiny-gemma3", "lru", store_clients[0])
    kv.policy.store_on_compute = lambda *_: None  # type: ignore[method-assign]
    a = Request("a", toks(MAX_LEN - 8, start=7000))
    admit(kv, a)
    want = fill(kv, tiers, a)
    computed(tiers, a)
    assert tiers.store_writes is not None
    tiers.store_writes.settle(wait=True)
    assert tiers.stats.store_writes == 0
    kv.free(a)
    tiers.store_writes.settle(wait=True)
    assert tiers.store is not None
    assert {(k.group_id, k.block_hash) for k in tiers.store.keys()} == set(want)  # noqa: SIM118
    tiers.check_integrity()
    tiers.close()
