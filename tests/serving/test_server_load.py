"""Reliability under a bounded load (``benchmarks/serve_load.py``): 300 requests,
32 at once, streamed and not, 20 % hanging up mid-stream, 10 % invalid.

Every valid request completes or is cleanly aborted, ``/health`` answers 200
throughout, no block stays with a finished or aborted request, and a second
identical round grows neither the process's memory nor the cached keys.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from serve_http import metrics

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from serve_load import cache_state, rss_mb, run_round

REQUESTS = 300


def _ended(url: str) -> float:
    m = metrics(url)
    return sum(v for (name, _), v in m.items() if name == "hybridkv:request_success_total")


def test_two_rounds_of_mixed_load(server: Any) -> None:
    live, engine = server
    rounds = []
    for _ in range(2):
        before = _ended(live.url)
        res = run_round(live.port, REQUESTS, concurrency=32, seed=0)
        assert res.failures == []
        assert set(res.health_codes) == {200} and sum(res.health_codes.values()) >= 2
        o = res.outcomes
        assert o["completed"] + o["hung up"] + o["rejected"] == REQUESTS
        assert o["rejected"] >= 10 and o["hung up"] >= 20
        # Each valid request ended exactly once in the engine: finished or aborted.
        assert _ended(live.url) - before == o["completed"] + o["hung up"]
        m = metrics(live.url)
        assert m[("hybridkv:orphan_blocks", ())] == 0
        assert m[("hybridkv:num_requests_running", ())] == 0
        engine.call(lambda llm: llm.manager.check_integrity()).result(30)
        keys, orphans = engine.call(cache_state).result(30)
        assert orphans == 0
        rounds.append((rss_mb(), keys))
    (rss1, keys1), (rss2, keys2) = rounds
    assert keys2 <= keys1
    assert rss2 <= rss1 * 1.02  # allocator noise only
