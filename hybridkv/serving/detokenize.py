"""``TextStream``: output token ids to streamed text, with stop strings.

The text of a request is always ``tokenizer.decode(all output ids,
skip_special_tokens=True)``, the same as ``LLM.generate``'s, so a streamed
reply joins to exactly the non-streamed one. What is handed out is held back
while it could still change: a trailing U+FFFD (an unfinished UTF-8
character) and, with stop strings, the last ``longest stop - 1`` characters
(they might begin a stop string). When a stop string appears, the text ends
just before it (OpenAI's rule: the stop string is not returned). Before
``min_tokens`` tokens are out, stop strings are not looked for (vLLM's rule).
"""

from __future__ import annotations

from typing import Any


class TextStream:
    """Incremental text of one request (module docstring)."""

    def __init__(self, tokenizer: Any, stops: list[str], min_tokens: int = 0) -> None:
        self.tokenizer = tokenizer
        self.min_tokens = min_tokens
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.token_ids: list[int] = []
        self.text = ""  # the whole text so far (cut at a stop string)
        self.sent = 0  # characters of ``text`` handed out
        self.stopped = False  # a stop string matched

    def add(self, token_ids: list[int], final: bool) -> str:
        """Take new tokens; return the text that can be handed out now.

        ``final``: the request has ended, so nothing is held back.
        """
        if self.stopped:
            return ""
        self.token_ids.extend(token_ids)
        text = "" if self.tokenizer is None else self._decode()
        if self.stops and len(self.token_ids) >= self.min_tokens:
            start = max(0, len(self.text) - self.hold)
            cut = min((i for i in (text.find(s, start) for s in self.stops) if i >= 0), default=-1)
            if cut >= 0:
                text, self.stopped, final = text[:cut], True, True
        self.text = text
        end = len(text)
        if not final:
            end -= self.hold if self.stops else 0
            if text.endswith("\ufffd"):
                end = min(end, len(text) - 1)
        if end <= self.sent:
            return ""
        delta = text[self.sent : end]
        self.sent = end
        return delta

    def _decode(self) -> str:
        return str(self.tokenizer.decode(self.token_ids, skip_special_tokens=True))
