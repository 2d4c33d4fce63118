"""What an attached but idle tier costs the scheduler and the manager (issue 45's
"no regression" target: at most 1.1x).

The engine's real ``Scheduler`` and ``KVCacheManager`` are driven with a null model
(each step's sampled token made up) over ``multi_round_qa.py``'s workload, with
short documents so that every prompt fits the tiny layouts' context. The device
pool holds everything, so nothing is ever demoted or loaded: the tier is attached
and idle. Without a tier and with one (``TieredCache`` over a host
tier, the engine's ``SlabMemory``), alternating in one process, ``--rounds``
times: the median time of each and their ratio, in wall time and in the
scheduler thread's CPU time. The tier's cost is its ``prepare`` before each
admission (one set test per group, ``tiers_may_hold``, while no tier holds a
block of the prompt; else the cross-tier lookup) and the pool's ``on_take`` hook.

    python benchmarks/bench_tier_idle.py [--layouts tiny-jamba] [--write]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from machine_info import cpu_features, machine
from multi_round_qa import multi_round_qa

from hybridkv import KVCacheManager
from hybridkv.engine.engine_request import EngineRequest
from hybridkv.engine.sampling_params import SamplingParams
from hybridkv.engine.scheduler import Scheduler
from hybridkv.layouts import shipped_layout
from hybridkv.offload import BlockBytes, TieredCache
from hybridkv.planning import allocate_kv_cache, plan_kv_cache
from hybridkv.tiers import HostTier, ModelFingerprint, UnitKey
from hybridkv.tiers.slab_memory import SlabMemory

OUT = Path(__file__).resolve().parent / "results" / "tier-idle.md"
MAX_LEN = 16384


def replay(
    layout: str, prompts: list[list[int]], tier: bool, policy: str, warm: int = 0
) -> tuple[float, float, int]:
    """Wall seconds and this thread's CPU seconds to run every prompt to 4 output
    tokens, and the tier hits (must be 0).
    ``warm``: units of other prompts put in the host tier first (a tier that holds
    entries, none of them a hit)."""
    plan = plan_kv_cache(
        shipped_layout(layout), 1 << 30, max_model_len=MAX_LEN, max_num_batched_tokens=2048
    )
    config = plan.kv_cache_config
    kv = KVCacheManager(config, MAX_LEN, cache_policy=policy)
    tiers = None
    if tier:
        fp = ModelFingerprint.from_kv_cache_config(config, "bench")
        block_bytes = BlockBytes(config, allocate_kv_cache(config))
        host = HostTier(fp, 1 << 30, SlabMemory(block_bytes.widths, 1 << 30))  # as the engine's
        tiers = TieredCache(kv, block_bytes, host)
        groups = len(config.kv_cache_groups)
        items = [
            (UnitKey(i.to_bytes(32, "big"), i % groups), block_bytes.parts(i % groups, 1), 1.0)
            for i in range(warm)
        ]
        for t in host.store_many(items):
            assert t.wait()
    sched = Scheduler(kv, max_num_seqs=32, max_num_batched_tokens=2048, tiers=tiers)
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    start, cpu = time.perf_counter(), time.thread_time()
    for i, p in enumerate(prompts):
        sched.add_request(EngineRequest(str(i), p, params, max_model_len=MAX_LEN))
    token = 1 << 20
    while sched.has_unfinished():
        out = sched.schedule()
        sampled = {}
        for s in out.scheduled:
            if s.start + s.num_tokens == s.request.num_tokens:
                token += 1
                sampled[s.request.request_id] = token
        sched.update(out, sampled, 0.0)
    seconds, cpu = time.perf_counter() - start, time.thread_time() - cpu
    hits = 0
    if tiers is not None:
        hits = tiers.stats.hits
        assert tiers.stats.demoted == 0, "the pool demoted: the tier was not idle"
        tiers.close()
    return seconds, cpu, hits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layouts", default="tiny-gemma3,tiny-jamba,tiny-llama4")
    ap.add_argument("--policy", default="hybrid")
    ap.add_argument("--users", type=int, default=32)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warm", type=int, default=4096, help="units in the warm tier")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    prompts = [
        r.prompt_token_ids()
        for r in multi_round_qa(
            args.users, args.requests, system_tokens=512, doc_tokens=(512, 1024)
        )
    ]
    rows = []
    for layout in args.layouts.split(","):
        replay(layout, prompts[:8], True, args.policy)  # warm-up (imports, allocations)
        base: list[tuple[float, float]] = []
        empty: list[tuple[float, float]] = []
        warm: list[tuple[float, float]] = []
        for _ in range(args.rounds):
            base.append(replay(layout, prompts, False, args.policy)[:2])
            for out, units in ((empty, 0), (warm, args.warm)):
                seconds, cpu, hits = replay(layout, prompts, True, args.policy, units)
                assert hits == 0
                out.append((seconds, cpu))
        for clock, k in (("wall", 0), ("CPU", 1)):
            b = statistics.median(x[k] for x in base)
            cells = [clock, f"{b * 1e3:.0f}"]
            for runs in (empty, warm):
                ratios = [y[k] / x[k] for x, y in zip(base, runs, strict=True)]
                t = statistics.median(y[k] for y in runs)
                cells.append(f"{t * 1e3:.0f} | {t / b:.3f}x ({min(ratios):.3f}-{max(ratios):.3f})")
            rows.append(f"| {layout} | " + " | ".join(cells) + " |")
            print(rows[-1], flush=True)
    text = "\n".join(
        [
            "# An attached, idle tier: scheduler + manager time (`benchmarks/bench_tier_idle.py`)",
            "",
            f"{machine()}; {cpu_features()}; policy `{args.policy}`; {len(prompts)} prompts "
            f"(`multi_round_qa.py`: {args.users} users, a 512-token system prompt, "
            "documents of 512-1,024 tokens), 4 output tokens each, null model; the device "
            "pool holds everything (no demotion, no load). Medians of "
            f"{args.rounds} alternating rounds in one process; the range of the per-round "
            "ratios in brackets. Two clocks: wall time, and the CPU time of the thread "
            "that runs the scheduler (`time.thread_time`: what the work costs, without "
            "the waits for a core on a shared machine). Target (issue 45): at most 1.1x.",
            "",
            "| layout | clock | no tier (ms) | empty host tier (ms) | ratio | host tier "
            f"holding {args.warm} other units (ms) | ratio |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
            *rows,
            "",
        ]
    )
    if args.write:
        OUT.write_text(text)
        print(f"wrote {OUT}")


if __name__ == "__main__":
    sys.exit(main())
