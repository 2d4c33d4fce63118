"""``EngineLoop``: one background thread runs ``LLM.step`` for every HTTP request.

Only the engine thread touches the ``LLM`` (scheduler, manager, model): the
event loop hands it work through a locked inbox, and gets results back as
``Delta``s on each request's ``asyncio.Queue`` (``call_soon_threadsafe``).

Contract:
- ``submit`` queues a checked request and returns its ``RequestStream``; it
  raises ``QueueFull`` when ``max_waiting`` requests wait already (HTTP 503).
- Each step's new tokens (and their logprobs, when asked) reach their streams
  as one ``Delta`` per request; a finished request's last ``Delta`` carries its
  ``finish_reason``. With a shared store, that last ``Delta`` waits until the
  store writes in flight after its step have ended (``HeldFinishes``): a next
  turn sent at once, to any replica, finds what the request wrote. The loop
  goes on stepping the other requests meanwhile.
- ``abort(request_id)`` (a client went away, a stop string matched) takes the
  request out of the engine and frees its blocks before the next step.
- A step that raises fails the requests it scheduled: their streams get a
  ``Delta`` with ``error``, their blocks that the step was to compute leave the
  prefix cache (``uncache_uncomputed``), their blocks are freed, and the loop
  goes on with the other requests. KV events of changes made outside a step
  (aborts, a failed step) are published at once.
- ``call(fn)`` runs ``fn(llm)`` in the engine thread between steps (consistent
  snapshots for ``/metrics``).
- When the thread ends (``stop``, or an error outside a step), every request
  still in it gets an ``error`` delta: no HTTP call waits forever.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from hybridkv.engine.engine_request import EngineRequest, RequestStatus
from hybridkv.engine.llm import LLM
from hybridkv.engine.outputs import Logprob
from hybridkv.serving.held_finishes import HeldFinishes
from hybridkv.serving.metrics import ServerMetrics


class QueueFull(Exception):
    """``max_waiting`` requests are waiting already."""


class EngineStopped(Exception):
    """The engine thread has stopped (shut down, or failed)."""


@dataclass(frozen=True)
class Delta:
    """What one step did for one request."""

    token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    error: str | None = None
    num_cached_tokens: int = 0
    #: Per new token, ``{token id: Logprob}`` (when the request asked for logprobs).
    logprobs: list[dict[int, Logprob]] | None = None


class RequestStream:
    """A request's ``Delta``s, put as ``(index, delta)`` on a queue of the event
    loop (one HTTP request's prompts share one queue)."""

    def __init__(
        self,
        request: EngineRequest,
        queue: asyncio.Queue[tuple[int, Delta]],
        index: int = 0,
    ) -> None:
        self.request = request
        self.request_id = request.request_id
        self.index = index
        self.queue = queue
        self._loop = asyncio.get_running_loop()
        self.sent = 0  # output tokens handed over (engine thread only)
        self.last_token_time: float | None = None  # engine thread only

    def put(self, delta: Delta) -> None:
        """Hand ``delta`` to the event loop (engine thread)."""
        self._loop.call_soon_threadsafe(self.queue.put_nowait, (self.index, delta))


class EngineLoop:
    """The engine thread and its inbox (see the module docstring)."""

    def __init__(self, llm: LLM, *, max_waiting: int, metrics: ServerMetrics) -> None:
        self.llm = llm
        self.max_waiting = max_waiting
        self.metrics = metrics
        self._cv = threading.Condition()
        self._new: list[RequestStream] = []
        self._aborts: list[str] = []
        self._calls: list[tuple[Callable[[LLM], Any], Future[Any]]] = []
        self._streams: dict[str, RequestStream] = {}
        self._num_waiting = 0  # the scheduler's, as of the last turn
        #: Finished requests' last deltas, waiting for their store writes.
        self._held: HeldFinishes[tuple[RequestStream, Delta]] = HeldFinishes(self._wake)
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="hybridkv-engine", daemon=True)

    # -- the event loop's side -------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread (requests still queued are dropped) and wait for it."""
        with self._cv:
            self._stop = True
            self._cv.notify()
        if self._thread.is_alive():
            self._thread.join()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def num_waiting(self) -> int:
        """Requests not yet running: the inbox and the scheduler's waiting queue
        (as of the engine thread's last turn)."""
        with self._cv:
            return self._num_waiting + len(self._new)

    def submit(self, streams: list[RequestStream]) -> None:
        """Queue the streams' requests, all or none: ``QueueFull`` when they
        would make more than ``max_waiting`` wait, ``EngineStopped`` once the
        engine thread has stopped."""
        with self._cv:
            if self._stop:
                raise EngineStopped("the engine has stopped")
            if self._num_waiting + len(self._new) + len(streams) > self.max_waiting:
                raise QueueFull(f"{self.max_waiting} requests are waiting already")
            self._new.extend(streams)
            self._cv.notify()

    def abort(self, request_id: str) -> None:
        """Drop the request (if still in the engine) and free its blocks."""
        with self._cv:
            self._aborts.append(request_id)
            self._cv.notify()

    def call(self, fn: Callable[[LLM], Any]) -> Future[Any]:
        """Run ``fn(llm)`` in the engine thread between steps."""
        fut: Future[Any] = Future()
        with self._cv:
            self._calls.append((fn, fut))
            self._cv.notify()
        return fut

    def _wake(self) -> None:
        """A held delta's store writes have ended (the store tier's thread)."""
        with self._cv:
            self._cv.notify()

    # -- the engine thread -------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop()
            reason = "the server is shutting down"
        except BaseException as e:  # the thread dies: /health turns 503
            reason = f"the engine thread failed: {type(e).__name__}: {e}"
            raise
        finally:  # nobody will answer these any more
            self.llm.close()  # the last KV events go out, the publisher stops
            with self._cv:
                self._stop = True
                pending = [*self._streams.values(), *self._new]
                calls, self._calls, self._new = self._calls, [], []
            self._streams.clear()
            for stream, delta in self._held.drain():  # finished: they go out as they are
                stream.put(delta)
            for stream in pending:
                stream.put(Delta([], finish_reason="error", error=reason))
            for _, fut in calls:
                fut.set_exception(RuntimeError(reason))

    def _loop(self) -> None:
        scheduler = self.llm.scheduler
        while True:
            with self._cv:
                while (
                    not (self._stop or self._new or self._aborts or self._calls)
                    and not scheduler.has_unfinished()
                    and (wait := self._held.wait_time()) != 0
                ):
                    self._cv.wait(wait)
                if self._stop:
                    return
                new, self._new = self._new, []
                aborts, self._aborts = self._aborts, []
                calls, self._calls = self._calls, []
            for stream, delta in self._held.due():
                stream.put(delta)
            for stream in new:
                self._streams[stream.request_id] = stream
                scheduler.add_request(stream.request)
            for rid in aborts:
                self._abort(rid)
            if aborts:
                self.llm.publish_kv_events()
            for fn, fut in calls:
                try:
                    fut.set_result(fn(self.llm))
                except Exception as e:  # handed to the caller
                    fut.set_exception(e)
            if scheduler.has_unfinished():
                self._step()
            with self._cv:
                self._num_waiting = len(scheduler.waiting)

    def _abort(self, request_id: str) -> None:
        stream = self._streams.pop(request_id, None)
        if self.llm.scheduler.abort(request_id) and stream is not None:
            self.metrics.request_finished("abort")
            stream.put(Delta([], finish_reason="abort"))

    def _step(self) -> None:
        llm = self.llm
        before = llm.scheduler.num_preemptions
        try:
            out = llm.step()
        except Exception as e:  # the step's requests fail; the server goes on
            self._fail_step(f"{type(e).__name__}: {e}")
            return
        self.metrics.preemptions(llm.scheduler.num_preemptions - before)
        self.metrics.prefix_cache(llm.manager.make_prefix_cache_stats())
        now = time.monotonic()
        finished: list[tuple[RequestStream, Delta]] = []
        for s in out.scheduled:
            req = s.request
            stream = self._streams.get(req.request_id)
            if stream is None:
                continue
            ids = req.core.output_token_ids
            new = list(ids[stream.sent :])
            if not new and not req.status.finished:
                continue
            self.metrics.tokens(stream, req, len(new), now)
            logprobs = None if req.logprobs is None else req.logprobs[stream.sent :]
            stream.sent = len(ids)
            reason = None
            if req.status.finished:
                reason = "stop" if req.status == RequestStatus.FINISHED_STOP else "length"
                del self._streams[req.request_id]
                self.metrics.request_finished(reason, req)
            delta = Delta(
                new, reason, num_cached_tokens=req.num_cached_tokens or 0, logprobs=logprobs
            )
            if reason is None:
                stream.put(delta)
            else:
                finished.append((stream, delta))
        if finished:
            self._finish(finished)

    def _finish(self, finished: list[tuple[RequestStream, Delta]]) -> None:
        """The last deltas of the requests that finished in this step: at once, or,
        with store writes in flight, once those have ended (``HeldFinishes``)."""
        tiers = self.llm.tiers
        barrier = tiers.store_barrier() if tiers is not None else None
        if barrier is None or barrier.done():
            for stream, delta in finished:
                stream.put(delta)
        else:
            self._held.hold(barrier, finished)

    def _fail_step(self, error: str) -> None:
        llm = self.llm
        failed = [s.request for s in llm.last_step.scheduled] if llm.last_step else []
        if not failed and llm.scheduler.waiting:  # nothing ran: the oldest waiting fails
            failed = [llm.scheduler.waiting[0]]
        for req in failed:
            llm.manager.uncache_uncomputed(req.core)
            llm.scheduler.abort(req.request_id)
            stream = self._streams.pop(req.request_id, None)
            if stream is not None:
                self.metrics.request_finished("error")
                stream.put(Delta([], finish_reason="error", error=error))
        llm.publish_kv_events()
