"""Where a tier's copies run: a copy thread, or inline; and batches of copies.

``submit(fn, *args)`` runs ``fn(*args)`` and returns a ``Completion`` of its
return value or exception. ``ThreadCopier`` runs jobs one at a time in
submission order on one thread (CPU copies release the GIL in memcpy and
numpy, file I/O in the kernel); a thread that waits for a job runs the queued
jobs up to it itself, so a wait never pays the copy thread's wake-up (on a
busy machine, milliseconds). ``InlineCopier`` runs them before ``submit``
returns.

``BatchCopier`` wraps either: inside ``with copier.collect():`` every
``submit`` joins one batch that runs as a single job when the block ends, and
each gets an ``ItemCompletion`` of its own result. One job per batch pays the
thread hand-off once, not once per entry (a 256 KiB entry copies in ~11 us; a
hand-off costs more than that).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from hybridkv.tiers.transfer import Completed, Completion


class Copier(Protocol):
    """Runs a tier's copy jobs; ``threaded``: on another thread."""

    threaded: bool

    def submit(self, fn: Callable[..., Any], *args: Any) -> Completion: ...

    def close(self) -> None: ...


class _Job:
    """One job of a ``ThreadCopier``: run once, by the copy thread or a waiter."""

    __slots__ = ("args", "callbacks", "done", "error", "fn", "result")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.fn, self.args = fn, args
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.callbacks: list[Callable[[], None]] = []


class JobCompletion:
    """A ``ThreadCopier`` job. ``wait()`` without a timeout helps: it runs the
    jobs queued before this one and this one itself, in order, in the waiting
    thread, rather than wait for the copy thread to be scheduled."""

    __slots__ = ("_copier", "_job")
    threaded = True

    def __init__(self, copier: ThreadCopier, job: _Job) -> None:
        self._copier, self._job = copier, job

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        with self._copier._lock:
            if not self._job.done.is_set():
                self._job.callbacks.append(fn)
                return
        fn()

    def done(self) -> bool:
        return self._job.done.is_set()

    def wait(self, timeout: float | None) -> None:
        if timeout is None:
            self._copier._help(self._job)
        if not self._job.done.wait(timeout):
            raise TimeoutError(f"transfer not done after {timeout} s")

    def outcome(self) -> tuple[Any, BaseException | None]:
        return self._job.result, self._job.error


class ThreadCopier:
    """One copy thread; jobs run one at a time in submission order, on the thread
    or in a thread that waits for one of them (``JobCompletion.wait``)."""

    threaded = True

    def __init__(self, name: str = "hybridkv-tier-copy") -> None:
        self._lock = threading.Lock()
        self._queue: deque[_Job] = deque()
        self._running = False  # a job is being run (by the thread or a waiter)
        self._idle = threading.Condition(self._lock)  # notified when a job ends
        self._closed = False
        self._name = name
        self._thread: threading.Thread | None = None  # started by the first job

    def submit(self, fn: Callable[..., Any], *args: Any) -> Completion:
        job = _Job(fn, args)
        with self._lock:
            if self._closed:
                raise RuntimeError("the copier is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name=self._name, daemon=True)
                self._thread.start()
            self._queue.append(job)
            self._idle.notify_all()
        return JobCompletion(self, job)

    def _next(self, block: bool) -> _Job | None:
        """Claim the next job (under the lock); None when closed and empty, or
        when another thread runs one (``block``: wait for one instead)."""
        while True:
            if not self._running and self._queue:
                self._running = True
                return self._queue.popleft()
            if not block or (self._closed and not self._queue):
                return None
            self._idle.wait()

    def _run(self, job: _Job) -> None:
        try:
            job.result = job.fn(*job.args)
        except BaseException as e:  # the job's failure is its transfer's error
            job.error = e
        with self._lock:
            self._running = False
            job.done.set()
            callbacks, job.callbacks = job.callbacks, []
            self._idle.notify_all()
        for callback in callbacks:
            callback()

    def _work(self) -> None:
        while True:
            with self._lock:
                job = self._next(block=True)
            if job is None:
                return
            self._run(job)

    def _help(self, target: _Job) -> None:
        """Run queued jobs up to ``target`` in this thread, in order; wait while
        another thread runs one."""
        while not target.done.is_set():
            with self._lock:
                if target.done.is_set():
                    return
                job = self._next(block=False)
                if job is None:
                    self._idle.wait()
                    continue
            self._run(job)

    def close(self) -> None:
        """Run every job still queued, then stop the thread."""
        with self._lock:
            self._closed = True
            self._idle.notify_all()
            thread = self._thread
        if thread is not None and threading.current_thread() is not thread:
            thread.join()


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
