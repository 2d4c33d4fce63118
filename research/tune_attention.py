#!/usr/bin/env python3
"""Sweep the Triton attention kernel's launch choices on a GPU (issue 16: "tune tile
sizes, split-KV and num_warps/stages").

For each shape (decodes at 2k-32k context and batch 1-256, fresh prefills, a
mixed batch), a staged sweep over ``TritonTiles`` (``kernels/attention/tiles.py``):

1. ``tile_n`` x ``num_warps`` (x ``block_m`` for batches with prefill rows);
2. ``num_stages`` with the best of 1;
3. for decodes, the split-KV factor (``num_segments``) with the best of 2; for
   batches with prefill rows, the best of 2 dispatched longest first
   (``TritonTiles.longest_first``), and split 2 and 4 ways: what
   ``prefill_attention_work.py`` says the tiles cannot fix (the launch order's tail,
   and the long mixed batch's 384 programs on 264 slots), since 2026-11-28.

"Defaults" are the launcher's rules as they stand when the sweep runs
(``kernels/attention/launch_rules.py``: no ``tiles``, no ``num_segments``), and
a candidate's ``None`` fields follow those rules too (a decode candidate's
split, say). Since 2026-11-26 the rules are the H200 sweep's best choices, so
a rerun's speedups are measured against them: ~1.0x where the rules hold, and
a second table lists what the rules chose per shape.

Every candidate's output is first compared with the defaults on the
same inputs (bf16 resolution); a candidate that fails to compile or differs
is reported, not timed. The table gives per shape the default's time, the best
candidate and its speedup; ``--write`` saves it as
``benchmarks/results/attention-tuning-<device>.md``. What to bake into the
launcher's rules is then a decision made from that table.

    python3 research/tune_attention.py [--quick] [--write]

Without CUDA it runs the same sweep at tiny shapes under Triton's interpreter
(a check of this script; the times mean nothing).
"""

from __future__ import annotations

import argparse
import datetime
import sys
from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks"), str(HERE)]

from kernel_attention_gpu import _paged_prompts  # noqa: E402
from kernel_common import timed  # noqa: E402

from hybridkv.kernels import AttentionMetadata, AttentionOptions, unified_attention  # noqa: E402
from hybridkv.kernels.attention import TritonTiles  # noqa: E402
from hybridkv.kernels.attention.launcher import plan_launch  # noqa: E402

GEOMETRY = (32, 8, 128, 16)  # query heads, KV heads, head size, block size
TINY_GEOMETRY = (4, 2, 16, 4)


@dataclass(frozen=True)
class Shape:
    name: str
    lens: tuple[tuple[int, int], ...]  # (context, new tokens) per sequence
    kind: tuple[tuple[str, int], ...] = ()  # AttentionOptions window / chunk

    @property
    def decode_only(self) -> bool:
        return all(n == 1 for _, n in self.lens)


def shapes(quick: bool, tiny: bool) -> list[Shape]:
    if tiny:
        return [
            Shape("decode 3 x 40", ((39, 1),) * 3),
            Shape("prefill 1 x 24", ((0, 24),)),
            Shape("sliding 7, decode 2 x 50", ((49, 1),) * 2, (("sliding_window", 7),)),
        ]
    out = [
        Shape("decode 16 x 8k", ((8191, 1),) * 16),
        Shape("decode 64 x 32k", ((32767, 1),) * 64),
        Shape("decode 256 x 2k", ((2047, 1),) * 256),
        Shape("decode 1 x 32k", ((32767, 1),)),
        Shape("prefill 1 x 8k", ((0, 8192),)),
        Shape("prefill 1 x 2k", ((0, 2048),)),  # issue 47's target shape (1.52x on an H100)
        Shape("prefill 4 x 2k", ((0, 2048),) * 4),
        Shape("mixed 2k chunk + 64 x 8k", ((2048, 2048),) + ((8191, 1),) * 64),
        Shape("sliding 1024, decode 64 x 32k", ((32767, 1),) * 64, (("sliding_window", 1024),)),
        # Second H200 lease: the short-span rule (no split, 2 warps, tile_n 32) measured
        # slower than the rules before it at batch 1 and 16 (8 or 128 programs on 132 SMs).
        Shape("sliding 1024, decode 1 x 32k", ((32767, 1),), (("sliding_window", 1024),)),
        Shape("sliding 1024, decode 16 x 8k", ((8191, 1),) * 16, (("sliding_window", 1024),)),
        Shape("decode 1 x 2k", ((2047, 1),)),
        Shape("mixed 512 on 30k + 16 x 32k", ((30000, 512),) + ((32767, 1),) * 16),
    ]
    return out[::3] if quick else out


def stage1(shape: Shape, tiny: bool) -> list[TritonTiles]:
    tiles_n = (16, 32) if tiny else (32, 64, 128)
    warps = (4,) if tiny else (2, 4, 8)
    rows = (None,) if shape.decode_only else ((32, 64) if tiny else (32, 64, 128))
    return [
        TritonTiles(block_m=m, tile_n=n, num_warps=w) for n in tiles_n for w in warps for m in rows
    ]


def stage2(best: TritonTiles, tiny: bool) -> list[TritonTiles]:
    return [replace(best, num_stages=s) for s in ((1, 2) if tiny else (1, 2, 3, 4))]


@dataclass
class Result:
    tiles: TritonTiles | None
    segments: int | None
    seconds: float | None  # None: refused (why)
    why: str = ""


def _describe(r: Result) -> str:
    if r.tiles is None and r.segments is None:
        return "defaults"
    parts = (
        [] if r.tiles is None else [f"{k}={v}" for k, v in vars(r.tiles).items() if v is not None]
    )
    if r.segments is not None:
        parts.append(f"segments={r.segments}")
    return ", ".join(parts)


def sweep_shape(shape: Shape, device: torch.device, tiny: bool, reps: int) -> list[str]:
    geometry = TINY_GEOMETRY if tiny else GEOMETRY
    q, kc, vc, meta = _paged_prompts(list(shape.lens), geometry, device)
    opts = AttentionOptions(scale=geometry[2] ** -0.5, **dict(shape.kind))
    run = partial(unified_attention, q, kc, vc, meta, opts, backend="triton")
    want = run().float()

    def measure(tiles: TritonTiles | None, segments: int | None) -> Result:
        try:
            got = run(tiles=tiles, num_segments=segments).float()
        except Exception as e:  # a config Triton cannot compile here: report it
            return Result(tiles, segments, None, f"{type(e).__name__}: {str(e)[:80]}")
        if not torch.allclose(got, want, rtol=2e-2, atol=2e-2):
            err = (got - want).abs().max().item()
            return Result(tiles, segments, None, f"differs from the defaults by {err:.3g}")
        return Result(
            tiles, segments, timed(partial(run, tiles=tiles, num_segments=segments), device, reps)
        )

    base = measure(None, None)
    assert base.seconds is not None
    tried = [base]

    def best_of(results: Iterable[Result]) -> Result:
        ok = [r for r in results if r.seconds is not None]
        return min(ok, key=lambda r: r.seconds or 0.0) if ok else base

    first = [measure(t, None) for t in stage1(shape, tiny)]
    tried += first
    b1 = best_of(first)
    second = [measure(t, None) for t in stage2(b1.tiles or TritonTiles(), tiny)]
    tried += second
    b2 = best_of([b1, *second])
    if shape.decode_only:
        tried += [measure(b2.tiles, s) for s in ((1, 2) if tiny else (1, 2, 4, 8, 16))]
    else:
        tried.append(measure(replace(b2.tiles or TritonTiles(), longest_first=True), None))
        tried += [measure(b2.tiles, s) for s in ((2,) if tiny else (2, 4))]
    best = best_of(tried)
    refused = [r for r in tried if r.seconds is None]
    bs, ts = best.seconds or 0.0, base.seconds
    row = (f"| {shape.name} | {ts * 1e3:.3f} | {_describe(best)} | {bs * 1e3:.3f} | "
           f"{ts / bs:.2f}x | {len(tried)} | {len(refused)} |")  # fmt: skip
    print(row, flush=True)
    for r in refused:
        print(f"    refused: {_describe(r)}: {r.why}", flush=True)
    return [row]


def defaults_row(shape: Shape, device: torch.device, tiny: bool) -> str:
    """What the launcher's rules choose for ``shape`` (no tiles, no forced split)."""
    hq, hkv, d, bs = TINY_GEOMETRY if tiny else GEOMETRY
    cols = max(-(-(c + n) // bs) for c, n in shape.lens)
    table = torch.zeros(len(shape.lens), cols, dtype=torch.int32, device=device)
    meta = AttentionMetadata.build(
        [n for _, n in shape.lens], [c + n for c, n in shape.lens], table
    )
    opts = AttentionOptions(scale=d**-0.5, **dict(shape.kind))
    c = plan_launch(meta, opts, hq, hkv, d, torch.bfloat16, device).choice
    return (f"| {shape.name} | {c.block_m} | {c.tile_n} | {c.num_warps} | {c.num_stages} | "
            f"{c.segments} |")  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a third of the shapes")
    ap.add_argument("--write", action="store_true", help="write the table to benchmarks/results")
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    if not cuda:
        import os

        if os.environ.get("TRITON_INTERPRET") != "1":
            sys.exit("no CUDA: run with TRITON_INTERPRET=1 for a tiny check of this script")
    device = torch.device("cuda" if cuda else "cpu")
    name = torch.cuda.get_device_name(device) if cuda else "CPU (Triton interpreter)"
    torch.manual_seed(0)
    what = (
        "bf16, 32 query / 8 KV heads, head 128, block 16. Times: median of CUDA-event-timed calls."
        if cuda
        else "bf16, 4 query / 2 KV heads, head 16, block 4, under the interpreter: a check of "
        "the script, the times mean nothing."
    )
    lines = [f"# Triton attention launch sweep on {name}", "",
             f"`research/tune_attention.py`, {datetime.date.today()}; {what}", "",
             "| shape | defaults ms | best choice | best ms | speedup | tried | refused |",
             "| --- | ---: | --- | ---: | ---: | ---: | ---: |"]  # fmt: skip
    chosen = ["", "What the defaults (`kernels/attention/launch_rules.py`) chose:", "",
              "| shape | block_m | tile_n | num_warps | num_stages | segments |",
              "| --- | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for shape in shapes(args.quick, tiny=not cuda):
        lines += sweep_shape(shape, device, tiny=not cuda, reps=10 if cuda else 1)
        chosen.append(defaults_row(shape, device, tiny=not cuda))
    lines += chosen
    print("\n".join(lines))
    if args.write:
        out = (
            ROOT
            / "benchmarks"
            / "results"
            / f"attention-tuning-{name.split(' (')[0].replace(' ', '-').lower()}.md"
        )
        out.write_text("\n".join(lines) + "\n")
        print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
