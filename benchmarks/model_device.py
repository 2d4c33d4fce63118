"""A **modelled** device for measuring the host/device overlap on a CPU: not a GPU.

A CPU forward is synchronous, so async scheduling cannot show there what it does on a
GPU. This models the one property that matters: a stream. Each launched step takes a
fixed ``seconds`` of "device time", starting when it is launched or when the step
before it ends, whichever is later (FIFO, one at a time); the host goes on meanwhile.
A host read of a step's result waits (sleeps) until that step ends: ``drain`` for the
synchronous engine's read of its sampled tokens, ``fence().wait()`` for the async
engine's (``hybridkv.offload.inflight_step.Fence``). No thread: the timeline is
computed, so the model adds no CPU work of its own beyond a ``time.sleep``::

    launch at t      end = max(t, last end) + seconds
    wait for end     sleep(end - now)        (a late wake-up is not carried forward)
"""

from __future__ import annotations

import time


class ModelDevice:
    """A FIFO stream whose every launch takes ``seconds`` (module docstring)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.last_end = 0.0  # perf_counter time the last launched step ends
        self.launches = 0
        self.waited = 0.0  # seconds the host slept waiting for the device

    def launch(self) -> None:
        """A step is launched now (the stub forward calls this)."""
        self.last_end = max(time.perf_counter(), self.last_end) + self.seconds
        self.launches += 1

    def _until(self, end: float) -> None:
        left = end - time.perf_counter()
        if left > 0:
            time.sleep(left)
            self.waited += left

    def drain(self) -> None:
        """Wait for every launched step (a synchronous read of the device)."""
        self._until(self.last_end)

    def fence(self) -> ModelFence:
        """The point after the steps launched so far (an event recorded now)."""
        return ModelFence(self, self.last_end)


class ModelFence:
    """``wait`` returns once the device reaches the point it was recorded at."""

    def __init__(self, device: ModelDevice, end: float) -> None:
        self.device = device
        self.end = end

    def wait(self) -> None:
        self.device._until(self.end)
