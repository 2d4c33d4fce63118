#!/usr/bin/env python3
"""What each Triton kernel costs an sm_90 GPU in registers and local memory, without a GPU.

A kernel that spills registers to local memory, or multiplies on CUDA cores where
tensor cores could, is slow on a Hopper whatever its launch grid. Both can be read
off the compiled binary: this script runs each case's public op on CPU tensors of a
real model's shape with the Triton launches intercepted (nothing runs), compiles
every launched kernel, with the launcher's own choices, for an H100/H200
(``GPUTarget("cuda", 90, 32)``: Triton's NVIDIA backend and its bundled ptxas work
offline), and reads the binary with the bundled ``cuobjdump -res-usage``:

- ``regs``: registers per thread (255 at most);
- ``stack``: bytes of local memory per thread: register spills, or arrays the
  compiler could not keep in registers. A launch rule should have 0;
- ``smem``: shared memory per program (static; Triton's pipelining buffers);
- ``tensor cores``: ``wgmma`` (Hopper's warpgroup MMA), ``mma`` (Ampere's), or
  none (every ``tl.dot`` ran as FMA on CUDA cores, as IEEE fp32 dots do).

Found with it (2026-11-26): the chunked Mamba2 scan's rules of the first GPU lease
(IEEE fp32 dots) compiled to 32 registers and 5-9 KB of local memory per thread,
with no tensor-core instruction, in both its chunk-state and chunk-scan kernels,
which is why it ran 5-12x slower than the sequential kernel on an H200.

    .venv/bin/python research/kernel_resources.py [--cases mamba2,attention] [--check] [--write]
        # --check: exit 1 if a launch rule uses local memory (but ALLOWED_STACK's)
        # --write: benchmarks/results/kernel-resources-sm90.md

It needs Triton's NVIDIA backend (any ``triton`` wheel) and runs with
``TRITON_INTERPRET`` unset (the interpreter's kernels cannot be compiled).
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.pop("TRITON_INTERPRET", None)  # before triton: its kernels must compile

import torch
import triton
from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import BaseBackend, GPUTarget

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks"), str(HERE)]

from launch_count import Launch, intercepted  # noqa: E402

from hybridkv.kernels import (  # noqa: E402
    AttentionMetadata,
    AttentionOptions,
    reshape_and_cache,
    unified_attention,
)
from hybridkv.kernels.mamba import (  # noqa: E402
    selective_chunk_scan_fn,
    selective_scan_fn,
    ssd_chunk_scan_fn,
    ssd_scan_fn,
)

TARGET = GPUTarget("cuda", 90, 32)
H100_SMS = 132  # and the H200's: the split-KV rule's SM count for decode_variants
#: Cases whose rule uses local memory, and why it stands (``--check`` lets these pass).
ALLOWED_STACK = {
    "prefill 1 x 2k, head 128": "block_m 128 / tile_n 32 / 4 warps spills 40-56 bytes, yet it "
    "was the H200 sweep's fastest prefill (1.43x flash SDPA at 1 x 8k against 2.3-3.0x "
    "before; attention-tuning-nvidia-h200.md)",
}
RESULTS = ROOT / "benchmarks" / "results" / "kernel-resources-sm90.md"
_DTYPES = {
    torch.float32: "fp32",
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.int16: "i16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.bool: "i1",
}


@dataclass(frozen=True)
class Resources:
    case: str
    kernel: str
    options: str
    regs: int
    stack: int
    smem: int
    tensor_cores: str


def capture(run: Callable[[], object]) -> list[Launch]:
    """The Triton launches ``run`` makes, intercepted (none runs)."""
    with intercepted() as got:
        run()
    return got


def _signature(launch: Launch) -> tuple[dict, dict, dict, dict]:
    """``(signature, constexprs, attrs, options)`` as Triton specialises the launch on a
    GPU (its own ``native_specialize_impl``): a pointer or integer divisible by 16 is
    marked so and an integer equal to 1 becomes a constant, unless the kernel says
    ``do_not_specialize`` for it."""
    fn = launch.fn
    values = dict(zip(fn.arg_names, launch.args, strict=False))
    values.update(launch.kwargs)
    option_names = ("num_warps", "num_stages", "enable_fp_fusion")
    options = {k: values.pop(k) for k in option_names if k in values}
    sig: dict[str, str] = {}
    const: dict[str, Any] = {}
    attrs: dict[tuple[int], list] = {}
    for i, (name, param) in enumerate(zip(fn.arg_names, fn.params, strict=True)):
        v = values[name]
        if param.is_constexpr:
            sig[name], const[name] = "constexpr", v
            continue
        kind, spec = native_specialize_impl(
            BaseBackend, v, False, not param.do_not_specialize, True
        )
        sig[name] = kind
        if kind == "constexpr":  # None, or an integer 1
            const[name] = v
        elif spec == "D":
            attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, const, attrs, options


def variant(launch: Launch) -> tuple:
    """What Triton compiles one binary per: the kernel, its specialised signature,
    constants and launch options. Launches with equal ``variant`` share a compile."""
    sig, const, attrs, options = _signature(launch)
    return (
        launch.fn.__name__,
        tuple(sig.items()),
        repr(sorted(const.items())),
        repr(sorted(attrs.items())),
        repr(sorted(options.items())),
    )


def _tool(name: str) -> str:
    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name)


def compile_launch(launch: Launch, **overrides: Any) -> Any:
    """``launch``'s kernel compiled for sm_90 as a GPU would compile it (``overrides``:
    compile options to change, e.g. ``enable_fp_fusion``)."""
    sig, const, attrs, options = _signature(launch)
    src = triton.compiler.ASTSource(launch.fn, sig, const, attrs)
    return triton.compile(src, target=TARGET, options={**options, **overrides})


def resources(case: str, launch: Launch) -> Resources:
    """Compile ``launch`` for sm_90 and read its resource use."""
    options = _signature(launch)[3]
    compiled = compile_launch(launch)
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        usage = subprocess.run(
            [_tool("cuobjdump"), "-res-usage", str(cubin)], capture_output=True, text=True
        ).stdout

    def field(key: str) -> int:
        m = re.search(rf"{key}:(\d+)", usage)
        if m is None:
            raise RuntimeError(f"cuobjdump printed no {key} for {launch.fn.__name__}: {usage!r}")
        return int(m.group(1))

    ptx = compiled.asm["ptx"]
    tc = "wgmma" if "wgmma" in ptx else "mma" if re.search(r"\bmma\.sync", ptx) else "none"
    opts = ", ".join(f"{k} {v}" for k, v in sorted(options.items())) or "defaults"
    return Resources(
        case, launch.fn.__name__, opts, field("REG"), field("STACK"), field("SHARED"), tc
    )


# --- cases: public ops on CPU tensors of real models' shapes, the launchers' rules ---


def _paged(lens: list[tuple[int, int]], hq: int, hkv: int, d: int, bs: int = 16):
    """(q, key_cache, value_cache, metadata) for (context, new tokens) per sequence;
    every sequence reads the same physical blocks (nothing runs: only shapes count)."""
    per = [-(-(c + n) // bs) for c, n in lens]
    width = max(per)
    table = torch.zeros(len(lens), width, dtype=torch.int32)
    for i, n in enumerate(per):
        table[i, :n] = torch.arange(1, n + 1, dtype=torch.int32)
    k = torch.zeros(width + 1, bs, hkv, d, dtype=torch.bfloat16)
    meta = AttentionMetadata.build([n for _, n in lens], [c + n for c, n in lens], table)
    q = torch.zeros(sum(n for _, n in lens), hq, d, dtype=torch.bfloat16)
    return q, k, torch.zeros_like(k), meta


def _attention(lens, hq=32, hkv=8, d=128, segments=None, **kind) -> Callable[[], object]:
    def run() -> object:
        q, k, v, meta = _paged(lens, hq, hkv, d)
        opts = AttentionOptions(scale=d**-0.5, **kind)
        return unified_attention(q, k, v, meta, opts, backend="triton", num_segments=segments)

    return run


def _cache_write() -> object:
    key = torch.zeros(256, 8, 128, dtype=torch.bfloat16)
    kc = torch.zeros(64, 16, 8, 128, dtype=torch.bfloat16)
    slots = torch.arange(256)
    return reshape_and_cache(key, key, kc, torch.zeros_like(kc), slots, backend="triton")


def _mamba2(chunked: bool, tokens: int = 256, chunk: int | None = None) -> Callable[[], object]:
    from bench_kernels import MAMBA2_SHAPES, mamba2_prefill_inputs

    def run() -> object:
        args, _ = mamba2_prefill_inputs(1, tokens, MAMBA2_SHAPES["Bamba 9B"], None, "cpu")
        if not chunked:
            return ssd_scan_fn(*args, backend="triton")
        return ssd_chunk_scan_fn(*args, chunk_size=chunk, backend="triton")

    return run


def _mamba1(chunked: bool) -> Callable[[], object]:
    from bench_kernels import mamba1_prefill_inputs

    def run() -> object:
        args = mamba1_prefill_inputs(1, 256, torch.device("cpu"))
        op = selective_chunk_scan_fn if chunked else selective_scan_fn
        return op(*args, backend="triton")

    return run


def _norms(op: str) -> Callable[[], object]:
    from hybridkv.kernels import norms_triton

    def run() -> object:  # Gemma 3 27B: hidden 5,376, MLP 21,504, 32 q heads of 128
        if op == "add_rms_norm":
            x = torch.zeros(64, 5376, dtype=torch.bfloat16)
            s = torch.ones(5376)
            return norms_triton.add_rms_norm(x, x, s, s, 1e-6)
        if op == "norm_rope":
            q = torch.zeros(64, 32, 128, dtype=torch.bfloat16)
            cs = torch.zeros(64, 1, 128, dtype=torch.bfloat16)
            return norms_triton.norm_rope(q, torch.ones(128), cs, cs, 1e-6)
        if op == "rms_norm":  # Jamba: hidden 4,096
            x = torch.zeros(64, 4096, dtype=torch.bfloat16)
            return norms_triton.rms_norm(x, torch.ones(4096, dtype=torch.bfloat16), 1e-6)
        g = torch.zeros(64, 21504, dtype=torch.bfloat16)
        return norms_triton.gelu_tanh_mul(g, g)

    return run


CASES: dict[str, dict[str, Callable[[], object]]] = {
    "attention": {
        "decode 4 x 4k, 32 q / 8 KV heads, head 128, bf16": _attention([(4095, 1)] * 4),
        "decode 4 x 4k, split in 2 segments (as on CUDA)": _attention([(4095, 1)] * 4, segments=2),
        "decode, sliding window 1024": _attention([(4095, 1)] * 4, sliding_window=1024),
        "prefill 1 x 2k, head 128": _attention([(0, 2048)]),
        "mixed: 2k chunk on 2k + 4 decodes": _attention([(2048, 2048)] + [(4095, 1)] * 4),
        "prefill 1 x 1k, Gemma 3 270M (4 q / 1 KV, head 256)": _attention(
            [(0, 1024)], hq=4, hkv=1, d=256
        ),
    },
    "cache": {"reshape_and_cache, 256 tokens, 8 KV heads, head 128, bf16": _cache_write},
    "norms": {
        "add_rms_norm, Gemma 3 27B rows (5,376), bf16": _norms("add_rms_norm"),
        "norm_rope, 32 heads of 128, bf16": _norms("norm_rope"),
        "gelu_tanh_mul, Gemma 3 27B MLP (21,504), bf16": _norms("gelu_tanh_mul"),
        "rms_norm (Llama's), Jamba rows (4,096), bf16": _norms("rms_norm"),
    },
    "mamba2": {
        "Mamba2 chunked scan, Bamba 9B heads (128 x 64, d_state 128), bf16": _mamba2(True),
        "Mamba2 chunked scan at chunk 256 (blocks of 64), Bamba 9B heads": _mamba2(True, 512, 256),
        "Mamba2 sequential scan, Bamba 9B heads": _mamba2(False),
    },
    "mamba1": {
        "Mamba1 chunked scan, Jamba (d_inner 8192, d_state 16), bf16": _mamba1(True),
        "Mamba1 sequential scan, Jamba": _mamba1(False),
    },
}


def decode_variants(
    batches: tuple[int, ...] = (1, 2, 3, 15, 16, 17, 31, 32, 33, 40),
    contexts: tuple[int, ...] = (100, 1000, *range(2148, 35000, 2048)),
) -> dict[str, int]:
    """Binaries Triton compiles for one layer geometry's decode steps (32 q / 8 KV heads,
    head 128, bf16) over ``batches`` x ``contexts``, split-KV as on CUDA (the launch
    rule's segments): a compile is a stall of the step that meets it first."""
    from hybridkv.kernels.attention.launch_rules import BatchKind, auto_segments, tile_n

    seen: dict[str, set] = {}
    for batch in batches:
        for ctx in contexts:
            keys = tile_n(BatchKind.DECODE, 128, 2, ctx)
            segments = auto_segments(BatchKind.DECODE, ctx, H100_SMS, batch * 8, keys)
            for launch in capture(_attention([(ctx - 1, 1)] * batch, segments=segments)):
                seen.setdefault(launch.fn.__name__, set()).add(variant(launch))
    return {name: len(keys) for name, keys in sorted(seen.items())}


def report(groups: list[str]) -> list[Resources]:
    out: list[Resources] = []
    seen: set[tuple] = set()
    for group in groups:
        for case, run in CASES[group].items():
            for launch in capture(run):
                key = variant(launch)
                if key in seen:  # the same compile as an earlier case's
                    continue
                seen.add(key)
                out.append(resources(case, launch))
    return out


def table(rows: list[Resources]) -> list[str]:
    lines = [
        "| case | kernel | options | regs | stack bytes | smem bytes | tensor cores |",
        "| --- | --- | --- | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r.case} | `{r.kernel}` | {r.options} | {r.regs} | {r.stack:,} | "
            f"{r.smem:,} | {r.tensor_cores} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma list of {', '.join(CASES)}")
    ap.add_argument("--check", action="store_true", help="exit 1 if a rule uses local memory")
    ap.add_argument("--write", action="store_true", help=f"write {RESULTS.relative_to(ROOT)}")
    ap.add_argument(
        "--variants",
        action="store_true",
        help="also count the binaries decode steps of batch 1-40 at 100-33k tokens compile",
    )
    args = ap.parse_args(argv)
    groups = [g for g in args.cases.split(",") if g]
    unknown = [g for g in groups if g not in CASES]
    if unknown:
        print(f"unknown case group(s): {', '.join(unknown)} (known: {', '.join(CASES)})")
        return 2
    rows = report(groups)
    lines = table(rows)
    if args.variants:
        counts = decode_variants()
        lines += [
            "",
            "Binaries compiled for one layer geometry's decode steps, batch 1, 2, 3, 15, 16, 17, "
            "31, 32, 33 and 40 at 100, 1,000 and 2,148 to 32,868 tokens in steps of 2,048 (every "
            "split of 1 to 16 segments), split-KV as on CUDA: "
            + ", ".join(f"`{k}` {v}" for k, v in counts.items()),
        ]
    print("\n".join(lines))
    if args.write:
        head = [
            "# Triton kernels compiled for sm_90 (H100/H200), at the launchers' rules",
            "",
            f"Generated by `research/kernel_resources.py` on {datetime.date.today()}, "
            f"Triton {triton.__version__}, offline (no GPU): each case's op on CPU tensors "
            "with the launches intercepted, every launched kernel compiled for "
            '`GPUTarget("cuda", 90, 32)` and read with `cuobjdump -res-usage`. '
            "`stack`: local memory per thread (spills); `tensor cores`: the MMA "
            "instructions in the PTX. Register and spill counts, not timings: the "
            "timings are in `kernels-nvidia-h200.md`.",
            "",
        ]
        RESULTS.write_text("\n".join(head + lines) + "\n")
        print(f"wrote {RESULTS.relative_to(ROOT)}")
    spilled = [r for r in rows if r.stack and r.case not in ALLOWED_STACK]
    if args.check and spilled:
        for r in spilled:
            print(f"local memory: {r.kernel} ({r.case}): {r.stack} bytes per thread")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
