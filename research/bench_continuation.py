#!/usr/bin/env python3
"""How well can an online cache tell which conversations go on? (issue 15's 80 GB target)

Beating vLLM 1.5x on Jamba at 80 GB needs a hit rate above every online ranking
tried (``bench_reuse_predictors.py``). What decides it is which cached prompts
are *continued* later: an oracle told only that reaches 26 % where recency gets
10 %. This script measures how predictable that is from what a request shows
when it arrives, on a Mooncake trace:

- a request's *parent* is the latest earlier request it shares the most
  512-token hash blocks with; it *continues* the parent when it shares all of
  the parent's blocks but at most the last (a partial block, re-rendered in
  the next turn); its *turn* is its parent's + 1 (0 for a first one);
- per request: turn, input and output length, new tokens past the parent,
  the gap since the parent, and the time in the trace (all known on arrival or,
  for the output length, when it finishes);
- a logistic regression on those features (standardized, plain gradient
  descent), trained on the first half of the requests, predicts whether each
  request of the second half is continued later; its AUC (0.5: no better than
  chance, 1: perfect) is the measure;
- the next-turn gaps beside the seconds of traffic a pool of ``--pool-tokens``
  holds (the trace's prompt tokens per second): a gap longer than that outlives
  recency.

    python3 research/bench_continuation.py [--trace T] [--pool-tokens N] [--write]

``--write`` saves ``benchmarks/results/cache-continuation.md``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = ROOT / "benchmarks" / "results" / "cache-continuation.md"
DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "mooncake_conversation.jsonl"
#: Jamba v0.1 at 80 GB: 61,035 blocks of 80 tokens.
DEFAULT_POOL_TOKENS = 61_035 * 80


def conversations(reqs: Sequence[dict]) -> tuple[list[int], list[int], list[bool], list[int]]:
    """Per request: parent (-1: none), shared hash blocks with it, whether a later
    request continues it, and its turn (module docstring)."""
    n = len(reqs)
    last: dict[int, int] = {}
    parent, shared = [-1] * n, [0] * n
    for i, r in enumerate(reqs):
        key = 0
        for d, h in enumerate(r["hash_ids"]):
            key = hash((key, h))
            if key in last:
                parent[i], shared[i] = last[key], d + 1
            last[key] = i
    continued, turn = [False] * n, [0] * n
    for i in range(n):
        p = parent[i]
        if p >= 0 and shared[i] >= max(2, len(reqs[p]["hash_ids"]) - 1):
            continued[p] = True
            turn[i] = turn[p] + 1
    return parent, shared, continued, turn


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve: the chance a positive outranks a negative (ties half)."""
    order = np.argsort(scores, kind="mergesort")
    s = scores[order]
    ranks = np.empty(len(s))
    i = 0
    while i < len(s):  # average ranks over ties
        j = i
        while j + 1 < len(s) and s[j + 1] == s[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2
        i = j + 1
    pos = labels.astype(bool)
    npos, nneg = int(pos.sum()), int((~pos).sum())
    if not npos or not nneg:
        raise ValueError("AUC needs both positive and negative labels")
    return float((ranks[pos].sum() - npos * (npos - 1) / 2) / (npos * nneg))


def fit_logistic(x: np.ndarray, y: np.ndarray, steps: int = 3000, lr: float = 0.5) -> np.ndarray:
    """Weights of a logistic regression (``x`` standardized, bias column included)."""
    w = np.zeros(x.shape[1])
    for _ in range(steps):
        p = 1 / (1 + np.exp(-x @ w))
        w -= lr * x.T @ (p - y) / len(y)
    return w


def features(
    reqs: Sequence[dict], parent: list[int], shared: list[int], turn: list[int]
) -> np.ndarray:
    """Each request's standardized features, with a bias column (module docstring)."""
    rows = []
    for i, r in enumerate(reqs):
        p = parent[i]
        new = r["input_length"] - (shared[i] * 512 if p >= 0 else 0)
        gap = (r["timestamp"] - reqs[p]["timestamp"]) / 1000 if turn[i] else 0.0
        rows.append([
            min(turn[i], 10), turn[i] == 0, math.log1p(r["input_length"]),
            math.log1p(r["output_length"]), math.log1p(max(0, new)), math.log1p(gap),
            r["timestamp"] / 3.6e6,
        ])  # fmt: skip
    x = np.array(rows, dtype=float)
    x = (x - x.mean(0)) / np.where(x.std(0) > 0, x.std(0), 1)
    return np.hstack([x, np.ones((len(rows), 1))])


def report(trace: Path, pool_tokens: int) -> list[str]:
    reqs = [json.loads(line) for line in trace.open()]
    parent, shared, continued, turn = conversations(reqs)
    y = np.array(continued, dtype=float)
    x = features(reqs, parent, shared, turn)
    half = len(reqs) // 2
    w = fit_logistic(x[:half], y[:half])
    test_auc = auc(x[half:] @ w, y[half:])
    turn_auc = auc(np.array(turn[half:], dtype=float), y[half:])
    span_s = reqs[-1]["timestamp"] / 1000
    tokens_per_s = sum(r["input_length"] for r in reqs) / span_s
    gaps = sorted(
        (reqs[i]["timestamp"] - reqs[parent[i]]["timestamp"]) / 1000
        for i in range(len(reqs))
        if turn[i]
    )
    q = {f"p{k}": gaps[int(k / 100 * (len(gaps) - 1))] for k in (10, 25, 50, 75, 90)}
    by_turn = []
    for lo, hi in ((0, 1), (1, 2), (2, 3), (3, 5), (5, 8), (8, 10**9)):
        sel = [c for c, t in zip(continued, turn, strict=True) if lo <= t < hi]
        if not sel:
            continue
        label = f"{lo}" if hi == lo + 1 else (f"{lo}+" if hi > 100 else f"{lo}-{hi - 1}")
        by_turn.append(f"| {label} | {len(sel):,} | {100 * sum(sel) / len(sel):.0f} % |")
    date = datetime.date.today().isoformat()
    return [
        "# Which conversations go on: how predictable on arrival",
        "",
        f"`research/bench_continuation.py` on `{trace.name}` ({len(reqs):,} requests), "
        f"{date}. Python {sys.version.split()[0]}; decisions only, no timing.",
        "",
        f"Continued later: {100 * y.mean():.1f} % of requests. By turn:",
        "",
        "| turn | requests | continued |",
        "| --- | ---: | ---: |",
        *by_turn,
        "",
        "Logistic regression on turn, first turn or not, input, output and new tokens, gap "
        "since the parent and time in the trace, trained on the first half, tested on the "
        f"second: AUC **{test_auc:.3f}** (turn alone: {turn_auc:.3f}; 0.5 is chance).",
        "",
        f"Next-turn gaps (s): p10 {q['p10']:.0f}, p25 {q['p25']:.0f}, median {q['p50']:.0f}, "
        f"p75 {q['p75']:.0f}, p90 {q['p90']:.0f}. The trace brings {tokens_per_s:,.0f} prompt "
        f"tokens a second, so a pool of {pool_tokens:,} tokens holds about "
        f"{pool_tokens / tokens_per_s:.0f} s of it under recency, before sharing.",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--pool-tokens", type=int, default=DEFAULT_POOL_TOKENS)
    ap.add_argument("--write", action="store_true", help=f"write {RESULTS.relative_to(ROOT)}")
    args = ap.parse_args(argv)
    lines = report(args.trace, args.pool_tokens)
    print("\n".join(lines))
    if args.write:
        RESULTS.write_text("\n".join(lines) + "\n")
        print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
