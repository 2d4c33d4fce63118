"""``HeldFinishes``: last deltas held on write barriers go out when their writes end
(the loop woken from the writer's thread), or at the barrier's deadline (counted late), or all
at once when the loop stops."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

from hybridkv.offload.stats import OffloadStats
from hybridkv.offload.write_barrier import WriteBarrier
from hybridkv.serving.held_finishes import HeldFinishes
from hybridkv.tiers import Transfer
from hybridkv.tiers.transfer import FutureCompletion


def _barrier(stats: OffloadStats, max_wait: float = 60) -> tuple[WriteBarrier, Future[None]]:
    fut: Future[None] = Future()
    return WriteBarrier([Transfer(0, "store", FutureCompletion(fut))], stats, max_wait), fut


def test_items_go_out_when_their_writes_end_and_the_loop_is_woken() -> None:
    stats = OffloadStats()
    woken = threading.Event()
    held: HeldFinishes[str] = HeldFinishes(woken.set)
    (b1, f1), (b2, f2) = _barrier(stats), _barrier(stats)
    held.hold(b1, ["r1", "r2"])
    held.hold(b2, ["r3"])
    assert held.due() == [] and len(held) == 3
    wait = held.wait_time()
    assert wait is not None and 50 < wait <= 60
    threading.Thread(target=f2.set_result, args=(None,)).start()
    assert woken.wait(10)
    assert held.wait_time() == 0.0
    assert held.due() == ["r3"] and len(held) == 2
    f1.set_result(None)
    assert held.due() == ["r1", "r2"] and len(held) == 0
    assert held.wait_time() is None
    assert stats.store_waits == 2 and stats.store_late == 0


def test_an_item_goes_out_at_its_barrier_s_deadline_counted_late() -> None:
    stats = OffloadStats()
    held: HeldFinishes[str] = HeldFinishes(lambda: None)
    barrier, _ = _barrier(stats, max_wait=0.05)
    held.hold(barrier, ["r1"])
    assert held.due() == []
    time.sleep(0.06)
    assert held.wait_time() == 0.0
    assert held.due() == ["r1"]
    assert stats.store_waits == 1 and stats.store_late == 1


def test_drain_hands_over_everything_still_held() -> None:
    stats = OffloadStats()
    held: HeldFinishes[str] = HeldFinishes(lambda: None)
    barrier, _ = _barrier(stats)
    held.hold(barrier, ["r1", "r2"])
    held.hold(_barrier(stats)[0], [])  # nothing to hold: not filed
    assert held.drain() == ["r1", "r2"] and len(held) == 0
    assert stats.store_late == 1
