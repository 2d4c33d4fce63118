"""``hybridkv serve --kv-store``: two replicas share a prefix over HTTP, ``/metrics``
reports the store, and a store that cannot be reached at start is one line, exit 2
(with ``optional=1``: the server starts without it and serves)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from live_server import start_server
from serve_http import metrics, post

from hybridkv.tiers.store_master import MooncakeMaster, free_port

SMALL = "&segment=16MiB&buffer=16MiB"


def test_a_prefix_from_one_replica_hits_on_the_other(
    tok_ckpt: Path, mooncake_master: MooncakeMaster
) -> None:
    url = mooncake_master.url + SMALL
    a, engine_a = start_server(tok_ckpt, kv_store=url)
    b, _ = start_server(tok_ckpt, kv_store=url)
    try:
        body = {"prompt": list(range(200, 241)), "max_tokens": 3, "temperature": 0}
        code, _, first = post(a.url, "/v1/completions", body)
        assert code == 200

        def written(llm: object) -> None:  # A's freed blocks have landed in the store
            llm.tiers.store_writes.settle(wait=True)  # type: ignore[attr-defined]

        engine_a.call(written).result(30)
        code, _, again = post(b.url, "/v1/completions", body)
        assert code == 200
        assert again["choices"][0]["text"] == first["choices"][0]["text"]
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 40
        mb, ma = metrics(b.url), metrics(a.url)
        store = (("medium", "STORE"),)
        assert mb[("hybridkv:kv_tier_hit_tokens_total", store)] == 40
        assert mb[("hybridkv:kv_tier_hits_total", store)] == 1
        assert mb[("hybridkv:kv_tier_loads_total", store)] > 0
        assert mb[("hybridkv:kv_store_gets_total", ())] > 0
        assert mb[("hybridkv:kv_store_bytes_total", (("direction", "get"),))] > 0
        assert mb[("hybridkv:kv_store_lookups_total", ())] >= 1
        assert mb[("hybridkv:kv_store_up", ())] == 1
        assert mb[("hybridkv:kv_store_get_seconds_count", ())] >= 1
        assert ma[("hybridkv:kv_store_puts_total", ())] > 0
        assert ma[("hybridkv:kv_store_bytes_total", (("direction", "put"),))] > 0
        assert ma[("hybridkv:kv_tier_stores_total", store)] > 0
        for kind in ("put", "no_room", "get", "unreachable", "device_full", "late"):
            assert ma[("hybridkv:kv_store_failures_total", (("kind", kind),))] == 0
        assert ma[("hybridkv:kv_store_evictions_seen_total", ())] == 0  # nothing evicted
    finally:
        b.stop()
        a.stop()


def test_a_next_turn_sent_at_once_to_the_other_replica_hits_the_reply(
    tok_ckpt: Path, mooncake_master: MooncakeMaster
) -> None:
    """A's puts are slowed (0.3 s a batch): its last chunk waits for them
    (``HeldFinishes``), so B, asked the moment A's reply ends, hits the reply too."""
    url = mooncake_master.url + SMALL
    a, engine_a = start_server(tok_ckpt, kv_store=url, cache_policy="hybrid")
    b, _ = start_server(tok_ckpt, kv_store=url, cache_policy="hybrid")
    try:

        def slow_puts(llm: Any) -> None:
            client = llm.tiers.store.client
            put = client.put_from  # both paths put through it

            def slow(*args: Any) -> Any:
                time.sleep(0.3)
                return put(*args)

            client.put_from = slow

        engine_a.call(slow_puts).result(30)
        prompt = " ".join(f"w{i}" for i in range(300, 322))  # BOS + 22 words
        body = {"prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
        code, _, first = post(a.url, "/v1/completions", body)
        assert code == 200
        reply = first["choices"][0]["text"].split()
        assert len(reply) == 12 and all(w.startswith("w") for w in reply)  # round-trips
        nxt = {**body, "prompt": " ".join([prompt, *reply, "w7", "w8"])}
        code, _, second = post(b.url, "/v1/completions", nxt)
        assert code == 200
        computed = 1 + 22 + 12 - 1  # the last sampled token is not computed
        assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == computed - computed % 4
        ma = metrics(a.url)
        assert ma[("hybridkv:kv_store_held_total", ())] >= 1
        assert ma[("hybridkv:kv_store_failures_total", (("kind", "late"),))] == 0
    finally:
        b.stop()
        a.stop()


def test_serve_refuses_a_store_it_cannot_reach(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hybridkv.cli import main

    port = free_port()
    argv = ["serve", "--port=0", str(tmp_path / "model"), "--kv-store"]
    argv += [f"mooncake://127.0.0.1:{port}"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"127.0.0.1:{port}" in err[0], err


def test_serve_starts_without_an_unreachable_store_when_it_is_optional(tok_ckpt: Path) -> None:
    live, _ = start_server(tok_ckpt, kv_store=f"mooncake://127.0.0.1:{free_port()}?optional=1")
    try:
        body = {"prompt": list(range(200, 221)), "max_tokens": 3, "temperature": 0}
        code, _, out = post(live.url, "/v1/completions", body)
        assert code == 200 and out["usage"]["completion_tokens"] == 3
        m = metrics(live.url)
        assert m[("hybridkv:kv_store_up", ())] == 0
        assert m[("hybridkv:kv_store_failures_total", (("kind", "unreachable"),))] > 0
    finally:
        live.stop()
