"""``Transfer``: one asynchronous store or load, and what it waits on.

A transfer wraps a *completion*: a finished value (``Completed``), a
``concurrent.futures.Future`` of a copy thread (``FutureCompletion``), or a
CUDA event (``tiers/torch_memory.py``). When it is first seen done (by
``done()``, ``wait()``, the tier's ``poll()``, or the thread's own callback)
it *settles* exactly once: the tier releases the entry's pin and commits or
drops it. After settling, ``error`` is None on success and ``result`` holds
a load's parts. A *batch* transfer (``HostTier.store_rows`` / ``load_rows`` / ``load_parts``)
covers several entries: ``keys`` names them all, and it settles them at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol


class Completion(Protocol):
    """What a transfer waits on. ``threaded``: it completes on another thread and
    calls back (``add_done_callback``); else whoever looks at it settles it."""

    threaded: bool

    def done(self) -> bool: ...

    def wait(self, timeout: float | None) -> None:
        """Block until done; raise ``TimeoutError`` if ``timeout`` passes first."""

    def outcome(self) -> tuple[Any, BaseException | None]:
        """``(result, error)`` once done."""


class Completed:
    """A completion that is already done (a skipped store, an inline copy)."""

    __slots__ = ("_error", "_result")
    threaded = False

    def __init__(self, result: Any = None, error: BaseException | None = None) -> None:
        self._result = result
        self._error = error

    def done(self) -> bool:
        return True

    def wait(self, timeout: float | None) -> None:
        return None

    def outcome(self) -> tuple[Any, BaseException | None]:
        return self._result, self._error


class FutureCompletion:
    """A job on a copy thread (``concurrent.futures.Future``)."""

    __slots__ = ("future",)
    threaded = True

    def __init__(self, future: Future[Any]) -> None:
        self.future = future

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        self.future.add_done_callback(lambda _f: fn())

    def done(self) -> bool:
        return self.future.done()

    def wait(self, timeout: float | None) -> None:
        if self.future.done():
            return
        try:
            self.future.exception(timeout)  # waits; the job's own error is outcome()'s
        except TimeoutError:
            raise TimeoutError(f"transfer not done after {timeout} s") from None

    def outcome(self) -> tuple[Any, BaseException | None]:
        error = self.future.exception()
        return (None if error is not None else self.future.result()), error


class Transfer:
    """An asynchronous store or load of one key (module docstring)."""

    __slots__ = (
        "_lock",
        "_on_settle",
        "_settled",
        "completion",
        "error",
        "key",
        "keys",
        "kind",
        "result",
    )

    def __init__(
        self,
        key: Any,
        kind: str,
        completion: Completion,
        on_settle: Callable[[Transfer], None] | None = None,
        keys: tuple[Any, ...] | None = None,
    ) -> None:
        self.key = key
        #: Every entry the transfer pins until it settles (a batch's; else ``(key,)``).
        self.keys = (key,) if keys is None else keys
        self.kind = kind  # "store" | "load"
        self.completion = completion
        self.result: Any = None
        self.error: BaseException | None = None
        self._on_settle = on_settle
        self._settled = False
        self._lock = threading.Lock()
        if completion.threaded:
            completion.add_done_callback(self._settle)  # type: ignore[attr-defined]

    @property
    def settled(self) -> bool:
        """True once the tier has accounted for the transfer's end."""
        return self._settled

    def done(self) -> bool:
        """True once the copy has ended (settling it if it had not been)."""
        if self._settled:
            return True
        if not self.completion.done():
            return False
        self._settle()
        return True

    def wait(self, timeout: float | None = None) -> bool:
        """Block until done (``TimeoutError`` after ``timeout`` s); True on success."""
        if not self._settled:
            self.completion.wait(timeout)
            self._settle()
        return self.error is None

    def _settle(self) -> None:
        # The tier's accounting runs under this transfer's lock, so that a
        # wait() returning in one thread sees what another thread settled.
        # (The tier never calls into a transfer while holding its own lock.)
        # ``settled`` turns True only once the tier's accounting is done, so that a
        # wait() or done() in another thread never returns before it.
        with self._lock:
            if self._settled:
                return
            self.result, self.error = self.completion.outcome()
            try:
                if self._on_settle is not None:
                    self._on_settle(self)
            finally:
                self._settled = True

    def __repr__(self) -> str:
        state = (
            "pending" if not self._settled else ("ok" if self.error is None else repr(self.error))
        )
        return f"Transfer({self.kind} {self.key!r}: {state})"
