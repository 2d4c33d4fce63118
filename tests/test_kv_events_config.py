"""KV events configuration, group fields, hash form, and the optional dependencies."""

from __future__ import annotations

import subprocess
import sys

import pytest
from factories import chunked, config, full, mamba, swa

from hybridkv.events import (
    GroupEventInfo,
    KVEventsConfig,
    external_hash,
    group_event_infos,
    is_bind_endpoint,
    open_publisher,
)
from hybridkv.events.config import bind_address, resolve_events_config


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"endpoint": "127.0.0.1:5557"}, "endpoint must be a ZeroMQ endpoint"),
        ({"replay_endpoint": "http://x"}, "replay_endpoint must be a ZeroMQ endpoint"),
        ({"endpoint": "tcp://h:1", "replay_endpoint": "tcp://h:1"}, "must differ"),
        ({"buffer_steps": 0}, "buffer_steps must be a positive integer"),
        ({"hwm": True}, "hwm must be a positive integer"),
        ({"max_queue_size": 1.5}, "max_queue_size must be a positive integer"),
        ({"medium": "TPU"}, "medium must be one of"),
        ({"topic": b"kv"}, "topic must be a str"),
        ({"bind_host": ""}, "bind_host must be an interface address"),
    ],
)
def test_bad_config_names_the_field(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        KVEventsConfig(**kwargs)


def test_defaults_are_vllms() -> None:
    c = KVEventsConfig()
    assert (c.endpoint, c.replay_endpoint, c.topic) == ("tcp://*:5557", None, "")
    assert (c.buffer_steps, c.hwm, c.max_queue_size) == (10_000, 100_000, 100_000)
    assert c.int_block_hashes is True and c.medium is None
    assert c.bind_host == "127.0.0.1"  # ours: a wildcard host binds loopback


def test_a_wildcard_host_binds_loopback_unless_told_otherwise() -> None:
    assert bind_address("tcp://*:5557", "127.0.0.1") == "tcp://127.0.0.1:5557"
    assert bind_address("tcp://[::]:5557", "127.0.0.1") == "tcp://127.0.0.1:5557"
    assert bind_address("tcp://*:*", "10.0.0.5") == "tcp://10.0.0.5:*"
    assert bind_address("tcp://*:5557", "*") == "tcp://*:5557"  # vLLM's meaning
    for same in ("tcp://127.0.0.1:*", "tcp://10.1.2.3:5557", "ipc:///tmp/kv", "inproc://kv"):
        assert bind_address(same, "127.0.0.1") == same


def test_the_publisher_binds_loopback_for_a_wildcard_host() -> None:
    pytest.importorskip("zmq")
    pytest.importorskip("msgspec")
    cfg = config(4, full(4))
    pub = open_publisher(KVEventsConfig("tcp://*:*", replay_endpoint="tcp://*:*"), cfg, "cpu")
    try:
        assert pub.endpoint.startswith("tcp://127.0.0.1:")
        assert pub.replay_endpoint is not None
        assert pub.replay_endpoint.startswith("tcp://127.0.0.1:")
    finally:
        pub.close()
    everywhere = KVEventsConfig("tcp://*:*", bind_host="*")
    pub = open_publisher(everywhere, cfg, "cpu")
    try:
        assert pub.endpoint.startswith("tcp://0.0.0.0:")
    finally:
        pub.close()


def test_bind_or_connect_follows_vllms_rule() -> None:
    binds = ["tcp://*:5557", "tcp://127.0.0.1:*", "tcp://[::]:5557", "ipc:///tmp/kv", "inproc://kv"]
    assert all(is_bind_endpoint(e) for e in binds)
    assert not any(is_bind_endpoint(e) for e in ["tcp://127.0.0.1:5557", "tcp://router:5557"])


def test_shorthand_options_resolve_to_a_config() -> None:
    assert resolve_events_config(None, None, None, None) is None
    got = resolve_events_config(None, "tcp://127.0.0.1:5557", "tcp://127.0.0.1:*", "kv")
    assert got == KVEventsConfig("tcp://127.0.0.1:5557", "tcp://127.0.0.1:*", "kv")
    assert resolve_events_config(None, "tcp://127.0.0.1:5557", None, None).topic == ""
    whole = KVEventsConfig(buffer_steps=5)
    assert resolve_events_config(whole, None, None, None) is whole
    with pytest.raises(ValueError, match="not both"):
        resolve_events_config(whole, "tcp://127.0.0.1:5557", None, None)
    with pytest.raises(ValueError, match="kv_events_topic needs kv_events_endpoint"):
        resolve_events_config(None, None, None, "kv")
    with pytest.raises(ValueError, match="must be a KVEventsConfig"):
        resolve_events_config({"endpoint": "tcp://*:1"}, None, None, None)  # type: ignore[arg-type]


def test_group_fields_are_vllms_kinds_and_windows() -> None:
    cfg = config(8, full(4), swa(4, 6), chunked(4, 8), mamba(4))
    assert group_event_infos(cfg) == (
        GroupEventInfo("full_attention", None),
        GroupEventInfo("sliding_window", 6),
        GroupEventInfo("chunked_local_attention", None),
        GroupEventInfo("mamba", None),
    )


def test_hashes_go_out_as_vllms_uint64_or_as_bytes() -> None:
    h = bytes(range(32))
    assert external_hash(h, False) is h
    assert external_hash(h, True) == 0x18191A1B1C1D1E1F  # the last 8 bytes, big-endian
    assert external_hash(b"\xff" * 32, True) == 2**64 - 1


def test_importing_hybridkv_loads_neither_zmq_nor_msgspec() -> None:
    code = (
        "import sys, hybridkv, hybridkv.events, hybridkv.engine.llm\n"
        "print(sorted(m for m in ('zmq', 'msgspec') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_a_missing_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "zmq", None)  # makes `import zmq` fail
    monkeypatch.delitem(sys.modules, "hybridkv.events.publisher", raising=False)
    with pytest.raises(ImportError, match=r"pip install 'hybridkv\[events\]'"):
        open_publisher(KVEventsConfig(), config(8, full(4)), "cpu")
