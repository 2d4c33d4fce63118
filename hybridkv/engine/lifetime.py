"""``EngineLifetime``: what an ``LLM`` holds beyond its steps, and how it lets go.

Three things outlive a step: the tiers under the device pool (copy threads, a
disk folder, a store: ``hybridkv.offload``), the KV events publisher (sockets and
a thread: ``hybridkv.events``) and the heap frozen after start-up
(``heap_freeze``). The constructor hands each over as it builds it
(``_hold_tiers``, ``_hold_events``, ``_freeze_heap``), each with a
``weakref.finalize``, so an engine dropped without ``close`` still lets go.
``close`` runs them once each (idempotent): the tiers (the disk tier writes the
cache), the pending KV events (published, then the sockets closed), the heap.

KV events go out after every step (``LLM.step``) and after a change of the cache
outside one (``reset_prefix_cache``, or a caller's ``publish_kv_events``).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Self

from hybridkv.engine.heap_freeze import freeze_startup_heap, release_heap

if TYPE_CHECKING:
    from hybridkv.cache_manager.kv_cache_manager import KVCacheManager
    from hybridkv.events.publisher import ZmqEventPublisher
    from hybridkv.offload import TieredCache


class EngineLifetime:
    """The tiers, the KV events publisher and the frozen heap of an engine (``LLM``)."""

    #: Set by the engine before it hands anything over.
    manager: KVCacheManager
    #: The host / disk / store tiers under the pool, or None (``_hold_tiers``).
    tiers: TieredCache | None
    #: The KV events publisher, or None without an endpoint (``_hold_events``).
    kv_events: ZmqEventPublisher | None

    def _hold_tiers(self, tiers: TieredCache | None) -> None:
        """Own ``tiers`` (None: no tiers): closed by ``close`` or when dropped."""
        self.tiers = tiers
        if tiers is not None:
            self._close_tiers = weakref.finalize(self, tiers.close)
            self._close_tiers.atexit = False  # copy threads are gone by then: close()

    def _hold_events(self, publisher: ZmqEventPublisher | None) -> None:
        """Own the KV events ``publisher`` (None: no endpoint), closed like the tiers."""
        self.kv_events = publisher
        if publisher is not None:
            self._close_events = weakref.finalize(self, publisher.close)

    def _freeze_heap(self) -> None:
        """Freeze the start-up heap (the first engine of a process; ``heap_freeze``)."""
        self._unfreeze = freeze_startup_heap(self)  # the pool leaves the GC's walks

    def publish_kv_events(self) -> None:
        """Publish the KV events collected since the last batch (``step`` does this
        itself; call it after changing the cache outside a step, e.g. uncaching the
        blocks of a failed step). No-op without a KV events endpoint."""
        if self.kv_events is not None:
            self.kv_events.publish(self.manager.take_events())

    def reset_prefix_cache(self) -> bool:
        """Drop every cached block (only when no request holds blocks). Returns success."""
        ok = self.manager.reset_prefix_cache()
        self.publish_kv_events()
        return ok

    def close(self) -> None:
        """Publish pending KV events and close the events sockets; write the cache to
        the disk tier (if any) and close the tiers; unfreeze the heap if this engine's
        start-up froze it (``heap_freeze``). Idempotent."""
        if self.tiers is not None and self._close_tiers.alive:
            self._close_tiers()
        if self.kv_events is not None and self._close_events.alive:
            self.publish_kv_events()
            self._close_events()
        release_heap(self._unfreeze)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
