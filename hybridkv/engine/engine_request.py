"""``EngineRequest``: a request's life in the engine (tokens, sampling, status, times).

The token ids, computed count and block hashes live in the manager-facing
``hybridkv.Request`` (``.core``); this adds what the scheduler and the sampler
need. ``num_cached_tokens`` is the prefix hit at first admission (a resumed
request's re-admission hits do not change it). ``cache_salt`` goes to the
``Request``: the request only hits blocks cached under the same salt.
``logprobs`` (when the params ask for them) gets one entry per output token,
recorded by the engine before the token is appended. ``num_pending_tokens`` (0 or 1)
counts a token sampled on the device and not yet appended (``LLM(async_scheduling=True)``,
``hybridkv.engine.async_step``): the scheduler schedules its position already.
``request_output`` builds
what ``LLM.generate`` returns from one prompt's finished samples. It imports torch only for a
seeded request's generator, so that ``hybridkv simulate`` (the scheduler on
these requests, no model) runs on the core install.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from hybridkv.core.request import Request
from hybridkv.engine.outputs import (
    CompletionOutput,
    Decode,
    Logprob,
    RequestMetrics,
    RequestOutput,
)
from hybridkv.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    import torch


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_LENGTH = "finished_length"
    FINISHED_STOP = "finished_stop"
    FINISHED_ABORTED = "finished_aborted"

    @property
    def finished(self) -> bool:
        return self in _FINISHED  # read per request per step: a set, not the name


_FINISHED = frozenset(s for s in RequestStatus if s.name.startswith("FINISHED"))


class EngineRequest:
    """One request as the engine tracks it (see the module docstring)."""

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        prompt: str | None = None,
        eos_token_ids: frozenset[int] = frozenset(),
        arrival_time: float | None = None,
        max_model_len: int | None = None,
        cache_salt: str | None = None,
    ) -> None:
        self.core = Request(request_id, prompt_token_ids, cache_salt=cache_salt)
        self.request_id = request_id
        self.prompt = prompt
        self.params = params
        self.status = RequestStatus.WAITING
        stop = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop |= eos_token_ids
        self.stop_token_ids = frozenset(stop)
        self.stop_reason: int | None = None
        self.num_cached_tokens: int | None = None
        #: How far the full-attention groups alone matched at first admission
        #: (>= ``num_cached_tokens``; more where a window or state was missing).
        self.num_full_match_tokens: int | None = None
        self.max_model_len = max_model_len
        #: Tokens sampled by a step in flight, not yet appended (async scheduling).
        self.num_pending_tokens = 0
        self.metrics = RequestMetrics(arrival_time or time.monotonic())
        self.logprobs: list[dict[int, Logprob]] | None = None
        self.cumulative_logprob: float | None = None
        if params.logprobs is not None:
            self.logprobs, self.cumulative_logprob = [], 0.0
        self.generator: torch.Generator | None = None
        if params.seed is not None:
            import torch  # here: only a seeded request needs torch (the simulator never seeds)

            self.generator = torch.Generator().manual_seed(params.seed)

    @property
    def num_tokens(self) -> int:
        return self.core.num_tokens

    @property
    def num_computed_tokens(self) -> int:
        return self.core.num_computed_tokens

    @property
    def num_output_tokens(self) -> int:
        return self.core.num_tokens - self.core.num_prompt_tokens

    def stops_at_pending(self) -> bool:
        """True when appending the pending token reaches ``max_tokens`` or
        ``max_model_len`` (known on the host before the token is): no step is scheduled
        for it after the one in flight."""
        n = self.core.num_tokens + self.num_pending_tokens
        return n - self.core.num_prompt_tokens >= self.params.max_tokens or (
            self.max_model_len is not None and n >= self.max_model_len
        )

    def record_logprobs(self, entry: dict[int, Logprob], token: int) -> None:
        """Record the log-probabilities of the token about to be appended."""
        assert self.logprobs is not None and self.cumulative_logprob is not None
        self.logprobs.append(entry)
        self.cumulative_logprob += entry[token].logprob

    def append_token(self, token: int, now: float) -> None:
        """Record a sampled token and finish the request if it stops here."""
        core = self.core
        core.append_output_token_ids(token)
        if self.metrics.first_token_time is None:
            self.metrics.first_token_time = now
        if token in self.stop_token_ids:
            self.status, self.stop_reason = RequestStatus.FINISHED_STOP, token
            return
        n = core.num_tokens
        if n - core.num_prompt_tokens >= self.params.max_tokens or (
            self.max_model_len is not None and n >= self.max_model_len
        ):
            self.status = RequestStatus.FINISHED_LENGTH

    def __repr__(self) -> str:
        return f"EngineRequest({self.request_id!r}, {self.status.value}, {self.core!r})"


def request_output(samples: Sequence[EngineRequest], decode: Decode | None) -> RequestOutput:
    """The ``RequestOutput`` of one prompt's ``n`` finished engine requests (in sample
    order). The prompt counts once: ``num_cached_tokens`` is the first sample's hit (the
    others hit the blocks it computed), ``metrics`` and ``request_id`` are the first
    sample's. ``decode(ids)`` gives text (None: no tokenizer, empty texts)."""
    first = samples[0]
    outputs = []
    for index, req in enumerate(samples):
        ids = list(req.core.output_token_ids)
        logprobs = req.logprobs
        if logprobs is not None and decode is not None:
            logprobs = [
                {t: replace(lp, decoded_token=decode([t])) for t, lp in entry.items()}
                for entry in logprobs
            ]
        outputs.append(
            CompletionOutput(
                index,
                "" if decode is None else decode(ids),
                ids,
                "stop" if req.stop_reason is not None else "length",
                req.stop_reason,
                logprobs,
                req.cumulative_logprob,
            )
        )
    return RequestOutput(
        request_id=first.request_id,
        prompt=first.prompt,
        prompt_token_ids=first.core.prompt_token_ids,
        outputs=outputs,
        num_cached_tokens=first.num_cached_tokens or 0,
        metrics=first.metrics,
        num_preemptions=sum(r.core.num_preemptions for r in samples),
    )
