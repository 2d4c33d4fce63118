"""``ZmqEventPublisher``: KV event batches over ZeroMQ, the way vLLM 0.33 sends them.

Messages (vLLM 0.33's ``ZmqEventPublisher``)::

    PUB     -> [topic, seq (8 bytes, big-endian), payload (msgpack EventBatch, wire.py)]
    ROUTER  <- [client id, b"", start seq (8 bytes, big-endian)]
            -> [client id, b"", topic, seq, payload]  for each kept batch with seq >= start
            -> [client id, b"", b"", (-1 as 8 signed bytes), b""]     end of replay

Sequence numbers start at 0 and go up by one per batch; a subscriber that
sees a gap asks the replay socket (``ReplayBuffer``: the newest
``buffer_steps`` batches). The client is a DEALER that sends
``[b"", start]`` and receives ``[b"", topic, seq, payload]`` until an empty
payload (a REQ socket would keep only the first reply).

One background thread owns both sockets: it encodes queued batches, sends and
buffers them, and answers replay requests between batches (within
``POLL_S``). ``publish`` only enqueues (it blocks when ``max_queue_size``
batches wait). A failure in the thread is raised by the next ``publish`` or
by ``close``. ``close`` sends what is queued, then closes the sockets.

Needs ``pyzmq`` and ``msgspec`` (the ``events`` extra); build it with
``hybridkv.events.open_publisher``.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Sequence

import zmq

from hybridkv.core.events import KVCacheEvent
from hybridkv.events.config import KVEventsConfig, bind_address, is_bind_endpoint
from hybridkv.events.groups import GroupEventInfo
from hybridkv.events.replay import ReplayBuffer
from hybridkv.events.wire import BatchEncoder

logger = logging.getLogger(__name__)

SEQ_BYTES = 8
END_SEQ = (-1).to_bytes(SEQ_BYTES, "big", signed=True)


class ZmqEventPublisher:
    """PUB socket + optional ROUTER replay socket, served by one thread."""

    #: Longest wait for a batch before the thread looks at the replay socket again.
    POLL_S = 0.05
    #: How long the sockets may still flush queued messages when closed.
    LINGER_MS = 500
    #: Bound on waiting for the thread to bind and to finish on ``close``.
    THREAD_TIMEOUT_S = 10.0

    def __init__(
        self, config: KVEventsConfig, groups: Sequence[GroupEventInfo], medium: str
    ) -> None:
        self.config = config
        self._encoder = BatchEncoder(groups, medium, config.int_block_hashes)
        self._topic = config.topic.encode("utf-8")
        self._queue: queue.Queue[tuple[float, list[KVCacheEvent]] | None] = queue.Queue(
            maxsize=config.max_queue_size
        )
        self.buffer = ReplayBuffer(config.buffer_steps)
        self.num_batches = 0  # batches accepted by ``publish`` (their seqs: 0 .. n-1)
        self.num_sent = 0  # batches sent on the PUB socket (and kept for replay)
        self.endpoint = config.endpoint
        self.replay_endpoint = config.replay_endpoint
        self._error: BaseException | None = None
        self._closed = False
        self._ctx = zmq.Context()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hybridkv-kv-events", daemon=True)
        self._thread.start()
        if not self._ready.wait(self.THREAD_TIMEOUT_S):
            raise RuntimeError("the KV events publisher thread did not start")
        if self._error is not None:
            self._thread.join(self.THREAD_TIMEOUT_S)
            self._ctx.term()
            self._closed = True
            raise RuntimeError(f"cannot open the KV events sockets: {self._error}") from self._error

    # -- the engine's side ---------------------------------------------------------
    def publish(self, events: list[KVCacheEvent]) -> None:
        """Queue one step's events as one batch (stamped now); no-op when empty."""
        if self._error is not None:
            raise RuntimeError("the KV events publisher failed") from self._error
        if self._closed:
            raise RuntimeError("the KV events publisher is closed")
        if not events:
            return
        item = (time.time(), events)
        while True:  # blocks while ``max_queue_size`` batches wait, unless the thread died
            try:
                self._queue.put(item, timeout=self.POLL_S)
                break
            except queue.Full:
                if self._error is not None or not self._thread.is_alive():
                    raise RuntimeError("the KV events publisher stopped") from self._error
        self.num_batches += 1

    def flush(self, timeout_s: float = THREAD_TIMEOUT_S) -> None:
        """Wait until every accepted batch is sent and replayable (bounded)."""
        deadline = time.monotonic() + timeout_s
        while self.num_sent < self.num_batches:
            if self._error is not None:
                raise RuntimeError("the KV events publisher failed") from self._error
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.num_batches - self.num_sent} KV event batches unsent")
            time.sleep(0.001)

    def close(self) -> None:
        """Send every queued batch, then close the sockets. Idempotent."""
        if self._closed:
            return
        self._closed = True
        # A full queue means the thread is stuck or dead: the join below times out or returns.
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=self.THREAD_TIMEOUT_S)
        self._thread.join(self.THREAD_TIMEOUT_S)
        if self._thread.is_alive():  # sockets still owned by the thread: leave them
            logger.warning("KV events publisher thread did not stop; sockets left open")
            return
        self._ctx.term()
        if self._error is not None:
            raise RuntimeError("the KV events publisher failed") from self._error

    def __enter__(self) -> ZmqEventPublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the thread ----------------------------------------------------------------
    def _open(self) -> tuple[zmq.Socket, zmq.Socket | None]:
        pub = self._ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.SNDHWM, self.config.hwm)
        pub.setsockopt(zmq.LINGER, self.LINGER_MS)
        replay = None
        try:
            if is_bind_endpoint(self.endpoint):
                pub.bind(bind_address(self.endpoint, self.config.bind_host))
                self.endpoint = pub.getsockopt_string(zmq.LAST_ENDPOINT)
            else:
                pub.connect(self.endpoint)
            if self.replay_endpoint is not None:
                replay = self._ctx.socket(zmq.ROUTER)
                # Room for a whole replay plus its end marker (as vLLM sizes it).
                replay.setsockopt(zmq.SNDHWM, 2 * (self.config.buffer_steps + 1))
                replay.setsockopt(zmq.LINGER, self.LINGER_MS)
                replay.bind(bind_address(self.replay_endpoint, self.config.bind_host))
                self.replay_endpoint = replay.getsockopt_string(zmq.LAST_ENDPOINT)
        except BaseException:
            pub.close(linger=0)
            if replay is not None:
                replay.close(linger=0)
            raise
        return pub, replay

    def _run(self) -> None:
        try:
            pub, replay = self._open()
        except BaseException as e:
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        try:
            self._loop(pub, replay)
        except BaseException as e:
            logger.exception("KV events publisher failed")
            self._error = e
        finally:
            pub.close()
            if replay is not None:
                replay.close()

    def _loop(self, pub: zmq.Socket, replay: zmq.Socket | None) -> None:
        q = self._queue
        while True:
            if replay is not None:
                while replay.poll(0):
                    self._serve_replay(replay)
            try:
                item = q.get(timeout=self.POLL_S)
            except queue.Empty:
                continue
            if item is None:
                return
            payload = self._encoder.encode(*item)
            seq = self.buffer.append(payload)
            pub.send_multipart((self._topic, seq.to_bytes(SEQ_BYTES, "big"), payload))
            self.num_sent = seq + 1

    def _serve_replay(self, replay: zmq.Socket) -> None:
        frames = replay.recv_multipart()
        if len(frames) != 3 or frames[1] != b"":
            logger.warning("ignored a malformed KV events replay request (%d frames)", len(frames))
            return
        client, _, start = frames
        start_seq = int.from_bytes(start, "big")
        for seq, payload in self.buffer.since(start_seq):
            replay.send_multipart(
                (client, b"", self._topic, seq.to_bytes(SEQ_BYTES, "big"), payload)
            )
        replay.send_multipart((client, b"", b"", END_SEQ, b""))
