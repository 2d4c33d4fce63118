"""``BatchItem``: one entry's share of a batch job run on a thread pool.

The store tier sends a batch of entries as one request from one job; the job
returns one ``(result, error)`` per entry, and each entry's ``Transfer`` waits on
a ``BatchItem`` (a ``Completion``) that picks its own outcome out of the job's.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

#: One entry's ``(result, error)`` in a batch job's answer.
Outcome = tuple[Any, "BaseException | None"]


class BatchItem:
    """One entry's share of a batch job (a ``Completion``; the job returns one
    ``(result, error)`` per entry). ``size``: the bytes it holds in the write queue."""

    __slots__ = ("future", "index", "size")
    threaded = True

    def __init__(self, index: int, size: int = 0) -> None:
        self.future: Future[list[Outcome]] | None = None
        self.index = index
        self.size = size

    def _job(self) -> Future[list[Outcome]]:
        assert self.future is not None, "an item looked at before its job was submitted"
        return self.future

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        self._job().add_done_callback(lambda _f: fn())

    def done(self) -> bool:
        return self._job().done()

    def wait(self, timeout: float | None) -> None:
        try:
            self._job().exception(timeout)
        except TimeoutError:
            raise TimeoutError(f"store transfer not done after {timeout} s") from None

    def outcome(self) -> tuple[Any, BaseException | None]:
        job = self._job()
        error = job.exception()
        return (None, error) if error is not None else job.result()[self.index]
