"""Log-probabilities in OpenAI's response shapes.

The engine gives, per output token, ``{token id: Logprob}``: the sampled token
and the ``k`` most likely (ranks from 1; ``SamplingParams.logprobs``). They are
vLLM's default ``raw_logprobs``: the model's own distribution, before
penalties, ``logit_bias`` and temperature. Chat (``logprobs: true``,
``top_logprobs: k``)::

    {"content": [{"token", "logprob", "bytes",
                  "top_logprobs": [k x {"token", "logprob", "bytes"}]}],
     "refusal": null}

Completions (``logprobs: k``; ``top_logprobs`` holds the sampled token too, so up
to ``k + 1`` entries, as OpenAI documents)::

    {"tokens": [...], "token_logprobs": [...], "top_logprobs": [{token: logprob}],
     "text_offset": [...]}

A token's text is ``decode([id])`` with special tokens kept (``token_id:N``
without a tokenizer); ``text_offset`` counts characters of those texts from the
start of the choice's text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hybridkv.engine.outputs import Logprob

Entry = dict[int, Logprob]


class LogprobFormat:
    """Turns engine logprob entries into one endpoint's JSON (module docstring)."""

    def __init__(self, tokenizer: Any, k: int, chat: bool) -> None:
        self.tokenizer = tokenizer
        self.k = k
        self.chat = chat

    def text(self, token: int) -> str:
        if self.tokenizer is None:
            return f"token_id:{token}"
        return str(self.tokenizer.decode([token], skip_special_tokens=False))

    def _top(self, entry: Entry) -> list[tuple[int, Logprob]]:
        return sorted(
            ((t, lp) for t, lp in entry.items() if lp.rank <= self.k), key=lambda x: x[1].rank
        )

    def _chat_item(self, token: int, lp: Logprob) -> dict[str, Any]:
        text = self.text(token)
        return {"token": text, "logprob": lp.logprob, "bytes": list(text.encode("utf-8"))}

    def format(
        self, token_ids: Sequence[int], entries: Sequence[Entry], offset: int = 0
    ) -> dict[str, Any]:
        """The ``logprobs`` object of ``token_ids`` (``offset``: characters of the choice's
        text before them, for a completion's ``text_offset``)."""
        if self.chat:
            content = []
            for token, entry in zip(token_ids, entries, strict=True):
                item = self._chat_item(token, entry[token])
                item["top_logprobs"] = [self._chat_item(t, lp) for t, lp in self._top(entry)]
                content.append(item)
            return {"content": content, "refusal": None}
        tokens, values, tops, offsets = [], [], [], []
        for token, entry in zip(token_ids, entries, strict=True):
            text = self.text(token)
            tokens.append(text)
            values.append(entry[token].logprob)
            top = {self.text(t): lp.logprob for t, lp in self._top(entry)}
            top.setdefault(text, entry[token].logprob)
            tops.append(top)
            offsets.append(offset)
            offset += len(text)
        return {
            "tokens": tokens,
            "token_logprobs": values,
            "top_logprobs": tops,
            "text_offset": offsets,
        }

    def length(self, token_ids: Sequence[int]) -> int:
        """Characters the tokens' texts take (to advance a stream's ``text_offset``)."""
        return sum(len(self.text(t)) for t in token_ids)
