"""``Generation``: one HTTP call's requests, from submission to the last chunk.

It submits one engine request per prompt (all or none), turns the engine's
``Delta``s into text (``TextStream``: stop strings end a choice and abort its
engine request), and yields ``(choice, text, new token ids, first, finish)``
events until every choice has finished. Whatever way the consumer stops (the
client went away, an error), ``close`` aborts the engine requests that are
still running, so their blocks are freed at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from hybridkv.engine.engine_request import EngineRequest
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
    first: bool
    finish: str | None


class Generation:
    """One HTTP call's engine requests (module docstring)."""

    def __init__(
        self, engine: EngineLoop, requests: list[EngineRequest], stops: list[str], tokenizer: Any
    ) -> None:
        self.engine = engine
        self.queue: asyncio.Queue[tuple[int, Delta]] = asyncio.Queue()
        self.streams = [RequestStream(r, self.queue, i) for i, r in enumerate(requests)]
        self.texts = [TextStream(tokenizer, stops) for _ in requests]
        self.choices = [
            Choice(i, prompt_token_ids=list(r.core.prompt_token_ids))
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
            choice.text += new
            if finish is not None:
                choice.finish_reason = finish
                self.running.discard(index)
            first = index not in self.started
            self.started.add(index)
            yield Event(choice, new, delta.token_ids, first, finish)

    def close(self) -> None:
        """Abort the engine requests still running."""
        for index in self.running:
            self.engine.abort(self.streams[index].request_id)
        self.running.clear()
