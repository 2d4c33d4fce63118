#!/usr/bin/env python3
"""Bytes, multiply-adds and parallelism of the chunked Mamba2 scan's phases: where the
gap to mamba-ssm must be (issue 47), without a GPU.

For Bamba 9B and Mamba2 2.7B heads (``bench_kernels.MAMBA2_SHAPES``; bf16 activations)
at 1 x 4,096 and 8 x 512 tokens, per phase of each layout:

- **bytes**: every tensor the phase must read or write once (DRAM traffic if each
  re-read of a small tensor hits L2): the lower bound of its memory traffic;
- **MACs**: the multiply-adds of its matmuls, and the dot precision they run at;
- **programs**: its launch grid (against the GPU's SMs);
- **steps**: the state pass's serial chain, chunks per sequence, times the dependent
  global round trips each step waits for.

A phase's floor is ``max(bytes / bandwidth, flops / tensor peak) + steps x round
trips x latency``; the layout's floor is the sum over its phases. Floors, not
predictions: they say which phase cannot fit the target, not how fast one will run.

Layouts: ours as measured on the 2026-11-28 lease (chunk 64, the [Q, Q] products in
one block, the state pass in blocks of 64 x 32 waiting three round trips a chunk:
contribution and decay, chunk end, its save slot; its kernels computed dt inside the
chunk-state and chunk-scan kernels, counted here as the dt phase), ours now (chunk 64, 128 or 256 in
blocks of 64, the pass over flat blocks of 512 one chunk ahead, C B^T shared per
group above chunk 64), and mamba-ssm's ``mamba_chunk_scan_combined`` (chunk 256, bf16
dots, its passed states written in the activations' dtype, C B^T once per group).
Both keep the per-chunk states in fp32 as they are made; ours also passes them in
fp32, which the tf32x3 accuracy rule needs (``ssd_chunk_scan_triton.RULE_PRECISION``).

    .venv/bin/python research/mamba_scan_bytes.py [--write]
        # --write: benchmarks/results/mamba-scan-bytes.md
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from bench_kernels import MAMBA2_SHAPES  # noqa: E402


@dataclass(frozen=True)
class Machine:
    """A GPU's rates: HBM bytes/s, dense tensor-core flop/s per input precision, SMs,
    and one dependent global load's round trip (seconds)."""

    name: str
    bandwidth: float
    peak: dict[str, float]
    sms: int
    latency: float


# H100 SXM datasheet: HBM3 3.35 TB/s, dense bf16 989 and tf32 495 TFLOP/s, 132 SMs;
# a dependent global load ~0.7 us (HBM round trip under load; an assumption).
H100 = Machine("H100 SXM", 3.35e12, {"bf16": 989e12, "tf32": 495e12}, 132, 0.7e-6)


@dataclass(frozen=True)
class Layout:
    """One way to run the scan (see the module docstring)."""

    name: str
    chunk: int
    block: int  # rows and columns per tile of the causal [Q, Q] product
    dot: str  # the tensor cores' input precision
    dot_passes: int  # products per multiply-add: 3 for tf32x3
    passed_bytes: int  # bytes per element of the passed start states
    shared_cb: bool  # C B^T once per (chunk, group), not per head
    pass_block: int  # state elements per state-pass program
    pass_trips: int  # dependent round trips per chunk step of the state pass
    block_p: int = 64
    block_n: int = 32


OURS_LEASE = Layout("ours, 2026-11-28 lease (chunk 64)", 64, 64, "tf32", 3, 4, False, 64 * 32, 3)
MAMBA_SSM = Layout("mamba-ssm (chunk 256, bf16 dots)", 256, 64, "bf16", 1, 2, True, 1024, 1)


def ours(chunk: int) -> Layout:
    """Our kernels now at ``chunk`` tokens, at the launcher's rules."""
    return Layout(f"ours now, chunk {chunk}", chunk, min(chunk, 64), "tf32", 3, 4, chunk > 64,
                  512, 1)  # fmt: skip


@dataclass(frozen=True)
class Phase:
    name: str
    bytes: float
    macs: float
    programs: int
    steps: int = 0  # serial round trips (the state pass)


def phases(shape: tuple[int, int, int, int], seqs: int, length: int, lay: Layout) -> list[Phase]:
    """Each phase's bytes, multiply-adds and grid for ``seqs`` prompts of ``length``."""
    heads, p, groups, n = shape
    q, b = lay.chunk, lay.block
    tokens = seqs * length
    chunks = seqs * -(-length // q)
    act = 2  # bf16 activations
    per_tok = tokens * heads * p * act  # x, z or out
    bc = tokens * groups * n * act  # B or C
    dt_buf = 2 * chunks * heads * q * 4  # dt and cumulative dA per chunk position, fp32
    states = chunks * heads * p * n * 4  # the per-chunk states, fp32
    passed = chunks * heads * p * n * lay.passed_bytes
    cb = chunks * groups * q * q * 4
    causal = tokens * (q + b) / 2  # (row, column) pairs per head of the blocked causal product
    out = [
        Phase("dt and cumulative dA", tokens * heads * act + dt_buf, 0, chunks * heads),
        Phase("chunk states", per_tok + bc + dt_buf + states, tokens * heads * p * n,
              chunks * heads * (p // lay.block_p) * (n // lay.block_n)),
        Phase("state passing", states + passed, 0,
              seqs * heads * -(-p * n // lay.pass_block), -(-length // q) * lay.pass_trips),
    ]  # fmt: skip
    if lay.shared_cb:
        out.append(Phase("C B^T per group", 2 * bc + cb, tokens * q * n * groups,
                         chunks * groups * (q // b) ** 2))  # fmt: skip
    scan_macs = tokens * heads * p * n + causal * heads * p
    if not lay.shared_cb:
        scan_macs += causal * heads * n  # C B^T per head
    scan_bytes = 3 * per_tok + 2 * bc + dt_buf + passed + (cb if lay.shared_cb else 0)
    programs = chunks * heads * (p // lay.block_p) * (q // b)
    out.append(Phase("chunk scan", scan_bytes, scan_macs, programs))
    return out


def floor_seconds(ph: Phase, lay: Layout, m: Machine) -> float:
    """max(bytes / bandwidth, flops / tensor peak) + serial steps x latency."""
    compute = 2 * ph.macs * lay.dot_passes / m.peak[lay.dot]
    return max(ph.bytes / m.bandwidth, compute) + ph.steps * m.latency


def floor_total(shape: tuple[int, int, int, int], seqs: int, length: int, lay: Layout,
                m: Machine) -> float:  # fmt: skip
    """The layout's floor: the sum of its phases' floors."""
    return sum(floor_seconds(ph, lay, m) for ph in phases(shape, seqs, length, lay))


def layouts() -> list[Layout]:
    return [OURS_LEASE, ours(64), ours(128), ours(256), MAMBA_SSM]


CASES = ((1, 4096), (8, 512))


def report(m: Machine = H100) -> list[str]:
    """Per-phase and total floors of every layout, as Markdown lines."""
    rows, totals = [], []
    for label, shape in MAMBA2_SHAPES.items():
        for seqs, length in CASES:
            base = floor_total(shape, seqs, length, MAMBA_SSM, m)
            for lay in layouts():
                ps = phases(shape, seqs, length, lay)
                case = f"{label} | {seqs} x {length:,} | {lay.name}"
                for ph in ps:
                    rows.append(
                        f"| {case} | {ph.name} | {ph.bytes / 1e6:,.1f} | {ph.macs / 1e9:.2f} | "
                        f"{ph.programs:,} ({ph.programs / m.sms:.1f} per SM) | {ph.steps} | "
                        f"{floor_seconds(ph, lay, m) * 1e6:,.0f} |"
                    )
                total = floor_total(shape, seqs, length, lay, m)
                nbytes = sum(ph.bytes for ph in ps)
                totals.append(f"| {case} | {nbytes / 1e6:,.0f} | {total * 1e6:,.0f} | "
                              f"{total / base:.2f}x |")  # fmt: skip
    return [
        f"Machine: {m.name}, {m.bandwidth / 1e12:.2f} TB/s, bf16 {m.peak['bf16'] / 1e12:.0f} "
        f"and tf32 {m.peak['tf32'] / 1e12:.0f} TFLOP/s dense, {m.sms} SMs, "
        f"{m.latency * 1e6:.1f} us per dependent round trip.", "",
        "### Totals (floors: sums of the phases' floors)", "",
        "| heads | seqs x tokens | layout | bytes MB | floor us | vs mamba-ssm's floor |",
        "| --- | --- | --- | ---: | ---: | ---: |",
        *totals, "",
        "### Per phase", "",
        "| heads | seqs x tokens | layout | phase | bytes MB | GMACs | programs | serial "
        "round trips | floor us |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |",
        *rows,
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--write", action="store_true", help="write the tables into the results md")
    args = ap.parse_args(argv)
    lines = report()
    print("\n".join(lines))
    if args.write:
        out = ROOT / "benchmarks" / "results" / "mamba-scan-bytes.md"
        text = out.read_text() if out.exists() else ""
        head = text.split("<!-- tables -->")[0].rstrip() + "\n\n" if text else ""
        out.write_text(head + "<!-- tables -->\n\n" + "\n".join(lines) + "\n")
        print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
