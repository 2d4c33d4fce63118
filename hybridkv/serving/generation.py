"""``Generation``: one HTTP call's requests, from submission to the last chunk.

It submits one engine request per choice (all or none: the ``n`` samples of
each prompt in turn, so choice ``i`` is sample ``i % n`` of prompt ``i // n``),
turns the engine's ``Delta``s into text (``TextStream``: stop strings end a
choice and abort its engine request; not before ``min_tokens`` tokens), and
yields ``(choice, text, new token ids, their logprobs, first, finish)`` events
until every choice has finished. Whatever way the consumer stops (the
client went away, an error), ``close`` aborts the engine requests that are
still running, so their blocks are freed at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from hybridkv.engine.engine_request import EngineRequest
from hybridkv.engine.outputs import Logprob
from hybridkv.serving.detokenize import TextStream
from hybridkv.serving.engine_loop import Delta, EngineLoop, RequestStream
from hybridkv.serving.responses import Choice


class EngineError(Exception):
    """A step that computed this call's requests failed (HTTP 500)."""


@dataclass(frozen=True)
class Event:
    """New output of one choice."""

    choice: Choice
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None
    first: bool
    finish: str | None


def _prompt_text(req: EngineRequest, tokenizer: Any) -> str:
    if req.prompt is not None or tokenizer is None:
        return req.prompt or ""
    return str(tokenizer.decode(req.core.prompt_token_ids, skip_special_tokens=True))


class Generation:
    """One HTTP call's engine requests (module docstring)."""

    def __init__(
        self,
        engine: EngineLoop,
        requests: list[EngineRequest],
        stops: list[str],
        tokenizer: Any,
        *,
        n: int = 1,
        echo: bool = False,
    ) -> None:
        self.engine = engine
        self.queue: asyncio.Queue[tuple[int, Delta]] = asyncio.Queue()
        self.streams = [RequestStream(r, self.queue, i) for i, r in enumerate(requests)]
        self.texts = [TextStream(tokenizer, stops, r.params.min_tokens) for r in requests]
        self.choices = [
            Choice(
                i,
                prompt_token_ids=list(r.core.prompt_token_ids),
                sample=i % n,
                prompt_text=_prompt_text(r, tokenizer) if echo else None,
                logprobs=None if r.params.logprobs is None else [],
            )
            for i, r in enumerate(requests)
        ]
        self.running = {s.index for s in self.streams}
        self.started: set[int] = set()

    def submit(self) -> None:
        """Queue every request (``QueueFull``: none is queued)."""
        self.engine.submit(self.streams)

    async def events(self) -> AsyncIterator[Event]:
        """Events until every choice has finished; ``EngineError`` on a failed step."""
        while self.running:
            index, delta = await self.queue.get()
            if index not in self.running:
                continue  # after a stop string: the abort's own delta
            if delta.error is not None:
                raise EngineError(delta.error)
            choice, text = self.choices[index], self.texts[index]
            choice.cached_tokens = delta.num_cached_tokens
            finish = delta.finish_reason
            new = text.add(delta.token_ids, final=finish is not None)
            if text.stopped:
                finish = "stop"
                self.engine.abort(self.streams[index].request_id)
            choice.token_ids.extend(delta.token_ids)
            if choice.logprobs is not None and delta.logprobs is not None:
                choice.logprobs.extend(delta.logprobs)
            choice.text += new
            if finish is not None:
                choice.finish_reason = finish
                self.running.discard(index)
            first = index not in self.started
            self.started.add(index)
            yield Event(choice, new, delta.token_ids, delta.logprobs, first, finish)

    def close(self) -> None:
        """Abort the engine requests still running."""
        for index in self.running:
            self.engine.abort(self.streams[index].request_id)
        self.running.clear()
