"""OpenAI response bodies: completions, chat completions, their stream chunks, errors.

Plain dicts shaped like OpenAI's (``id``, ``object``, ``created``, ``model``,
``choices``, ``usage`` with ``prompt_tokens_details.cached_tokens``); errors
are ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

#: The openai client's exception class for a status; others: the status's phrase.
_ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


def error_type(status: int) -> str:
    """``BadRequestError`` (400), ``MethodNotAllowedError`` (405), ..."""
    if status in _ERROR_TYPES:
        return _ERROR_TYPES[status]
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        return "Error"
    return "".join(w[0].upper() + w[1:] for w in phrase.replace("-", " ").split()) + "Error"


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": error_type(status),
            "param": param,
            "code": status,
        }
    }


def sse(payload: dict[str, Any] | str) -> str:
    """One Server-Sent Events frame."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n"


@dataclass
class Choice:
    """One prompt's result so far."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    prompt_token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    cached_tokens: int = 0


@dataclass
class Reply:
    """The envelope shared by a response and its chunks."""

    chat: bool
    model: str
    return_token_ids: bool = False
    cached_tokens: bool = True  # usage.prompt_tokens_details.cached_tokens (else left out)
    id: str = ""
    created: int = 0

    def __post_init__(self) -> None:
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def _head(self, chunk: bool) -> dict[str, Any]:
        kind = "chat.completion" if self.chat else "text_completion"
        if chunk and self.chat:
            kind += ".chunk"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def usage(self, choices: list[Choice]) -> dict[str, Any]:
        prompt = sum(len(c.prompt_token_ids) for c in choices)
        completion = sum(len(c.token_ids) for c in choices)
        out: dict[str, Any] = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        if self.cached_tokens:
            out["prompt_tokens_details"] = {"cached_tokens": sum(c.cached_tokens for c in choices)}
        return out

    def _ids(self, out: dict[str, Any], c: Choice, *, prompt: bool, new: list[int]) -> None:
        if self.return_token_ids:
            if prompt:
                out["prompt_token_ids"] = c.prompt_token_ids
            out["token_ids"] = new

    def response(self, choices: list[Choice]) -> dict[str, Any]:
        """The whole (non-streamed) response."""
        out = self._head(chunk=False)
        items = []
        for c in choices:
            item: dict[str, Any] = {
                "index": c.index,
                "finish_reason": c.finish_reason,
                "logprobs": None,
            }
            if self.chat:
                item["message"] = {"role": "assistant", "content": c.text}
            else:
                item["text"] = c.text
            self._ids(item, c, prompt=True, new=c.token_ids)
            items.append(item)
        out["choices"] = items
        out["usage"] = self.usage(choices)
        return out

    def chunk(
        self,
        c: Choice,
        text: str,
        new_ids: list[int],
        *,
        first: bool = False,
        finish: str | None = None,
    ) -> dict[str, Any]:
        """A stream chunk for one choice: new text, and the finish reason at the end."""
        out = self._head(chunk=True)
        item: dict[str, Any] = {"index": c.index, "finish_reason": finish, "logprobs": None}
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": text} if first else {}
            if text and not first:
                delta["content"] = text
            item["delta"] = delta
        else:
            item["text"] = text
        self._ids(item, c, prompt=first, new=new_ids)
        out["choices"] = [item]
        return out

    def usage_chunk(self, choices: list[Choice]) -> dict[str, Any]:
        out = self._head(chunk=True)
        out["choices"] = []
        out["usage"] = self.usage(choices)
        return out
