"""``WriteBarrier``: the store writes in flight at one moment; done once each has
ended (landed or failed), calling back from the thread that ends the last one, and
counting an output's wait and a wait cut short (``store_late``)."""

from __future__ import annotations

import threading
from concurrent.futures import Future

from hybridkv.offload.stats import OffloadStats
from hybridkv.offload.write_barrier import WriteBarrier
from hybridkv.tiers import Transfer
from hybridkv.tiers.transfer import Completed, FutureCompletion


def _write(key: int) -> tuple[Transfer, Future[None]]:
    fut: Future[None] = Future()
    return Transfer(key, "store", FutureCompletion(fut)), fut


def test_done_once_every_write_has_ended_landed_or_failed() -> None:
    (t1, f1), (t2, f2) = _write(1), _write(2)
    skipped = Transfer(3, "store", Completed(error=OSError("no room")))  # ended already
    stats = OffloadStats()
    barrier = WriteBarrier([t1, t2, skipped], stats, 60)
    called: list[str] = []
    barrier.when_done(lambda: called.append(threading.current_thread().name))
    assert not barrier.done()
    f1.set_result(None)
    assert not barrier.done() and not called
    ended = threading.Thread(target=lambda: f2.set_exception(OSError("put failed")), name="w")
    ended.start()
    ended.join()
    assert called == ["w"]  # from the thread that ended the last write, once
    assert barrier.done()
    assert barrier.release()
    assert stats.store_waits == 1 and stats.store_late == 0 and stats.store_wait_seconds > 0


def test_a_barrier_with_nothing_in_flight_is_done_and_counts_no_wait() -> None:
    (t, f) = _write(1)
    f.set_result(None)
    stats = OffloadStats()
    barrier = WriteBarrier([t], stats, 60)
    called: list[int] = []
    barrier.when_done(lambda: called.append(1))
    assert called == [1] and barrier.done()
    assert barrier.wait()
    assert stats.store_waits == 0 and stats.store_wait_seconds == 0


def test_wait_returns_when_the_writes_end() -> None:
    (t, f) = _write(1)
    stats = OffloadStats()
    barrier = WriteBarrier([t], stats, 10)
    timer = threading.Timer(0.05, lambda: f.set_result(None))
    timer.start()
    assert barrier.wait()
    assert stats.store_waits == 1 and stats.store_late == 0
    assert 0.04 < stats.store_wait_seconds < 5


def test_a_wait_cut_short_is_counted_late() -> None:
    (t, f) = _write(1)
    stats = OffloadStats()
    barrier = WriteBarrier([t], stats, 0.05)
    assert not barrier.wait()
    assert stats.store_waits == 1 and stats.store_late == 1
    assert stats.store_wait_seconds >= 0.05
    f.set_result(None)  # ends later: nothing more is counted
    assert barrier.done() and stats.store_late == 1
