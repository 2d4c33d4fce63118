"""``HeldPuts``: store batches built now and put later, together, as one job.

A request's free comes in several calls (one per released run); each unit's
object is built at once (the block may be reused right after), into the
store tier's staging memory, but the batches wait for one ``send`` so that
the whole free goes out as one existence check and one put. Each held batch
has its own ``Future`` (its ``BatchItem``s wait on it), answered with its own
slice of the joint job's outcomes.

Contract: a held batch's transfers are not done until ``send`` (or the tier's
``close``, which sends first); the caller that holds batches sends them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from hybridkv.tiers.batch_item import Outcome

#: One built batch: its ``(key, staged object)`` pairs, and the future its items wait on.
Held = tuple[list[tuple[Any, Any]], "Future[list[Outcome]]"]


class HeldPuts:
    """Batches waiting for ``send`` (module docstring). Thread-safe."""

    def __init__(self) -> None:
        self._held: list[Held] = []
        self._lock = threading.Lock()

    def hold(self, batch: list[tuple[Any, Any]]) -> Future[list[Outcome]]:
        """Keep ``batch`` until ``take``; the future its items wait on."""
        future: Future[list[Outcome]] = Future()
        with self._lock:
            self._held.append((batch, future))
        return future

    def take(self) -> list[Held]:
        """Every batch held, oldest first; none is held after."""
        with self._lock:
            held, self._held = self._held, []
        return held

    @staticmethod
    def run(held: list[Held], put: Callable[[list[Any]], list[Outcome]]) -> None:
        """Put ``held``'s batches as one (``put``), and answer each future with its slice
        (or ``put``'s exception)."""
        joint = [pair for batch, _ in held for pair in batch]
        try:
            outcomes = put(joint)
        except BaseException as e:
            for _, future in held:
                future.set_exception(e)
            raise
        at = 0
        for batch, future in held:
            future.set_result(outcomes[at : at + len(batch)])
            at += len(batch)
