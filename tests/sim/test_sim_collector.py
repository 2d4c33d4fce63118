"""``collector_paused``: the replay's garbage-collector pause is bounded and undone."""

from __future__ import annotations

import gc

import pytest

from hybridkv.sim.collector import collector_paused


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_pause_freezes_collects_by_hand_and_restores() -> None:
    assert gc.isenabled()
    with collector_paused(every=3) as collector:
        assert not gc.isenabled() and gc.get_freeze_count() > 0
        before = gc.get_count()[0]
        for _ in range(1000):
            _Cycle()  # unreachable cycles: automatic collection would have run
        assert gc.get_count()[0] >= before + 1000
        collector.tick(2)
        assert collector.collections == 0
        collector.tick()  # the third finished request: collect now
        assert collector.collections == 1 and gc.get_count()[0] < 1000
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_pause_is_undone_on_error_and_keeps_a_disabled_collector_off() -> None:
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("replay failed")
    assert gc.isenabled() and gc.get_freeze_count() == 0
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
    with pytest.raises(ValueError, match="every must be >= 1"), collector_paused(every=0):
        pass
