"""``LazyCopier``: a tier copier whose copies land when the test says, or when
someone waits for one.

It stands for a copy thread (the host tier's on the CPU, the disk tier's I/O
thread) whose timing the test controls: ``submit`` queues the job; ``land(n)``
runs the oldest ``n`` in submission order, each completion then calling back
(as a thread's future does, here on the test's thread), so a transfer settles
as it lands. A ``wait`` on a job not yet run runs every job up to it first, so
a caller that must wait (a demotion before its block is rewritten, a load the
scheduler waits on) never blocks, while every other copy stays in flight for
as long as the state machine likes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any


class LazyJob:
    """One queued copy (a threaded ``Completion``: it calls back when it has run)."""

    threaded = True

    def __init__(self, copier: LazyCopier, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self._copier = copier
        self._fn = fn
        self._args = args
        self._ran = False
        self._result: Any = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[], None]] = []

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        if self._ran:
            fn()
        else:
            self._callbacks.append(fn)

    def run(self) -> None:
        try:
            self._result = self._fn(*self._args)
        except Exception as e:  # the job's failure is the transfer's error
            self._error = e
        self._ran = True
        for fn in self._callbacks:
            fn()

    def done(self) -> bool:
        return self._ran

    def wait(self, timeout: float | None) -> None:
        while not self._ran:
            self._copier.land(1)

    def outcome(self) -> tuple[Any, BaseException | None]:
        assert self._ran
        return self._result, self._error


class LazyCopier:
    """Copies held until landed or waited for (module docstring)."""

    threaded = True

    def __init__(self) -> None:
        self.pending: deque[LazyJob] = deque()

    def submit(self, fn: Callable[..., Any], *args: Any) -> LazyJob:
        job = LazyJob(self, fn, args)
        self.pending.append(job)
        return job

    def land(self, count: int | None = None) -> None:
        """Run the oldest ``count`` jobs (all by default)."""
        count = len(self.pending) if count is None else count
        for _ in range(min(count, len(self.pending))):
            self.pending.popleft().run()

    def close(self) -> None:
        self.land()
