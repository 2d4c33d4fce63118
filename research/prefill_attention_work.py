#!/usr/bin/env python3
"""Prefill and mixed-batch attention: how the launch's programs fill the GPU over time
(issue 47: 1 x 2k at 1.52x flash SDPA and the long mixed batch at 1.66x on the
2026-11-28 H100 lease; target 1.5x), without a GPU.

Per shape, the launch as the launcher plans it (``plan_launch``, the real rules, 32
query / 8 KV heads of 128, bf16, an H100's 132 SMs): its programs in the order the GPU
dispatches them (grid axis 0, the q blocks, fastest; then KV heads; then segments), each
with the key tiles it walks (causal: a prefill q block sees the keys up to its last
query). The programs are list-scheduled onto ``132 x resident`` slots (a free slot takes
the next program; the hardware's block dispatch), a program taking ``FIXED + tiles``
tile-times. The **tail**: makespan over the work's lower bound, ``max(total / slots,
longest program)``, for the order launched now, for the q blocks longest first (KV heads
inner), and for a split of every program's keys in ``segments`` (the merge launch
aside). Its per-tile time is calibrated on the lease's measured call, so the other
orders' times are predictions; the ratio to SDPA follows. A model, not a measurement:
the next lease's ``tune`` times it (``tune_attention.py``: ``prefill 1 x 2k``, and
split-KV for the mixed batch).

    .venv/bin/python research/prefill_attention_work.py [--write]
"""

from __future__ import annotations

import argparse
import heapq
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE)]

from results_tables import emit  # noqa: E402

from hybridkv.kernels.attention import AttentionMetadata, AttentionOptions  # noqa: E402
from hybridkv.kernels.attention.launcher import plan_launch  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "prefill-attention-work.md"
HQ, HKV, HEAD, BLOCK = 32, 8, 128, 16
SMS = 132
#: Programs an SM holds, by rows per program (4 warps, tile_n 32): block_m 128 compiles to
#: 255 registers a thread for sm_90, block_m 64 (the mixed rule) to 168
#: (kernel-resources-sm90.md): 65,536 registers hold 2 and 3 programs of 128 threads.
RESIDENT = {128: 2, 64: 3}
#: A program's fixed part, in tile-times (launch, sequence search, q load, store): assumed.
FIXED = 1.0


@dataclass(frozen=True)
class Case:
    name: str
    lens: tuple[tuple[int, int], ...]  # (context, new tokens) per sequence
    ours_ms: float  # the lease's one call (kernels-nvidia-h100-2026-11-28.md)
    sdpa_ms: float


CASES = (
    Case("prefill 1 x 2k", ((0, 2048),), 0.278, 0.183),
    Case("prefill 4 x 2k", ((0, 2048),) * 4, 0.688, 0.489),
    Case("prefill 1 x 8k", ((0, 8192),), 2.440, 1.726),
    Case("mixed 512 on 30k + 16 x 32k", ((30000, 512),) + ((32767, 1),) * 16, 2.319, 1.398),
    Case("mixed 2k on 2k + 64 x 8k", ((2048, 2048),) + ((8191, 1),) * 64, 1.533, 1.253),
)


def programs(case: Case, segments: int | None = None) -> tuple[list[float], str, int]:
    """Each program's tiles in dispatch order (q blocks with no token: 0, placed last;
    they exit at once), the launch, and the programs an SM holds."""
    lens = list(case.lens)
    cols = max(-(-(c + n) // BLOCK) for c, n in lens)
    table = torch.zeros(len(lens), cols, dtype=torch.int32)
    meta = AttentionMetadata.build([n for _, n in lens], [c + n for c, n in lens], table)
    plan = plan_launch(meta, AttentionOptions(scale=HEAD**-0.5), HQ, HKV, HEAD, torch.bfloat16,
                       torch.device("cuda"), num_segments=segments, sms=SMS)  # fmt: skip
    c = plan.choice
    per_q: list[float] = []  # tiles of each q block, in q-block order
    for ctx, n in lens:
        blocks = -(-n // c.block_q)
        for j in range(blocks):
            last = ctx + min((j + 1) * c.block_q, n)  # keys up to the block's last query
            per_q.append(float(-(-last // c.tile_n)))
    per_q += [0.0] * (plan.grid[0] - len(per_q))  # q blocks with no token (exit at once)
    s = c.segments
    tiles = [-(-t // s) if t else 0.0 for t in per_q]
    order = [t for _seg in range(s) for _head in range(HKV) for t in tiles]
    what = f"grid {plan.grid}, block_m {c.block_m} ({c.block_q} tokens), tile_n {c.tile_n}"
    return order, what, RESIDENT[c.block_m]


def makespan(tiles: list[float], slots: int) -> float:
    """List scheduling in order onto ``slots``; a program takes ``duration(tiles)``."""
    free = [0.0] * slots
    for t in tiles:
        start = heapq.heappop(free)
        heapq.heappush(free, start + duration(t))
    return max(free)


def duration(tiles: float) -> float:
    return FIXED + tiles if tiles else 0.0


def bound(tiles: list[float], slots: int) -> float:
    work = [duration(t) for t in tiles]
    return max(sum(work) / slots, max(work))


def longest_first(tiles: list[float]) -> list[float]:
    """The same programs, the q blocks dispatched longest first, KV heads inner."""
    return sorted(tiles, reverse=True)


def report(overlap: bool) -> list[str]:
    """One table: every case's tails and predictions; ``overlap``: the programs an SM
    holds run side by side (latency-bound), else one at a time (its tensor cores)."""
    title = "programs an SM holds overlap (latency-bound)" if overlap else "one at a time"
    lines = [f"### Slots: {title}", "",
             "| shape | launch | programs | slots | tail now | tail longest first | "
             "tail split 4 | ours ms (lease) | / SDPA | longest first, predicted | "
             "split 4, predicted |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | "
             "---: | ---: | ---: |"]  # fmt: skip
    for case in CASES:
        now, what, resident = programs(case)
        split, _, _ = programs(case, 4)
        slots = SMS * (resident if overlap else 1)
        t_now, t_lpt = makespan(now, slots), makespan(longest_first(now), slots)
        t_split = makespan(split, slots)
        per = case.ours_ms / t_now  # ms per tile-time, calibrated on the lease
        lines.append(
            f"| {case.name} | {what} | {sum(1 for t in now if t):,} | {slots} | "
            f"{t_now / bound(now, slots):.2f} | {t_lpt / bound(now, slots):.2f} | "
            f"{t_split / bound(split, slots):.2f} | {case.ours_ms:.3f} | "
            f"{case.ours_ms / case.sdpa_ms:.2f}x | {t_lpt * per / case.sdpa_ms:.2f}x | "
            f"{t_split * per / case.sdpa_ms:.2f}x |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--write", action="store_true", help=f"write {RESULTS.relative_to(ROOT)}")
    args = ap.parse_args(argv)
    # Latency-bound programs overlap on an SM (2 slots each); throughput-bound ones share
    # its tensor cores (1 slot): the truth is between, so both.
    lines = [*report(overlap=True), "", *report(overlap=False)]
    emit(RESULTS, lines, args.write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
