#!/usr/bin/env python3
"""Can request features beat recency at keeping full-attention KV? (issue 15's targets)

The 1.5x-vLLM and 3x-lru targets on Jamba sit above the recency ceiling of
``bench_ceiling.py``: every page holds full-attention KV, evicted least
recently used first. This script replays the same expanded requests through
the same all-full-attention cache (one at a time, hit = leading cached blocks,
capped one token short of the prompt) under rankings that use what a request
tells about its future, to see how far any of them gets:

- ``lru``: recency (the ceiling);
- ``oracle: continued``: a request that a later replayed one continues
  (shares at least its first two 512-token hash blocks: more than the common
  first block) keeps its blocks ahead of every other: told *whether*, not
  when (a bound, not a policy);
- ``feature rates, best of 12``: recency plus ``K`` x the share of requests of
  the same feature bucket (prompt under 1,024 tokens; turn in its
  conversation, 1-6+; log2 gap to the previous turn) continued within ``H``
  requests, rates taken from the *whole* trace (a look ahead no online
  policy has), the best of ``K`` in 100-3000 and ``H`` in 200-1000;
- ``later turns first``: first turns (and prompts under 1,024 tokens) are
  evicted before every later turn;
- ``admit 70 %`` / ``admit 50 %``: a fixed pseudo-random share of requests
  is cached; the others' new blocks are evicted first;
- ``hazard``: per request, the bucket's rate of being continued at the
  request's current age (from the whole trace); the lowest is evicted first;
- ``returning, +B turnovers``: online, what ``hybrid`` ships
  (``hybridkv/policy/returning.py``): a request is *returning* when the
  blocks covering half its prompt, from its start, rounded up to a run of
  ``SAMPLE_BLOCKS`` blocks, were seen before (in a memory of one chained key
  in ``SAMPLE_BLOCKS`` of the last 4-8 x pool-size blocks, evicted or not, in
  two generations); its blocks
  rank ``B`` pool turnovers (in requests: pool blocks / mean request blocks)
  above a first turn's of the same age;
- ``returning by turn``: the same memory also remembers each request's turn
  (1 + the turn of the request it continues, 0 for a first one), and the
  bonus grows with it (``min(turn, 8)`` or ``log2(1 + turn)`` times ``B``):
  continuation climbs from 26 % of first turns to 97 % past the eighth;
- ``hit density (LHD), turn classes``: online, least hit density
  (``lhd_ranking.py``, after Beckmann et al., NSDI 2018), with the turn in the
  conversation (1-6+) as the class: each request's blocks rank by the hits
  their class has got at their age so far, per block and request of time;
- ``belady``: offline optimal (``bench_ceiling.belady_hits``).

    .venv/bin/python research/bench_reuse_predictors.py          # Jamba, 40 and 80 GB
    .venv/bin/python research/bench_reuse_predictors.py --write  # results/cache-predictors.md
"""

from __future__ import annotations

import argparse
import datetime
import heapq
import math
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks"), str(HERE)]

from bench_ceiling import evict_units  # noqa: E402
from ceilings import belady_hits, block_keys, hit_blocks, lru_hits  # noqa: E402
from lhd_ranking import lhd_hits  # noqa: E402
from machine_info import machine  # noqa: E402

from hybridkv.layouts import shipped_layout  # noqa: E402
from hybridkv.policy.tuning import DEFAULT_TUNING  # noqa: E402
from hybridkv.sim import SimOptions  # noqa: E402
from hybridkv.sim.replay import plan_replay, replay_max_model_len  # noqa: E402
from hybridkv.sim.trace import TraceRequest, load_trace  # noqa: E402
from hybridkv.specs import FullAttentionSpec  # noqa: E402

RETURN_BONUS = DEFAULT_TUNING.return_bonus
RETURNING_SHARE = DEFAULT_TUNING.returning_share
SAMPLE_BLOCKS = DEFAULT_TUNING.sample_blocks
SEEN_PER_BLOCK = DEFAULT_TUNING.seen_per_block

TRACE = ROOT.parent / "shared" / "traces" / "mooncake_conversation.jsonl"
Rank = Callable[[int, int], float]  # (request index, block depth) -> priority (kept longer)


class Conversations:
    """Per request (of the whole trace): its parent (the latest earlier request
    sharing its longest common 512-token prefix, if at least two hash blocks),
    its turn, and when (if ever) it is continued."""

    def __init__(self, requests: Sequence[TraceRequest]) -> None:
        n = len(requests)
        owner: dict[int, int] = {}
        self.parent = [-1] * n
        self.turn = [1] * n
        self.next_use: list[int | None] = [None] * n
        for i, r in enumerate(requests):
            assert r.hash_ids is not None, "Mooncake requests only"
            h, chain = 0, []
            for x in r.hash_ids:
                h = hash((h, x))
                chain.append(h)
            d = 0
            while d < len(chain) and chain[d] in owner:
                d += 1
            if d >= 2:
                p = owner[chain[d - 1]]
                self.parent[i] = p
                self.turn[i] = self.turn[p] + 1
                if self.next_use[p] is None:
                    self.next_use[p] = i
            for c in chain:
                owner[c] = i
        self.small = [r.input_length < 1024 for r in requests]

    def bucket(self, i: int) -> tuple[bool, int, int]:
        gap = -1 if self.parent[i] < 0 else min(int(math.log2(max(1, i - self.parent[i]))), 11)
        return self.small[i], min(self.turn[i], 6), gap

    def rates_within(self, horizon: int) -> dict[tuple[bool, int, int], float]:
        counts: defaultdict[tuple[bool, int, int], list[int]] = defaultdict(lambda: [0, 0])
        for i, nxt in enumerate(self.next_use):
            c = counts[self.bucket(i)]
            c[0] += 1
            c[1] += nxt is not None and nxt - i < horizon
        return {k: (v[1] + 1) / (v[0] + 2) for k, v in counts.items()}

    def hazard(self, limit: int) -> Callable[[int, int], float]:
        """``(request, age) -> P(continued at this age | not yet)`` per bucket
        and half-octave of age, over the first ``limit`` requests' outcomes."""
        exposure: defaultdict[tuple[object, int], int] = defaultdict(int)
        events: defaultdict[tuple[object, int], int] = defaultdict(int)

        def age_bin(a: int) -> int:
            return int(math.log2(a + 1) * 2)

        for i in range(limit):
            nxt = self.next_use[i]
            end = nxt if nxt is not None and nxt < limit else limit
            b = self.bucket(i)
            for a in range(1, end - i + 1):
                exposure[(b, age_bin(a))] += 1
            if nxt is not None and nxt < limit:
                events[(b, age_bin(nxt - i))] += 1

        def h(i: int, age: int) -> float:
            k = (self.bucket(i), age_bin(age))
            return (events[k] + 0.1) / (exposure[k] + 1)

        return h


def ranked_hits(
    keys: Sequence[list[int]], lengths: Sequence[int], bs: int, cap: int, rank: Rank
) -> int:
    """Hit tokens when the block with the lowest ``rank`` at insertion is evicted first."""
    cached: dict[int, float] = {}
    heap: list[tuple[float, int]] = []
    hits = 0
    for i, (ks, length) in enumerate(zip(keys, lengths, strict=True)):
        hits += hit_blocks(ks, length, bs, cached) * bs
        for d, k in enumerate(ks):
            p = rank(i, d)
            cached[k] = p
            heapq.heappush(heap, (p, k))
        while len(cached) > cap:
            p, k = heapq.heappop(heap)
            if cached.get(k) == p:
                del cached[k]
    return hits


def admitted_hits(
    keys: Sequence[list[int]], lengths: Sequence[int], bs: int, cap: int, share: float
) -> int:
    """LRU, but only a pseudo-random ``share`` of requests cache new blocks
    (the others' are evicted first; blocks they hit stay as recent)."""
    return ranked_hits(
        keys,
        lengths,
        bs,
        cap,
        lambda i, d: i - d * 1e-6 - (0 if (i * 2654435761) % 1000 < share * 1000 else 1e9),
    )


def hazard_hits(
    keys: Sequence[list[int]],
    lengths: Sequence[int],
    bs: int,
    cap: int,
    h: Callable[[int, int], float],
) -> int:
    """Evict, request by request, the blocks last used by the request with the
    lowest hazard at its age (deepest first)."""
    owner: dict[int, int] = {}
    units: dict[int, list[int]] = {}
    hits = 0
    for i, (ks, length) in enumerate(zip(keys, lengths, strict=True)):
        hits += hit_blocks(ks, length, bs, owner) * bs
        for k in ks:
            owner[k] = i
        units[i] = list(ks)
        if len(owner) <= cap:
            continue
        order = sorted((h(j, i + 1 - j), j) for j in units if j != i)
        evict_units(owner, units, (j for _, j in order), i, cap)
    return hits


def returning_hits(
    keys: Sequence[list[int]],
    lengths: Sequence[int],
    bs: int,
    cap: int,
    bonus: float,
    grade: Callable[[int], float] = bool,
) -> int:
    """Hit tokens when a returning request's blocks rank ``bonus x
    grade(turn)`` requests higher (module docstring; the memory of seen
    keys is updated after each request, as a freed request updates it).
    ``turn``: 0 for a request that is not returning, else 1 + the turn
    remembered with the sample that decided it (each request's samples are
    stored with its own turn); the default grade is what ``hybrid`` ships."""
    newer: dict[int, int] = {}  # two generations, as ``SeenPrefixes``
    older: dict[int, int] = {}
    half = SEEN_PER_BLOCK * cap // SAMPLE_BLOCKS // 2
    cached: dict[int, float] = {}
    heap: list[tuple[float, int]] = []
    hits = 0
    for i, (ks, length) in enumerate(zip(keys, lengths, strict=True)):
        hits += hit_blocks(ks, length, bs, cached) * bs
        need = max(1, math.ceil(RETURNING_SHARE * length / bs))
        last = -(-need // SAMPLE_BLOCKS) * SAMPLE_BLOCKS - 1  # keys are chained
        seen = None
        if last < len(ks):
            seen = newer.get(ks[last])
            if seen is None:
                seen = older.get(ks[last])
        turn = 0 if seen is None else seen + 1
        base = i + bonus * grade(turn)
        for d, k in enumerate(ks):
            p = base - d * 1e-6
            cached[k] = p
            heapq.heappush(heap, (p, k))
        newer.update(dict.fromkeys(ks[SAMPLE_BLOCKS - 1 :: SAMPLE_BLOCKS], turn))
        if len(newer) > half:
            newer, older = {}, newer
        while len(cached) > cap:
            p, k = heapq.heappop(heap)
            if cached.get(k) == p:
                del cached[k]
    return hits


def run(
    layout_name: str,
    gb: int,
    requests: Sequence[TraceRequest],
    conv: Conversations,
    online_only: bool = False,
    max_model_len: int | None = None,
) -> dict[str, float]:
    """Hit rates by ranking; ``online_only``: lru and the returning rows alone;
    ``max_model_len``: plan for this length (default: the layout's)."""
    layout = shipped_layout(layout_name)
    plan = plan_replay(
        layout,
        SimOptions(memory_bytes=gb * 10**9),
        replay_max_model_len(layout, requests, max_model_len),
    )
    cfg = plan.kv_cache_config
    (bs,) = {
        g.kv_cache_spec.block_size
        for g in cfg.kv_cache_groups
        if type(g.kv_cache_spec) is FullAttentionSpec
    }
    cap = cfg.num_blocks
    keys = [block_keys(r, bs) for r in requests]
    lengths = [r.input_length for r in requests]
    total = sum(lengths)
    n = len(requests)
    continued = [(conv.next_use[i] or n) < n for i in range(n)]  # within the replay
    out: dict[str, float] = {}

    def pct(hits: int) -> float:
        return 100 * hits / total

    out["lru"] = pct(lru_hits(keys, lengths, bs, cap))
    turnover = cap / (sum(map(len, keys)) / n)  # requests per pool turnover
    for b in (1, 2, RETURN_BONUS):
        out[f"returning, +{b:g} turnovers"] = pct(
            returning_hits(keys, lengths, bs, cap, b * turnover)
        )
    for b in (0.5, 1):
        out[f"returning by turn, +{b:g} x min(turn, 8) turnovers"] = pct(
            returning_hits(keys, lengths, bs, cap, b * turnover, lambda t: min(t, 8))
        )
    for b in (1, RETURN_BONUS):
        out[f"returning by turn, +{b:g} x log2(1 + turn) turnovers"] = pct(
            returning_hits(keys, lengths, bs, cap, b * turnover, lambda t: math.log2(1 + t))
        )
    # LHD's settings: the best of 3 on the whole trace, Jamba at 80 GB (results file).
    out["hit density (LHD), turn classes"] = pct(
        lhd_hits(keys, lengths, bs, cap, [min(t, 6) for t in conv.turn[:n]], 200, 0.99)
    )
    if online_only:
        return out
    out["oracle: continued"] = pct(
        ranked_hits(
            keys, lengths, bs, cap, lambda i, d: i - d * 1e-6 + (0 if continued[i] else -1e9)
        )
    )
    best = 0.0
    for horizon in (200, 400, 1000):
        rates = conv.rates_within(horizon)
        for k in (100, 300, 1000, 3000):
            best = max(
                best,
                pct(
                    ranked_hits(
                        keys,
                        lengths,
                        bs,
                        cap,
                        lambda i, d, k=k, rates=rates: i - d * 1e-6 + k * rates[conv.bucket(i)],
                    )
                ),
            )
    out["feature rates, best of 12"] = best
    out["later turns first"] = pct(
        ranked_hits(
            keys,
            lengths,
            bs,
            cap,
            lambda i, d: (
                i - d * 1e-6 + (1e6 if conv.turn[i] >= 2 else 0) - (1e7 if conv.small[i] else 0)
            ),
        )
    )
    out["admit 70 %"] = pct(admitted_hits(keys, lengths, bs, cap, 0.7))
    out["admit 50 %"] = pct(admitted_hits(keys, lengths, bs, cap, 0.5))
    out["hazard"] = pct(hazard_hits(keys, lengths, bs, cap, conv.hazard(len(conv.turn))))
    out["belady"] = pct(belady_hits(keys, lengths, bs, cap))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--requests", type=int, default=1500)
    ap.add_argument("--layout", default="jamba-v0.1")
    ap.add_argument("--memory", default="40,80", help="budgets in GB (10^9 bytes)")
    ap.add_argument(
        "--max-model-len", type=int, help="plan for this length (default: the layout's)"
    )
    ap.add_argument("--write", action="store_true", help="write results/cache-predictors.md")
    ap.add_argument("--append", action="store_true", help="add a section to it instead")
    ap.add_argument(
        "--online-only", action="store_true", help="lru and the returning rows only (fast)"
    )
    args = ap.parse_args(argv)
    whole = load_trace(args.trace)
    conv = Conversations(whole)
    requests = whole[: args.requests]
    budgets = [int(m) for m in args.memory.split(",")]
    results = {
        gb: run(args.layout, gb, requests, conv, args.online_only, args.max_model_len)
        for gb in budgets
    }
    names = list(results[budgets[0]])
    head = [
        "# Ranking full-attention KV by what requests tell about their future",
        "",
        (__doc__ or "").split("\n\n")[1].strip(),
        "",
    ]
    lines = [
        f"## {Path(args.trace).name}, first {len(requests):,} requests, {args.layout}"
        + (f", max_model_len {args.max_model_len:,}" if args.max_model_len else ""),
        "",
        f"Machine: {machine()}. Generated by `research/bench_reuse_predictors.py` on "
        f"{datetime.date.today().isoformat()}.",
        "",
        "| ranking | " + " | ".join(f"{gb} GB" for gb in budgets) + " |",
        "| --- | " + " | ".join("---:" for _ in budgets) + " |",
        *(
            f"| {name} | " + " | ".join(f"{results[gb][name]:.2f} %" for gb in budgets) + " |"
            for name in names
        ),
        "",
    ]
    print("\n".join(head + lines))
    out = ROOT / "benchmarks" / "results" / "cache-predictors.md"
    if args.append:
        with out.open("a") as f:  # a blank line before the new section, one after it
            f.write("\n" + "\n".join(lines).rstrip("\n") + "\n")
    elif args.write:
        out.write_text("\n".join(head + lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
