"""Where a tier's copies run: a copy thread, or inline; and batches of copies.

``submit(fn, *args)`` runs ``fn(*args)`` and returns a ``Completion`` of its
return value or exception. ``ThreadCopier`` runs jobs in submission order on
one thread (CPU copies release the GIL in memcpy, file I/O in the kernel);
``InlineCopier`` runs them before ``submit`` returns.

``BatchCopier`` wraps either: inside ``with copier.collect():`` every
``submit`` joins one batch that runs as a single job when the block ends, and
each gets an ``ItemCompletion`` of its own result. One job per batch pays the
thread hand-off once, not once per entry (a 256 KiB entry copies in ~11 us; a
hand-off costs more than that).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Protocol

from hybridkv.tiers.transfer import Completed, Completion, FutureCompletion


class Copier(Protocol):
    """Runs a tier's copy jobs; ``threaded``: on another thread."""

    threaded: bool

    def submit(self, fn: Callable[..., Any], *args: Any) -> Completion: ...

    def close(self) -> None: ...


class ThreadCopier:
    """One copy thread; jobs run in submission order."""

    threaded = True

    def __init__(self, name: str = "hybridkv-tier-copy") -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Completion:
        return FutureCompletion(self._pool.submit(fn, *args))

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class InlineCopier:
    """Runs each job at once, in the caller's thread."""

    threaded = False

    def submit(self, fn: Callable[..., Any], *args: Any) -> Completion:
        try:
            return Completed(fn(*args))
        except Exception as e:  # the job's failure is the transfer's error
            return Completed(None, e)

    def close(self) -> None:
        return None


class _Batch:
    """Jobs collected for one submission, and their outcomes once it ran."""

    def __init__(self) -> None:
        self.jobs: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        self.callbacks: list[Callable[[], None]] = []
        self.outcomes: list[tuple[Any, BaseException | None]] = []
        self.parent: Completion | None = None

    def run(self) -> None:
        for fn, args in self.jobs:
            try:
                self.outcomes.append((fn(*args), None))
            except Exception as e:  # one entry's failure is its own
                self.outcomes.append((None, e))

    def fire(self) -> None:
        for callback in self.callbacks:
            callback()


class ItemCompletion:
    """One job of a batch."""

    __slots__ = ("batch", "index", "threaded")

    def __init__(self, batch: _Batch, index: int, threaded: bool) -> None:
        self.batch = batch
        self.index = index
        self.threaded = threaded

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        self.batch.callbacks.append(fn)  # fired once the batch's job has run

    def _parent(self) -> Completion:
        assert self.batch.parent is not None, "a batch item looked at before its batch ran"
        return self.batch.parent

    def done(self) -> bool:
        return self._parent().done()

    def wait(self, timeout: float | None) -> None:
        self._parent().wait(timeout)

    def outcome(self) -> tuple[Any, BaseException | None]:
        _, error = self._parent().outcome()
        return (None, error) if error is not None else self.batch.outcomes[self.index]


class BatchCopier:
    """A copier whose jobs submitted inside ``collect()`` run as one (module docstring)."""

    def __init__(self, inner: Copier) -> None:
        self.inner = inner
        self.threaded = inner.threaded
        self._batch: _Batch | None = None

    def submit(self, fn: Callable[..., Any], *args: Any) -> Completion:
        if self._batch is None:
            return self.inner.submit(fn, *args)
        self._batch.jobs.append((fn, args))
        return ItemCompletion(self._batch, len(self._batch.jobs) - 1, self.threaded)

    @contextmanager
    def collect(self) -> Iterator[None]:
        """Collect the jobs submitted in the block; submit them as one when it ends
        (none of them if the block raises)."""
        assert self._batch is None, "collect() does not nest"
        batch = self._batch = _Batch()
        try:
            yield
        except BaseException:
            self._batch = None  # the block failed: none of its jobs runs
            raise
        else:
            self._batch = None
            if batch.jobs:
                parent = self.inner.submit(batch.run)
                batch.parent = parent
                if parent.threaded:
                    parent.add_done_callback(batch.fire)  # type: ignore[attr-defined]

    def close(self) -> None:
        self.inner.close()
