#!/usr/bin/env python3
"""Hit-rate ceilings: what any cache policy could reach at a memory budget.

For a layout, a budget and a trace, the planner gives the pool's ``num_blocks``
(one page each). A prefix hit at L needs the full-attention blocks of [0, L)
in every case, plus, for a hybrid layout, some sliding/chunked blocks or a
Mamba state at L. This script drops that extra cost: it spends *every* page on
full-attention blocks of the full-attention group and replays the same
expanded requests (one at a time, hit = leading cached blocks, capped one
token short of the prompt, as the manager does) through two eviction rules:

- ``lru``: least recently used, a request's blocks released deepest first
  (the free queue's order);
- ``belady``: offline optimal for the paging problem: evict the block whose
  next use is furthest away (never used again first; a deeper block first on
  ties, so the cache stays prefix-closed), and do not keep a block whose next
  use is further than every block kept.

Both are upper bounds for the hybrid layout at that budget: ``lru`` for any
policy that evicts full-attention KV by recency (ours and vLLM's), ``belady``
for any policy at all that keeps one state/window per hit point for free. A
target above ``belady`` cannot be met by retention alone.

    .venv/bin/python research/bench_ceiling.py --layouts jamba-v0.1 --memory 40,80
    .venv/bin/python research/bench_ceiling.py --write   # -> results/cache-ceiling.md
"""

from __future__ import annotations

import argparse
import datetime
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks"), str(HERE)]

from ceilings import belady_hits, block_keys, lru_hits  # noqa: E402
from machine_info import machine  # noqa: E402

from hybridkv.layouts import shipped_layout  # noqa: E402
from hybridkv.sim import SimOptions  # noqa: E402
from hybridkv.sim.replay import plan_replay, replay_max_model_len  # noqa: E402
from hybridkv.sim.trace import TraceRequest, load_trace  # noqa: E402
from hybridkv.specs import FullAttentionSpec  # noqa: E402

TRACE = ROOT.parent / "shared" / "traces" / "mooncake_conversation.jsonl"


def evict_units(
    owner: dict[int, int],
    units: dict[int, list[int]],
    order: Iterable[int],
    newest: int,
    cap: int,
) -> list[tuple[int, int]]:
    """Evict blocks until ``owner`` (block key -> its unit) holds at most ``cap``: the
    units of ``order`` first, in that order, each from its deepest block it still owns;
    then ``newest``'s own. ``units[u]`` lists unit ``u``'s blocks shallowest first (some
    taken over by later units); a unit it visits keeps only its own, and one left with
    none is removed. Returns ``(unit, blocks evicted)`` for each unit of ``order`` that
    lost any."""
    n = len(owner)
    evicted: list[tuple[int, int]] = []
    for u in order:
        if n <= cap:
            break
        mine = [k for k in units[u] if owner.get(k) == u]
        count = 0
        while mine and n > cap:
            del owner[mine.pop()]
            n -= 1
            count += 1
        if count:
            evicted.append((u, count))
        units[u] = mine
        if not mine:
            del units[u]
    while n > cap:
        del owner[units[newest].pop()]
        n -= 1
    return evicted


@dataclass(frozen=True)
class Ceiling:
    layout: str
    memory_gb: int
    num_blocks: int
    block_size: int
    prompt_tokens: int
    lru: float
    belady: float


def ceilings(
    layouts: Sequence[str],
    budgets: Sequence[int],
    requests: Sequence[TraceRequest],
    max_model_len: int | None = None,
) -> Iterator[Ceiling]:
    total = sum(r.input_length for r in requests)
    lengths = [r.input_length for r in requests]
    for name in layouts:
        layout = shipped_layout(name)
        max_len = replay_max_model_len(layout, requests, max_model_len)
        by_size: dict[int, list[list[int]]] = {}
        for gb in budgets:
            plan = plan_replay(layout, SimOptions(memory_bytes=gb * 10**9), max_len)
            cfg = plan.kv_cache_config
            (bs,) = {
                g.kv_cache_spec.block_size
                for g in cfg.kv_cache_groups
                if type(g.kv_cache_spec) is FullAttentionSpec
            }
            if bs not in by_size:
                by_size[bs] = [block_keys(r, bs) for r in requests]
            keys = by_size[bs]
            n = cfg.num_blocks
            yield Ceiling(
                name,
                gb,
                n,
                bs,
                total,
                100 * lru_hits(keys, lengths, bs, n) / total,
                100 * belady_hits(keys, lengths, bs, n) / total,
            )


def table(rows: Sequence[Ceiling]) -> list[str]:
    out = [
        "| layout @ budget | pages | block | every page full attention: lru | belady (optimal) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for c in rows:
        out.append(
            f"| {c.layout} @ {c.memory_gb} GB | {c.num_blocks:,} | {c.block_size} "
            f"| {c.lru:.2f} % | {c.belady:.2f} % |"
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--requests", type=int, default=1500)
    ap.add_argument("--layouts", default="jamba-v0.1,gemma-3-27b,gemma-3-12b,llama-4-scout")
    ap.add_argument("--memory", default="40,80", help="budgets in GB (10^9 bytes)")
    ap.add_argument(
        "--max-model-len", type=int, help="plan for this length (default: the layout's)"
    )
    ap.add_argument("--write", action="store_true", help="write results/cache-ceiling.md")
    ap.add_argument("--append", action="store_true", help="add a section to it instead")
    args = ap.parse_args(argv)
    requests = load_trace(args.trace, limit=args.requests)
    rows = []
    for c in ceilings(
        args.layouts.split(","),
        [int(m) for m in args.memory.split(",")],
        requests,
        args.max_model_len,
    ):
        rows.append(c)
        print(table([c])[-1], flush=True)
    lines = [
        "# Hit-rate ceilings at a memory budget",
        "",
        (__doc__ or "").split("\n\n")[1].strip(),
        "",
        f"## {Path(args.trace).name}, first {len(requests):,} requests "
        f"({rows[0].prompt_tokens:,} prompt tokens"
        + (f", max_model_len {args.max_model_len:,}" if args.max_model_len else "")
        + ")",
        "",
        f"Machine: {machine()}. Generated by `research/bench_ceiling.py` on "
        f"{datetime.date.today().isoformat()}.",
        "",
        *table(rows),
        "",
    ]
    print("\n".join(lines))
    out = ROOT / "benchmarks" / "results" / "cache-ceiling.md"
    if args.append:
        with out.open("a") as f:
            f.write("\n".join(lines[lines.index("") + 3 :]))
    elif args.write:
        out.write_text("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
