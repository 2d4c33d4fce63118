"""``AsyncSteps``: async scheduling (``LLM(async_scheduling=True)``, vLLM's name): the host
schedules and fills step N+1 while the device runs step N.

One ``step`` (one ``LLM.step`` call)::

    host    commit N | schedule N+1 | fill, launch N+1 | wait for N's ids | append, stops
    device  ..... N runs ..........................| N's argmax | N+1 runs ...........

1. The step in flight (N) counts as computed (``Scheduler.commit_computed``: the tiers
   store what it computes now, after it on the device) and its sampled tokens as
   pending (``EngineRequest.num_pending_tokens``): N+1 schedules their positions; a
   request whose pending token reaches ``max_tokens`` / ``max_model_len``
   is not scheduled again.
2. N+1 is launched (``ModelRunner.execute``): positions, slots and tables from the host,
   the pending tokens' ids copied on the device from N's sampled ids
   (``hybridkv.engine.pending``). If every request that samples in N+1 is plainly
   greedy (``sampler.plainly_greedy``) its argmax stays on the device, copied to the host
   behind a fence (a CUDA event; on the CPU the work is done already): N+1 is in flight.
3. Then the host waits for N's ids and applies them (``Scheduler.update``: appended,
   stop checks, finished requests freed). A request that stopped at N (a stop token)
   was scheduled in N+1 already: its N+1 token is dropped (a wasted slot); its blocks
   are freed now, which is safe on a GPU since a later step that reuses them runs after
   N+1 on the stream. A request preempted while N was in flight gets N's token while it
   waits (``Scheduler.update``).

A step that samples on the host (temperature draws, seeds, penalties and other logit
processing, log-probabilities; so also parallel samples, ``n > 1``, which draw) is
**settled**: sampled after N's tokens are applied (penalties see them), its own
applied at once, so the next step is scheduled after it with no overlap. Each is
counted in ``stats["settled: host sampling"]`` (the first logged once, at INFO);
``stats["overlapped"]`` counts the steps left in flight, ``"dropped tokens"`` and
``"late tokens"`` the two cases of 3.

Tokens are those of the synchronous engine; what changes is when a stop is seen (one
step later) and so when a seat frees (batches may differ). Chunked prefill and prefix
caching work as without it (a chunk samples nothing; a block ending in a pending token
is cached one step later, so no request hits a block whose last token is not known
yet). So do the tiers: each launched step's fence is handed to them
(``TieredCache.step_launched`` / ``step_landed``), and a tier copy of device blocks
issued while it is in flight runs after it (``hybridkv.offload.inflight_step``).
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import chain

import torch

from hybridkv.engine.engine_request import EngineRequest, RequestStatus
from hybridkv.engine.engine_step import host_samples, stamp_admitted, stuck
from hybridkv.engine.pending import PendingTokens
from hybridkv.engine.runner import ModelRunner
from hybridkv.engine.sampler import GreedyOp, plainly_greedy
from hybridkv.engine.scheduler import Scheduler, SchedulerOutput
from hybridkv.offload.inflight_step import Fence

logger = logging.getLogger(__name__)


class Done:
    """A fence already passed: the CPU's work is done when its call returns."""

    def wait(self) -> None:
        return None


class CudaFence:
    """A CUDA event recorded on the current stream."""

    def __init__(self) -> None:
        self.event = torch.cuda.Event()
        self.event.record()

    def wait(self) -> None:
        self.event.synchronize()


@dataclass
class InFlight:
    """A launched step whose sampled ids are not read yet: ``pending`` holds them on the
    device (None when nothing samples), ``host`` their host copy, valid after ``fence``."""

    out: SchedulerOutput
    samplers: list[EngineRequest]
    pending: PendingTokens | None
    host: torch.Tensor | None
    fence: Fence

    def tokens(self) -> dict[str, int]:
        """``{request id: token}``, once the device has copied them (waits)."""
        self.fence.wait()
        if self.host is None:
            return {}
        return dict(zip([r.request_id for r in self.samplers], self.host.tolist(), strict=True))


class AsyncSteps:
    """The engine's steps with one in flight (module docstring). ``record`` makes the
    fence after a launch (``CudaFence`` on CUDA, ``Done`` on the CPU; a benchmark's
    modelled device replaces it)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.record: Callable[[], Fence] = CudaFence if device.type == "cuda" else Done
        self.inflight: InFlight | None = None
        #: The step launched last, or after a failure every step it concerned.
        self.last: SchedulerOutput | None = None
        self.stats: collections.Counter[str] = collections.Counter()

    def step(
        self, scheduler: Scheduler, runner: ModelRunner, greedy: GreedyOp, num_blocks: int
    ) -> SchedulerOutput:
        """Schedule and launch a step, then apply the one in flight (and the new one, if
        it is settled); returns the applied steps' requests (empty on the first call)."""
        prev = self.inflight
        if prev is not None:
            scheduler.commit_computed(prev.out)
        out = scheduler.schedule()
        self.last = out if prev is None else _joined([prev.out, out], out)
        if not out.scheduled and prev is None:
            raise stuck(scheduler, num_blocks)
        try:
            applied = self._step(prev, out, scheduler, runner, greedy)
        except BaseException:
            self.inflight = None
            for s in self.last.scheduled:
                s.request.num_pending_tokens = 0
            raise
        self.last = out
        return _joined(applied, out)

    def _step(self, prev: InFlight | None, out: SchedulerOutput, scheduler: Scheduler,
              runner: ModelRunner, greedy: GreedyOp) -> list[SchedulerOutput]:  # fmt: skip
        launched, logits, samplers = None, None, []
        if out.scheduled:
            stamp_admitted(out, time.monotonic())
            logits = runner.execute(out.scheduled, None if prev is None else prev.pending)
            samplers = [s.request for s in out.scheduled if s.samples]
            if plainly_greedy(samplers):
                launched = self._launch(out, samplers, logits, greedy)
        self.inflight = launched
        if launched is not None and scheduler.tiers is not None:
            scheduler.tiers.step_launched(launched.fence)  # tier copies wait for it
        applied = []
        if prev is not None:
            self._apply(prev, scheduler)
            applied.append(prev.out)
        if logits is not None and launched is None:
            if not self.stats["settled: host sampling"]:
                logger.info(
                    "async scheduling: a step that samples on the host (temperature, seed, "
                    "penalties, logprobs, n > 1) runs without overlap; such steps are "
                    "counted in LLM.async_steps.stats['settled: host sampling']"
                )
            self.stats["settled: host sampling"] += 1
            live = [i for i, r in enumerate(samplers) if r.status is RequestStatus.RUNNING]
            if len(live) < len(samplers):  # stopped at the step before: not sampled
                self.stats["dropped tokens"] += len(samplers) - len(live)
                logits, samplers = logits[live], [samplers[i] for i in live]
            sampled = host_samples(logits, samplers, greedy) if samplers else {}
            scheduler.update(out, sampled, time.monotonic())
            applied.append(out)
        return applied

    def _launch(self, out: SchedulerOutput, samplers: list[EngineRequest],
                logits: torch.Tensor, greedy: GreedyOp) -> InFlight:  # fmt: skip
        """Leave ``out`` in flight: its argmax on the device, copied to the host behind a
        fence (pinned memory on CUDA)."""
        self.stats["overlapped"] += 1
        if not samplers:
            return InFlight(out, samplers, None, None, self.record())
        ids = greedy(logits)
        host = ids
        if ids.device.type == "cuda":
            host = torch.empty(ids.shape, dtype=ids.dtype, pin_memory=True)
            host.copy_(ids, non_blocking=True)
        for r in samplers:
            r.num_pending_tokens += 1
        rows = {r.request_id: i for i, r in enumerate(samplers)}
        return InFlight(out, samplers, PendingTokens(ids, rows), host, self.record())

    def _apply(self, prev: InFlight, scheduler: Scheduler) -> None:
        """Wait for ``prev``'s ids and apply them (module docstring, 3)."""
        sampled = prev.tokens()
        if scheduler.tiers is not None:
            scheduler.tiers.step_landed(prev.fence)
        for r in prev.samplers:
            r.num_pending_tokens -= 1
            if r.status.finished:
                self.stats["dropped tokens"] += 1
            elif r.status is RequestStatus.PREEMPTED:
                self.stats["late tokens"] += 1
        scheduler.update(prev.out, sampled, time.monotonic(), committed=True)

    def settle(self, scheduler: Scheduler) -> SchedulerOutput:
        """Apply the step in flight, if any (nothing is launched); returns it."""
        prev, self.inflight = self.inflight, None
        if prev is None:
            return SchedulerOutput((), ())
        scheduler.commit_computed(prev.out)
        self._apply(prev, scheduler)
        return prev.out

    def check_integrity(self, scheduler: Scheduler) -> None:
        """Between steps, a queued request has one pending token if the step in flight
        samples it, else none."""
        inflight = set() if self.inflight is None else set(map(id, self.inflight.samplers))
        for r in chain(scheduler.running, scheduler.waiting):
            want = 1 if id(r) in inflight else 0
            assert r.num_pending_tokens == want, (r.request_id, r.num_pending_tokens, want)


def _joined(steps: list[SchedulerOutput], last: SchedulerOutput) -> SchedulerOutput:
    """One output with ``steps``' requests in order, and ``last``'s preemptions."""
    if len(steps) == 1 and steps[0] is last:
        return last
    scheduled = tuple(chain.from_iterable(s.scheduled for s in steps))
    return SchedulerOutput(scheduled, last.preempted, last.load_wait)
