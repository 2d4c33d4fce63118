"""``WriteBarrier``: the store writes an engine had queued at one moment, so that a
finished request's output can wait until what it wrote is in the store.

The puts to a store shared by replicas run on the store tier's thread
(``StoreWrites``): a step never waits for them. A conversation's next turn,
though, is sent the moment the previous reply ends, and round-robin routing
sends it to another replica, whose lookup then misses what the put still in
flight carries (under ``hybrid`` the free writes the reply's blocks and the
tail's kept points: ``docs/tiers.md``, "What is written, and when"). So the
engine takes a barrier after the step in which requests finish and hands their
outputs over once it is ``done``: every write queued until then has ended,
landed or failed. The step itself never waits:

- ``LLM.generate`` returns once the barrier after its last step is done;
- the server's engine loop holds a finished request's last chunk
  (``serving.held_finishes``) and goes on stepping the others.

Each wait is bounded (``max_wait``: the ``kv_store`` URL's ``finish`` field, 1 s
by default, ``tiers.store_url``; 0: no barrier is taken, nothing waits): an
output held past it goes out with its writes still in flight, counted as
``OffloadStats.store_late``. A write the store refused (full, unreachable) has
ended too: the output does not wait for a write that will never land.

    step k: request r finishes; its free queues puts p1..pn (and earlier
    steps' puts may still be in flight)
    barrier = the puts in flight after step k
    r's output goes out when every one of them has ended (<= max_wait)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from hybridkv.offload.stats import OffloadStats
from hybridkv.tiers import Transfer


class WriteBarrier:
    """The writes in flight at one moment (module docstring). ``stats``: where
    ``release`` counts the waits; ``max_wait``: seconds an output waits at most
    (``deadline``)."""

    __slots__ = (
        "_callbacks",
        "_held",
        "_left",
        "_lock",
        "_started",
        "_stats",
        "_transfers",
        "deadline",
    )

    def __init__(self, transfers: Sequence[Transfer], stats: OffloadStats, max_wait: float) -> None:
        self._transfers = [t for t in transfers if not t.done()]
        self._stats = stats
        self._started = time.monotonic()
        #: When an output held on it goes anyway (``time.monotonic()``).
        self.deadline = self._started + max_wait
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []
        self._left = len(self._transfers)
        #: Something was in flight when it was taken (an output waits on it).
        self._held = bool(self._transfers)
        for t in self._transfers:
            # A store transfer ends on the tier's thread and calls back; one that does
            # not would never wake a waiter (only its ``deadline`` would).
            assert t.completion.threaded, f"{t!r}: a store write that does not call back"
            t.completion.add_done_callback(self._one_ended)  # type: ignore[attr-defined]

    def _one_ended(self) -> None:
        with self._lock:
            self._left -= 1
            if self._left:
                return
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            fn()

    def done(self) -> bool:
        """True once every write has ended (landed or failed)."""
        self._transfers = [t for t in self._transfers if not t.done()]
        return not self._transfers

    def when_done(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` once every write has ended: now (in this thread) if they
        have, else from the thread that ends the last one."""
        with self._lock:
            if self._left:
                self._callbacks.append(fn)
                return
        fn()

    def wait(self) -> bool:
        """Block until every write has ended, or until ``deadline``; then ``release``.
        True when they all ended."""
        for t in self._transfers:
            left = self.deadline - time.monotonic()
            if left <= 0:
                break
            try:
                t.completion.wait(left)
            except TimeoutError:
                break
        return self.release()

    def release(self) -> bool:
        """The output held on this barrier goes now (called once): count its wait
        (``store_waits``, ``store_wait_seconds``) and, with writes still in flight,
        ``store_late``. True when they all ended."""
        done = self.done()
        if self._held:
            stats = self._stats
            stats.store_waits += 1
            stats.store_wait_seconds += time.monotonic() - self._started
            stats.store_late += not done
        return done
