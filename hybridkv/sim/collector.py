"""``collector_paused``: Python's cyclic garbage collector held off during a replay.

A replay allocates millions of small objects (block token lists, hash lists,
requests) and keeps a large heap alive (the trace, every block). CPython's
collector runs after every few hundred allocations and walks the young
objects, and from time to time the whole heap: on the Gemma 3 27B replay
that is about a quarter of the wall time, for almost no garbage (the manager
and scheduler make few reference cycles). So, as vLLM does after start-up,
the heap that exists when the replay starts is frozen (never walked again),
automatic collection is off, and the replay collects by hand every
``every`` calls of ``tick``: what cycles it makes are still reclaimed, at a
bounded delay. Everything is restored on exit, whatever happens.

Decisions do not depend on it: only when unreachable cycles are freed.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

#: Finished requests between two manual collections.
COLLECT_EVERY = 2000


class _Ticker:
    """Counts finished requests; collects every ``every`` of them."""

    __slots__ = ("collections", "count", "every")

    def __init__(self, every: int) -> None:
        self.every = every
        self.count = 0
        self.collections = 0

    def tick(self, n: int = 1) -> None:
        self.count += n
        if self.count >= self.every:
            self.count = 0
            self.collections += 1
            gc.collect()


@contextmanager
def collector_paused(every: int = COLLECT_EVERY) -> Iterator[_Ticker]:
    """Freeze the current heap, stop automatic collection, and hand back a
    ticker whose ``tick(n)`` collects every ``every`` ticks; restore on exit."""
    if every < 1:
        raise ValueError(f"every must be >= 1, got {every}")
    was_enabled = gc.isenabled()
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield _Ticker(every)
    finally:
        gc.unfreeze()
        if was_enabled:
            gc.enable()
