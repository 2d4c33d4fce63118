"""One engine step's parts (``LLM.step`` runs them): ``schedule_step`` then ``run_step``.

``schedule_step`` asks the scheduler for a step and fails loudly when nothing can be
scheduled (the KV cache cannot hold the oldest waiting request). ``run_step`` stamps
the requests admitted in the step (``first_scheduled_time``), runs the model (the
runner: eager or from a graph), samples the requests that reach their last token
(``sampler.sample``: one greedy call and one read of its result for a plainly greedy
batch) and hands the tokens to the scheduler's ``update`` (appended, stop checks,
finished requests freed). No output is built and nothing is detokenised per step:
``generate`` builds its outputs once its requests finish, a server its deltas from the
requests' token lists (``hybridkv.serving.engine_loop``). ``async_step`` runs the same
parts with the next step scheduled while one is in flight (``async_scheduling=True``).
"""

from __future__ import annotations

import time

import torch

from hybridkv.engine.engine_request import EngineRequest
from hybridkv.engine.runner import ModelRunner
from hybridkv.engine.sampler import GreedyOp, sample
from hybridkv.engine.scheduler import Scheduler, SchedulerOutput


def schedule_step(scheduler: Scheduler, num_blocks: int) -> SchedulerOutput:
    """The scheduler's next step; ``RuntimeError`` when it schedules nothing though
    requests wait (``num_blocks``: the KV cache's, for the message)."""
    out = scheduler.schedule()
    if not out.scheduled:
        raise stuck(scheduler, num_blocks)
    return out


def stuck(scheduler: Scheduler, num_blocks: int) -> RuntimeError:
    """The error of a step that schedules nothing though requests wait."""
    waiting = [r.request_id for r in scheduler.waiting]
    return RuntimeError(
        f"no request can be scheduled (waiting: {waiting[:5]}): the KV cache "
        f"({num_blocks} blocks) is too small"
    )


def stamp_admitted(out: SchedulerOutput, now: float) -> None:
    """Stamp ``first_scheduled_time`` on the requests admitted in ``out`` (they come last)."""
    for s in reversed(out.scheduled):
        if not s.admitted:
            break
        if s.request.metrics.first_scheduled_time is None:
            s.request.metrics.first_scheduled_time = now


def host_samples(
    logits: torch.Tensor, samplers: list[EngineRequest], greedy: GreedyOp
) -> dict[str, int]:
    """Sample one token per row of ``logits`` (row ``i`` for ``samplers[i]``), record the
    log-probabilities asked for; returns ``{request id: token}``."""
    draws = sample(logits, samplers, greedy)
    if draws.logprobs.count(None) < len(samplers):
        for req, token, lp in zip(samplers, draws.tokens, draws.logprobs, strict=True):
            if lp is not None:
                req.record_logprobs(lp, token)
    return dict(zip([r.request_id for r in samplers], draws.tokens, strict=True))


def run_step(
    out: SchedulerOutput, scheduler: Scheduler, runner: ModelRunner, greedy: GreedyOp
) -> None:
    """Run the scheduled step ``out``, sample, and apply it to the scheduler."""
    stamp_admitted(out, time.monotonic())
    logits: torch.Tensor = runner.execute(out.scheduled)
    samplers = [s.request for s in out.scheduled if s.samples]
    sampled = host_samples(logits, samplers, greedy) if samplers else {}
    scheduler.update(out, sampled, time.monotonic())
