#!/usr/bin/env python3
"""What any cache could reach at a memory budget, Mamba states counted (issue 45).

``bench_ceiling.py`` spends every page on full-attention blocks (states free). Here a
hit of ``k`` blocks of jamba-v0.1 also needs the Mamba state after block ``k``: one
page per Mamba group (7 pages against 1 for a KV block). Figures, as token hit rates:

- **sequential model** (``offline_units``: one request at a time, the whole pool a
  cache between requests):
  - ``unlimited``: every request hits its reach (no eviction);
  - ``bound``: the dual bound of ``offline_bound`` (no cache can do better there);
  - ``belady``: Belady with every reachable hit planned (``offline_replay``), in
    requests and per byte; ``lru``: LRU over KV and every boundary's state. Both
    achievable there.
- **in the simulator** (``--sim``; ``oracle_sim``): ``hybridkv simulate``'s own replay
  (trace arrivals, 64 running, H100 profile) with the oracle free set: achievable
  there, by an offline rule. With it, ``hybrid`` at the same budget, each request's
  hit recorded, and the tokens the oracle hits and ``hybrid`` does not, by how long
  ago the hit's prefix was last in a prompt.

    .venv/bin/python research/offline_ceiling.py --requests 2000 --memory 20,40
    .venv/bin/python research/offline_ceiling.py --memory 200,360 --sim   # ~25 min
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks"), str(HERE)]

import numpy as np  # noqa: E402
from machine_info import machine  # noqa: E402
from offline_bound import DualProblem, dual_bound  # noqa: E402
from offline_replay import lru_replay, planned_replay  # noqa: E402
from offline_units import Units, build_units  # noqa: E402
from oracle_sim import (  # noqa: E402
    hooked_manager,
    hooked_replay,
    oracle_replay,
    plan_needs,
    reach,
    sim_hashes,
)

from hybridkv.layouts import shipped_layout  # noqa: E402
from hybridkv.sim import SimOptions  # noqa: E402
from hybridkv.sim.replay import plan_replay, replay_max_model_len  # noqa: E402
from hybridkv.sim.trace import TraceRequest, load_trace  # noqa: E402
from hybridkv.specs import FullAttentionSpec, MambaSpec  # noqa: E402

TRACE = ROOT.parent / "shared" / "traces" / "mooncake_conversation.jsonl"
#: Buckets of how long ago a hit's prefix was last in a prompt (prompt tokens between).
GAP_EDGES_TOKENS = (2e6, 5e6, 10e6, 20e6, 40e6)


def layout_units(name: str, requests: Sequence[TraceRequest], gb: int) -> tuple[Units, int]:
    """The units of ``requests`` for layout ``name`` and the pages of ``gb`` GB."""
    layout = shipped_layout(name)
    max_len = replay_max_model_len(layout, requests, None)
    plan = plan_replay(layout, SimOptions(memory_bytes=gb * 10**9), max_len)
    groups = plan.kv_cache_config.kv_cache_groups
    specs = [g.kv_cache_spec for g in groups]
    kinds = {type(s) for s in specs}
    if not kinds <= {FullAttentionSpec, MambaSpec} or len({s.block_size for s in specs}) != 1:
        raise ValueError(f"{name}: only full attention + Mamba with one block size is modeled")
    kv = sum(type(s) is FullAttentionSpec for s in specs)
    units = build_units(requests, specs[0].block_size, kv, len(specs) - kv)
    return units, plan.kv_cache_config.num_blocks


def sequential_row(units: Units, gb: int, pages: int, iterations: int) -> dict[str, float]:
    """The sequential model's figures at ``pages`` (percent of prompt tokens)."""
    pct = 100.0 / units.prompt_tokens
    t = time.perf_counter()
    _, best, _ = dual_bound(DualProblem(units, pages), iterations=iterations)
    row = {
        "gb": gb,
        "pages": pages,
        "unlimited": units.unlimited_hits() * pct,
        "bound": min(best.bound, units.unlimited_hits()) * pct,
        "belady": planned_replay(units, pages, units.reach, per_byte=False) * pct,
        "belady_per_byte": planned_replay(units, pages, units.reach, per_byte=True) * pct,
        "dual_plan": planned_replay(units, pages, best.depth, per_byte=False) * pct,
        "lru": lru_replay(units, pages) * pct,
        "peak_pages": float(DualProblem(units, pages).usage(units.reach).max()),
    }
    row["seconds"] = time.perf_counter() - t
    return row


def sequential_table(rows: Sequence[dict[str, float]]) -> list[str]:
    out = [
        "| budget | pages | unlimited | **bound** | belady | belady per byte | dual's plan | lru "
        "| pages the unlimited plan holds (peak) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        out.append(
            f"| {r['gb']:.0f} GB | {r['pages']:,.0f} | {r['unlimited']:.2f} % "
            f"| **{r['bound']:.2f} %** | {r['belady']:.2f} % | {r['belady_per_byte']:.2f} % "
            f"| {r['dual_plan']:.2f} % | {r['lru']:.2f} % | {r['peak_pages']:,.0f} |"
        )
    return out


def loss_by_gap(
    requests: Sequence[TraceRequest],
    units: Units,
    oracle: dict[int, int],
    other: dict[int, int],
) -> list[str]:
    """Tokens ``oracle`` hits beyond ``other``, by how long ago the request's reached
    prefix was last in a prompt (``units.prev`` of its last reached block), in prompt
    tokens of the requests between (what an LRU stack pushes over it)."""
    total = units.prompt_tokens
    tokens = np.cumsum([0] + [r.input_length for r in requests])
    edges = (*GAP_EDGES_TOKENS, float("inf"))
    rows = np.zeros((len(edges), 4))  # reach, requests losing, lost, won back
    for r in range(len(requests)):
        d = int(units.reach[r])
        if not d:
            continue
        prev = int(units.prev[units.start[r] + d - 1])
        b = next(i for i, e in enumerate(edges) if tokens[r] - tokens[prev + 1] < e)
        diff = oracle.get(r, 0) - other.get(r, 0)
        rows[b] += (d * units.bs, diff > 0, max(diff, 0), max(-diff, 0))
    out = [
        "| prompt tokens since the prefix was last in a prompt | reach (points) "
        "| requests losing | points lost | points won back |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    lo = 0.0
    for i, e in enumerate(edges):
        label = f">= {lo / 1e6:.0f}M" if e == float("inf") else f"{lo / 1e6:.0f}-{e / 1e6:.0f}M"
        out.append(
            f"| {label} | {100 * rows[i, 0] / total:.2f} | {rows[i, 1]:,.0f} "
            f"| {100 * rows[i, 2] / total:.2f} | {100 * rows[i, 3] / total:.2f} |"
        )
        lo = e
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--requests", type=int, help="the first N requests (default: all)")
    ap.add_argument("--layout", default="jamba-v0.1")
    ap.add_argument("--memory", default="200,360", help="budgets in GB (10^9 bytes)")
    ap.add_argument("--iterations", type=int, default=100, help="dual subgradient steps")
    ap.add_argument("--sim", action="store_true", help="also the oracle and hybrid in the sim")
    args = ap.parse_args(argv)
    requests = load_trace(args.trace, limit=args.requests)
    budgets = [int(m) for m in args.memory.split(",")]
    print(f"Machine: {machine()}. {len(requests):,} requests of {Path(args.trace).name}.")
    rows = []
    units = None
    for gb in budgets:
        units, pages = layout_units(args.layout, requests, gb)
        rows.append(sequential_row(units, gb, pages, args.iterations))
        print(sequential_table(rows[-1:])[-1], f"({rows[-1]['seconds']:.0f} s)", flush=True)
    print("\n".join(["", "Sequential model:", *sequential_table(rows)]), flush=True)
    if not args.sim or units is None:
        return 0
    layout = shipped_layout(args.layout)
    hashes = sim_hashes(requests, units.bs)
    depth = reach(requests, hashes, units.bs)
    if depth != units.reach.tolist():
        raise AssertionError("the simulator's hashes and the model's keys disagree on reach")
    needs = plan_needs(hashes, depth)
    del hashes
    for gb in budgets:
        oracle: dict[int, int] = {}
        hyb: dict[int, int] = {}
        t = time.perf_counter()
        res = oracle_replay(layout, requests, gb * 10**9, needs, oracle)
        opts = SimOptions(memory_bytes=gb * 10**9, policy="hybrid")
        ref = hooked_replay(layout, requests, opts, hooked_manager(hyb))
        print(
            f"\n{gb} GB in the simulator: oracle {100 * res.token_hit_rate:.2f} %, hybrid "
            f"{100 * ref.token_hit_rate:.2f} % ({time.perf_counter() - t:.0f} s)",
            flush=True,
        )
        print("\n".join(loss_by_gap(requests, units, oracle, hyb)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
