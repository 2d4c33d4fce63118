"""A KV events subscriber for the tests, written the way a vLLM consumer is.

It knows nothing of ``hybridkv.events``: it speaks ZeroMQ (SUB for the live
stream, a fresh DEALER per replay request, as vLLM's own tests do: a REQ
socket would take only the first of the replies) and decodes payloads with msgspec's
*untyped* msgpack decoder, so it checks the wire format on its own terms:
``[ts, [event maps], dp_rank]``, 8-byte big-endian sequence numbers, an end
of replay marked by an empty payload.

``keys`` mirrors the cache as a set of ``(group_idx, hash)``. Strict: a
``BlockStored`` of a key already held, a ``BlockRemoved`` of a key not held,
or a sequence number out of order fails at once. Every wait is bounded.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
import zmq


def wire_hash(block_hash: bytes) -> int:
    """vLLM's default external hash: the uint64 of the last 8 bytes, big-endian."""
    return int.from_bytes(block_hash[-8:], "big")


def pool_keys(pool: Any) -> set[tuple[int, int]]:
    """What a mirror must hold: the key of every block of ``pool`` that has a hash."""
    return {(b.group_id, wire_hash(b.block_hash)) for b in pool.blocks if b.block_hash is not None}


class MirrorSubscriber:
    """Binds a SUB socket on loopback (the publisher connects) and mirrors the cache."""

    def __init__(self, ctx: zmq.Context, topic: str = "", replay_endpoint: str | None = None):
        self.ctx = ctx
        self.topic = topic.encode()
        self.sub = ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.SUBSCRIBE, self.topic)
        self.sub.bind("tcp://127.0.0.1:*")
        self.endpoint: str = self.sub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.replay_endpoint = replay_endpoint
        self.last_seq = -1
        self.keys: set[tuple[int, int | bytes]] = set()
        self.batches: list[list[Any]] = []  # decoded, in sequence order
        self.live = 0  # batches applied from the live stream
        self.replayed = 0  # batches applied from replays
        self.counts = {"BlockStored": 0, "BlockRemoved": 0, "AllBlocksCleared": 0}

    # -- decoding --------------------------------------------------------------------
    def apply(self, topic: bytes, seq_bytes: bytes, payload: bytes) -> bool:
        """Apply one ``[topic, seq, payload]`` message; False when already seen."""
        assert topic == self.topic, f"topic {topic!r}"
        assert len(seq_bytes) == 8
        seq = int.from_bytes(seq_bytes, "big")
        if seq <= self.last_seq:
            return False
        assert seq == self.last_seq + 1, f"gap: got {seq} after {self.last_seq}"
        batch = msgspec.msgpack.decode(payload)
        assert isinstance(batch, list) and len(batch) == 3, batch
        ts, events, dp_rank = batch
        assert isinstance(ts, float) and abs(time.time() - ts) < 600 and dp_rank == 0
        for ev in events:
            self._apply_event(ev)
        self.batches.append(batch)
        self.last_seq = seq
        return True

    def _apply_event(self, ev: dict[str, Any]) -> None:
        kind = ev["type"]
        self.counts[kind] += 1
        if kind == "AllBlocksCleared":
            assert set(ev) == {"type"}, ev
            self.keys.clear()
            return
        group = ev["group_idx"]
        for h in ev["block_hashes"]:
            key = (group, h)
            if kind == "BlockStored":
                assert key not in self.keys, f"stored twice: {key}"
                self.keys.add(key)
            else:
                assert kind == "BlockRemoved", kind
                assert key in self.keys, f"removed but not held: {key}"
                self.keys.discard(key)

    # -- receiving -------------------------------------------------------------------
    def replay_from(self, start: int, timeout_s: float = 5.0) -> int:
        """Ask the replay socket for batches from ``start``; returns how many were new."""
        assert self.replay_endpoint is not None
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        try:
            dealer.connect(self.replay_endpoint)
            dealer.send_multipart([b"", start.to_bytes(8, "big")])
            new = 0
            deadline = time.monotonic() + timeout_s
            while True:
                left_ms = int((deadline - time.monotonic()) * 1000)
                assert left_ms > 0 and dealer.poll(left_ms), "replay timed out"
                delimiter, topic, seq_bytes, payload = dealer.recv_multipart()
                assert delimiter == b""
                if not payload:  # end marker: empty topic, seq -1, empty payload
                    assert topic == b"" and int.from_bytes(seq_bytes, "big", signed=True) == -1
                    return new
                if self.apply(topic, seq_bytes, payload):
                    new += 1
                    self.replayed += 1
        finally:
            dealer.close()

    def catch_up(self, num_batches: int, timeout_s: float = 10.0) -> None:
        """Receive until batches ``0 .. num_batches - 1`` are applied, replaying gaps."""
        deadline = time.monotonic() + timeout_s
        while self.last_seq < num_batches - 1:
            assert time.monotonic() < deadline, (
                f"caught up to {self.last_seq} of {num_batches - 1} before the deadline"
            )
            if self.sub.poll(50):
                topic, seq_bytes, payload = self.sub.recv_multipart()
                seq = int.from_bytes(seq_bytes, "big")
                if seq > self.last_seq + 1 and self.replay_endpoint is not None:
                    self.replay_from(self.last_seq + 1)
                if self.apply(topic, seq_bytes, payload):
                    self.live += 1
            elif self.replay_endpoint is not None:
                self.replay_from(self.last_seq + 1)  # the tail may have been dropped

    def close(self) -> None:
        self.sub.close()
