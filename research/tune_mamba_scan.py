#!/usr/bin/env python3
"""Sweep the chunked Mamba2 scan's launch choices on a GPU (issue 16, part 3: the
chunked scan at least 10x faster than the sequential kernel at 4k tokens).

For Bamba 9B and Mamba2 2.7B heads (bf16 activations, fp32 states, final saves)
at 1 x 4,096 and 8 x 512 tokens, a staged sweep over ``ScanTiles``
(``kernels/mamba/scan_tiles.py``):

0. at the rule's precision (tf32x3, the accuracy the product keeps) first: chunks of
   128 and 256 in row and position blocks (``block_m``, ``block_k``), the state
   pass's ``pass_block``, ``shared_cb`` (issue 47: ``research/mamba_scan_bytes.py``
   puts chunk 256's floor at 1.4x mamba-ssm's, chunk 64's at 2.8x); reported apart,
   with its own host-cost and per-kernel rows, since the stages below may pick a
   faster choice that rounds the matmul inputs (tf32, bf16);
1. ``precision`` (ieee, tf32, tf32x3, bf16) x ``num_warps`` (4, 8), then the best
   of them with ``shared_cb`` (C B^T once per chunk and group, not per head);
2. ``chunk_size`` (32-256) x ``block_n`` (all of d_state, 64, 32) with the best of 1;
3. ``block_p`` x ``num_stages``, and 16 warps, with the best of 2; then the best
   of all with ``shared_cb`` flipped (its share of the work grows with the chunk).

Each candidate's output and states are first compared with the sequential
kernel's on the same inputs, as max |error| / max |value|; one over its
precision's tolerance (``TOL``) or that fails to compile is reported, not
timed. Times are medians of CUDA-event-timed calls after warm-up calls; the
sequential kernel is timed in the same process. The Mamba1 chunked scan's
``chunk_size`` is swept at 1 x 4,096 too (d_inner 8192, d_state 16).

Host cost: for the defaults and the best choice, the CUDA-event time next to
the host's time to issue the call (launches, ``chunk_layout``'s torch ops,
allocations; the GPU idle before each call). Where the two are close the call
is launch-bound and only fewer launches help.

Where the time goes: for the defaults and the best choice, each launched
kernel's mean device time per call (``torch.profiler``, CUDA activity only), to
tell which phase (chunk states, state passing, C B^T, chunk scan, or torch's
own ops) holds the gap to mamba-ssm.

Every compile counts: ``--budget`` seconds (120 by default) bounds the sweep;
candidates past it are counted as skipped. Expected: 1-2 minutes on an H200
(29 candidates per shape and case, 2 of them for ``shared_cb``).

    python3 research/tune_mamba_scan.py [--write] [--budget S]
        # --write: benchmarks/results/mamba-scan-tuning-<device>.md
    TRITON_INTERPRET=1 python3 research/tune_mamba_scan.py --smoke
        # tiny shapes and candidates under the interpreter: a check of the script
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks"), str(HERE)]

from bench_kernels import (  # noqa: E402
    MAMBA2_SHAPES,
    mamba1_prefill_inputs,
    mamba2_prefill_inputs,
)
from kernel_common import from_idle_seconds, timed  # noqa: E402

from hybridkv.kernels.mamba import (  # noqa: E402
    selective_chunk_scan_fn,
    selective_scan_fn,
    ssd_chunk_scan_fn,
    ssd_scan_fn,
)
from hybridkv.kernels.mamba.scan_tiles import PRECISIONS, ScanTiles  # noqa: E402
from hybridkv.kernels.mamba.ssd_chunk_scan import DEFAULT_CHUNK_SIZE  # noqa: E402
from hybridkv.kernels.mamba.ssd_chunk_scan_triton import RULE_PRECISION, shares_cb  # noqa: E402

# (outputs, states) tolerance per precision, as max |error| / max |sequential value|.
# Outputs are bf16 in both kernels, so one bf16 rounding (2^-8 ~ 4e-3 of a value)
# may separate them whatever the precision: 1e-2. fp32 states differ only by the
# summation order (ieee, tf32x3: 1e-4). tf32 rounds the matmul inputs to 2^-11 and
# bf16 to 2^-8 (the kernel tests measure ~1e-2 for bf16 against fp64): 2e-2 and 5e-2.
TOL = {"ieee": (1e-2, 1e-4), "tf32x3": (1e-2, 1e-4), "tf32": (2e-2, 2e-2), "bf16": (5e-2, 5e-2)}
MAMBA1_TOL = (1e-2, 1e-4)  # fp32 math (no matmuls): as ieee
CASES = ((1, 4096), (8, 512))
TINY_SHAPES = {"tiny": (2, 16, 1, 32)}  # heads, head_dim, groups, d_state (2 blocks of 16)
TINY_CASES = ((1, 40),)
MAMBA1 = (8192, 16, (1, 4096))  # d_inner, d_state, (seqs, tokens): Jamba
TINY_MAMBA1 = (8, 4, (1, 24))


@dataclass(frozen=True)
class Plan:
    """The candidate values of each stage, and how each candidate is timed."""

    precisions: tuple[str, ...]
    warps: tuple[int, ...]
    chunks: tuple[int, ...]
    blocks_n: tuple[int | None, ...]
    blocks_p: tuple[int | None, ...]
    stages: tuple[int | None, ...]
    more_warps: tuple[int, ...]  # stage 3: for chunks whose [Q, Q] tiles spill at 8 warps
    mamba1_chunks: tuple[int, ...]
    reps: int
    warmup: int
    # Try shared_cb with stage 1's best and flipped on the final best (2 candidates).
    # Off in the smoke plan, whose candidate count its test pins.
    shared_cb: bool = False
    # Stage 0: candidates at the rule's precision, tried first (see the module docstring).
    rule_stage: tuple[ScanTiles, ...] = ()


# Stage 0 on a GPU: chunk 128/256 at the rules, then one change each from chunk 256's
# rules (all but block_n 64 and block_p 32, 48 and 32 bytes, compile without local
# memory on sm_90 offline, research/kernel_resources.py), and chunk 64's candidates.
RULE_STAGE = (
    ScanTiles(chunk_size=128), ScanTiles(chunk_size=256),
    ScanTiles(chunk_size=256, block_n=64), ScanTiles(chunk_size=256, block_k=32),
    ScanTiles(chunk_size=256, block_m=128, num_warps=8), ScanTiles(chunk_size=256, block_p=32),
    ScanTiles(chunk_size=256, num_stages=2), ScanTiles(chunk_size=256, pass_block=2048),
    ScanTiles(chunk_size=256, shared_cb=False), ScanTiles(shared_cb=True),
    ScanTiles(pass_block=2048), ScanTiles(chunk_size=128, block_p=32),
    # chunk 64's three that compiled without local memory (docs/gpu.md, 2026-11-27)
    ScanTiles(shared_cb=True, num_stages=2),
    ScanTiles(block_n=64, num_warps=8, num_stages=2, shared_cb=True),
)  # fmt: skip


GPU_PLAN = Plan(PRECISIONS, (4, 8), (32, 64, 128, 256), (None, 64, 32), (None, 32), (None, 2, 3),
                (16,), (16, 32, 64), reps=10, warmup=2, shared_cb=True,
                rule_stage=RULE_STAGE)  # fmt: skip
SMOKE_PLAN = Plan(("ieee", "bf16"), (4,), (16, 32), (None, 16), (None, 16), (None, 1), (8,),
                  (2, 4), reps=1, warmup=0, shared_cb=True,
                  rule_stage=(ScanTiles(chunk_size=32, block_m=16, block_k=16),
                              ScanTiles(chunk_size=32, pass_block=64)))  # fmt: skip


class Deadline:
    """``expired()`` once ``seconds`` have passed since it was made (None: never)."""

    def __init__(self, seconds: float | None) -> None:
        self.end = None if seconds is None else time.monotonic() + seconds

    def expired(self) -> bool:
        return self.end is not None and time.monotonic() > self.end


@dataclass
class Result:
    tiles: ScanTiles
    seconds: float | None  # None: refused or skipped (why)
    err: tuple[float, float] | None = None  # (outputs, states) relative errors
    why: str = ""


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max |want| (0 where both are zero)."""
    scale = want.float().abs().max().item()
    return (got.float() - want.float()).abs().max().item() / (scale or 1.0)


def host_seconds(fn: Callable[[], object], device: torch.device, reps: int) -> float:
    """Median host time to issue ``fn`` (the GPU idle at each start, not waited for)."""
    return from_idle_seconds(fn, device, reps, until_done=False)


def kernel_totals(events: Sequence[object], calls: int) -> list[tuple[str, float]]:
    """``(kernel name, mean device seconds per call)``, costliest first, from a CUDA-only
    profile's ``key_averages()`` over ``calls`` calls (names cut at the first ``(``)."""
    totals: dict[str, float] = {}
    for e in events:
        us = getattr(e, "self_device_time_total", None)
        if us is None:  # torch before 2.4
            us = getattr(e, "self_cuda_time_total", 0.0)
        if us > 0:
            name = str(getattr(e, "key", "?")).split("(")[0].strip() or "?"
            totals[name] = totals.get(name, 0.0) + us * 1e-6 / calls
    return sorted(totals.items(), key=lambda kv: -kv[1])


def kernel_seconds(
    fn: Callable[[], object], device: torch.device, calls: int
) -> list[tuple[str, float]] | None:
    """``kernel_totals`` of ``calls`` calls of ``fn`` after one warm-up; None off CUDA."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize(device)
    return kernel_totals(prof.key_averages(), calls)


def stage1(plan: Plan) -> list[ScanTiles]:
    return [ScanTiles(precision=p, num_warps=w) for p in plan.precisions for w in plan.warps]


def stage2(best: ScanTiles, plan: Plan) -> list[ScanTiles]:
    return [replace(best, chunk_size=q, block_n=n) for q in plan.chunks for n in plan.blocks_n]


def stage3(best: ScanTiles, plan: Plan) -> list[ScanTiles]:
    out = [replace(best, block_p=b, num_stages=s) for b in plan.blocks_p for s in plan.stages]
    return out + [replace(best, num_warps=w) for w in plan.more_warps]


def flip_shared_cb(best: ScanTiles, plan: Plan) -> list[ScanTiles]:
    """``best`` with ``shared_cb`` on where it is off (by the rule or set), and off where
    it is on, if the plan tries it."""
    q = best.chunk_size or DEFAULT_CHUNK_SIZE
    want = not shares_cb(best, q)
    rule = shares_cb(replace(best, shared_cb=None), q)
    return [replace(best, shared_cb=None if want == rule else want)] if plan.shared_cb else []


def _ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e3:.3f}"


def _errs(r: Result) -> str:
    return "-" if r.err is None else f"{r.err[0]:.1e} / {r.err[1]:.1e}"


def sweep_shape(
    name: str, shape: tuple[int, int, int, int], seqs: int, length: int,
    device: torch.device, plan: Plan, deadline: Deadline,
) -> tuple[str, list[str], list[str], list[str], str]:  # fmt: skip
    """One shape's sweep: (summary row, one detail row per candidate, host-cost rows,
    per-kernel rows, the row of stage 0's best at the rule's precision)."""
    args, _ = mamba2_prefill_inputs(seqs, length, shape, None, device)
    state = args[9]
    seq_run = partial(ssd_scan_fn, *args, backend="triton")
    state.zero_()
    want_y, want_st = seq_run(), state.clone()
    t_seq = timed(seq_run, device, reps=max(1, plan.reps // 2), warmup=plan.warmup)

    def run(tiles: ScanTiles) -> torch.Tensor:
        return ssd_chunk_scan_fn(*args, backend="triton", tiles=tiles)

    seen: dict[ScanTiles, Result] = {}

    def measure(tiles: ScanTiles, always: bool = False) -> Result:
        if tiles in seen:
            return seen[tiles]
        if deadline.expired() and not always:
            seen[tiles] = Result(tiles, None, why="skipped: over the time budget")
            return seen[tiles]
        state.zero_()
        try:
            got = run(tiles)
        except Exception as e:  # a choice Triton cannot compile here: report it
            r = Result(tiles, None, why=f"{type(e).__name__}: {str(e)[:80]}")
        else:
            err = (rel_err(got, want_y), rel_err(state, want_st))
            tol = TOL[tiles.precision or RULE_PRECISION]
            if err[0] > tol[0] or err[1] > tol[1]:
                r = Result(tiles, None, err, f"over the tolerance {tol[0]:g} / {tol[1]:g}")
            else:
                r = Result(tiles, timed(partial(run, tiles), device, plan.reps, plan.warmup), err)
        seen[tiles] = r
        return r

    def best_of(results: list[Result], fallback: Result) -> Result:
        ok = [r for r in results if r.seconds is not None]
        return min(ok, key=lambda r: r.seconds or 0.0) if ok else fallback

    base = measure(ScanTiles(), always=True)  # past the budget too: every shape has its row
    rule = best_of([base, *(measure(t) for t in plan.rule_stage)], base)
    b1 = best_of([measure(t) for t in stage1(plan)], base)
    b1 = best_of([b1, *(measure(t) for t in flip_shared_cb(b1.tiles, plan))], b1)
    b2 = best_of([measure(t) for t in stage2(b1.tiles, plan)], b1)
    for t in stage3(b2.tiles, plan):
        measure(t)
    for t in flip_shared_cb(best_of(list(seen.values()), base).tiles, plan):
        measure(t)
    best = best_of(list(seen.values()), base)
    tried = list(seen.values())
    refused = [r for r in tried if r.seconds is None and not r.why.startswith("skipped")]
    skipped = [r for r in tried if r.why.startswith("skipped")]
    what = f"| {name} | {seqs} x {length:,} |"
    speed = (
        f"{t_seq / best.seconds:.1f}x | {base.seconds / best.seconds:.1f}x"
        if best.seconds and base.seconds
        else "- | -"
    )
    row = (f"{what} {_ms(t_seq)} | {_ms(base.seconds)} | {best.tiles.describe()} | "
           f"{_ms(best.seconds)} | {speed} | {_errs(best)} | {len(tried)} | {len(refused)} | "
           f"{len(skipped)} |")  # fmt: skip
    details = [
        f"{what} {r.tiles.describe()} | {_ms(r.seconds)} | {_errs(r)} | {r.why or 'ok'} |"
        for r in tried
    ]
    rule_speed = f"{base.seconds / rule.seconds:.2f}x" if rule.seconds and base.seconds else "-"
    rule_row = (f"{what} {_ms(base.seconds)} | {rule.tiles.describe()} | {_ms(rule.seconds)} | "
                f"{rule_speed} | {_errs(rule)} |")  # fmt: skip
    host, phases = [], []
    picks = [("defaults", base), ("best", best)]
    if rule.tiles != base.tiles and rule.tiles != best.tiles:
        picks.append((f"best at {RULE_PRECISION}", rule))
    for label, r in picks:
        if r.seconds is not None:
            h = host_seconds(partial(run, r.tiles), device, plan.reps)
            host.append(f"{what} {label}: {r.tiles.describe()} | {_ms(r.seconds)} | {_ms(h)} | "
                        f"{h / r.seconds:.0%} |")  # fmt: skip
            try:  # a profiler that fails here must not cost the sweep's other rows
                kernels = kernel_seconds(partial(run, r.tiles), device, plan.reps)
            except Exception as e:
                phases.append(f"{what} {label} | - | - | profiler failed: "
                              f"{type(e).__name__}: {str(e)[:80]} |")  # fmt: skip
                continue
            if kernels is None:
                phases.append(f"{what} {label} | - | - | no CUDA profiler on the CPU |")
            else:
                total = sum(t for _, t in kernels) or 1.0
                phases += [f"{what} {label} | `{k}` | {_ms(t)} | {t / total:.0%} |"
                           for k, t in kernels]  # fmt: skip
    print(row, flush=True)
    return row, details, host, phases, rule_row


def mamba1_rows(device: torch.device, plan: Plan, tiny: bool) -> list[str]:
    """Mamba1's chunked scan per ``chunk_size`` against its sequential kernel."""
    d_inner, d_state, (seqs, length) = TINY_MAMBA1 if tiny else MAMBA1
    args = mamba1_prefill_inputs(seqs, length, device, d_inner, d_state)
    state = args[9]
    seq_run = partial(selective_scan_fn, *args, backend="triton")
    state.zero_()
    want_y, want_st = seq_run(), state.clone()
    t_seq = timed(seq_run, device, reps=max(1, plan.reps // 2), warmup=plan.warmup)
    rows = []
    for q in plan.mamba1_chunks:
        run = partial(selective_chunk_scan_fn, *args, chunk_size=q, backend="triton")
        state.zero_()
        err = (rel_err(run(), want_y), rel_err(state, want_st))
        ok = err[0] <= MAMBA1_TOL[0] and err[1] <= MAMBA1_TOL[1]
        t = timed(run, device, plan.reps, plan.warmup) if ok else None
        ratio = f"{t_seq / t:.1f}x" if t else "refused: over the tolerance"
        rows.append(f"| {seqs} x {length:,} | {q} | {_ms(t_seq)} | {_ms(t)} | {ratio} | "
                    f"{err[0]:.1e} / {err[1]:.1e} |")  # fmt: skip
        print(rows[-1], flush=True)
    return rows


def report(device: torch.device, smoke: bool, budget: float | None) -> list[str]:
    """The whole sweep as Markdown lines."""
    plan = SMOKE_PLAN if smoke else GPU_PLAN
    deadline = Deadline(budget)
    shapes = TINY_SHAPES if smoke else MAMBA2_SHAPES
    cuda = device.type == "cuda"
    name = torch.cuda.get_device_name(device) if cuda else "CPU (Triton interpreter)"
    summary, details, host, kernels, rule = [], [], [], [], []
    for label, shape in shapes.items():
        for seqs, length in TINY_CASES if smoke else CASES:
            row, d, h, k, r = sweep_shape(label, shape, seqs, length, device, plan, deadline)
            summary.append(row)
            rule.append(r)
            details += d
            host += h
            kernels += k
    m1 = mamba1_rows(device, plan, smoke)
    note = "" if cuda and not smoke else " Smoke run: tiny shapes, the times mean nothing."
    return [
        f"# Chunked Mamba scan launch sweep on {name}", "",
        f"`research/tune_mamba_scan.py`, {datetime.date.today()}; bf16 activations, fp32 "
        f"states, fresh prompts saving their final state; medians of CUDA-event-timed calls "
        f"({plan.reps} after {plan.warmup} warm-up).{note} Errors: max |error| / max |value| "
        "against the sequential kernel, outputs / states. Target: >= 10x the sequential "
        "kernel at 4k tokens.", "",
        "## Mamba2 (`ssd_chunk_scan_fn`, `ScanTiles`)", "",
        "| heads | seqs x tokens | sequential ms | defaults ms | best choice | best ms | "
        "best vs sequential | best vs defaults | best errors | tried | refused | skipped |",
        "| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |",
        *summary, "",
        f"## At the rule's precision ({RULE_PRECISION}): stage 0's best", "",
        "| heads | seqs x tokens | defaults ms | best choice | best ms | vs defaults | errors |",
        "| --- | --- | ---: | --- | ---: | ---: | --- |",
        *rule, "",
        "## Host cost (launch-bound where the host time nears the CUDA-event time)", "",
        "| heads | seqs x tokens | choice | CUDA events ms | host issue ms | host / events |",
        "| --- | --- | --- | ---: | ---: | ---: |",
        *host, "",
        "## Where the time goes (each kernel's device time per call, `torch.profiler`)", "",
        "| heads | seqs x tokens | choice | kernel | ms per call | share |",
        "| --- | --- | --- | --- | ---: | ---: |",
        *kernels, "",
        f"## Mamba1 (`selective_chunk_scan_fn`, d_inner {(TINY_MAMBA1 if smoke else MAMBA1)[0]}"
        f", d_state {(TINY_MAMBA1 if smoke else MAMBA1)[1]})", "",
        "| seqs x tokens | chunk | sequential ms | chunked ms | sequential / chunked | errors |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
        *m1, "",
        "## Every Mamba2 candidate", "",
        "| heads | seqs x tokens | choice | ms | errors | status |",
        "| --- | --- | --- | ---: | --- | --- |",
        *details,
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes and candidates")
    ap.add_argument("--write", action="store_true", help="write the table to benchmarks/results")
    ap.add_argument("--budget", type=float, default=120.0, help="seconds for the Mamba2 sweep")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not (args.smoke and os.environ.get("TRITON_INTERPRET") == "1"):
        sys.exit("no CUDA: run TRITON_INTERPRET=1 ... --smoke for a tiny check of this script")
    if args.smoke and args.write:
        sys.exit("--smoke times tiny shapes: nothing to write")
    device = torch.device("cuda" if cuda else "cpu")
    t0 = time.monotonic()
    lines = report(device, args.smoke, None if args.smoke else args.budget)
    print("\n".join(lines))
    print(f"swept in {time.monotonic() - t0:.0f} s", flush=True)
    if args.write:
        slug = torch.cuda.get_device_name(device).split(" (")[0].replace(" ", "-").lower()
        out = ROOT / "benchmarks" / "results" / f"mamba-scan-tuning-{slug}.md"
        out.write_text("\n".join(lines) + "\n")
        print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
