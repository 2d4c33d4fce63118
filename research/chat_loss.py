#!/usr/bin/env python3
"""Where the ``hybrid`` policy loses hits on the chat workload (``multiturn.py``).

A diagnostic for issue 43's open question: on ``benchmarks/multiturn.py`` the
returning-prompt bonus costs hit rate in every cell, and on Llama 4 Scout at
64 GB ``hybrid`` loses to ``lru``. For each run (a policy and a ``--tuning``
text) it replays the workload one request at a time (``replay_trace``, as the
ablation does) and records:

- per request: its client and turn (from the workload: a turn's prompt
  starts with the client's previous prompt), its *ceiling* (the previous
  turn's prompt length: nothing else is shared), the tokens it hit, the
  requests since its client's previous turn (the gap), and whether the
  detector (``SeenPrefixes``) called it returning;
- every ``--every`` requests, a census of the cached blocks: per kind (full
  attention, other), whether the block's client is *dead* (sends nothing
  more), and for a non-full block whether it is *stale* (more than
  ``STALE_TOKENS`` below its client's last prompt end and not read by a hit
  there: the next turn resumes past it), and the share of cached blocks in
  each class;
- per request, where its lost tokens went (``chat_loss_why``): the first block
  missing, by kind, value class and age at its eviction; with an ``lru`` run,
  the tokens each other run loses to it, request by request.

The hits come from ``KVCacheManager.record_prefix_cache_stats`` (called once
per admitted request with its hit), and the admissions from the manager's
``admitted`` (the policy's ``admit``), both wrapped for the run and restored after.

    python research/chat_loss.py --layout bamba-9b --gb 8 \\
        --run hybrid= --run hybrid=learn_returning=off --run lru=
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from chat_loss_why import Attribution, Evictions, compare, report_why  # noqa: E402
from multiturn import multiturn  # noqa: E402

import hybridkv.cache_manager.kv_cache_manager as kvm  # noqa: E402
from hybridkv.cache_manager.kv_cache_manager import KVCacheManager  # noqa: E402
from hybridkv.layouts import shipped_layout  # noqa: E402
from hybridkv.sim import (  # noqa: E402
    CostModel,
    SimOptions,
    active_params_for,
    device_profile,
    replay_trace,
)
from hybridkv.sim.trace import TraceRequest  # noqa: E402

#: A non-full block this far below its client's last prompt end is stale.
STALE_TOKENS = 1024
#: Gap bins (requests since the client's previous turn).
GAP_BINS = (32, 64, 128, 256, 10**9)


@dataclass
class Workload:
    """The requests and what the generator knows about them."""

    requests: list[TraceRequest]
    client: list[int]
    turn: list[int]
    ceiling: list[int]  # tokens an unlimited cache hits (the previous turn's prompt)
    gap: list[int]  # requests since the client's previous turn (0: first turn)
    last_index: dict[int, int]  # client -> index of its last request


def workload(n: int) -> Workload:
    reqs = multiturn(requests=n, seed=0)
    by_head: dict[tuple[int, ...], int] = {}
    client, turn, ceiling, gap = [], [], [], []
    last_len: dict[int, int] = {}
    last_at: dict[int, int] = {}
    turns: Counter[int] = Counter()
    for i, r in enumerate(reqs):
        p = r.prompt
        assert p is not None
        head = tuple(p[:16])
        c = by_head.setdefault(head, len(by_head))
        if c in last_len:
            assert len(p) > last_len[c]
        client.append(c)
        turns[c] += 1
        turn.append(turns[c])
        ceiling.append(last_len.get(c, 0))
        gap.append(i - last_at[c] if c in last_at else 0)
        last_len[c] = len(p)
        last_at[c] = i
    return Workload(reqs, client, turn, ceiling, gap, dict(last_at))


@dataclass
class Run:
    hits: list[int] = field(default_factory=list)
    returning: list[int] = field(default_factory=list)
    census: Counter[str] = field(default_factory=Counter)
    census_classes: dict[str, Counter[int | None]] = field(
        default_factory=lambda: defaultdict(Counter)
    )
    rate: float = 0.0
    grades: list[float] = field(default_factory=list)
    rates: tuple[float | None, float | None] = (None, None)
    why: Attribution = field(default_factory=Attribution)
    evictions: Evictions | None = None


def replay(
    layout_name: str, gb: int, policy: str, tuning: str | None, wl: Workload, every: int
) -> Run:
    layout = shipped_layout(layout_name)
    cost = CostModel.from_layout(layout, device_profile("h100"), active_params_for(layout.name))
    reqs = wl.requests
    options = SimOptions(
        memory_bytes=gb * 10**9,
        policy=policy,
        max_num_seqs=1,
        arrivals="closed",
        tuning=tuning or None,
        max_model_len=max(r.num_tokens for r in reqs),
    )
    run = Run()
    hashes: dict[int, list[bytes]] = {}
    owner: list[dict[bytes, tuple[int, int]]] = []
    done = [0]
    last_prompt: dict[int, int] = {}

    original = KVCacheManager.record_prefix_cache_stats
    original_admitted = kvm.admitted
    now = [0]
    seen_manager: list[KVCacheManager] = []

    def admitted(policy: Any, adm: Any, request: Any) -> None:
        i = now[0]
        if seen_manager and wl.ceiling[i]:
            manager = seen_manager[0]
            managers = manager.coordinator.managers
            assert run.evictions is not None
            run.why.admit(
                adm.hit,
                adm.branch,
                wl.ceiling[i],
                [m.group_hashes(hashes[i]) for m in managers],
                managers,
                manager.block_pool,
                run.evictions,
                next(g for g, m in enumerate(managers) if m.prefix_closed),
            )
        else:
            run.why.admit(0, 0, 0, [], [], None, run.evictions, 0)  # type: ignore[arg-type]
        now[0] += 1
        original_admitted(policy, adm, request)

    def record(self: KVCacheManager, request: object, num_hits: int) -> None:
        run.hits.append(num_hits)
        original(self, request, num_hits)  # type: ignore[arg-type]

    def on_finished(manager: KVCacheManager, n: int) -> None:
        coord = manager.coordinator
        managers = coord.managers
        if not owner:  # the first call: index every block hash of the workload
            seen_manager.append(manager)
            run.evictions = Evictions(manager.block_pool, now)
            run.evictions.install()
            for _ in managers:
                owner.append({})
            for i, r in enumerate(reqs):
                assert r.prompt is not None
                h = manager.hasher.hash_tokens(list(r.prompt))
                hashes[i] = h
                for gid, m in enumerate(managers):
                    for j, gh in enumerate(m.group_hashes(h)):
                        owner[gid].setdefault(gh, (wl.client[i], (j + 1) * m.block_size))
        for _ in range(n):
            i = done[0]
            last_prompt[wl.client[i]] = reqs[i].num_tokens
            done[0] += 1
        k = done[0]
        policy_obj = coord.policy
        seen = getattr(policy_obj, "seen", None)
        if k < len(reqs):  # the detector's answer for the next request (admitted next)
            if seen is None:
                run.returning.append(0)
            else:
                fg = policy_obj.full_gid
                m = managers[fg]
                run.returning.append(
                    seen.returning(m.group_hashes(hashes[k]), m.block_size, reqs[k].num_tokens)
                )
        if k % every:
            return
        measured = getattr(policy_obj, "rates", None)
        if measured is not None:
            run.grades.append(measured.grade())
            run.rates = (measured.rate(True), measured.rate(False))
        pool = manager.block_pool
        for gid, index in enumerate(pool.cached):
            kind = "full" if managers[gid].prefix_closed else "other"
            for h, block in index.items():
                c, end = owner[gid].get(h, (-1, 0))
                if c < 0:
                    cls = "output"
                elif wl.last_index[c] < k:
                    cls = "dead"
                elif kind == "other" and _stale(managers[gid], end, last_prompt.get(c, 0)):
                    cls = "stale"
                else:
                    cls = "live"
                key = f"{kind}:{cls}"
                run.census[key] += 1
                run.census_classes[key][block.free_class] += 1

    KVCacheManager.record_prefix_cache_stats = record  # type: ignore[method-assign]
    kvm.admitted = admitted
    try:
        run.rate = replay_trace(layout, reqs, options, cost, on_finished=on_finished).token_hit_rate
    finally:
        KVCacheManager.record_prefix_cache_stats = original  # type: ignore[method-assign]
        kvm.admitted = original_admitted
    assert len(run.hits) == len(reqs), (len(run.hits), len(reqs))
    return run


def _stale(m: Any, end: int, last: int) -> bool:
    """A non-full block ending at ``end`` is stale: more than ``STALE_TOKENS``
    below its client's last prompt end ``last``, and not needed by a hit there
    (a chunk's blocks are, back to the chunk's start)."""
    return end < last - STALE_TOKENS and end // m.block_size <= m.first_needed_block(last)


def gap_bin(g: int) -> str:
    lo = 0
    for hi in GAP_BINS:
        if g < hi:
            return f"{lo}-{hi}" if hi < 10**9 else f">={lo}"
        lo = hi
    raise AssertionError


def report(name: str, run: Run, wl: Workload) -> None:
    n = len(wl.requests)
    total_prompt = sum(r.num_tokens for r in wl.requests)
    print(f"\n## {name}: token hit rate {100 * run.rate:.2f} %")
    # Losses against the ceiling, by the previous turn's class.
    by: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])  # ceiling, hit, requests
    for i in range(n):
        if not wl.ceiling[i]:
            continue
        prev_turn = "prev turn 1" if wl.turn[i] == 2 else "prev turn >=2"
        for key in (
            prev_turn,
            f"gap {gap_bin(wl.gap[i])}",
            f"{prev_turn}, gap {gap_bin(wl.gap[i])}",
        ):
            row = by[key]
            row[0] += wl.ceiling[i]
            row[1] += run.hits[i]
            row[2] += 1
    print("| class | requests | ceiling Mtok | hit Mtok | lost Mtok | hit/ceiling |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for key in sorted(by):
        c, h, k = by[key]
        print(
            f"| {key} | {k} | {c / 1e6:.3f} | {h / 1e6:.3f} | {(c - h) / 1e6:.3f} "
            f"| {h / max(1, c):.3f} |"
        )
    ceiling = sum(wl.ceiling)
    print(f"ceiling {100 * ceiling / total_prompt:.2f} % of prompt tokens")
    if any(run.returning):
        ret = Counter()
        for i in range(1, n):
            r = bool(run.returning[i - 1])
            ret[(r, wl.turn[i] > 1)] += 1
        print(f"detector (returning, is a later turn): {dict(ret)}")
        cont = Counter()
        for i in range(n):
            r = bool(run.returning[i - 1]) if i else False
            cont[(r, wl.last_index[wl.client[i]] > i)] += 1
        print(f"detector (returning, continued): {dict(cont)}")
    if run.grades:
        g = run.grades
        print(
            f"bonus share: mean {sum(g) / len(g):.2f}, min {min(g):.2f}, max {max(g):.2f}; "
            f"last rates (returning, first): {run.rates}"
        )
    if run.evictions is not None and run.why.lost:
        report_why(run.why, run.evictions)
    tot = sum(run.census.values())
    print("census (share of cached blocks over the samples; value classes):")
    for key in sorted(run.census):
        cls = run.census_classes[key]
        top = ", ".join(
            f"{c}:{v / run.census[key]:.2f}"
            for c, v in sorted(cls.items(), key=lambda x: -x[1])[:4]
        )
        print(f"  {key}: {run.census[key] / tot:.3f}  [{top}]")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layout", default="bamba-9b")
    ap.add_argument("--gb", type=int, default=8)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--every", type=int, default=50, help="requests between two censuses")
    ap.add_argument(
        "--run", action="append", default=[], help="POLICY=TUNING (TUNING may be empty)"
    )
    args = ap.parse_args(argv)
    wl = workload(args.requests)
    print(
        f"{args.layout} {args.gb} GB, multiturn {args.requests} requests, "
        f"{len(wl.last_index)} clients"
    )
    runs: dict[str, Run] = {}
    for spec in args.run or ["hybrid=", "hybrid=learn_returning=off", "lru="]:
        policy, _, tuning = spec.partition("=")
        run = runs[spec] = replay(args.layout, args.gb, policy, tuning or None, wl, args.every)
        report(spec, run, wl)
    ref = next((spec for spec in runs if spec.startswith("lru")), None)
    for spec, run in runs.items():
        if ref is not None and spec != ref and run.why.lost:
            compare(spec, run.why, run.hits, ref, runs[ref].hits)


if __name__ == "__main__":
    main()
