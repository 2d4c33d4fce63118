"""The multi-turn conversations ``bench_cluster.py`` replays, as text prompts, and ``play``.

A conversation is a list of turns; a turn is the hash ids of its prompt's
512-token blocks, prefix-chained as in the Mooncake traces (two prompts whose
lists start with the same k ids share their first k blocks). Two sources:

- ``trace_conversations``: the Mooncake conversation trace's requests grouped by
  their second hash id (the first, id 0, is shared by every request);
- ``generated_conversations``: a small workload of the same shape, for a
  machine without the trace: one block shared by every prompt, a block of the
  conversation's own, then each turn re-sends the conversation so far plus 1-3
  new blocks (seeded, so every run and policy replays the same requests).

``as_text`` turns each block into ``words`` words of a word-level vocabulary
(``w5`` ... ``w511``), the same words for the same id, so prompts share exactly
the text prefixes their blocks share (the gateway routes on text).
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

VOCAB = 512
Conversation = list[list[int]]


def trace_conversations(
    path: Path, n: int, min_turns: int, max_turns: int, max_blocks: int
) -> list[Conversation]:
    """The first ``n`` conversations of the trace with at least ``min_turns`` turns
    (each cut to ``max_turns``), skipping requests longer than ``max_blocks`` blocks."""
    convs: dict[int, Conversation] = defaultdict(list)
    order: list[int] = []
    with path.open() as f:
        for line in f:
            ids = json.loads(line)["hash_ids"]
            if len(ids) < 2 or len(ids) > max_blocks:
                continue
            if ids[1] not in convs:
                order.append(ids[1])
            convs[ids[1]].append(ids)
    return [convs[k][:max_turns] for k in order if len(convs[k]) >= min_turns][:n]


def generated_conversations(
    n: int, min_turns: int, max_turns: int, seed: int = 0
) -> list[Conversation]:
    """``n`` conversations shaped like the trace's (module docstring)."""
    rng = random.Random(seed)
    next_id = 1
    out = []
    for _ in range(n):
        ids = [0, next_id]
        next_id += 1
        turns = []
        for _ in range(rng.randint(min_turns, max_turns)):
            new = rng.randint(1, 3)
            ids = ids + list(range(next_id, next_id + new))
            next_id += new
            turns.append(ids)
        out.append(turns)
    return out


def prefix_ceiling(convs: list[Conversation]) -> float:
    """The cached fraction of prompt blocks that one cache holding everything
    would give, whatever the order across conversations: each turn's longest
    block prefix shared with an earlier turn of its conversation or with any turn
    of another. An upper bound on what routing and tiers can reach (hits are cut
    to whole KV blocks, a little below)."""
    prefixes: dict[tuple[int, ...], set[int]] = defaultdict(set)  # prefix -> conversations
    for c, conv in enumerate(convs):
        for turn in conv:
            for k in range(1, len(turn) + 1):
                prefixes[tuple(turn[:k])].add(c)
    hit = total = 0
    for c, conv in enumerate(convs):
        for t, turn in enumerate(conv):
            earlier = {tuple(x) for x in conv[:t]}
            best = 0
            for k in range(1, len(turn) + 1):
                p = tuple(turn[:k])
                own_earlier = any(e[:k] == p for e in earlier if len(e) >= k)
                if not (own_earlier or prefixes[p] - {c}):
                    break
                best = k
            hit += best
            total += len(turn)
    return hit / total if total else 0.0


def as_text(convs: list[Conversation], words: int) -> list[list[str]]:
    """Each turn's prompt text: ``words`` words per block id (module docstring)."""

    def block(h: int) -> str:
        return " ".join(f"w{5 + (h * 7919 + j * 104729) % (VOCAB - 5)}" for j in range(words))

    return [[" ".join(block(h) for h in turn) for turn in conv] for conv in convs]


def play(
    url: str,
    model: str,
    convs: list[list[str]],
    concurrency: int,
    max_tokens: int,
    think_s: float = 0.0,
) -> dict[str, Any]:
    """Each client plays whole conversations (``think_s`` between a reply and the next
    turn); TTFT per request, wall time, and the cached share of prompt tokens that the
    responses' usage reports (``usage_cached``)."""
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)
    ttfts: list[float] = []
    tokens = 0
    prompt_tokens = cached_tokens = 0  # from each response's usage (clients' view)
    lock = threading.Lock()

    def conversation(turns: list[str]) -> None:
        nonlocal tokens, prompt_tokens, cached_tokens
        for k, prompt in enumerate(turns):
            if k and think_s:
                time.sleep(think_s)
            t0 = time.perf_counter()
            first = None
            n = 0
            usage: Any = None
            for chunk in client.completions.create(
                model=model,
                prompt=prompt,
                max_tokens=max_tokens,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
            ):
                if first is None and chunk.choices and chunk.choices[0].text:
                    first = time.perf_counter() - t0
                n += len(chunk.choices[0].text.split()) if chunk.choices else 0
                if chunk.usage is not None:
                    usage = chunk.usage
            if usage is None:
                raise RuntimeError("a streamed response ended without usage (include_usage)")
            details = usage.prompt_tokens_details
            with lock:
                ttfts.append(first if first is not None else time.perf_counter() - t0)
                tokens += n
                prompt_tokens += usage.prompt_tokens
                if details is not None and details.cached_tokens:
                    cached_tokens += details.cached_tokens

    t = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(conversation, convs))
    wall = time.perf_counter() - t
    ttfts.sort()
    return {
        "requests": len(ttfts),
        "ttft_p50": ttfts[len(ttfts) // 2],
        "ttft_p99": ttfts[min(len(ttfts) - 1, int(len(ttfts) * 0.99))],
        "wall": wall,
        "tokens_per_s": tokens / wall,
        "requests_per_s": len(ttfts) / wall,
        "usage_cached": cached_tokens / prompt_tokens if prompt_tokens else 0.0,
    }
