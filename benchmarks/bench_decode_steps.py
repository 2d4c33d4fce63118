#!/usr/bin/env python3
"""``KVCacheManager.allocate_slots`` on decode steps, by what the step does.

A Gemma 3-like layout (five sliding-window groups and one full-attention group, block
size 16, ``--window`` tokens) serves ``--batch`` requests of ``--length`` prompt tokens,
then decodes ``--tokens`` tokens each, one ``allocate_slots(request, 1)`` per request and
step as the engine's scheduler calls it. Each call is timed in thread CPU time and put in
one class by what the step asks of the manager:

- ``quiet``: nothing (the slot exists, no block fills, nothing leaves the window);
- ``fills``: the step's token fills a block (it is cached in every group);
- ``crosses``: the step needs a new block in every group;
- ``window``: a block leaves the window under ``lru``'s rule (released in every sliding
  group; ``hybrid`` keeps a tail of hit points whole, so it releases later). With a
  window that is a multiple of the block size (Gemma 3's 512 and 1024) this is also the
  step that fills a block.

The table gives the median microseconds per call of each class (median over the steps,
then over ``--rounds`` fresh processes) and the mean over all decode calls, under each
cache policy. ``--compare TREE`` alternates fresh processes of this checkout and another
one's ``hybridkv`` (e.g. ``git worktree add --detach /tmp/base main``) and prints both.

    .venv/bin/python benchmarks/bench_decode_steps.py [--window 64] [--compare /tmp/base]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
KINDS = ("quiet", "fills", "crosses", "window", "mean")
BLOCK = 16


def _manager(policy: str, window: int, max_len: int, num_blocks: int) -> Any:
    import torch

    from hybridkv import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        KVCacheManager,
        KVCacheTensor,
        SlidingWindowSpec,
    )

    attn: dict[str, Any] = dict(num_kv_heads=1, head_size=256, dtype=torch.bfloat16)
    groups = []
    for g in range(6):
        spec = (
            FullAttentionSpec(block_size=BLOCK, **attn)
            if g == 5
            else SlidingWindowSpec(block_size=BLOCK, sliding_window=window, **attn)
        )
        groups.append(KVCacheGroupSpec([f"layers.{3 * g + i}" for i in range(3)], spec))
    tensors = [
        KVCacheTensor(size=g.kv_cache_spec.page_size_bytes * num_blocks, shared_by=[name])
        for g in groups
        for name in g.layer_names
    ]
    config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=tensors, kv_cache_groups=groups)
    return KVCacheManager(config, max_model_len=max_len, cache_policy=policy)


def _kind(computed: int, window: int) -> str:
    """What the step from ``computed`` to ``computed + 1`` tokens asks of the manager."""
    if computed >= window and (computed - window + 1) % BLOCK == 0:
        return "window"  # the first token of a block leaves the window at this query
    if computed % BLOCK == 0:
        return "crosses"
    if (computed + 1) % BLOCK == 0:
        return "fills"
    return "quiet"


def run_once(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    from hybridkv import Request

    out = {}
    clock = time.thread_time_ns
    for policy in ("lru", "hybrid"):
        max_len = args.length + args.tokens + BLOCK
        blocks = args.batch * 6 * (max_len // BLOCK + 2) + 64
        kv = _manager(policy, args.window, max_len, blocks)
        reqs = [Request(f"r{i}", [(7 * i + j) % 509 + 3 for j in range(args.length)])
                for i in range(args.batch)]  # fmt: skip
        for r in reqs:
            hit_blocks, hit = kv.get_computed_blocks(r)
            assert kv.allocate_slots(r, r.num_tokens - hit, hit, hit_blocks) is not None
            r.num_computed_tokens = r.num_tokens
            r.append_output_token_ids(5)
        allocate = kv.allocate_slots
        times: dict[str, list[float]] = {k: [] for k in KINDS}
        for step in range(args.tokens - 1):
            kind = _kind(reqs[0].num_computed_tokens, args.window)
            t = clock()
            for r in reqs:
                allocate(r, 1)
            per_call = (clock() - t) / args.batch / 1e3
            times[kind].append(per_call)
            times["mean"].append(per_call)
            for r in reqs:
                r.num_computed_tokens += 1
                r.append_output_token_ids(5 + step % 7)
        kv.check_integrity()
        out[policy] = {
            k: (statistics.mean(v) if k == "mean" else statistics.median(v)) if v else 0.0
            for k, v in times.items()
        }
    return out


def _table(results: list[tuple[str, dict[str, dict[str, float]]]]) -> list[str]:
    heads = [f"{name} {policy}" for name, _ in results for policy in ("lru", "hybrid")]
    lines = ["| us per call | " + " | ".join(heads) + " |", "| --- |" + " ---: |" * len(heads)]
    for k in KINDS:
        cells = [r[policy][k] for _, r in results for policy in ("lru", "hybrid")]
        lines.append(f"| {k} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--window", type=int, default=64, help="sliding window (tokens)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--compare", help="another checkout's root: alternate runs with it")
    ap.add_argument("--json", action="store_true", help="print one run's result as JSON")
    args = ap.parse_args(argv)
    if args.json:
        print(json.dumps(run_once(args)))
        return 0
    trees = {"this": HERE.parent}
    if args.compare:
        trees = {"base": Path(args.compare).resolve(), "new": HERE.parent}
    rest = [a for a in argv if a not in ("--compare", args.compare)]
    sys.path.insert(0, str(HERE))
    from machine_info import cpu_features, machine
    from tree_runs import alternate

    runs = alternate(Path(__file__).resolve(), trees, rest, args.rounds)
    merged = [
        (name, {p: {k: statistics.median(r[p][k] for r in rs) for k in KINDS} for p in rs[0]})
        for name, rs in runs.items()
    ]
    load = os.getloadavg()
    print(f"{machine()}; {cpu_features()}; load average {load[0]:.1f} {load[1]:.1f}; "
          f"{args.batch} x {args.length} -> {args.tokens}, window {args.window}, block "
          f"{BLOCK}, 6 groups; medians of {args.rounds} runs (mean: over all calls)")  # fmt: skip
    print()
    print("\n".join(_table(merged)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
