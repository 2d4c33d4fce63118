"""``simulate --host-memory [--disk]``: tiers replayed under the device pool.

- A host without room adds nothing and changes no figure.
- Every tier hit is whole and as long as the units allow: every unit it needs is
  on the device or in a tier, and one block more would miss one; the budgets
  hold after every sync (``check_integrity``).
- An unbounded host brings a tight device to the unbounded device's hit (closed
  arrivals, one request at a time, so timing cannot move the schedule); a disk
  under a small host serves what the host dropped.
- Loads cost their bytes over the device's links; a step never gets faster than
  its computed tokens alone; loaded tokens are not computed.
- With device presence only, the lookup is the coordinator's rule.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from hybridkv import KVCacheManager, Request
from hybridkv.coordinators.tiered_hit import tiered_hit_length
from hybridkv.layouts import shipped_layout
from hybridkv.planning import plan_kv_cache
from hybridkv.sim import CostModel, SimOptions, device_profile, load_trace, replay_trace, tier_model
from hybridkv.sim.table import render_results
from hybridkv.sim.tier_model import unit_bytes
from hybridkv.sim.tier_replay import TierReplay

LAYOUT = shipped_layout("tiny-jamba")
COST = CostModel.from_layout(LAYOUT, device_profile("h100"), active_params=1e9)
TIGHT = int(2.2 * 2**20)  # 281 blocks: the pool evicts documents that come back later
POLICIES = ["lru", "hybrid"]


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


def replay(write_trace, memory, policy, host=None, disk=None, arrivals="trace", seqs=4):
    options = SimOptions(
        memory_bytes=memory,
        policy=policy,
        host_memory_bytes=host,
        disk_bytes=disk,
        max_num_seqs=seqs,
        arrivals=arrivals,
    )
    return replay_trace(LAYOUT, load_trace(write_trace(rows())), options, COST)


@pytest.fixture
def checked(monkeypatch):
    """Every tier hit checked whole and maximal, every sync followed by
    ``check_integrity``; yields the list of loads seen."""
    loads = []
    admit, sync = tier_model.TieredCache.admit, tier_model.TieredCache.sync

    def checked_admit(self, block_hashes, max_length, device_hit, own=()):
        load = admit(self, block_hashes, max_length, device_hit, own)
        if load is not None:
            loads.append(load)
            assert load.device_hit < load.total <= max_length
            assert self.missing_units(block_hashes, load.total, own, device_hit) == []
            step = max(m.block_size for m in self.managers)
            longer = (load.total // step + 1) * step
            if longer <= max_length:
                assert self.missing_units(block_hashes, longer, own, device_hit) != []
            assert load.host_bytes + load.disk_bytes > 0
        return load

    def checked_sync(self, events, taken):
        sync(self, events, taken)
        self.check_integrity()

    monkeypatch.setattr(tier_model.TieredCache, "admit", checked_admit)
    monkeypatch.setattr(tier_model.TieredCache, "sync", checked_sync)
    return loads


@pytest.mark.parametrize("policy", POLICIES)
def test_a_host_without_room_adds_nothing_and_changes_nothing(write_trace, policy):
    plain = replay(write_trace, TIGHT, policy)
    tiered = replay(write_trace, TIGHT, policy, host=1)  # no unit fits in one byte
    assert tiered.tiers is not None and plain.tiers is None
    assert tiered.tiers.host_hit_tokens == tiered.tiers.host_used_bytes == 0
    assert tiered.tiers.load_s == 0
    for field in dataclasses.fields(plain):
        if field.name not in {"host_memory_bytes", "tiers", "replay_seconds"}:
            assert getattr(tiered, field.name) == getattr(plain, field.name), field.name


@pytest.mark.parametrize("policy", POLICIES)
def test_an_unbounded_host_reaches_the_unbounded_device_hit(write_trace, policy, checked):
    closed = {"arrivals": "closed", "seqs": 1}
    unbounded = replay(write_trace, 1 << 30, policy, **closed)
    tight = replay(write_trace, TIGHT, policy, **closed)
    assert tight.hit_tokens < unbounded.hit_tokens  # the pool did evict what came back
    tiered = replay(write_trace, TIGHT, policy, host=1 << 40, **closed)
    assert tiered.hit_tokens + tiered.host_hit_tokens == unbounded.hit_tokens
    assert checked and all(load.disk_tokens == 0 for load in checked)
    t = tiered.tiers
    assert t is not None and t.loaded_tokens == t.host_hit_tokens > 0
    # Loaded tokens are not computed.
    assert tiered.prefill_tokens == unbounded.prefill_tokens
    report = render_results([tiered], "trace.jsonl")
    assert "+ host hits" in report and f"{100 * tiered.total_hit_rate:.2f}%" in report


@pytest.mark.parametrize("policy", POLICIES)
def test_a_disk_under_a_small_host_serves_what_the_host_dropped(write_trace, policy, checked):
    small = replay(write_trace, TIGHT, policy, host=200_000)
    both = replay(write_trace, TIGHT, policy, host=200_000, disk=1 << 40)
    assert 0 < small.tiers.host_used_bytes <= 200_000  # type: ignore[union-attr]
    assert both.disk_hit_tokens > 0 and both.tiers.disk_load_bytes > 0  # type: ignore[union-attr]
    assert both.total_hit_rate > small.total_hit_rate
    # A disk byte costs its read and its copy to the device.
    dev = COST.device
    disk_loads = [load for load in checked if load.disk_bytes]
    for load in disk_loads:
        want = (load.host_bytes + load.disk_bytes) / dev.host_to_device_bandwidth
        want += load.disk_bytes / dev.disk_to_host_bandwidth
        assert load.seconds == pytest.approx(want)
    assert disk_loads


def test_a_step_never_beats_its_computed_tokens() -> None:
    tiers = TierReplay(None, [], step_overhead_s=0.002, tables=lambda rid: ())  # type: ignore[arg-type]
    assert tiers.step_seconds(0.01, 0.0) == 0.01
    assert tiers.step_seconds(0.01, 0.004) == 0.01  # the load hides behind the compute
    assert tiers.step_seconds(0.01, 0.03) == 0.03
    assert tiers.step_seconds(0.0, 0.03) == pytest.approx(0.032)  # nothing computed: overhead
    assert tiers.load_wait_s == pytest.approx(0.02 + 0.03)
    assert tiers.load_s == pytest.approx(0.064)


def test_the_lookup_across_tiers_is_the_coordinators_rule_on_the_device() -> None:
    plan = plan_kv_cache(LAYOUT, 3 << 20, block_size=16)
    manager = KVCacheManager(plan.kv_cache_config, 256)
    coordinator = manager.coordinator
    rng = random.Random(1)
    docs = [[rng.randrange(1000) for _ in range(200)] for _ in range(6)]
    live: list[Request] = []
    hits = []
    cached = manager.block_pool.cached  # the pool's index, one dict per group

    def on_device(group: int, index: int, block_hash: bytes) -> bool:
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


@pytest.mark.parametrize("layout", ["tiny-jamba", "toy-1full-3sliding"])
@pytest.mark.parametrize("seed", range(3))
def test_the_hit_is_the_longest_whose_every_needed_unit_is_held(layout, seed) -> None:
    """Against a naive reference on random holes: the longest length whose needed
    blocks (``first_needed_block`` on) are held in every group, and no longer."""
    spec = shipped_layout(layout)
    managers = KVCacheManager(
        plan_kv_cache(spec, 3 << 20, block_size=16).kv_cache_config, 4096
    ).coordinator.managers
    rng = random.Random(seed)
    hashes = [bytes([i % 256, i // 256]) for i in range(120)]
    step = max(m.block_size for m in managers)
    for _ in range(30):
        holes = {(m.group_id, i) for m in managers for i in range(200) if rng.random() < 0.04}

        def held(gid: int, index: int, block_hash: bytes, holes: set = holes) -> bool:
            return (gid, index) not in holes

        max_length = rng.randrange(1, 120 * 16)

        def whole(length: int) -> bool:
            for m in managers:
                n = len(m.group_hashes(hashes))
                end = length // m.block_size
                if end > n or any(
                    not held(m.group_id, i, b"") for i in range(m.first_needed_block(length), end)
                ):
                    return False
            return True

        want = next((n for n in range(max_length - max_length % step, 0, -step) if whole(n)), 0)
        assert tiered_hit_length(managers, hashes, max_length, held) == want


@pytest.mark.parametrize("policy", POLICIES)
def test_a_resumed_request_loads_back_what_its_preemption_dropped(write_trace, policy, checked):
    """32 requests decoding at once in 2.3 MB preempt; a resumed one reloads from the
    host, and reloads are no hits of its prompt."""
    rng = random.Random(0)
    trace = [
        {"timestamp": 0, "input_length": 160, "output_length": 90, "hash_ids": [rng.randrange(30)]}
        for _ in range(80)
    ]
    options = SimOptions(
        memory_bytes=2_300_000,
        policy=policy,
        host_memory_bytes=1 << 40,
        max_num_seqs=32,
        arrivals="closed",
    )
    r = replay_trace(LAYOUT, load_trace(write_trace(trace)), options, COST)
    t = r.tiers
    assert t is not None and r.preemptions > 0 and t.reloaded_tokens > 0
    assert t.loaded_tokens <= t.host_hit_tokens + t.reloaded_tokens
    # Every load is a first admission's hit or a resumed request's reload, never both.
    loaded = sum(load.total - load.device_hit for load in checked)
    assert loaded == t.host_hit_tokens + t.disk_hit_tokens + t.reloaded_tokens
