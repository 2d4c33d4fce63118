"""The publisher's framing, sequence numbers and replay socket, frame by frame.

Loopback only; every wait is bounded and every socket closed. The replay
client is a DEALER, as in vLLM's own tests: ``[b"", start]`` out,
``[b"", topic, seq, payload]`` back, ending with an empty payload.
"""

from __future__ import annotations

import hashlib
import time

import pytest

zmq = pytest.importorskip("zmq")
msgspec = pytest.importorskip("msgspec")

from factories import config, full  # noqa: E402

from hybridkv import BlockStored  # noqa: E402
from hybridkv.events import KVEventsConfig, open_publisher  # noqa: E402
from hybridkv.events.replay import ReplayBuffer  # noqa: E402

END = (-1).to_bytes(8, "big", signed=True)


def stored(k: int) -> BlockStored:
    """Batch ``k``'s one event: a block whose hash and tokens encode ``k``."""
    return BlockStored([hashlib.sha256(b"%d" % k).digest()], None, [k] * 4, 4, None, 0)


def token_of(payload: bytes) -> int:
    return msgspec.msgpack.decode(payload)[1][0]["token_ids"][0]


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.term()


def open_pub(buffer_steps: int, topic: str = "kv"):
    cfg = KVEventsConfig(
        endpoint="tcp://127.0.0.1:*",
        replay_endpoint="tcp://127.0.0.1:*",
        topic=topic,
        buffer_steps=buffer_steps,
    )
    return open_publisher(cfg, config(8, full(4)), "cpu")


def replay(ctx, endpoint: str, start: int, frames: list[bytes] | None = None) -> list[list[bytes]]:
    """Every message of one replay, end marker included."""
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    try:
        dealer.connect(endpoint)
        dealer.send_multipart(frames or [b"", start.to_bytes(8, "big")])
        out = []
        while not out or out[-1][3] != b"":
            assert dealer.poll(5000), "replay timed out"
            out.append(dealer.recv_multipart())
        return out
    finally:
        dealer.close()


def test_replay_returns_missed_batches_by_sequence_number(ctx) -> None:
    with open_pub(buffer_steps=5) as pub:
        assert pub.endpoint.startswith("tcp://127.0.0.1:") and "*" not in pub.endpoint
        for k in range(8):
            pub.publish([stored(k)])
        pub.publish([])  # an empty step sends nothing
        pub.flush()
        assert pub.num_batches == pub.num_sent == 8
        # From 0: only the newest 5 (3..7) are kept; then the end marker.
        msgs = replay(ctx, pub.replay_endpoint, 0)
        assert [m[:3] for m in msgs[:-1]] == [
            [b"", b"kv", s.to_bytes(8, "big")] for s in range(3, 8)
        ]
        assert [token_of(m[3]) for m in msgs[:-1]] == [3, 4, 5, 6, 7]
        assert msgs[-1] == [b"", b"", END, b""]
        # From 6: 6 and 7. From 8 (nothing yet): just the marker.
        assert [int.from_bytes(m[2], "big") for m in replay(ctx, pub.replay_endpoint, 6)[:-1]] == [
            6,
            7,
        ]
        assert replay(ctx, pub.replay_endpoint, 8) == [[b"", b"", END, b""]]
        # A malformed request is ignored and the socket keeps serving.
        bad = ctx.socket(zmq.DEALER)
        bad.setsockopt(zmq.LINGER, 0)
        bad.connect(pub.replay_endpoint)
        bad.send(b"\x00" * 8)  # no empty delimiter frame
        assert not bad.poll(300)
        bad.close()
        pub.publish([stored(8)])
        pub.flush()
        assert [token_of(m[3]) for m in replay(ctx, pub.replay_endpoint, 7)[:-1]] == [7, 8]
    pub.buffer.check_integrity()
    assert len(pub.buffer) == 5 and pub.buffer.next_seq == 9


def test_live_stream_frames_and_a_late_subscriber_catches_up_by_replay(ctx) -> None:
    with open_pub(buffer_steps=100, topic="kv@replica-0") as pub:
        for k in range(3):  # before anyone listens: lost on the live stream
            pub.publish([stored(k)])
        pub.flush()  # publish only enqueues: send them before the subscriber connects
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
        other = ctx.socket(zmq.SUB)  # another topic: hears nothing
        other.setsockopt(zmq.LINGER, 0)
        other.setsockopt(zmq.SUBSCRIBE, b"metrics")
        try:
            sub.connect(pub.endpoint)
            other.connect(pub.endpoint)
            # Publish until the subscription has reached the publisher (bounded).
            deadline, k = time.monotonic() + 10, 3
            while not sub.poll(20):
                assert time.monotonic() < deadline, "subscriber never connected"
                pub.publish([stored(k)])
                k += 1
            topic, seq, payload = sub.recv_multipart()
            assert topic == b"kv@replica-0" and len(seq) == 8
            first = int.from_bytes(seq, "big")
            assert first >= 3 and token_of(payload) == first
            # The gap 0 .. first-1 comes back from the replay socket, in order.
            pub.flush()
            msgs = replay(ctx, pub.replay_endpoint, 0)[:-1]
            assert [int.from_bytes(m[2], "big") for m in msgs] == list(range(k))
            assert [token_of(m[3]) for m in msgs] == list(range(k))
            # Later batches arrive live, numbered on.
            pub.publish([stored(k)])
            got = []
            while sub.poll(2000):
                got.append(int.from_bytes(sub.recv_multipart()[1], "big"))
                if got[-1] == k:
                    break
            assert got == list(range(first + 1, k + 1))
            assert not other.poll(100)
        finally:
            sub.close()
            other.close()


def test_publish_after_close_and_bad_sockets_fail_loudly(ctx) -> None:
    pub = open_pub(buffer_steps=2)
    pub.close()
    pub.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        pub.publish([stored(0)])
    holder = ctx.socket(zmq.ROUTER)
    holder.setsockopt(zmq.LINGER, 0)
    holder.bind("tcp://127.0.0.1:*")
    taken = holder.getsockopt_string(zmq.LAST_ENDPOINT)
    try:
        cfg = KVEventsConfig(endpoint="tcp://127.0.0.1:*", replay_endpoint=taken)
        with pytest.raises(RuntimeError, match="cannot open the KV events sockets"):
            open_publisher(cfg, config(8, full(4)), "cpu")
    finally:
        holder.close()


def test_a_failure_in_the_publisher_thread_is_raised_to_the_engine() -> None:
    pub = open_pub(buffer_steps=2)
    pub.publish(["not an event"])  # type: ignore[list-item]
    with pytest.raises(RuntimeError, match="publisher failed") as err:
        pub.flush()
    assert isinstance(err.value.__cause__, TypeError)
    with pytest.raises(RuntimeError, match="publisher failed"):
        pub.publish([stored(0)])
    with pytest.raises(RuntimeError, match="publisher failed"):
        pub.close()  # the sockets are closed all the same
    pub.close()


def test_replay_buffer_keeps_the_newest_batches() -> None:
    buf = ReplayBuffer(3)
    assert list(buf.since(0)) == []
    assert [buf.append(b"%d" % i) for i in range(5)] == [0, 1, 2, 3, 4]
    assert list(buf.since(0)) == [(2, b"2"), (3, b"3"), (4, b"4")]
    assert list(buf.since(4)) == [(4, b"4")]
    assert list(buf.since(5)) == []
    buf.check_integrity()
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(0)
