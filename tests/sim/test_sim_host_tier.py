"""``simulate --host-memory``: a modeled host tier under the device pool (a shadow count).

- With no room in the host, it adds nothing and the replay is unchanged.
- With an unbounded host, device + host hits reach what an unbounded device hits
  (every unit the pool evicted is still somewhere): the lookup across tiers is the
  coordinator's rule.
- With a device-only presence, the lookup across tiers is exactly the coordinator's.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from hybridkv import KVCacheManager, Request
from hybridkv.layouts import shipped_layout
from hybridkv.planning import plan_kv_cache
from hybridkv.sim import CostModel, SimOptions, device_profile, load_trace, replay_trace
from hybridkv.sim.host_tier import tiered_hit_length, unit_bytes
from hybridkv.sim.table import render_results

LAYOUT = shipped_layout("tiny-jamba")
COST = CostModel.from_layout(LAYOUT, device_profile("h100"), active_params=1e9)
TIGHT = int(2.2 * 2**20)  # 281 blocks: the pool evicts documents that come back later


def rows() -> list[dict]:
    """80 requests over 30 documents of 240 tokens (one Mooncake hash id each)."""
    rng = random.Random(0)
    return [
        {
            "timestamp": 50 * i,
            "input_length": 240,
            "output_length": 4,
            "hash_ids": [rng.randrange(30)],
        }
        for i in range(80)
    ]


def replay(write_trace, memory: int, policy: str, host: int | None):
    options = SimOptions(memory_bytes=memory, policy=policy, host_memory_bytes=host, max_num_seqs=4)
    return replay_trace(LAYOUT, load_trace(write_trace(rows())), options, COST)


@pytest.mark.parametrize("policy", ["lru", "hybrid"])
def test_a_host_without_room_adds_nothing_and_changes_nothing(write_trace, policy):
    plain = replay(write_trace, TIGHT, policy, None)
    shadow = replay(write_trace, TIGHT, policy, 1)  # no unit fits in one byte
    assert shadow.host_hit_tokens == shadow.host_used_bytes == shadow.host_demoted_units == 0
    same = {"host_memory_bytes", "host_hit_tokens", "replay_seconds"}
    for field in dataclasses.fields(plain):
        if field.name not in same:
            assert getattr(shadow, field.name) == getattr(plain, field.name), field.name


@pytest.mark.parametrize("policy", ["lru", "hybrid"])
def test_an_unbounded_host_reaches_the_unbounded_device_hit(write_trace, policy):
    unbounded = replay(write_trace, 1 << 30, policy, None)
    tight = replay(write_trace, TIGHT, policy, None)
    assert tight.hit_tokens < unbounded.hit_tokens  # the pool did evict what came back
    tiered = replay(write_trace, TIGHT, policy, 1 << 40)
    assert tiered.hit_tokens == tight.hit_tokens  # a shadow: the replay is unchanged
    assert tiered.hit_tokens + tiered.host_hit_tokens == unbounded.hit_tokens
    small = replay(write_trace, TIGHT, policy, 200_000)
    assert 0 < small.host_hit_tokens < tiered.host_hit_tokens
    assert 0 < small.host_used_bytes <= 200_000 < tiered.host_used_bytes
    # The same evictions: an unbounded host takes each unit once, a small one again after
    # dropping it.
    assert small.host_demoted_units >= tiered.host_demoted_units > 0
    report = render_results([tiered], "trace.jsonl")
    assert "+ host hits" in report and f"{100 * tiered.host_hit_rate:.2f}%" in report


def test_the_lookup_across_tiers_is_the_coordinators_rule_on_the_device() -> None:
    plan = plan_kv_cache(LAYOUT, 3 << 20, block_size=16)
    manager = KVCacheManager(plan.kv_cache_config, 256)
    coordinator = manager.coordinator
    rng = random.Random(1)
    docs = [[rng.randrange(1000) for _ in range(200)] for _ in range(6)]
    live: list[Request] = []
    hits = []
    cached = manager.block_pool.cached  # the pool's index, one dict per group

    def on_device(group: int, block_hash: bytes) -> bool:
        return block_hash in cached[group]

    for i in range(60):  # a workload that caches, evicts and frees
        doc = docs[rng.randrange(len(docs))]
        req = Request(f"r{i}", doc[: rng.randrange(20, 200)] + [5000 + i] * rng.randrange(1, 30))
        blocks, hit = manager.get_computed_blocks(req)
        total = tiered_hit_length(
            coordinator.managers, req.block_hashes, req.num_tokens - 1, on_device
        )
        assert total == hit, (i, total, hit)
        hits.append(hit)
        if manager.allocate_slots(req, req.num_tokens - hit, hit, blocks) is not None:
            req.num_computed_tokens = req.num_tokens
            live.append(req)
        if len(live) > 3 or (live and rng.random() < 0.5):
            manager.free(live.pop(0))
    assert sum(h > 0 for h in hits) >= 20 and 0 in hits[10:]  # hits, and misses after evictions
    assert unit_bytes(plan.kv_cache_config)[0] > 0
