"""Where a tier's copies run: a copy thread, or inline; and batches of copies.

``submit(fn, *args)`` runs ``fn(*args)`` and returns a ``Completion`` of its
return value or exception. ``ThreadCopier`` runs jobs one at a time in
submission order on one thread (CPU copies release the GIL in memcpy and
numpy, file I/O in the kernel); a thread that waits for a job runs the queued
jobs up to it itself, so a wait never pays the copy thread's wake-up (on a
busy machine, milliseconds). ``queue(fn, *args)`` submits without waking the
thread: the job runs when someone waits for it, or once ``wake()`` (or a later
``submit``) wakes the thread. A job its submitter is about to wait for then
never has the thread contend for the GIL and the lock while the waiter runs
it. ``InlineCopier`` runs them before ``submit`` returns.

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
    """Runs a tier's copy jobs; ``threaded``: on another thread. (A copier may
    also have ``queue(fn, *args)`` and ``wake()``: ``ThreadCopier``'s.)"""

    threaded: bool

    def submit(self, fn: Callable[..., Any], *args: Any) -> Completion: ...

    def close(self) -> None: ...


class _Job:
    """One job of a ``ThreadCopier``: run once, by the copy thread or a waiter."""

    __slots__ = ("args", "callbacks", "done", "error", "fn", "result", "seq")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], seq: int) -> None:
        self.fn, self.args, self.seq = fn, args, seq
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
        self._work = threading.Condition(self._lock)  # the thread's: jobs to run, or close
        self._seq = 0  # jobs added so far (each job's ``seq``: its number)
        self._wake_upto = 0  # the thread runs the jobs up to this number (``queue`` leaves it)
        self._closed = False
        self._name = name
        self._thread: threading.Thread | None = None  # started by the first job

    def submit(self, fn: Callable[..., Any], *args: Any) -> Completion:
        return self._add(fn, args, wake=True)

    def queue(self, fn: Callable[..., Any], *args: Any) -> Completion:
        """``submit`` without waking the thread (module docstring)."""
        return self._add(fn, args, wake=False)

    def wake(self) -> None:
        """Wake the thread for the jobs ``queue`` left to it."""
        with self._lock:
            if self._wake_upto < self._seq:
                self._wake_upto = self._seq
                self._work.notify()

    def _add(self, fn: Callable[..., Any], args: tuple[Any, ...], wake: bool) -> Completion:
        with self._lock:
            if self._closed:
                raise RuntimeError("the copier is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
                self._thread.start()
            self._seq += 1
            job = _Job(fn, args, self._seq)
            self._queue.append(job)
            if wake:
                self._wake_upto = self._seq
                self._work.notify()
        return JobCompletion(self, job)

    def _thread_may_run(self) -> bool:
        """True when the head job is one the thread was woken for (under the lock)."""
        return bool(self._queue) and self._queue[0].seq <= self._wake_upto

    def _next(self, block: bool) -> _Job | None:
        """Claim the next job (under the lock); None when closed and empty, or
        when another thread runs one (``block``, the copy thread: wait to be
        woken for one instead; it leaves the jobs ``queue`` left alone)."""
        while True:
            if not self._running and (self._thread_may_run() if block else self._queue):
                self._running = True
                return self._queue.popleft()
            if not block or (self._closed and not self._queue):
                return None
            self._work.wait()

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
            if self._thread_may_run():
                self._work.notify()  # the thread may have waited for this run to end
        for callback in callbacks:
            callback()

    def _serve(self) -> None:
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
            self._wake_upto = self._seq  # (close runs every job still queued)
            self._work.notify()
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
    def collect(self, wake: bool = True) -> Iterator[None]:
        """Collect the jobs submitted in the block; submit them as one when it ends
        (none of them if the block raises). ``wake=False``: through the inner
        copier's ``queue`` where it has one (its thread is not woken for them)."""
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
                submit = self.inner.submit
                if not wake:
                    submit = getattr(self.inner, "queue", submit)
                parent = submit(batch.run)
                batch.parent = parent
                if parent.threaded:
                    parent.add_done_callback(batch.fire)  # type: ignore[attr-defined]

    def wake(self) -> None:
        """The inner copier's ``wake`` (where it has one): run what ``queue`` left."""
        wake = getattr(self.inner, "wake", None)
        if wake is not None:
            wake()

    def close(self) -> None:
        self.inner.close()
