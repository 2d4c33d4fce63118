"""OpenAI response bodies: completions, chat completions, their stream chunks, errors.

Plain dicts shaped like OpenAI's (``id``, ``object``, ``created``, ``model``,
``choices``, ``usage`` with ``prompt_tokens_details.cached_tokens``); errors
are ``{"error": {"message", "type", "param", "code"}}``. With ``n`` samples a
prompt counts once in ``usage`` (its tokens and its cache hit are those of its
first sample; the others hit the blocks that one computed); every sample's
tokens count as completion tokens. ``logprobs`` come in OpenAI's shapes
(``logprob_format.py``); ``echo`` puts the prompt's text before a completion's.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from hybridkv.engine.outputs import Logprob
from hybridkv.serving.logprob_format import LogprobFormat

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
    sample: int = 0  # which of the prompt's n samples
    prompt_text: str | None = None
    logprobs: list[dict[int, Logprob]] | None = None  # per token, when asked
    offset: int = 0  # characters of the text streamed so far (``text_offset``)


@dataclass
class Reply:
    """The envelope shared by a response and its chunks."""

    chat: bool
    model: str
    return_token_ids: bool = False
    cached_tokens: bool = True  # usage.prompt_tokens_details.cached_tokens (else left out)
    logprobs: LogprobFormat | None = None
    echo: bool = False
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
        firsts = [c for c in choices if c.sample == 0]  # one per prompt
        prompt = sum(len(c.prompt_token_ids) for c in firsts)
        completion = sum(len(c.token_ids) for c in choices)
        out: dict[str, Any] = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        if self.cached_tokens:
            out["prompt_tokens_details"] = {"cached_tokens": sum(c.cached_tokens for c in firsts)}
        return out

    def _logprobs(
        self, c: Choice, ids: list[int], entries: list[dict[int, Logprob]] | None
    ) -> dict[str, Any] | None:
        if self.logprobs is None or entries is None:
            return None
        out = self.logprobs.format(ids, entries, c.offset)
        c.offset += self.logprobs.length(ids)
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
                "logprobs": self._logprobs(c, c.token_ids, c.logprobs),
            }
            if self.chat:
                item["message"] = {"role": "assistant", "content": c.text}
            else:
                item["text"] = (c.prompt_text or "") + c.text if self.echo else c.text
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
        logprobs: list[dict[int, Logprob]] | None = None,
    ) -> dict[str, Any]:
        """A stream chunk for one choice: new text (with ``echo``, the prompt's before
        the first), its tokens' logprobs, and the finish reason at the end."""
        out = self._head(chunk=True)
        lp = self._logprobs(c, new_ids, logprobs) if new_ids else None
        item: dict[str, Any] = {"index": c.index, "finish_reason": finish, "logprobs": lp}
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": text} if first else {}
            if text and not first:
                delta["content"] = text
            item["delta"] = delta
        else:
            item["text"] = (c.prompt_text or "") + text if self.echo and first else text
        self._ids(item, c, prompt=first, new=new_ids)
        out["choices"] = [item]
        return out

    def usage_chunk(self, choices: list[Choice]) -> dict[str, Any]:
        out = self._head(chunk=True)
        out["choices"] = []
        out["usage"] = self.usage(choices)
        return out
