"""Request bodies of the OpenAI API that ``hybridkv serve`` accepts.

Unknown fields are ignored (clients send many); fields we cannot honour are
refused with a 400 naming them, never silently dropped: ``n`` other than 1,
``best_of``, ``logprobs``, ``echo``, ``suffix``, tools. vLLM's extensions
``top_k``, ``stop_token_ids``, ``ignore_eos`` and ``return_token_ids`` (the
prompt and output token ids in each choice) are honoured.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingFields(BaseModel):
    """Fields common to both endpoints."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1)
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**63)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool = False
    logprobs: Any = None
    tools: Any = None

    def unsupported(self) -> str | None:
        """The first field set that the server cannot honour, as an error message."""
        if self.n != 1:
            return f"n={self.n} is not supported (only n=1)"
        if self.logprobs not in (None, False):
            return "logprobs is not supported"
        if self.tools:
            return "tools are not supported"
        if self.stream_options is not None and not self.stream:
            return "stream_options is only allowed when stream is true"
        return None

    def stop_strings(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return [s for s in stops if s]


class CompletionRequest(SamplingFields):
    """``POST /v1/completions``."""

    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=1)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    def unsupported(self) -> str | None:
        if self.echo:
            return "echo is not supported"
        if self.suffix:
            return "suffix is not supported"
        if self.best_of not in (None, 1):
            return "best_of is not supported"
        return super().unsupported()

    def prompts(self) -> list[str | list[int]]:
        """The prompts: one text, one token-id list, or a list of either."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if p and all(isinstance(t, int) for t in p):
            return [p]  # type: ignore[list-item]
        return list(p)  # type: ignore[arg-type]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]] | None = None

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


class ChatCompletionRequest(SamplingFields):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)

    def token_limit(self, default: int) -> int:
        return self.max_completion_tokens or self.max_tokens or default
