"""What ``LLM.generate`` returns (vLLM names): ``RequestOutput`` and friends.

Times are ``time.monotonic()`` seconds. ``RequestMetrics.time_to_first_token``
is first token minus arrival (queueing included); ``num_cached_tokens`` is the
prefix-cache hit at the request's first admission.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CompletionOutput:
    """One generated sequence."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "length" | "stop"
    stop_reason: int | None = None  # the stop token id, if any


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
