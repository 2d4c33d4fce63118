#!/usr/bin/env python3
"""Decode attention's work per launch in the graphed Gemma 3 270M step, and what it
predicts (issue 47): why 527 us for 326 MB of K/V, without a GPU.

On the 2026-11-28 H200 lease (``step-profile-nvidia-h200-bfloat16-random-graphs-2026-11-28.md``)
the graphed decode step of 64 requests at 260-292 keys spent 526.6 us in 18
``unified_attention_kernel`` launches, 7.7x the 68 us its K/V takes at 4.8 TB/s. For
each launch as the launcher plans it (``plan_launch``, the real rules, per layer kind:
15 layers of a 512-key window, 3 full), this counts:

- **programs**: the grid, those with keys to read (a decode's q block holds one
  token, so ``grid[0] - seqs`` q blocks exit at once; a split's segment past the last
  tile too), and per SM against the programs an SM holds (``RESIDENT``);
- **tiles**: key tiles the longest program walks, one after another;
- **bytes**: K/V once (a program serves all query heads of its KV head: no re-read),
  q and the output, a split's fp32 partials written and read back by the merge.

Two floors per launch: ``bytes / bandwidth``, and the latency chain of its longest
program, ``waves x (FIXED + tiles x tile time) (+ MERGE when split)``; the prediction
is the larger. The chain's times are fitted (``CHAIN``, one line of provenance each):
a model, not a measurement. ``--measure`` (on a GPU) times the same launches at the
same shapes, 18 layers in one CUDA graph, beside the prediction.

    .venv/bin/python research/decode_attention_bytes.py [--write]
    .venv/bin/python research/decode_attention_bytes.py --measure [--write]  # a GPU
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks"), str(HERE)]

from random_checkpoint import SHAPES  # noqa: E402
from results_tables import emit  # noqa: E402

from hybridkv.engine.config import CacheConfig  # noqa: E402
from hybridkv.kernels.attention import (  # noqa: E402
    AttentionMetadata,
    AttentionOptions,
    TritonTiles,
    launch_rules,
)
from hybridkv.kernels.attention.launcher import LaunchPlan, plan_launch, within_reach  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "decode-attention-bytes.md"
MEASURED_US = 526.6  # H200, 2026-11-28: unified_attention_kernel per graphed step
LEASE_CONTEXTS = tuple(range(260, 293))  # that profile's steps: 64 requests at one context


@dataclass(frozen=True)
class Geometry:
    """The model's attention as the engine runs it: one window (or None) per layer."""

    windows: tuple[int | None, ...]
    heads: int
    kv_heads: int
    head: int
    block_size: int
    elem: int = 2  # bf16


def gemma_270m() -> Geometry:
    cfg = SHAPES["gemma-3-270m"]
    windows = tuple(
        cfg["sliding_window"] if t == "sliding_attention" else None for t in cfg["layer_types"]
    )
    return Geometry(windows, cfg["num_attention_heads"], cfg["num_key_value_heads"],
                    cfg["head_dim"], CacheConfig().block_size)  # fmt: skip


@dataclass(frozen=True)
class Machine:
    name: str
    bandwidth: float  # HBM bytes/s (datasheet)
    sms: int


H100 = Machine("H100 SXM", 3.35e12, 132)
H200 = Machine("H200", 4.8e12, 132)


@dataclass(frozen=True)
class Chain:
    """A program's latency chain, fitted (a model): per value its provenance."""

    #: Launch, sequence search (~7 dependent loads for 64 sequences), q load and store:
    #: assumed (not separable from the per-tile time with the lease's data; the report's
    #: last table recalibrates the tile time for 2 and 6 us).
    fixed: float = 4e-6
    #: A tile of 32 keys at head 256 (32 KB of K+V): the H200 lease's 29.3 us per launch
    #: for ~9.1 tiles, less ``fixed``; the H100's graphed head-128 decodes of 1-16
    #: sequences (kernels-nvidia-h100-2026-11-28.md) took 1.7 us a 16 KB tile (sliding
    #: 1024, 33 tiles, 59 us) and 2.7 us a 64 KB tile (full 1 x 2k, 16 tiles, 47 us):
    #: latency-bound, nearly whatever the tile's bytes.
    tile_32k: float = (29.26e-6 - 4e-6) / 9.12
    tile_64k: float = 2.7e-6  # the H100's full 1 x 2k (16 tiles of 64 KB in 47.3 us)
    #: The merge launch of a split: H100 graphed full 1 x 8k (4 segments of 16 tiles,
    #: 52.8 us) less 1 x 2k (16 tiles, no split, 47.3 us).
    merge: float = 5.5e-6

    def tile(self, tile_bytes: int) -> float:
        return self.tile_32k if tile_bytes <= 32 * 1024 else self.tile_64k


CHAIN = Chain()

#: (tile_n, warps, split) -> (registers, dynamic shared bytes) of the decode kernel at
#: head 256, compiled for sm_90 offline (research/kernel_resources.py's compile, Triton
#: 3.9, 2026-11-28; no local memory in any). An SM has 65,536 registers, 228 KB shared.
COMPILED = {
    (32, 4, False): (196, 42_240),
    (32, 4, True): (214, 42_240),
    (64, 4, False): (238, 76_288),
    (64, 4, True): (235, 76_288),
}


def resident(tile_n: int, warps: int, split: bool) -> int:
    """Programs of the decode kernel one SM holds at once (registers and shared memory)."""
    regs, smem = COMPILED[(tile_n, warps, split)]
    by_regs = 65_536 // (-(-regs // 8) * 8 * 32 * warps)
    return max(1, min(by_regs, 228 * 1024 // (smem + 1024)))


@dataclass(frozen=True)
class Variant:
    """One way the step's launches are planned: the span the plan sees (None: the
    real longest context, as eagerly), the fill rule's programs per SM, tile overrides."""

    name: str
    span: int | None
    per_sm: int
    tiles: TritonTiles | None = None


VARIANTS = (
    Variant("lease: graph, span class 416 (max_model_len), no fill rule", 416, 0),
    Variant("graph at span class 2,048, no fill rule", 2048, 0),
    Variant("now: span class 512, fill rule (2 per SM)", 512, 2),
    Variant("fill rule, tiles of 64 keys", 512, 2, TritonTiles(tile_n=64)),
    Variant("tiles of 64 keys, no fill rule", 512, 0, TritonTiles(tile_n=64)),
)


@contextlib.contextmanager
def programs_per_sm(n: int) -> Iterator[None]:
    saved = launch_rules.PROGRAMS_PER_SM
    launch_rules.PROGRAMS_PER_SM = n
    try:
        yield
    finally:
        launch_rules.PROGRAMS_PER_SM = saved


def metadata(contexts: list[int], planned: int | None, table: torch.Tensor,
             device: torch.device | None = None) -> AttentionMetadata:  # fmt: skip
    """Decode metadata over ``table``: ``contexts`` keys per sequence (the new token's
    included) on the device, host lengths ``planned`` (a graph's span class) where
    given, as ``StaticStep`` makes them; ``table`` holds ``planned`` keys' blocks."""
    lens = [planned] * len(contexts) if planned is not None else contexts
    meta = AttentionMetadata.build([1] * len(contexts), lens, table, device)
    if planned is None:
        return meta
    real = AttentionMetadata.build([1] * len(contexts), contexts, table, device)
    return dataclasses.replace(meta, seq_lens=real.seq_lens)


def table_width(contexts: list[int], planned: int | None, block_size: int) -> int:
    return -(-max(planned or 0, *contexts) // block_size)


def plan(geo: Geometry, v: Variant, contexts: list[int], window: int | None,
         sms: int) -> tuple[LaunchPlan, AttentionOptions]:  # fmt: skip
    table = torch.zeros(len(contexts), table_width(contexts, v.span, geo.block_size),
                        dtype=torch.int32)  # fmt: skip
    meta = metadata(contexts, v.span, table)
    opts = within_reach(meta, AttentionOptions(scale=geo.head**-0.5, sliding_window=window))
    with programs_per_sm(v.per_sm):
        p = plan_launch(meta, opts, geo.heads, geo.kv_heads, geo.head, torch.bfloat16,
                        torch.device("cuda"), v.tiles, sms=sms)  # fmt: skip
    return p, opts


@dataclass(frozen=True)
class Work:
    """One launch's work (module docstring); bytes are DRAM bytes if each is read once."""

    plan: LaunchPlan
    launched: int
    busy: int
    max_tiles: int
    kv_bytes: int
    io_bytes: int  # q in, and the output or a split's partials out
    merge_bytes: int  # partials read back and the output written by the merge
    resident: int


def work(geo: Geometry, v: Variant, contexts: list[int], window: int | None, sms: int) -> Work:
    p, opts = plan(geo, v, contexts, window, sms)
    c = p.choice
    hkv, d, e = geo.kv_heads, geo.head, geo.elem
    busy = kv = max_tiles = 0
    for n in contexts:  # as the kernel: the visible range, its tiles cut in equal segments
        lo = opts.first_visible_key(n - 1)
        tiles = -(-n // c.tile_n) - lo // c.tile_n
        per = -(-tiles // c.segments)
        busy += -(-tiles // per) * hkv
        max_tiles = max(max_tiles, per)
        kv += (n - lo) * hkv * d * 2 * e
    seqs, split = len(contexts), c.segments > 1
    partial = seqs * geo.heads * c.segments * (p.head_pad * 4 + 8)
    io = seqs * geo.heads * d * e + (partial if split else seqs * geo.heads * d * e)
    merge = partial + seqs * geo.heads * d * e if split else 0
    launched = p.grid[0] * p.grid[1] * p.grid[2]
    return Work(p, launched, busy, max_tiles, kv, io, merge,
                resident(c.tile_n, c.num_warps, split))  # fmt: skip


def predict(w: Work, geo: Geometry, m: Machine, chain: Chain = CHAIN) -> tuple[float, float]:
    """``(bytes floor, prediction)`` in seconds for one launch (and its merge)."""
    c = w.plan.choice
    floor = (w.kv_bytes + w.io_bytes + w.merge_bytes) / m.bandwidth
    waves = -(-w.busy // (m.sms * w.resident))
    t = waves * (chain.fixed + w.max_tiles * chain.tile(c.tile_n * geo.head * geo.elem * 2))
    t += chain.merge if c.segments > 1 else 0.0
    return floor, max(floor, t)


def step(geo: Geometry, v: Variant, contexts: list[int], m: Machine,
         chain: Chain = CHAIN) -> dict[str, float]:  # fmt: skip
    """Sums over the step's layers: MB, the bytes floor and the prediction (us)."""
    out = {"kv": 0.0, "other": 0.0, "floor": 0.0, "pred": 0.0}
    for window in geo.windows:
        w = work(geo, v, contexts, window, m.sms)
        floor, pred = predict(w, geo, m, chain)
        out["kv"] += w.kv_bytes / 1e6
        out["other"] += (w.io_bytes + w.merge_bytes) / 1e6
        out["floor"] += floor * 1e6
        out["pred"] += pred * 1e6
    return out


def report(geo: Geometry, machines: tuple[Machine, ...] = (H200, H100)) -> list[str]:
    lines = ["### Per launch (64 requests at 276 keys; per layer kind)", "",
             "| variant | layers | grid | tiles x warps | segments | programs: launched / "
             "with keys / per SM (SM holds) | tiles, longest program | K/V MB | other MB |",
             "| --- | --- | --- | --- | ---: | --- | ---: | ---: | ---: |"]  # fmt: skip
    ctx = [276] * 64
    for v in VARIANTS:
        for window, label in ((512, "15 sliding (512)"), (None, "3 full")):
            w = work(geo, v, ctx, window, 132)
            c = w.plan.choice
            other = (w.io_bytes + w.merge_bytes) / 1e6
            lines.append(
                f"| {v.name} | {label} | {w.plan.grid} | {c.tile_n} x {c.num_warps} | "
                f"{c.segments} | {w.launched} / {w.busy} / {w.busy / 132:.2f} ({w.resident}) | "
                f"{w.max_tiles} | {w.kv_bytes / 1e6:.2f} | {other:.2f} |"
            )
    lines += ["", "### Per step (18 layers): bytes floor and prediction, us", "",
              "| machine | contexts | variant | K/V MB | other MB | bytes floor | predicted "
              "| predicted / floor |",
              "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    cases = (("260-292 (the lease's profile)", list(LEASE_CONTEXTS)), ("320", [320]),
             ("384", [384]))  # fmt: skip
    for m in machines:
        for label, span in cases:
            for v in VARIANTS:
                s = {k: sum(step(geo, v, [c] * 64, m)[k] for c in span) / len(span)
                     for k in ("kv", "other", "floor", "pred")}  # fmt: skip
                lines.append(
                    f"| {m.name} | {label} | {v.name} | {s['kv']:.0f} | {s['other']:.1f} | "
                    f"{s['floor']:.0f} | {s['pred']:.0f} | {s['pred'] / s['floor']:.1f}x |"
                )
    return [*lines, "", *sensitivity(geo)]


def sensitivity(geo: Geometry) -> list[str]:
    """The predictions (H200, the lease's contexts) for another assumed fixed part, the
    tile time recalibrated on the lease's 29.3 us a launch."""
    lines = ["### The assumed fixed part: predictions (H200, 260-292 keys, us a step)", "",
             "| fixed us | tile of 32 keys, us | " + " | ".join(v.name for v in VARIANTS) + " |",
             "| ---: | ---: |" + " ---: |" * len(VARIANTS)]  # fmt: skip
    for fixed in (2e-6, 4e-6, 6e-6):
        chain = Chain(fixed=fixed, tile_32k=(29.26e-6 - fixed) / 9.12)
        cells = [sum(step(geo, v, [n] * 64, H200, chain)["pred"] for n in LEASE_CONTEXTS)
                 / len(LEASE_CONTEXTS) for v in VARIANTS]  # fmt: skip
        lines.append(f"| {fixed * 1e6:.0f} | {chain.tile_32k * 1e6:.2f} | "
                     + " | ".join(f"{c:.0f}" for c in cells) + " |")  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--write", action="store_true", help=f"write {RESULTS.relative_to(ROOT)}")
    ap.add_argument("--measure", action="store_true", help="time the variants (a GPU)")
    args = ap.parse_args(argv)
    geo = gemma_270m()
    lines = report(geo)
    if args.measure:
        from decode_attention_time import measure_lines

        gpu = H200 if "H200" in torch.cuda.get_device_name() else H100
        lines += ["", *measure_lines(geo, VARIANTS, lambda v, ctx: step(geo, v, ctx, gpu)["pred"])]
    emit(RESULTS, lines, args.write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
