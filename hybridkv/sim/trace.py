"""Request traces for ``hybridkv simulate``: reading, checking, expanding to token ids.

One JSON object per line, in one of two forms (blank lines are skipped):

- Mooncake (kvcache-ai/Mooncake FAST25 traces)::

      {"timestamp": 27482, "input_length": 6955, "output_length": 52,
       "hash_ids": [46, 47, ..., 2354]}

  ``hash_ids`` are prefix-chained ids of 512-token blocks. Hash id ``h``
  expands to the tokens ``range(h * 512, h * 512 + 512)``, and the prompt is
  the expansion cut to ``input_length``: two requests whose lists start with
  the same ``k`` ids share exactly their first ``k * 512`` tokens (no more,
  since distinct ids expand to disjoint token ranges).

- token prompts::

      {"timestamp": 0, "prompt_token_ids": [1, 2, 3], "output_length": 4}

``timestamp`` (milliseconds from the start of the trace) may be left out: a
line without one arrives with the line before it (the first at 0). Arrivals
must not go backwards. ``output_length`` is required unless the caller fixes
the output length for every request (``output_tokens``).

Every problem is a ``TraceError`` (a ``ValueError``) of one line naming the
file, the line number and the field. Prompt token ids stay below
``OUTPUT_TOKEN_BASE`` (2**31), so that the simulator's output ids, counted up
from there, never collide with a prompt.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Tokens per Mooncake hash id.
HASH_BLOCK_TOKENS = 512
#: First output token id; prompt ids stay below it.
OUTPUT_TOKEN_BASE = 2**31
#: Largest hash id whose expansion stays below ``OUTPUT_TOKEN_BASE``.
MAX_HASH_ID = OUTPUT_TOKEN_BASE // HASH_BLOCK_TOKENS - 1


class TraceError(ValueError):
    """A trace that cannot be read (one line: file, line number, field, fix)."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace; ``line`` is its 1-based line in the file.

    Exactly one of ``hash_ids`` (Mooncake) and ``prompt`` (token ids) is set.
    """

    line: int
    arrival_s: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...] | None = None
    prompt: tuple[int, ...] | None = None

    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens (the request's final length)."""
        return self.input_length + self.output_length

    def prompt_token_ids(self) -> list[int]:
        """The prompt as token ids (a fresh list; built in C, no per-token Python)."""
        if self.prompt is not None:
            return list(self.prompt)
        assert self.hash_ids is not None
        n = HASH_BLOCK_TOKENS
        blocks = (range(h * n, h * n + n) for h in self.hash_ids)
        return list(itertools.islice(itertools.chain.from_iterable(blocks), self.input_length))


def _int_field(obj: dict[str, Any], key: str, where: str, minimum: int) -> int:
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceError(f"{where}: {key} must be an integer, got {value!r}")
    if value < minimum:
        raise TraceError(f"{where}: {key} must be >= {minimum}, got {value}")
    return value


def _int_list(obj: dict[str, Any], key: str, where: str, high: int) -> tuple[int, ...]:
    """``obj[key]`` as a non-empty tuple of ints in ``[0, high]``."""
    values = obj[key]
    if not isinstance(values, list) or not values:
        raise TraceError(f"{where}: {key} must be a non-empty list of integers")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= high:
            raise TraceError(
                f"{where}: {key} holds {v!r}; every entry must be an int in [0, {high}]"
            )
    return tuple(values)


def _timestamp(obj: dict[str, Any], where: str, previous: float) -> float:
    if "timestamp" not in obj:
        return previous
    t = obj["timestamp"]
    if isinstance(t, bool) or not isinstance(t, int | float) or not t >= 0:
        raise TraceError(f"{where}: timestamp must be a number of milliseconds >= 0, got {t!r}")
    seconds = t / 1000.0
    if seconds < previous:
        raise TraceError(
            f"{where}: timestamp {t} goes back in time (the line before arrives at "
            f"{previous * 1000:g} ms); sort the trace by timestamp"
        )
    return seconds


def _parse(
    obj: dict[str, Any], where: str, line: int, previous: float, output_tokens: int | None
) -> TraceRequest:
    arrival = _timestamp(obj, where, previous)
    if output_tokens is not None:
        output_length = output_tokens
    elif "output_length" in obj:
        output_length = _int_field(obj, "output_length", where, 1)
    else:
        raise TraceError(
            f"{where}: missing 'output_length'; add it or fix every request's output "
            "length (--output-tokens N)"
        )
    if "prompt_token_ids" in obj:
        prompt = _int_list(obj, "prompt_token_ids", where, OUTPUT_TOKEN_BASE - 1)
        return TraceRequest(line, arrival, len(prompt), output_length, prompt=prompt)
    for key in ("input_length", "hash_ids"):
        if key not in obj:
            raise TraceError(
                f"{where}: missing {key!r} (a Mooncake line needs input_length, "
                "output_length and hash_ids; a token line needs prompt_token_ids)"
            )
    input_length = _int_field(obj, "input_length", where, 1)
    hash_ids = _int_list(obj, "hash_ids", where, MAX_HASH_ID)
    if len(hash_ids) * HASH_BLOCK_TOKENS < input_length:
        raise TraceError(
            f"{where}: {len(hash_ids)} hash_ids cover {len(hash_ids) * HASH_BLOCK_TOKENS} "
            f"tokens, fewer than input_length={input_length}"
        )
    return TraceRequest(line, arrival, input_length, output_length, hash_ids=hash_ids)


def load_trace(
    path: str | Path, *, limit: int | None = None, output_tokens: int | None = None
) -> list[TraceRequest]:
    """The first ``limit`` requests (all when ``None``) of the trace at ``path``.

    ``output_tokens`` replaces every request's ``output_length``. Raises
    ``TraceError`` for an unreadable file, a bad line, or no request at all.
    """
    if limit is not None and limit < 1:
        raise TraceError(f"limit must be >= 1, got {limit}")
    if output_tokens is not None and output_tokens < 1:
        raise TraceError(f"output_tokens must be >= 1, got {output_tokens}")
    requests: list[TraceRequest] = []
    previous = 0.0
    try:
        with open(path, encoding="utf-8") as f:
            for number, text in enumerate(f, start=1):
                if limit is not None and len(requests) >= limit:
                    break
                if not text.strip():
                    continue
                where = f"{path}:{number}"
                try:
                    obj = json.loads(text)
                except json.JSONDecodeError as e:
                    raise TraceError(f"{where}: not JSON ({e.msg} at column {e.colno})") from None
                if not isinstance(obj, dict):
                    raise TraceError(f"{where}: expected a JSON object, got {type(obj).__name__}")
                req = _parse(obj, where, number, previous, output_tokens)
                previous = req.arrival_s
                requests.append(req)
    except OSError as e:
        raise TraceError(f"cannot read trace {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise TraceError(f"cannot read trace {path}: not UTF-8 text") from None
    if not requests:
        raise TraceError(f"trace {path} holds no request")
    return requests
