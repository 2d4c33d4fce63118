"""A failing step (500, the server goes on), clients that go away (their blocks
are freed at once) and what ``/metrics`` reports."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from live_server import LiveServer, start_server
from serve_http import metrics, open_stream, post, wait_until


@pytest.fixture
def slow_server(tok_ckpt: Path) -> Iterator[tuple[LiveServer, Any, dict[str, Any]]]:
    """A server whose steps take >= 50 ms, and can be made to fail (``knobs['fail']``)."""
    live, engine = start_server(tok_ckpt)
    runner = engine.llm.runner
    execute = runner.execute
    knobs: dict[str, Any] = {"fail": 0, "delay": 0.05}

    def slow_execute(*args: Any, **kwargs: Any) -> Any:
        time.sleep(knobs["delay"])
        if knobs["fail"]:
            knobs["fail"] -= 1
            raise RuntimeError("injected kernel failure")
        return execute(*args, **kwargs)

    runner.execute = slow_execute
    yield live, engine, knobs
    live.stop()


def _clean(engine: Any) -> None:
    def check(llm: Any) -> None:
        llm.manager.check_integrity()
        assert not llm.scheduler.running and not llm.scheduler.waiting
        assert llm.manager.block_pool.num_free_blocks == llm.kv_cache_config.num_blocks - 1

    engine.call(check).result(30)


def _value(m: dict[Any, float], name: str, **labels: str) -> float:
    return m.get((name, tuple(sorted(labels.items()))), 0.0)


def _complete(url: str, prompt: str) -> tuple[int, dict[str, str], Any]:
    return post(url, "/v1/completions", {"prompt": prompt, "max_tokens": 3, "temperature": 0})


def test_a_failed_step_is_500_and_the_server_goes_on(slow_server: Any) -> None:
    live, engine, knobs = slow_server
    ok_before = _complete(live.url, "w30 w31")
    knobs["fail"] = 1
    prompt = "w60 w61 w62 w63 w64 w65 w66 w67 w68"
    code, _, out = _complete(live.url, prompt)
    assert code == 500
    assert out["error"]["code"] == 500
    assert "injected kernel failure" in out["error"]["message"]
    # Blocks cached for the failed step were never written: nothing of them may hit.
    code, _, again = _complete(live.url, prompt)
    assert code == 200 and again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    ok_after = _complete(live.url, "w30 w31")
    assert ok_before[0] == ok_after[0] == 200
    assert ok_after[2]["choices"][0]["text"] == ok_before[2]["choices"][0]["text"]
    m = metrics(live.url)
    assert _value(m, "hybridkv:request_success_total", finished_reason="error") == 1
    _clean(engine)


def test_a_failed_step_mid_stream_ends_with_an_error_chunk(slow_server: Any) -> None:
    live, engine, knobs = slow_server
    conn, resp = open_stream(live.url, {"prompt": "w70 w71", "max_tokens": 20})
    try:
        first = resp.readline()
        assert first.startswith(b"data: {")
        knobs["fail"] = 1
        rest = resp.read().decode()
    finally:
        conn.close()
    frames = [f for f in rest.split("\n\n") if f]
    assert '"code":500' in frames[-2] and "injected kernel failure" in frames[-2]
    assert frames[-1] == "data: [DONE]"
    _clean(engine)


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_goes_away_is_aborted(slow_server: Any, stream: bool) -> None:
    live, engine, _ = slow_server
    body = {"prompt": "w80 w81 w82 w83 w84", "max_tokens": 50, "ignore_eos": True}
    if stream:
        conn, resp = open_stream(live.url, body)
        assert resp.readline().startswith(b"data: {")  # generation has begun
        conn.close()
    else:
        import http.client
        import json

        conn = http.client.HTTPConnection("127.0.0.1", live.port, timeout=60)
        conn.request(
            "POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"}
        )
        wait_until(lambda: _value(metrics(live.url), "hybridkv:num_requests_running") == 1)
        conn.close()
    # 50 tokens take >= 2.5 s (>= 50 ms a step); the abort comes before they are done.
    wait_until(
        lambda: (
            _value(metrics(live.url), "hybridkv:request_success_total", finished_reason="abort")
            == 1
        )
    )
    m = metrics(live.url)
    assert _value(m, "hybridkv:num_requests_running") == 0
    assert _value(m, "hybridkv:orphan_blocks") == 0
    assert _value(m, "hybridkv:generation_tokens_total") < 50
    _clean(engine)


def test_metrics_report_the_cache_and_the_requests(server: Any) -> None:
    live, _ = server
    before = metrics(live.url)
    ids = list(range(200, 221))
    for _ in range(2):
        code, _, _ = post(live.url, "/v1/completions", {"prompt": ids, "max_tokens": 4})
        assert code == 200
    m = metrics(live.url)

    def delta(name: str, **labels: str) -> float:
        return _value(m, name, **labels) - _value(before, name, **labels)

    assert delta("hybridkv:prefix_cache_queries_total") == 42
    assert delta("hybridkv:prefix_cache_hits_total") == 20
    assert delta("hybridkv:generation_tokens_total") == 8
    assert delta("hybridkv:prompt_tokens_total") == 42
    assert delta("hybridkv:request_success_total", finished_reason="length") == 2
    assert delta("hybridkv:time_to_first_token_seconds_count") == 2
    assert delta("hybridkv:inter_token_latency_seconds_count") == 6
    assert delta("hybridkv:e2e_request_latency_seconds_count") == 2
    assert _value(m, "hybridkv:num_requests_running") == 0
    assert _value(m, "hybridkv:num_requests_waiting") == 0
    assert _value(m, "hybridkv:orphan_blocks") == 0
    assert _value(m, "hybridkv:prefix_cache_blocks") >= 5
    # Gemma 3's two groups, by kind: nothing runs, so no pages are in use.
    kinds = {dict(k[1])["kind"] for k in m if k[0] == "hybridkv:kv_cache_group_usage_perc"}
    assert kinds == {"full", "sliding_window"}
    assert _value(m, "hybridkv:kv_cache_usage_perc") == 0


def test_a_stopped_engine_answers_every_request(tok_ckpt: Path) -> None:
    import threading

    live, engine = start_server(tok_ckpt)
    release = threading.Event()
    try:
        engine.call(lambda llm: release.wait(30))  # hold the thread: requests stay queued
        result: list[Any] = []
        client = threading.Thread(target=lambda: result.append(_complete(live.url, "w9 w10")))
        client.start()
        wait_until(lambda: engine.num_waiting == 1)
        stopper = threading.Thread(target=engine.stop)
        stopper.start()
        release.set()
        stopper.join(30)
        client.join(30)
        code, _, out = result[0]
        assert code == 500 and "shutting down" in out["error"]["message"]
        code, _, out = _complete(live.url, "w9 w10")
        assert code == 503 and "stopped" in out["error"]["message"]
        status, _ = urllib_get(live.url + "/health")
        assert status == 503
    finally:
        release.set()
        live.stop()


def urllib_get(url: str) -> tuple[int, bytes]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_every_series_is_exported_at_0_from_the_start(tok_ckpt: Path) -> None:
    live, _ = start_server(tok_ckpt)
    try:
        m = metrics(live.url)
    finally:
        live.stop()
    for name in (
        "hybridkv:num_preemptions_total",
        "hybridkv:prefix_cache_queries_total",
        "hybridkv:prefix_cache_hits_total",
        "hybridkv:prompt_tokens_total",
        "hybridkv:generation_tokens_total",
        "hybridkv:time_to_first_token_seconds_count",
        "hybridkv:e2e_request_latency_seconds_count",
        "hybridkv:num_requests_running",
        "hybridkv:orphan_blocks",
    ):
        assert m[(name, ())] == 0.0, name
    for reason in ("stop", "length", "abort", "error"):
        assert m[("hybridkv:request_success_total", (("finished_reason", reason),))] == 0.0
