"""``hybridkv serve --kv-events-endpoint``: a subscriber mirrors the server's cache,
including what changes outside a step (a client hanging up, a failed step)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest
from live_server import start_server
from serve_http import open_stream, post, wait_until

zmq = pytest.importorskip("zmq")
pytest.importorskip("msgspec")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kv_subscriber import MirrorSubscriber, pool_keys  # noqa: E402


def test_the_mirror_follows_the_server(tok_ckpt: Path) -> None:
    ctx = zmq.Context()
    sub = MirrorSubscriber(ctx, topic="kv")
    live, engine = start_server(
        tok_ckpt,
        kv_events_endpoint=sub.endpoint,
        kv_events_topic="kv",
        kv_events_replay_endpoint="tcp://127.0.0.1:*",
    )
    try:
        llm = engine.llm
        sub.replay_endpoint = llm.kv_events.replay_endpoint

        def in_sync() -> bool:
            sub.catch_up(llm.kv_events.num_batches)
            keys = engine.call(lambda llm: pool_keys(llm.manager.block_pool)).result(30)
            return bool(sub.keys == keys)

        body = {"prompt": " ".join(f"w{i}" for i in range(30, 50)), "max_tokens": 4}
        assert post(live.url, "/v1/completions", body)[0] == 200
        wait_until(in_sync)
        assert sub.keys  # the prompt's blocks are cached
        # A failed step: its blocks were cached at allocation and leave at once.
        runner = llm.runner
        execute = runner.execute
        runner.execute = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom"))
        failed = {"prompt": " ".join(f"w{i}" for i in range(60, 90)), "max_tokens": 4}
        removed = sub.counts["BlockRemoved"]
        try:
            assert post(live.url, "/v1/completions", failed)[0] == 500
        finally:
            runner.execute = execute
        # The mirror and the pool also agree before the failed step's events arrive
        # (neither holds its blocks then), so wait for its removals, then agreement.
        wait_until(lambda: in_sync() and sub.counts["BlockRemoved"] > removed)
        # A client that hangs up mid-stream.
        runner.execute = lambda *a, **k: (time.sleep(0.05), execute(*a, **k))[1]
        conn, resp = open_stream(live.url, {"prompt": "w7 w8 w9 w10 w11", "max_tokens": 40})
        assert resp.readline().startswith(b"data: {")
        conn.close()
        wait_until(lambda: engine.call(lambda llm: not llm.scheduler.running).result(30))
        wait_until(in_sync)
    finally:
        live.stop()  # stops the engine thread, which closes the publisher
        sub.close()
        ctx.term()
    assert llm.kv_events is not None and not llm._close_events.alive


def test_serve_names_the_events_extra_when_missing(
    tok_ckpt: Path, monkeypatch: Any, capsys: Any
) -> None:
    import uvicorn

    from hybridkv.cli import main

    def never(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("serve started without the events extra")

    monkeypatch.setattr(uvicorn.Server, "run", never)
    monkeypatch.setitem(sys.modules, "zmq", None)
    monkeypatch.delitem(sys.modules, "hybridkv.events.publisher", raising=False)
    code = main(
        ["serve", "--port=0", str(tok_ckpt), "--kv-events-endpoint", "tcp://127.0.0.1:5557"]
    )
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("hybridkv serve: error: KV events need pyzmq and msgspec")
    assert err.endswith("pip install 'hybridkv[events]'")


def test_a_wildcard_events_host_binds_loopback(tok_ckpt: Path, capsys: Any) -> None:
    live, engine = start_server(tok_ckpt, kv_events_endpoint="tcp://*:*")
    try:
        assert engine.llm.kv_events.endpoint.startswith("tcp://127.0.0.1:")
    finally:
        live.stop()
    line = capsys.readouterr().err.strip().splitlines()[-2]  # before the chat template's
    assert line.startswith("hybridkv serve: KV events bound at tcp://127.0.0.1:")
    assert line.endswith(
        "(the wildcard host binds 127.0.0.1; --kv-events-bind-host '*': every interface)"
    )
    from hybridkv.cli import main

    assert main(["serve", "--port=0", str(tok_ckpt), "--kv-events-bind-host", "*"]) == 2
    assert capsys.readouterr().err == (
        "hybridkv serve: error: --kv-events-bind-host needs --kv-events-endpoint\n"
    )
