"""How many tokens a request may generate: its ``max_tokens`` must fit in the context.

::

    |<------------------------ max_model_len ------------------------>|
    |<------- prompt (n tokens) ------->|<-------- room ------------>|

A client's ``max_tokens`` (or ``max_completion_tokens``) beyond the room is
refused, naming both numbers, as vLLM does; it is never cut silently. Without
one, a request gets the endpoint's default (None: the whole room), cut to the
room. A prompt that fills the context leaves no room and is refused too.
"""

from __future__ import annotations

from dataclasses import dataclass


class NoRoom(ValueError):
    """The request's output does not fit in the context (HTTP 400); ``field`` names it."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True, slots=True)
class Limit:
    """What a request asked for, and the endpoint's default."""

    requested: int | None
    """The client's ``max_tokens`` (or ``max_completion_tokens``); None: not given."""
    default: int | None
    """Without one: this many (cut to the room); None: the whole room."""
    field: str
    """The request field ``requested`` came from (the 400's ``param``)."""
    prompt_field: str
    """The request field holding the prompt (``prompt`` or ``messages``)."""

    def budget(self, prompt_len: int, max_model_len: int) -> int:
        """The ``max_tokens`` to run with (module docstring); ``NoRoom`` if none fits."""
        room = max_model_len - prompt_len
        want, field = self.requested, self.field
        if want is not None and want > room:
            raise NoRoom(
                f"{field}={want} is too large: this model's maximum context length is "
                f"{max_model_len} tokens and the prompt has {prompt_len}, which leaves room for "
                f"{max(room, 0)} ({want} > {max_model_len} - {prompt_len}); lower {field}",
                field,
            )
        if room < 1:
            raise NoRoom(
                f"the prompt has {prompt_len} tokens, the whole context (max_model_len="
                f"{max_model_len}): no room for a completion; shorten the {self.prompt_field}",
                self.prompt_field,
            )
        if want is not None:
            return want
        return room if self.default is None else min(self.default, room)
