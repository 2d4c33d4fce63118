"""Where a tier's copies run: a copy thread, or inline (tests, benchmarks' baseline).

``submit(fn, *args)`` runs ``fn(*args)`` and returns a ``Completion`` of its
return value or exception. ``ThreadCopier`` runs jobs in submission order on
one thread (CPU copies release the GIL in memcpy, file I/O in the kernel);
``InlineCopier`` runs them before ``submit`` returns.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from hybridkv.tiers.transfer import Completed, Completion, FutureCompletion


class Copier(Protocol):
    """Runs a tier's copy jobs."""

    def submit(self, fn: Callable[..., Any], *args: Any) -> Completion: ...

    def close(self) -> None: ...


class ThreadCopier:
    """One copy thread; jobs run in submission order."""

    def __init__(self, name: str = "hybridkv-tier-copy") -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Completion:
        return FutureCompletion(self._pool.submit(fn, *args))

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class InlineCopier:
    """Runs each job at once, in the caller's thread."""

    def submit(self, fn: Callable[..., Any], *args: Any) -> Completion:
        try:
            return Completed(fn(*args))
        except Exception as e:  # the job's failure is the transfer's error
            return Completed(None, e)

    def close(self) -> None:
        return None
