"""``InFlightStep``: tier copies ordered after the device step still in flight.

With async scheduling (``hybridkv.engine.async_step``) step N+1 is scheduled while
step N runs on the device, so a tier copy issued while scheduling N+1, or between
two ``LLM.step`` calls, may touch device blocks N still writes:

- **reads** of blocks N writes: the write-through and computed-block stores of N
  itself (``TieredCache.after_step``, from ``Scheduler.commit_computed`` before N+1
  is scheduled: the next schedule may free a window's blocks or preempt the
  request, so this is the last moment its blocks are all there), a preempted
  request's swap (``Swap.swap_out``: N computed its newest blocks, cached since
  they were allocated), the demotion of those blocks when the same schedule
  reuses them (``Demotion.demote`` from ``BlockPool.on_take``), a store's copy of
  a freed request's blocks (``StoreWrites.on_free``), ``persist`` at close;
- **writes** into blocks N still reads or writes: a load's destination blocks are
  taken from the free list (``Loads`` through ``BlockPool.get_new_blocks``), which
  holds the blocks of requests freed while N was in flight (a victim preempted
  while scheduling N+1; a request that stopped at N-1 and still got a slot in N).

So the engine tells the tiers which step is in flight (``launched`` with its fence,
``landed`` once its tokens are read) and every such copy calls ``before_copy``
first: the host waits for the step's fence, unless ``stream_ordered``::

    host    schedule N+1: take / swap / free ... before_copy | copy issued
    device  ... N runs ...............................| (N landed) | copy reads / writes

``stream_ordered`` (CUDA): nothing to wait for, the copies are ordered already:
every tier copy of device blocks is queued on a copy stream that first waits for
the work queued on the current stream (``TorchHostMemory._on_stream``,
``UnitReads``), or runs on the current stream itself (a disk or store load's
``copy_``), and step N was queued on the current stream before the copy. On the
CPU a step's work is done when ``execute`` returns (its fence is ``Done``): the
wait is free there, and what this orders is a stand-in device that lands a step's
writes only at its fence (``tests/engine/deferred_device.py``).

In a step call the commit's stores come first, so the copies of the schedule after
them find the step landed; the other call sites order what is issued between calls
(``close``'s ``persist``, an abort's store writes, a take outside a schedule) and keep
each copy's rule where the copy is. A fence waited here is waited again when the
engine reads the step's tokens (a fence may be waited any number of times).
"""

from __future__ import annotations

from typing import Protocol


class Fence(Protocol):
    """The point on the device after a step (``hybridkv.engine.async_step`` records one
    per launch: a CUDA event, ``Done`` on the CPU)."""

    def wait(self) -> None: ...


class InFlightStep:
    """The newest step launched and not landed (module docstring); ``waits``: the
    copies that made the host wait for it."""

    __slots__ = ("_fence", "stream_ordered", "waits")

    def __init__(self, stream_ordered: bool) -> None:
        self.stream_ordered = stream_ordered
        self._fence: Fence | None = None
        self.waits = 0

    def launched(self, fence: Fence) -> None:
        """A step was launched; ``fence`` passes once it has run (and every step
        before it: a stream runs in order)."""
        self._fence = fence

    def landed(self, fence: Fence | None = None) -> None:
        """The step of ``fence`` has landed (None: every step, e.g. after a failure);
        a newer step stays in flight."""
        if fence is None or fence is self._fence:
            self._fence = None

    def before_copy(self) -> None:
        """A tier copy that reads or writes device blocks is about to be issued:
        return once it would run after the step in flight."""
        fence = self._fence
        if fence is None or self.stream_ordered:
            return
        fence.wait()
        self.waits += 1
        self._fence = None
