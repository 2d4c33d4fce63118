"""``hybridkv serve --async-scheduling``: a bounded mixed load (``benchmarks/serve_load.py``:
streamed and not, clients hanging up mid-stream, invalid requests) completes with every
block given back, and a completion's tokens are those of the synchronous engine."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from live_server import start_server
from serve_http import metrics, post

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from serve_load import run_round


def test_a_mixed_load_with_async_scheduling(tok_ckpt: Path, server: Any) -> None:
    live, engine = start_server(tok_ckpt, async_scheduling=True)
    try:
        assert engine.llm.async_steps is not None
        res = run_round(live.port, 60, concurrency=16, seed=1)
        assert res.failures == []
        o = res.outcomes
        assert o["completed"] + o["hung up"] + o["rejected"] == 60 and o["completed"] > 0
        m = metrics(live.url)
        assert m[("hybridkv:orphan_blocks", ())] == 0
        assert m[("hybridkv:num_requests_running", ())] == 0
        engine.call(lambda llm: llm.manager.check_integrity()).result(30)
        body = {"model": "tiny", "prompt": "a b c d", "max_tokens": 6, "temperature": 0}
        got = post(live.url, "/v1/completions", body)[2]["choices"][0]["text"]
        want = post(server[0].url, "/v1/completions", body)[2]["choices"][0]["text"]
        assert got == want
        assert engine.call(lambda llm: llm.async_steps.stats["overlapped"]).result(30) > 0
    finally:
        live.stop()
