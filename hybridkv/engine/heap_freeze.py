"""``freeze_startup_heap``: what an engine built at start-up leaves the garbage
collector's generations.

An engine's start-up builds long-lived objects by the hundred thousand: the
block pool's blocks and their free list, the managers' tables, the tiers'
ledgers. CPython's cyclic collector walks every tracked object at each full
(generation 2) collection, which allocation counts trigger from time to time:
with a large pool that is one pause of tens to hundreds of milliseconds in a
step, for almost no garbage (``benchmarks/results/gc-freeze.md``).
``gc.freeze()`` moves every object alive into a permanent generation that no
collection walks, as vLLM does after its start-up. Frozen objects are still
freed by reference counting; only their reference cycles wait.

Freezing is process-wide, so an ``LLM`` freezes only when nothing froze the heap
before it (``gc.get_freeze_count() == 0``), after one full collection (so no
garbage is frozen), and its ``close`` unfreezes (``release_heap``; so does the
engine's being freed without ``close``, unless a cycle holds it): once the
engine is dropped, its cycles (an engine holds some: tier callbacks) are
collectable again, and the next engine to start freezes anew.
While the heap is frozen, further engines do not freeze (their pools are walked
as before). Freezing at every start instead would keep every engine dropped
without ``close`` alive for good (a frozen cycle is never collected): in a
process that builds many engines, as the tests do, that is a leak per engine;
this way it is bounded by what lived at one start-up. The simulator freezes
the heap for each replay on its own (``sim/collector.py``).
"""

from __future__ import annotations

import gc
import weakref


def freeze_startup_heap(engine: object) -> weakref.finalize | None:
    """After ``engine``'s start-up: collect, then freeze the heap, unless something
    froze it already. The unfreeze (for ``release_heap``; it also runs if ``engine``
    is freed first), or None when this call froze nothing."""
    if gc.get_freeze_count():
        return None
    gc.collect()
    gc.freeze()
    unfreeze = weakref.finalize(engine, gc.unfreeze)
    unfreeze.atexit = False  # the process is ending: nothing to collect for
    return unfreeze


def release_heap(unfreeze: weakref.finalize | None) -> None:
    """At the close of the engine whose start-up froze the heap: unfreeze it (once)."""
    if unfreeze is not None:
        unfreeze()
