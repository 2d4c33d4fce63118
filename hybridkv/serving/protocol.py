"""Request bodies of the OpenAI API that ``hybridkv serve`` accepts.

Every field of OpenAI's published completion and chat request schemas is
declared here, and each is either honoured or refused with a 400 whose
``param`` names it (``fields.refusal``): nothing is accepted and ignored.
A field outside the schemas and vLLM's extensions below is refused too
(``extra="forbid"``: a 400 naming it).

Honoured: ``model``, ``prompt`` / ``messages``, ``max_tokens`` /
``max_completion_tokens``, ``temperature``, ``top_p``, ``seed``, ``stop``,
``stream``, ``stream_options.include_usage``, ``n``, ``logprobs`` /
``top_logprobs``, ``echo`` (without ``logprobs``), ``frequency_penalty``,
``presence_penalty``, ``logit_bias``, ``best_of`` equal to ``n``; the values
that ask for what the server does anyway (``store: false``, ``modalities:
["text"]``, ``response_format: {"type": "text"}``, ``tool_choice`` /
``function_call: "none"``, ``service_tier: "auto" | "default"``,
``stream_options.include_obfuscation: false``). vLLM's extensions:
``top_k``, ``min_tokens``, ``repetition_penalty``, ``stop_token_ids``,
``ignore_eos``, ``return_token_ids`` (the prompt and output token ids in each
choice) and ``cache_salt``. SGLang's fields that sglang-router adds to every
request it forwards, at the values it sends, which describe what the server
does (``fields.GATEWAY``): ``no_stop_trim: false``, ``skip_special_tokens:
true``, ``return_hidden_states: false``; in chat ``continue_final_message:
false``, ``separate_reasoning: true`` and ``stream_reasoning: true`` (no
reasoning parser: nothing to separate or stream apart).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: bool = False
    include_obfuscation: bool | None = None


class SamplingFields(BaseModel):
    """Fields common to both endpoints."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**63)
    stop: str | list[str] | None = None
    n: int = Field(default=1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    user: Any = None
    # vLLM's extensions
    top_k: int | None = Field(default=None, ge=-1)
    min_tokens: int = Field(default=0, ge=0)
    repetition_penalty: float | None = Field(default=None, gt=0)
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    return_token_ids: bool = False
    cache_salt: str | None = Field(default=None, min_length=1)
    # SGLang's fields, which sglang-router adds at these defaults (fields.GATEWAY)
    no_stop_trim: Any = None
    skip_special_tokens: Any = None
    return_hidden_states: Any = None

    def stop_strings(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return [s for s in stops if s]

    def num_logprobs(self) -> int | None:
        """The top-k log-probabilities asked per token (None: none)."""
        raise NotImplementedError


class CompletionRequest(SamplingFields):
    """``POST /v1/completions``."""

    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=1)
    logprobs: int | None = Field(default=None, ge=0)
    echo: bool = False
    suffix: Any = None
    best_of: int | None = Field(default=None, ge=1)

    def prompts(self) -> list[str | list[int]]:
        """The prompts: one text, one token-id list, or a list of either."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if p and all(isinstance(t, int) for t in p):
            return [p]  # type: ignore[list-item]
        return list(p)  # type: ignore[arg-type]

    def num_logprobs(self) -> int | None:
        return self.logprobs


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None

    def text(self) -> str:
        """The content as text (only text parts are supported)."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        parts = []
        for k, part in enumerate(self.content):
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError(f"content part {k}: only text parts are supported")
            parts.append(part["text"])
        return "".join(parts)

    def for_template(self) -> dict[str, str]:
        """The message as the chat template sees it (``name`` only when given)."""
        out = {"role": self.role, "content": self.text()}
        if self.name is not None:
            out["name"] = self.name
        return out


class ChatCompletionRequest(SamplingFields):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0)
    # Published fields honoured only in the value that matches what the server does,
    # or refused (``fields.refusal``).
    store: Any = None
    metadata: Any = None
    service_tier: Any = None
    modalities: Any = None
    response_format: Any = None
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    functions: Any = None
    function_call: Any = None
    audio: Any = None
    prediction: Any = None
    reasoning_effort: Any = None
    verbosity: Any = None
    web_search_options: Any = None
    moderation: Any = None
    safety_identifier: Any = None
    prompt_cache_key: Any = None
    prompt_cache_retention: Any = None
    prompt_cache_options: Any = None
    # SGLang's chat fields, which sglang-router adds at these defaults (fields.GATEWAY)
    continue_final_message: Any = None
    separate_reasoning: Any = None
    stream_reasoning: Any = None

    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None
