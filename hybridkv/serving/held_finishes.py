"""``HeldFinishes``: a finished request's last ``Delta`` held until the store has
what it wrote (``hybridkv.offload.write_barrier``).

With a store shared by replicas, the engine loop takes a ``WriteBarrier``
after a step in which requests finished. Their last deltas (the ones carrying
``finish_reason``) wait here until the barrier is done, so that a client who
sends the conversation's next turn the moment the reply ends, to any replica,
finds the reply's blocks in the store; the loop meanwhile steps the other
requests. A delta is never held past its barrier's ``deadline`` (the store
URL's ``finish``; then it goes out anyway, counted as ``store_late``).

Contract (engine thread only, except ``wake``): ``hold`` files deltas under a
barrier, whose end calls ``wake`` (from the store's thread); ``due`` returns,
in finishing order, those whose barrier is done or whose time is up;
``wait_time`` says how long the loop may sleep; ``drain`` returns every one
still held (the loop is stopping: they are finished results, and go out).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

from hybridkv.offload.write_barrier import WriteBarrier

T = TypeVar("T")


class HeldFinishes(Generic[T]):
    """Items (a stream and its last delta) held on write barriers (module docstring)."""

    def __init__(self, wake: Callable[[], None]) -> None:
        self._wake = wake
        #: ``(barrier, items)``, oldest first.
        self._held: deque[tuple[WriteBarrier, list[T]]] = deque()

    def __len__(self) -> int:
        return sum(len(items) for _, items in self._held)

    def hold(self, barrier: WriteBarrier, items: list[T]) -> None:
        """Hold ``items`` until ``barrier`` is done (at most until its ``deadline``)."""
        if items:
            self._held.append((barrier, items))
            barrier.when_done(self._wake)

    def due(self) -> list[T]:
        """The items free to go: each barrier that is done, or whose time is up
        (released, counted); in the order they were held."""
        out: list[T] = []
        if not self._held:
            return out
        now = time.monotonic()
        still: deque[tuple[WriteBarrier, list[T]]] = deque()
        for barrier, items in self._held:
            if barrier.done() or now >= barrier.deadline:
                barrier.release()
                out.extend(items)
            else:
                still.append((barrier, items))
        self._held = still
        return out

    def wait_time(self) -> float | None:
        """Seconds the loop may sleep before an item is due (None: nothing held;
        0: one is due now)."""
        if not self._held:
            return None
        if any(barrier.done() for barrier, _ in self._held):
            return 0.0
        return max(0.0, min(b.deadline for b, _ in self._held) - time.monotonic())

    def drain(self) -> list[T]:
        """Every item still held (released at once)."""
        out = []
        for barrier, items in self._held:
            barrier.release()
            out.extend(items)
        self._held.clear()
        return out
