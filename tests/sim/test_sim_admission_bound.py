"""``cannot_admit`` (``hybridkv.cache_manager.admission_bound``) never changes a decision.

Two checks on real replays under memory pressure (preemptions, repeated
admission retries): every time the bound says "cannot admit", the full path
(lookup, then allocation) is run too and must fail; and a replay with the
bound off makes exactly the same decisions as one with it on.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from hybridkv import KVCacheManager
from hybridkv.layouts import shipped_layout
from hybridkv.sim import CostModel, SimOptions, device_profile, load_trace, replay_trace
from hybridkv.sim.replay import plan_replay

H100 = device_profile("h100")
MAX_LEN = 4200  # the longest request below: 8 * 512 prompt + 59 output tokens


def _rows(seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for k in range(60):
        n = rng.randrange(2, 9)
        ids = [rng.randrange(4)] + [rng.randrange(40) for _ in range(n - 1)]
        rows.append(
            {
                "timestamp": k * 40,
                "input_length": n * 512 - rng.randrange(0, 400),
                "output_length": rng.randrange(1, 60),
                "hash_ids": ids,
            }
        )
    return rows


def _replay(layout_name: str, path, policy: str, memory: int):  # type: ignore[no-untyped-def]
    layout = shipped_layout(layout_name)
    options = SimOptions(
        memory_bytes=memory, policy=policy, max_num_batched_tokens=1024, max_model_len=MAX_LEN
    )
    cost = CostModel.from_layout(layout, H100, active_params=1e9)
    return replay_trace(layout, load_trace(path), options, cost)


CASES = [
    ("toy-1full-3sliding", "hybrid"),
    ("toy-1full-3sliding", "lru"),
    ("gemma-3-27b", "hybrid"),
    ("jamba-v0.1", "hybrid"),
]


@pytest.mark.parametrize(("layout", "policy"), CASES)
def test_a_skipped_admission_would_have_failed(layout, policy, write_trace, monkeypatch):
    real = KVCacheManager.cannot_admit
    said = [0, 0]

    def checked(self, request, budget):  # type: ignore[no-untyped-def]
        verdict = real(self, request, budget)
        said[verdict] += 1
        if verdict:  # run the full path on a copy of nothing: it must change nothing
            blocks, hit = self.get_computed_blocks(request)
            n = min(request.num_tokens - hit, budget)
            assert self.allocate_slots(request, n, hit, blocks) is None
        return verdict

    monkeypatch.setattr(KVCacheManager, "cannot_admit", checked)
    memory = _memory(layout)
    _replay(layout, write_trace(_rows(1)), policy, memory)
    assert said[True] > 5, said  # the bound did answer under pressure


@pytest.mark.parametrize(("layout", "policy"), CASES)
def test_replays_decide_the_same_with_the_bound_off(layout, policy, write_trace, monkeypatch):
    path = write_trace(_rows(2))
    memory = _memory(layout)
    on = _replay(layout, path, policy, memory)
    monkeypatch.setattr(KVCacheManager, "cannot_admit", lambda self, request, budget: False)
    off = _replay(layout, path, policy, memory)
    skip = {"replay_seconds"}
    a = {k: v for k, v in dataclasses.asdict(on).items() if k not in skip}
    b = {k: v for k, v in dataclasses.asdict(off).items() if k not in skip}
    assert a == b
    assert on.preemptions > 0  # under pressure, where the bound matters


def _memory(layout: str) -> int:
    """1.5x the smallest budget that holds one request of ``MAX_LEN`` tokens:
    a few of these requests fit, not all (so they queue and get preempted)."""
    lo, hi = 1, 1 << 40
    while lo < hi:
        mid = (lo + hi) // 2
        try:
            plan_replay(
                shipped_layout(layout),
                SimOptions(memory_bytes=mid, max_num_batched_tokens=1024),
                MAX_LEN,
            )
            hi = mid
        except ValueError:
            lo = mid + 1
    return lo * 3 // 2
