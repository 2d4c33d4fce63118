"""``hybrid`` must beat ``lru`` on a small multi-round QA workload: the policy earns
its place on a Mamba, a sliding-window and a chunked layout.

The workload (``benchmarks/multi_round_qa.py``; deterministic, seed 0; built in about a
second): 96 requests of 32 users sharing an 800-token system prompt; each pair of users
shares a document of 6,000-14,000 tokens, and each user's conversation grows by 100-500
tokens a turn (prompts of 7,000-19,000 tokens); users are drawn with a skew (a few come
back often, most rarely), so reuse distances vary. It is replayed by ``hybridkv
simulate``'s replay (``replay_trace``: the engine's scheduler, one request at a time,
one output token) at a budget where the cache is under pressure. ``lru`` keeps every
block boundary's window, chunk or Mamba state until recency evicts it; ``hybrid`` keeps
what its kept points' hits need and ranks free blocks by value, so the same memory holds
more.

Token hit rates (2026-11-27), lru -> hybrid: jamba-v0.1 @ 3 GB 23.37 % -> 68.18 %
(2.92x), gemma-3-12b @ 10 GB 23.42 % -> 42.13 % (1.80x), llama-4-scout @ 6 GB
26.80 % -> 54.82 % (2.05x); the required factors (``CASES``) sit 7-15 % below. Broken
on purpose, the policy fails here: with no kept point at admission (hit, branch, prompt
end, floor) the factors are 2.67x, 1.35x, 1.94x; with a release that keeps no point
0.50x, 0.50x, 0.44x; with the free blocks' ranking undone (plain recency, no
evict-first, no value) 2.64x, 1.03x, 1.01x.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hybridkv.layouts import shipped_layout
from hybridkv.sim import CostModel, SimOptions, active_params_for, device_profile, replay_trace
from hybridkv.sim.trace import TraceRequest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from multi_round_qa import multi_round_qa

#: (layout, budget in GB, the least hybrid / lru hit-rate factor; measured above).
CASES = [
    ("jamba-v0.1", 3, 2.7),  # Mamba
    ("gemma-3-12b", 10, 1.55),  # sliding window
    ("llama-4-scout", 6, 1.75),  # chunked local attention
]


@pytest.fixture(scope="module")
def workload() -> list[TraceRequest]:
    return multi_round_qa()


def hit_rate(layout_name: str, gb: int, policy: str, requests: list[TraceRequest]) -> float:
    layout = shipped_layout(layout_name)
    cost = CostModel.from_layout(layout, device_profile("h100"), active_params_for(layout.name))
    options = SimOptions(memory_bytes=gb * 10**9, policy=policy, max_num_seqs=1, arrivals="closed")
    result = replay_trace(layout, requests, options, cost)
    return result.hit_tokens / sum(r.input_length for r in requests)


@pytest.mark.parametrize(("layout", "gb", "factor"), CASES, ids=[c[0] for c in CASES])
def test_hybrid_beats_lru_by_the_stated_factor(layout, gb, factor, workload) -> None:
    lru = hit_rate(layout, gb, "lru", workload)
    hybrid = hit_rate(layout, gb, "hybrid", workload)
    assert lru > 0.15, f"lru hits {lru:.2%}: a factor over next to nothing says nothing"
    assert hybrid >= factor * lru, f"{layout} @ {gb} GB: hybrid {hybrid:.2%}, lru {lru:.2%}"
