"""``InFlightStep``: a tier copy waits for the step in flight once, never on a stream."""

from __future__ import annotations

from hybridkv.offload.inflight_step import InFlightStep


class CountingFence:
    def __init__(self) -> None:
        self.waits = 0

    def wait(self) -> None:
        self.waits += 1


def test_a_copy_waits_for_the_step_in_flight_once() -> None:
    step = InFlightStep(stream_ordered=False)
    step.before_copy()  # nothing in flight: nothing to wait for
    fence = CountingFence()
    step.launched(fence)
    step.before_copy()
    step.before_copy()  # landed by the first wait
    assert fence.waits == 1 and step.waits == 1


def test_an_older_step_landing_leaves_the_newer_in_flight() -> None:
    step = InFlightStep(stream_ordered=False)
    old, new = CountingFence(), CountingFence()
    step.launched(old)
    step.launched(new)
    step.landed(old)  # the engine read the older step's tokens
    step.before_copy()
    assert (old.waits, new.waits) == (0, 1)
    step.launched(old)
    step.landed()  # every step (a failure): nothing left to wait for
    step.before_copy()
    assert old.waits == 0


def test_stream_ordered_copies_never_make_the_host_wait() -> None:
    step = InFlightStep(stream_ordered=True)
    fence = CountingFence()
    step.launched(fence)
    step.before_copy()
    assert fence.waits == 0 and step.waits == 0
