#!/usr/bin/env python3
"""Would a release plan kept as each request grows make ``free`` under ``hybrid`` cheap?

Issue 43 asks for ``free`` no slower than vLLM's; under ``hybrid`` it is 2.5-3.7x
with a window or a Mamba group, half of it the release plan (``FinalPoints`` and
``release_hybrid``). The idea tried here: keep the plan per request while it runs
(its pieces by unit and kind, the kept points, the unit values, the interleave
order), so that ``free`` only hands precomputed runs to the pool. Replays the
shared harness's workload (``bench_manager.py``'s: 2,000 requests on 8 shared
prefixes, ``hybrid`` policy) and measures, per config:

- *best case*: ``free``'s thread CPU time per call with the plan taken out of the
  timed region, as if kept for nothing (``FinalPoints`` and ``release_hybrid``
  still run, wrapped, and their time is subtracted), next to the whole ``free``
  and ``lru``'s ``free`` in the same process;
- *what could be kept*: at one free, in a warm loop, the whole plan against its
  part that reads no ref count (the points, each table's spans);
- *what moves before the free*: between a request's last ``allocate_slots`` and
  its ``free``, how often the plan's inputs change: the ranges only it holds
  (ref counts: other requests hit or free its blocks), ``E`` (the end of what it
  cached), the tail's grid (``tail_alignment``) and the return grade
  (``ContinuationRates``), all global or set by others;
- how often ``E`` moves after admission (each move would re-plan a kept plan).

Needs the shared harness (``../shared/bench/vllm_baseline``), not vLLM.

    .venv/bin/python research/free_plan.py [--requests 2000] [--configs hybrid hybrid_mamba]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
import timeit
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
HARNESS = ROOT.parent / "shared" / "bench" / "vllm_baseline"
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks"), str(HARNESS)]

from hybridkv_adapter import HybridkvAdapter, make_config  # noqa: E402

import hybridkv.policy.hybrid as hybrid_policy  # noqa: E402

clock = time.thread_time_ns


def replay(kind: str, policy: str, requests: int, hooks: Any = None) -> HybridkvAdapter:
    """The harness's workload through our manager under ``policy``; ``hooks(adapter)``
    wraps what it measures before the replay."""
    import bench_vllm  # the shared harness

    a = bench_vllm.parse_args(["--requests", str(requests)])
    adapter = HybridkvAdapter(make_config(kind, a.block_size, a.num_blocks, a.window), a, policy)
    if hooks is not None:
        hooks(adapter)
    gc.disable()
    try:
        bench_vllm.replay(adapter, bench_vllm.make_workload(a), a)
    finally:
        gc.enable()
    return adapter


def best_case(kind: str, requests: int) -> dict[str, float]:
    """Median thread CPU per ``free`` (us): whole, without the plan, and ``lru``'s."""
    plan_ns = [0]
    whole: list[int] = []
    rest: list[int] = []
    lru: list[int] = []
    saved = hybrid_policy.release_hybrid, hybrid_policy.FinalPoints

    def timed(f: Any) -> Any:
        def run(*args: Any, **kw: Any) -> Any:
            t0 = clock()
            out = f(*args, **kw)
            plan_ns[0] += clock() - t0
            return out

        return run

    def time_free(into: list[int], excluded: bool) -> Any:
        def hooks(adapter: HybridkvAdapter) -> None:
            kv = adapter.kv
            free = kv.free

            def timed_free(req: Any) -> bool:
                plan_ns[0] = 0
                t0 = clock()
                out = free(req)
                d = clock() - t0
                into.append(d)
                if excluded:
                    rest.append(d - plan_ns[0])
                return out

            kv.free = timed_free  # type: ignore[method-assign]

        return hooks

    hybrid_policy.release_hybrid = timed(saved[0])  # type: ignore[assignment]
    hybrid_policy.FinalPoints = timed(saved[1])  # type: ignore[assignment,misc]
    try:
        replay(kind, "hybrid", requests, time_free(whole, True))
    finally:
        hybrid_policy.release_hybrid, hybrid_policy.FinalPoints = saved  # type: ignore[misc]
    replay(kind, "lru", requests, time_free(lru, False))
    return {
        "free": statistics.median(whole) / 1e3,
        "without plan": statistics.median(rest) / 1e3,
        "lru free": statistics.median(lru) / 1e3,
    }


def what_could_be_kept(kind: str, requests: int, repeat: int = 2000) -> dict[str, float]:
    """At the middle request's free, warm-loop times (us, best of 5) of the whole plan
    (``FinalPoints`` and ``release_hybrid``) and of its part a kept plan could hold:
    what needs no ref count (the points, each table's spans and where a tail point's
    own state ends)."""
    out: dict[str, float] = {}
    seen = [0]

    def hooks(adapter: HybridkvAdapter) -> None:
        pol = adapter.kv.policy
        release = pol.release

        def timed_release(rid: str, tables: Any, hashes: Any, num_tokens: Any) -> Any:
            seen[0] += 1
            if seen[0] == requests // 2:
                managers, states = zip(*tables, strict=True)
                p: Any = pol
                end = min(st.num_cached * m.block_size for m, st in tables)
                end -= end % p.step

                def points() -> Any:
                    return hybrid_policy.FinalPoints(
                        states[0].kept, end, p.tail, p.step, p.tail_alignment.align,
                        p.free_point_period, num_tokens,
                    )  # fmt: skip

                def static() -> list[Any]:
                    pts = points()
                    kept = []
                    for m, st, local in zip(managers, states, p.point_local, strict=True):
                        first = m.first_needed_block if m.has_skips else None
                        own = first(pts.end if local else pts.top) if first else 0
                        spans = pts.spans(first, m.block_size, st.num_skipped, len(st.blocks))
                        kept.append((spans, own))
                    return kept

                def plan() -> Any:
                    return hybrid_policy.release_hybrid(
                        managers, states, points(), p.point_local, 1.0, p._ranks_by_value,
                        p.options.tuning.charge_tail_pages,
                    )  # fmt: skip

                for name, f in (("plan", plan), ("no ref counts", static)):
                    best = min(timeit.repeat(f, number=repeat, repeat=5))
                    out[name] = best / repeat * 1e6
            return release(rid, tables, hashes, num_tokens)

        pol.release = timed_release  # type: ignore[method-assign]

    replay(kind, "hybrid", requests, hooks)
    return out


def what_moves(kind: str, requests: int) -> tuple[Counter[str], Counter[int], int]:
    """Per freed request, the plan inputs that changed since its last
    ``allocate_slots``; how many times its ``E`` moved after admission; frees seen."""
    changed: Counter[str] = Counter()
    moves: Counter[int] = Counter()
    frees = [0]

    def hooks(adapter: HybridkvAdapter) -> None:
        kv = adapter.kv
        co, pol = kv.coordinator, kv.policy
        last: dict[str, dict[str, Any]] = {}
        e_moves: Counter[str] = Counter()

        def inputs(rid: str) -> dict[str, Any]:
            sts = [m.states[rid] for m in co.managers]
            rates = getattr(pol, "rates", None)
            pairs = zip(co.managers, sts, strict=True)
            return {
                "E": min(st.num_cached * m.block_size for m, st in pairs),
                "grid": pol.tail_alignment.align,  # type: ignore[attr-defined]
                "grade": None if rates is None else rates.grade(),
                "held": tuple(
                    bytes(b.ref_cnt == 1 for b in st.blocks[st.num_skipped :]) for st in sts
                ),
            }

        allocate, free = kv.allocate_slots, kv.free

        def on_allocate(req: Any, *args: Any, **kw: Any) -> Any:
            out = allocate(req, *args, **kw)
            rid = req.request_id
            if out is not None:
                now = inputs(rid)
                if rid in last and now["E"] != last[rid]["E"]:
                    e_moves[rid] += 1
                last[rid] = now
            return out

        def on_free(req: Any) -> bool:
            rid = req.request_id
            if rid in last and co.has_request(rid):
                frees[0] += 1
                now, before = inputs(rid), last.pop(rid)
                diff = [k for k in now if now[k] != before[k]]
                changed.update(diff or ["nothing"])
                moves[e_moves.pop(rid, 0)] += 1
            return free(req)

        kv.allocate_slots = on_allocate  # type: ignore[method-assign]
        kv.free = on_free  # type: ignore[method-assign]

    replay(kind, "hybrid", requests, hooks)
    return changed, moves, frees[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--configs", nargs="+", default=["hybrid", "hybrid_mamba"])
    args = p.parse_args()
    if not (HARNESS / "bench_vllm.py").exists():
        sys.exit(f"replay harness not found at {HARNESS}")
    for kind in args.configs:
        t = best_case(kind, args.requests)
        print(
            f"{kind}: free {t['free']:.1f} us per call, without the plan {t['without plan']:.1f}"
            f" us (best case of a kept plan), lru's free {t['lru free']:.1f} us"
        )
        w = what_could_be_kept(kind, args.requests)
        print(f"{kind}: warm, at one free: the plan {w['plan']:.1f} us, of which needs no ref"
              f" count {w['no ref counts']:.1f} us (what a kept plan could hold)")  # fmt: skip
        changed, moves, frees = what_moves(kind, args.requests)
        what = ", ".join(f"{k} {n}" for k, n in sorted(changed.items()))
        print(f"{kind}: plan inputs changed since the last allocate_slots, of {frees} frees:", what)
        what = ", ".join(f"{k} times: {n} requests" for k, n in sorted(moves.items()))
        print(f"{kind}: E moves after admission: {what}")


if __name__ == "__main__":
    main()
