"""What ``LLM.generate`` returns (vLLM names): ``RequestOutput`` and friends.

Times are ``time.monotonic()`` seconds. ``CompletionOutput.logprobs`` (when
``SamplingParams.logprobs`` is set) holds one ``{token id: Logprob}`` per output
token: the sampled token first, then the ``logprobs`` most likely ones (a
token in both appears once), as vLLM's ``SampleLogprobs``;
``cumulative_logprob`` is the sum of the sampled tokens' log-probabilities.
``RequestMetrics.time_to_first_token`` is first token minus arrival (queueing
included); ``num_cached_tokens`` is the prefix-cache hit at the request's first
admission.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

#: Token ids -> text (the tokenizer's ``decode`` without special tokens).
Decode = Callable[[list[int]], str]


@dataclass
class Logprob:
    """One token's log-probability (raw logits' ``log_softmax``) and its rank
    (1: the most likely); ``decoded_token`` is its text (None without a tokenizer)."""

    logprob: float
    rank: int
    decoded_token: str | None = None


#: Per output token: ``{token id: Logprob}`` (vLLM's ``SampleLogprobs``).
SampleLogprobs = list[dict[int, Logprob]]


@dataclass
class CompletionOutput:
    """One generated sequence (``index``: its sample number among ``n``)."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "length" | "stop"
    stop_reason: int | None = None  # the stop token id, if any
    logprobs: SampleLogprobs | None = None
    cumulative_logprob: float | None = None


@dataclass
class RequestMetrics:
    """Timestamps of a request (``time.monotonic()``)."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None

    @property
    def time_to_first_token(self) -> float | None:
        """Seconds from arrival to the first output token."""
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time


@dataclass
class RequestOutput:
    """The result of one prompt."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    num_cached_tokens: int
    metrics: RequestMetrics
    finished: bool = True
    num_preemptions: int = 0
    extra: dict[str, object] = field(default_factory=dict)
