"""From a request body to ``SamplingParams``, or a refusal naming the field.

``refusal(body)`` returns ``(param, message)`` for the first field the server
cannot honour as sent (the HTTP layer answers 400 with that ``param``), and
``sampling_params`` maps the rest onto the engine's ``SamplingParams``. The
tables below are the whole policy; ``protocol.py`` lists what is honoured.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hybridkv.engine.sampling_params import MAX_LOGPROBS, SamplingParams
from hybridkv.serving.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields

Refusal = tuple[str, str]

_CACHE = "hybridkv caches prefixes by itself; cache_salt separates tenants"
#: Chat fields refused whatever their value (None: absent), and why.
_CHAT_REFUSED = {
    "tools": "hybridkv has no tool calling",
    "parallel_tool_calls": "it goes with tools, and hybridkv has no tool calling",
    "functions": "hybridkv has no function calling",
    "audio": "hybridkv generates text only",
    "prediction": "predicted outputs are not supported",
    "reasoning_effort": "the served models have no reasoning-effort setting",
    "verbosity": "the served models have no verbosity setting",
    "web_search_options": "hybridkv has no web search",
    "moderation": "hybridkv does no moderation",
    "safety_identifier": "hybridkv does no per-user safety monitoring",
    "prompt_cache_key": _CACHE,
    "prompt_cache_retention": _CACHE,
    "prompt_cache_options": _CACHE,
}
#: Chat fields honoured in the values that ask for what the server does anyway.
_CHAT_ONLY: dict[str, tuple[Callable[[Any], bool], str]] = {
    "store": (lambda v: v is False, "false (hybridkv stores no completion)"),
    "metadata": (lambda v: v == {}, "{} (metadata goes with store, and nothing is stored)"),
    "service_tier": (lambda v: v in ("auto", "default"), '"auto" or "default" (one tier)'),
    "modalities": (lambda v: v == ["text"], '["text"] (hybridkv generates text only)'),
    "response_format": (
        lambda v: v == {"type": "text"},
        '{"type": "text"} (no constrained decoding for JSON output)',
    ),
    "tool_choice": (lambda v: v == "none", '"none" (hybridkv has no tool calling)'),
    "function_call": (lambda v: v == "none", '"none" (hybridkv has no function calling)'),
}


#: SGLang's fields that sglang-router adds to what it forwards, and the one value taken.
GATEWAY: dict[str, object] = {
    "no_stop_trim": False,
    "skip_special_tokens": True,
    "return_hidden_states": False,
    "continue_final_message": False,
    "separate_reasoning": True,
    "stream_reasoning": True,
}


def _logprobs_refusal(body: SamplingFields) -> Refusal | None:
    if isinstance(body, ChatCompletionRequest):
        if body.top_logprobs is not None and not body.logprobs:
            return "top_logprobs", "top_logprobs needs logprobs: true"
        if (body.top_logprobs or 0) > MAX_LOGPROBS:
            return "top_logprobs", f"top_logprobs must be at most {MAX_LOGPROBS}"
    elif isinstance(body, CompletionRequest) and (body.logprobs or 0) > MAX_LOGPROBS:
        return "logprobs", f"logprobs must be at most {MAX_LOGPROBS}"
    return None


def refusal(body: SamplingFields) -> Refusal | None:
    """The first field sent that the server cannot honour: ``(param, message)``."""
    if body.user is not None:
        return "user", "user is not supported: hybridkv does no per-user monitoring; leave it out"
    if body.stream_options is not None:
        if not body.stream:
            return "stream_options", "stream_options is only allowed when stream is true"
        if body.stream_options.include_obfuscation:
            return (
                "stream_options.include_obfuscation",
                "stream_options.include_obfuscation: true is not supported (send false)",
            )
    for name, want in GATEWAY.items():
        value = getattr(body, name, None)
        if value is not None and value != want:
            return name, f"{name}={value!r} is not supported; the one value honoured: {want!r}"
    if isinstance(body, CompletionRequest):
        if body.suffix:
            return "suffix", "suffix is not supported (no fill-in-the-middle)"
        if body.best_of is not None and body.best_of != body.n:
            return "best_of", f"best_of must equal n={body.n}: every sample drawn is returned"
        if body.echo and body.logprobs is not None:
            return "echo", "echo with logprobs needs the prompt's logprobs, which are not computed"
    if isinstance(body, ChatCompletionRequest):
        for name, why in _CHAT_REFUSED.items():
            if getattr(body, name) is not None:
                return name, f"{name} is not supported: {why}"
        for name, (ok, allowed) in _CHAT_ONLY.items():
            value = getattr(body, name)
            if value is not None and not ok(value):
                return name, f"{name}={value!r} is not supported; the one value honoured: {allowed}"
    return _logprobs_refusal(body)


def _logit_bias(body: SamplingFields, vocab_size: int) -> dict[int, float] | None:
    if not body.logit_bias:
        return None
    out = {}
    for key, value in body.logit_bias.items():
        try:
            tid = int(key)
        except ValueError:
            raise ValueError(f"logit_bias keys must be token ids, got {key!r}") from None
        if not 0 <= tid < vocab_size:
            raise ValueError(f"logit_bias keys must be token ids in [0, {vocab_size}), got {tid}")
        out[tid] = value
    return out


def sampling_params(body: SamplingFields, max_tokens: int, vocab_size: int) -> SamplingParams:
    """The body's ``SamplingParams`` (``ValueError`` naming the field).

    Defaults are OpenAI's: temperature 1, top_p 1, no penalty."""
    return SamplingParams(
        n=body.n,
        max_tokens=max_tokens,
        min_tokens=body.min_tokens,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=body.top_k or 0,
        seed=body.seed,
        stop_token_ids=tuple(body.stop_token_ids or ()),
        ignore_eos=body.ignore_eos,
        presence_penalty=body.presence_penalty or 0.0,
        frequency_penalty=body.frequency_penalty or 0.0,
        repetition_penalty=1.0 if body.repetition_penalty is None else body.repetition_penalty,
        logit_bias=_logit_bias(body, vocab_size),
        logprobs=body.num_logprobs(),
    )


def error_param(body: SamplingFields, message: str) -> str | None:
    """The body field a ``SamplingParams`` error names (its first word), if any."""
    head = message.split(" ", 1)[0].split("[", 1)[0]
    return head if head in type(body).model_fields else None
