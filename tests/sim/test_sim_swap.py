"""``simulate --preemption-mode``: swap preemption, the engine's decision.

- The default is the engine's swap rule (``offload/swap_decision.py``): a
  unit the pool demotes on reuse (``hybrid``) or a tier holds (``lru``
  written through) is not copied, whatever the link, so on a fast link the
  default replays ``recompute`` figure for figure; ``swap`` swaps whatever the
  link; ``recompute`` is the replay without swaps.
- What the rule does copy (under ``lru``, units the host dropped) goes into
  spare room only: a swap store never evicts a valued unit.
- The ``LoadCost`` the replay uses carries the profile's link and the cost
  model's prefill time per token.
- A swapped request's units are all in a tier right after its swap, and it
  resumes with at least its swap point as its hit (an unbounded host keeps
  them).
- Byte budgets hold and ``check_integrity`` passes after every swap store, a
  disk below a small host taking the host's victims.
- Without a host tier nothing changes and ``swap`` is an error.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from hybridkv.layouts import shipped_layout
from hybridkv.offload.swap_decision import swap_units
from hybridkv.sim import (
    CostModel,
    SimOptions,
    device_profile,
    load_trace,
    replay_trace,
    tier_model,
    tier_swap,
)
from hybridkv.sim.table import render_results
from hybridkv.sim.tier_replay import TierReplay

#: Per layout, a pool that preempts under ``rows()`` under both policies.
MEMORY = {"tiny-jamba": 2_300_000, "tiny-gemma3": 1_000_000}
LAYOUTS = list(MEMORY)
POLICIES = ["lru", "hybrid"]
H100 = device_profile("h100")
SLOW = dataclasses.replace(H100, name="slow-link", host_to_device_bandwidth=1.0)
FAST = dataclasses.replace(H100, name="fast-link", host_to_device_bandwidth=1e18)


def cost_of(layout: str, device=H100) -> CostModel:
    return CostModel.from_layout(shipped_layout(layout), device, active_params=1e9)


def rows() -> list[dict]:
    """80 requests decoding at once over 30 shared 160-token documents: the
    ``MEMORY`` pools preempt (closed arrivals, 32 running)."""
    rng = random.Random(0)
    return [
        {"timestamp": 0, "input_length": 160, "output_length": 90, "hash_ids": [rng.randrange(30)]}
        for _ in range(80)
    ]


def replay(write_trace, layout, policy, mode, device=H100, host=1 << 40, disk=None):
    options = SimOptions(
        memory_bytes=MEMORY[layout],
        policy=policy,
        host_memory_bytes=host,
        disk_bytes=disk,
        max_num_seqs=32,
        arrivals="closed",
        preemption_mode=mode,
    )
    trace = load_trace(write_trace(rows()))
    return replay_trace(shipped_layout(layout), trace, options, cost_of(layout, device))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_load_cost_carries_the_profiles_link_and_prefill_time(layout) -> None:
    cost = cost_of(layout)
    load = tier_swap.profile_load_cost(cost, 8192)
    assert load.load_bandwidth == H100.host_to_device_bandwidth
    assert load.seconds_per_token == pytest.approx(cost.step([(0, 8192)]).seconds / 8192)


def _without_swaps(r):
    """``r`` with its wall time and the swap decision's own counters zeroed."""
    assert r.tiers is not None
    tiers = dataclasses.replace(r.tiers, preemption_mode=None, swaps_declined=0, swaps_unneeded=0)
    return dataclasses.replace(r, replay_seconds=0, tiers=tiers)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("policy", POLICIES)
def test_a_fast_link_copies_nothing_the_tiers_keep(write_trace, layout, policy) -> None:
    """The old rule swapped every preemption on a fast link; the pool demotes
    (``hybrid``) or the host holds (``lru``, unbounded) every unit, so the rule
    copies nothing and the replay is the recompute replay."""
    fast = replay(write_trace, layout, policy, None, FAST)
    assert fast.tiers is not None and fast.preemptions > 0
    assert fast.tiers.swaps == 0 and fast.tiers.swapped_bytes == 0
    assert fast.tiers.swaps_unneeded > 0 and fast.tiers.swaps_declined == 0
    never = replay(write_trace, layout, policy, "recompute", FAST)
    assert _without_swaps(fast) == _without_swaps(never)
    forced = replay(write_trace, layout, policy, "swap", SLOW).tiers
    assert forced is not None and forced.swaps > 0 and forced.swaps_declined == 0
    assert forced.swap_saved_s < 0  # the cost model said it would cost time


@pytest.mark.parametrize("layout", LAYOUTS)
def test_copies_take_spare_room_only(write_trace, layout, monkeypatch) -> None:
    """``lru`` with a host that turns over: units of a preempted request the host
    dropped would be lost on reuse; on a fast link they are copied, as spare,
    and no valued unit leaves the host for them."""
    store_host = tier_model.TieredCache.store_host
    calls: list[bool] = []

    def checked(self, key, gid, cls):
        assert cls is None, "the rule's copies are spare"
        valued = {k for k, u in self.host.units.items() if u.cls is not None}
        ok = store_host(self, key, gid, cls)
        assert valued <= set(self.host.units), "a swap copy evicted a valued unit"
        calls.append(ok)
        return ok

    monkeypatch.setattr(tier_model.TieredCache, "store_host", checked)
    r = replay(write_trace, layout, "lru", None, FAST, host=60_000)
    t = r.tiers
    assert t is not None and t.swaps > 0 and calls
    assert t.swapped_units == sum(calls) and t.host_spare_skips == len(calls) - sum(calls)
    assert t.host_used_bytes <= 60_000


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("policy", POLICIES)
def test_recompute_never_swaps_and_the_slow_link_replays_it(write_trace, layout, policy) -> None:
    """A slow link: the rule declines or finds nothing to copy at every
    preemption, and that is the recompute replay, figure for figure."""
    never = replay(write_trace, layout, policy, "recompute", SLOW)
    declined = replay(write_trace, layout, policy, None, SLOW)
    assert never.tiers is not None and declined.tiers is not None
    assert never.tiers.swaps == never.tiers.swaps_declined == never.tiers.swaps_unneeded == 0
    assert never.tiers.preemption_mode == "recompute" and declined.tiers.swaps == 0
    assert declined.tiers.swaps_declined + declined.tiers.swaps_unneeded > 0
    assert _without_swaps(never) == _without_swaps(declined)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("policy", POLICIES)
def test_a_swapped_request_resumes_with_its_swap_point(
    write_trace, layout, policy, monkeypatch
) -> None:
    points: dict[str, int] = {}
    resumed: list[tuple[int, int]] = []
    swap_out, admit = tier_swap.SimSwap.swap_out, TierReplay._admit

    def recorded_swap_out(self, request, hasher):
        before = self.swapped_tokens
        swapped = swap_out(self, request, hasher)
        if swapped:
            point = self.swapped_tokens - before
            assert point > 0
            # Every unit of the swap point is in a tier now, not only on the device.
            for gid, _, h in swap_units(self.cache.managers, request.live_block_hashes, point):
                assert any((h, gid) in t for t in self.cache.tiers)
            points[request.request_id] = point
        return swapped

    def recorded_admit(self, out):
        waiting = {rid for rid in self.preempted if rid in points}
        admit(self, out)
        for s in out.scheduled:
            rid = s.request.request_id
            if rid in waiting and rid not in self.preempted:
                load = self.loading.get(rid)
                resumed.append((points.pop(rid), s.start if load is None else load.total))

    monkeypatch.setattr(tier_swap.SimSwap, "swap_out", recorded_swap_out)
    monkeypatch.setattr(TierReplay, "_admit", recorded_admit)
    r = replay(write_trace, layout, policy, "swap")
    assert r.tiers is not None and r.tiers.swaps > 0 and resumed
    for point, hit in resumed:
        assert hit >= point


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("policy", POLICIES)
def test_budgets_and_integrity_hold_through_swaps(write_trace, layout, policy, monkeypatch):
    store_host = tier_model.TieredCache.store_host
    stored: list[bool] = []

    def checked(self, key, gid, cls):
        ok = store_host(self, key, gid, cls)
        stored.append(ok)
        self.check_integrity()
        return ok

    monkeypatch.setattr(tier_model.TieredCache, "store_host", checked)
    host, disk = 60_000, 200_000  # a host that turns over; its victims to disk under hybrid
    r = replay(write_trace, layout, policy, "swap", host=host, disk=disk)
    t = r.tiers
    assert t is not None and t.swaps > 0 and stored
    assert t.swapped_units == sum(stored) and t.swapped_bytes > 0
    assert t.host_used_bytes <= host and t.disk_used_bytes <= disk
    assert t.host_evictions > 0


def test_without_a_host_tier_nothing_changes_and_swap_is_an_error(write_trace) -> None:
    def plain(mode):
        options = SimOptions(
            memory_bytes=2_300_000, max_num_seqs=32, arrivals="closed", preemption_mode=mode
        )
        trace = load_trace(write_trace(rows()))
        return replay_trace(shipped_layout("tiny-jamba"), trace, options, cost_of("tiny-jamba"))

    a, b = plain(None), plain("recompute")
    assert a.preemptions > 0 and a.tiers is None
    assert dataclasses.replace(a, replay_seconds=0) == dataclasses.replace(b, replay_seconds=0)
    with pytest.raises(ValueError, match="preemption_mode swap needs a host tier"):
        SimOptions(memory_bytes=2_300_000, preemption_mode="swap")
    with pytest.raises(ValueError, match="preemption_mode must be one of"):
        SimOptions(memory_bytes=2_300_000, host_memory_bytes=1, preemption_mode="always")


def test_the_report_and_json_carry_the_swaps(write_trace) -> None:
    r = replay(write_trace, "tiny-gemma3", "hybrid", "swap")
    assert r.tiers is not None and r.tiers.swaps > 0
    tiers = r.to_json()["tiers"]
    assert tiers["swaps"] == r.tiers.swaps and tiers["preemption_mode"] == "swap"
    assert tiers["swapped_bytes"] == r.tiers.swapped_bytes > 0
    text = render_results([r], "t.jsonl")
    assert "swapped" in text and f"{r.tiers.swaps:,} (" in text
