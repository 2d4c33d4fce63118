#!/usr/bin/env python3
"""Kernel benchmark: paged attention and Mamba state updates against same-process baselines.

On a CUDA GPU (the issue's targets):

- **decode**: achieved bandwidth of ``unified_attention`` (KV bytes actually
  read / time; for sliding and chunked layers only the keys inside the window
  or chunk count) as a fraction of the device-to-device copy bandwidth
  measured in the same process; batch 1 to 256, context 2k / 8k / 32k, 32
  query heads over 8 KV heads, head 128, bf16, block size 16; full, sliding
  (W = 1024) and chunked (C = 8192). Target: >= 60% at >= 2k context.
  ``torch`` SDPA on contiguous K/V of the same shapes is shown beside it.
- **prefill** and **mixed batches**: time of ``unified_attention`` on fresh
  prompts, and on a prefill chunk plus decodes in one launch, against
  ``scaled_dot_product_attention`` with the flash backend for the same work
  (target: within 1.5x).
- **reshape_and_cache**: bytes read and written per second against the copy
  bandwidth (target: >= 70%).
- **where a small call's time goes**: a lone call, calls back to back (as the
  layers of a step), the host's time per call, and apart, the per-step costs
  (metadata build, first call on new metadata) that the rows above exclude.
- **Mamba decode**: our Triton ``selective_state_update`` / ``ssd_state_update``
  against mamba-ssm's Triton kernel, where mamba-ssm is installed.
- **Mamba2 prefill**: the chunked SSD scan ``ssd_chunk_scan_fn`` against the
  sequential ``ssd_scan_fn`` (target: >= 10x at 4k tokens) and mamba-ssm's
  ``mamba_chunk_scan_combined`` where it imports (target: within 1.5x); bf16,
  Bamba-9B and Mamba2-2.7B head shapes, 1k/4k tokens and a batch of 8 x 512.
- **Mamba1 prefill**: ``selective_chunk_scan_fn`` against the sequential
  ``selective_scan_fn`` at Jamba's shape (d_inner 8192, d_state 16).

The attention and cache-write rows live in ``kernel_attention_gpu.py``. On
the CPU it runs the torch reference (the engine's CPU backend) against SDPA on
contiguous tensors for small-model shapes (Gemma 3 270M: 4 query heads, 1 KV
head, head 256) and says that the GPU figures are pending.

    .venv/bin/python benchmarks/bench_kernels.py [--write]
        # --write: benchmarks/results/kernels-<device>.md
"""

from __future__ import annotations

import argparse
import platform
import sys
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kernel_attention_gpu import (  # noqa: E402
    cache_write_rows,
    call_cost_rows,
    decode_rows,
    mixed_rows,
    prefill_rows,
)
from kernel_common import (  # noqa: E402
    copy_bandwidth,
    graph_seconds,
    paged_decode,
    timed,
    visible_keys,
)

from hybridkv.kernels import AttentionMetadata, AttentionOptions, unified_attention  # noqa: E402


def cpu_rows() -> list[str]:
    """Torch reference (paged) vs SDPA on contiguous K/V, Gemma 3 270M shapes."""
    dev = torch.device("cpu")
    rows = []
    hq, hkv, d, bs = 4, 1, 256, 16
    for dtype in (torch.float32, torch.bfloat16):
        for name, kind, batch, ctx in (
            ("decode, full", {}, 16, 1024),
            ("decode, sliding 512", {"sliding_window": 512}, 16, 1024),
        ):
            opts = AttentionOptions(scale=d**-0.5, **kind)
            q, k, v, meta = paged_decode(batch, ctx, hq, hkv, d, bs, dtype, dev)
            t = timed(partial(unified_attention, q, k, v, meta, opts), dev)
            n = visible_keys(ctx, kind)
            kc = torch.randn(batch, hq, n, d, dtype=dtype)
            vc = torch.randn_like(kc)
            qc = q.view(batch, hq, 1, d)
            ts = timed(partial(F.scaled_dot_product_attention, qc, kc, vc), dev)
            rows.append(
                f"| {name} | {str(dtype)[6:]} | {batch} x {ctx:,} | {t * 1e3:.2f} | "
                f"{ts * 1e3:.2f} | {t / ts:.2f}x |"
            )
            print(rows[-1], flush=True)
        length = 512
        per = length // bs
        k = torch.randn(per + 1, bs, hkv, d, dtype=dtype)
        v = torch.randn_like(k)
        table = torch.arange(1, per + 1, dtype=torch.int32)[None]
        meta = AttentionMetadata.build([length], [length], table)
        q = torch.randn(length, hq, d, dtype=dtype)
        opts = AttentionOptions(scale=d**-0.5)
        t = timed(partial(unified_attention, q, k, v, meta, opts), dev)
        qs = torch.randn(1, hq, length, d, dtype=dtype)
        ks = torch.randn_like(qs)
        ts = timed(partial(F.scaled_dot_product_attention, qs, ks, ks, is_causal=True), dev)
        rows.append(
            f"| prefill, full | {str(dtype)[6:]} | 1 x {length} | {t * 1e3:.2f} | "
            f"{ts * 1e3:.2f} | {t / ts:.2f}x |"
        )
        print(rows[-1], flush=True)
    return rows


def mamba_inputs(batch: int, d_inner: int, d_state: int, device: torch.device, dtype):
    """Mamba1 decode inputs (Jamba shapes) with ``batch`` state slots after a null slot."""
    g = torch.Generator(device=device).manual_seed(0)

    def r(*shape: int, dt=dtype) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device=device, dtype=dt)

    state = r(batch + 1, d_inner, d_state, dt=torch.float32)
    a = -torch.rand(d_inner, d_state, generator=g, device=device)
    idx = torch.randperm(batch, device=device).int() + 1
    return (
        state,
        r(batch, d_inner),
        r(batch, d_inner),
        a,
        r(batch, d_state),
        r(batch, d_state),
        r(d_inner, dt=torch.float32),
        r(batch, d_inner),
        r(d_inner, dt=torch.float32),
        idx,
    )


def _ours_mamba(args: tuple, backend: str) -> None:
    from hybridkv.kernels.mamba import selective_state_update

    st, x, dt, a, b, c, d, z, dtb, idx = args
    selective_state_update(st, x, dt, a, b, c, d, z, dtb, True, state_indices=idx, backend=backend)


def _their_mamba_ref(ops, args: tuple) -> None:
    # mamba-ssm's reference updates a dense [batch, ...] state: gather and scatter the slots.
    st, x, dt, a, b, c, d, z, dtb, idx = args
    s = st[idx.long()]
    ops.selective_state_update_ref(s, x, dt, a, b, c, d, z, dtb, dt_softplus=True)
    st[idx.long()] = s


def mamba_rows(device: torch.device) -> list[str]:
    """Mamba1 decode step: ours vs mamba-ssm (its Triton kernel on GPU, its ref on CPU)."""
    from hybridkv.kernels.mamba import load_mamba_ssm, mamba_ssm_available

    if not mamba_ssm_available():
        return ["| (mamba-ssm not installed: `make mamba`) | | | | |"]
    ops = load_mamba_ssm()
    rows = []
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    for batch, d_inner in ((16, 8192), (64, 8192)) if cuda else ((8, 512), (64, 2048)):
        args = mamba_inputs(batch, d_inner, 16, device, dtype)
        ours = "triton" if cuda else "torch"
        t = timed(partial(_ours_mamba, args, ours), device)
        if cuda:
            base = "mamba-ssm Triton"
            tb = timed(partial(_ours_mamba, args, "mamba_ssm"), device)
        else:
            base = "mamba-ssm torch ref"
            tb = timed(partial(_their_mamba_ref, ops, args), device)
        rows.append(f"| {ours} vs {base} | {batch} x {d_inner} | {t * 1e6:.1f} | "
                    f"{tb * 1e6:.1f} | {t / tb:.2f}x |")  # fmt: skip
        print(rows[-1], flush=True)
    return rows


# H, P, G, N: Bamba 9B's mamba_n_heads is 128 (configs/bamba-9b.yaml; d_inner 8192),
# Mamba2 2.7B's d_inner 5120 is 80 heads of 64.
MAMBA2_SHAPES = {"Bamba 9B": (128, 64, 1, 128), "Mamba2 2.7B": (80, 64, 1, 128)}
MAMBA_SSM_CHUNK = 256  # the chunk size of mamba-ssm's Mamba2 checkpoints


def mamba2_prefill_inputs(
    seqs: int, length: int, shape: tuple[int, int, int, int], block: int | None, device
) -> tuple[list, torch.Tensor]:
    """``ssd_scan_fn`` arguments for ``seqs`` fresh prompts of ``length`` tokens (bf16).

    Each sequence saves its final state and, with ``block``, a checkpoint
    after every ``block`` tokens (as the engine does with prefix caching).
    Returns the argument list and the saving tokens.
    """
    heads, head_dim, groups, d_state = shape
    n = seqs * length
    g = torch.Generator(device=device).manual_seed(0)

    def r(*dims: int, dt=torch.bfloat16) -> torch.Tensor:
        return torch.randn(*dims, generator=g, device=device, dtype=dt)

    pos = torch.arange(n, device=device) % length
    saving = (pos == length - 1) | ((pos + 1) % block == 0 if block else False)
    tokens = torch.nonzero(saving).flatten()
    save = torch.full((n,), -1, dtype=torch.int32, device=device)
    save[tokens] = torch.arange(1, tokens.numel() + 1, dtype=torch.int32, device=device)
    state = torch.zeros((tokens.numel() + 1, heads, head_dim, d_state), device=device)
    qsl = torch.arange(0, n + 1, length, dtype=torch.int32, device=device)
    init = torch.full((seqs,), -1, dtype=torch.int32, device=device)
    a = -torch.rand(heads, generator=g, device=device) - 0.5
    args = [
        r(n, heads, head_dim),
        r(n, heads),
        a,
        r(n, groups, d_state),
        r(n, groups, d_state),
        r(heads, dt=torch.float32),
        r(n, heads, head_dim),
        r(heads, dt=torch.float32) * 0.1,
        True,
        state,
        qsl,
        init,
        save,
    ]
    return args, tokens


def _their_chunk_scan(ops, args: list, seqs: int) -> None:
    # mamba-ssm's batch layout (equal lengths): final states only, no checkpoints.
    x, dt, a, b, c, d, z, dtb = args[:8]

    def bl(t: torch.Tensor) -> torch.Tensor:
        return t.view(seqs, -1, *t.shape[1:])

    ops.mamba_chunk_scan_combined(
        bl(x),
        bl(dt),
        a,
        bl(b),
        bl(c),
        MAMBA_SSM_CHUNK,
        D=d,
        z=bl(z),
        dt_bias=dtb,
        dt_softplus=True,
        return_final_states=True,
    )


#: Our chunk sizes timed per case: the rule's (``DEFAULT_CHUNK_SIZE``, 64) and mamba-ssm's
#: (issue 47: at 64 the fp32 per-chunk states move ~4x the bytes, research/mamba_scan_bytes.py).
OUR_CHUNKS = (64, 256)


def mamba2_prefill_rows(device: torch.device, quick: bool) -> list[str]:
    """Chunked (per ``OUR_CHUNKS``) vs sequential Mamba2 prefill scan (and mamba-ssm's,
    where it imports, timed once per case)."""
    from hybridkv.kernels.mamba import (
        load_mamba_ssm,
        mamba_ssm_available,
        ssd_chunk_scan_fn,
        ssd_scan_fn,
    )

    ops = load_mamba_ssm() if mamba_ssm_available() else None
    cases = [(1, 1024, None), (1, 4096, None), (8, 512, None), (1, 4096, 256)]
    rows = []
    for name, shape in MAMBA2_SHAPES.items():
        for seqs, length, block in cases[:2] if quick else cases:
            args, _ = mamba2_prefill_inputs(seqs, length, shape, block, device)
            ts = timed(partial(ssd_scan_fn, *args, backend="triton"), device, reps=5)
            tm = gm = None
            why_m = "not installed" if ops is None else "no checkpoints"
            if ops is not None and block is None:
                call = partial(_their_chunk_scan, ops, args, seqs)
                tm = timed(call, device)
                gm, why_m = graph_seconds(call, device, calls=4)
            for q in OUR_CHUNKS:
                ours = partial(ssd_chunk_scan_fn, *args, chunk_size=q, backend="triton")
                tc = timed(ours, device)
                gc, why = graph_seconds(ours, device, calls=4)
                graphed = f"{gc * 1e3:.3f}" if gc else f"n/a ({why})"
                # mamba-ssm: (ms, ours / its) plain, then (ms, ours / its) in a graph.
                theirs = [f"n/a ({why_m})", "", "n/a", ""]
                if tm is not None:
                    theirs = [f"{tm * 1e3:.3f}", f"{tc / tm:.2f}x",
                              f"{gm * 1e3:.3f}" if gm else f"n/a ({why_m})",
                              f"{gc / gm:.2f}x" if gc and gm else ""]  # fmt: skip
                saves = f"every {block} + final" if block else "final"
                cells = [name, f"{seqs} x {length:,}", saves, str(q), f"{ts * 1e3:.3f}",
                         f"{tc * 1e3:.3f}", f"{ts / tc:.1f}x", *theirs[:2], graphed,
                         *theirs[2:]]  # fmt: skip
                rows.append("| " + " | ".join(cells) + " |")
                print(rows[-1], flush=True)
    return rows


def mamba1_prefill_inputs(
    seqs: int, length: int, device: torch.device, d_inner: int = 8192, d_state: int = 16
) -> list:
    """``selective_scan_fn`` arguments (default: Jamba's d_inner 8192, d_state 16; bf16),
    final saves."""
    n = seqs * length
    g = torch.Generator(device=device).manual_seed(0)

    def r(*dims: int, dt=torch.bfloat16) -> torch.Tensor:
        return torch.randn(*dims, generator=g, device=device, dtype=dt)

    save = torch.full((n,), -1, dtype=torch.int32, device=device)
    save[length - 1 :: length] = torch.arange(1, seqs + 1, dtype=torch.int32, device=device)
    a = -torch.rand(d_inner, d_state, generator=g, device=device) - 0.5
    return [
        r(n, d_inner),
        r(n, d_inner),
        a,
        r(n, d_state),
        r(n, d_state),
        r(d_inner, dt=torch.float32),
        r(n, d_inner),
        r(d_inner, dt=torch.float32) * 0.1,
        True,
        torch.zeros((seqs + 1, d_inner, d_state), device=device),
        torch.arange(0, n + 1, length, dtype=torch.int32, device=device),
        torch.full((seqs,), -1, dtype=torch.int32, device=device),
        save,
    ]


def mamba1_prefill_rows(device: torch.device, quick: bool) -> list[str]:
    """Chunked vs sequential Mamba1 prefill scan at Jamba's shape."""
    from hybridkv.kernels.mamba import selective_chunk_scan_fn, selective_scan_fn

    rows = []
    for seqs, length in ((1, 1024), (1, 4096)) if quick else ((1, 1024), (1, 4096), (8, 512)):
        args = mamba1_prefill_inputs(seqs, length, device)
        ts = timed(partial(selective_scan_fn, *args, backend="triton"), device, reps=5)
        tc = timed(partial(selective_chunk_scan_fn, *args, backend="triton"), device)
        rows.append(f"| {seqs} x {length:,} | {ts * 1e3:.3f} | {tc * 1e3:.3f} | {ts / tc:.1f}x |")
        print(rows[-1], flush=True)
    return rows


def skip_rows() -> list[str]:
    """Tiles outside the window are skipped: interpreter time vs context at a fixed window.

    Under ``TRITON_INTERPRET=1`` each visited tile costs milliseconds, so if the
    kernel only masked out-of-window tiles, 16x the context would take about 16x
    the time; skipping keeps it flat.
    """
    import os

    if os.environ.get("TRITON_INTERPRET") != "1":
        return ["| (run with TRITON_INTERPRET=1 to measure) | | | |"]
    dev = torch.device("cpu")
    rows = []
    for name, kind in (("sliding 64", {"sliding_window": 64}), ("chunked 64", {"chunk_size": 64})):
        opts = AttentionOptions(scale=0.25, **kind)
        times = []
        for ctx in (256, 4096):
            q, k, v, meta = paged_decode(2, ctx, 4, 2, 16, 16, torch.float32, dev)
            run = partial(unified_attention, q, k, v, meta, opts, backend="triton")
            times.append(timed(run, dev, reps=3))
        rows.append(
            f"| {name} | {times[0] * 1e3:.1f} | {times[1] * 1e3:.1f} | {times[1] / times[0]:.2f}x |"
        )
        print(rows[-1], flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true", help="write benchmarks/results/kernels-*.md")
    ap.add_argument("--quick", action="store_true", help="fewer shapes")
    args = ap.parse_args()
    torch.manual_seed(0)
    lines: list[str] = []
    if torch.cuda.is_available():
        dev = torch.device("cuda")
        name = torch.cuda.get_device_name(dev)
        bw = copy_bandwidth(dev)
        print(f"{name}: device-to-device copy {bw / 1e9:.0f} GB/s", flush=True)
        lines += [f"# Kernel benchmark on {name}", "",
                  f"torch {torch.__version__}; measured copy bandwidth {bw / 1e9:.0f} GB/s "
                  "(bytes read + written per second).", "",
                  "## Decode (bf16, 32 q heads / 8 KV heads, head 128, block 16)", "",
                  "Bytes: the K/V the kernel must read (inside the window or chunk). Target: "
                  ">= 60 % of the copy bandwidth at >= 2k context; batch x context above "
                  "64 x 32k left out (memory). *Ours*: one call between two CUDA events "
                  "(the host's launch cost included); *in a graph*: per call of 16 replayed "
                  "from one CUDA graph, the GPU's time alone (how the engine's decode steps "
                  "run with `cuda_graphs=True`).", "",
                  "| kind | batch | context | ours us | ours GB/s | ours / copy bw | "
                  "in a graph us | in a graph / copy bw | SDPA contiguous us | SDPA / copy bw |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
        lines += decode_rows(dev, bw, args.quick)
        lines += ["", "## Prefill (bf16, fresh prompts)", "",
                  "| kind | batch x length | ours ms | SDPA flash (full causal) ms | ratio |",
                  "| --- | --- | --- | --- | --- |"]  # fmt: skip
        lines += prefill_rows(dev, args.quick)
        lines += ["", "## Mixed batch (bf16, full attention): a prefill chunk on a cached prefix "
                  "plus decodes, one launch", "",
                  "SDPA: the chunk (causal, bottom-right aligned, flash) and the decodes on "
                  "contiguous K/V, timed apart and added. Target: within 1.5x.", "",
                  "| chunk on prefix + decodes x context | ours ms | SDPA ms | ratio |",
                  "| --- | --- | --- | --- |"]  # fmt: skip
        lines += mixed_rows(dev, args.quick)
        lines += ["", "## reshape_and_cache (bf16, 8 KV heads x 128, block 16, shuffled slots)", "",
                  "Bytes: K and V read and written. Target: >= 70 % of the copy bandwidth.", "",
                  "| new tokens | us | GB/s | / copy bw |",
                  "| --- | --- | --- | --- |"]  # fmt: skip
        lines += cache_write_rows(dev, bw, args.quick)
        lines += ["", "## Where a small call's time goes (bf16 decodes, 32 q / 8 KV heads, "
                  "head 128; reshape_and_cache of 256 tokens)", "",
                  "Per call: *alone* between two CUDA events (as the tables above), *back to "
                  "back* (32 calls enqueued in a row, as a step's layers: max(host, GPU) per "
                  "call), *host* (perf_counter around 32 enqueues), *synced* (host time until "
                  "the GPU is done). Per step and KV cache group, not per layer: "
                  "`AttentionMetadata.build` (host-to-device copies included) and the first "
                  "call on new metadata (it plans the launches; synced). The decode rows above "
                  "reuse one metadata, so they never include these.", "",
                  "| call | alone us | back to back us/call | host us/call | synced us | "
                  "per step: metadata build us | per step: first call synced us |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
        lines += call_cost_rows(dev, args.quick)
        lines += ["", "## Mamba1 decode step (selective_state_update, d_state 16, bf16)", "",
                  "| backends | batch x d_inner | ours us | baseline us | ratio |",
                  "| --- | --- | --- | --- | --- |"]  # fmt: skip
        lines += mamba_rows(dev)
        lines += ["", "## Mamba2 prefill scan (bf16 activations, fp32 states, fresh prompts)", "",
                  "Ours: chunks of 64 (the rule) and 256, tf32x3 dots; mamba-ssm: "
                  f"`mamba_chunk_scan_combined`, chunk {MAMBA_SSM_CHUNK}, batch layout, final "
                  "states only. *In a graph*: per call of 4 replayed from one CUDA graph, the "
                  "GPU's time without the host's (launches, `chunk_layout`'s torch ops).", "",
                  "| heads | seqs x tokens | saves | chunk | sequential ms | chunked ms | "
                  "sequential / chunked | mamba-ssm ms | chunked / mamba-ssm | "
                  "chunked in a graph ms | mamba-ssm in a graph ms | in a graph: chunked / "
                  "mamba-ssm |",
                  "| --- " * 12 + "|"]  # fmt: skip
        lines += mamba2_prefill_rows(dev, args.quick)
        lines += ["", "## Mamba1 prefill scan (bf16, d_inner 8192, d_state 16, fresh prompts)", "",
                  "| seqs x tokens | sequential ms | chunked ms | sequential / chunked |",
                  "| --- | --- | --- | --- |"]  # fmt: skip
        lines += mamba1_prefill_rows(dev, args.quick)
        out = ROOT / "benchmarks" / "results" / f"kernels-{name.replace(' ', '-').lower()}.md"
    else:
        dev = torch.device("cpu")
        print(
            "No CUDA device: GPU figures (decode bandwidth, prefill vs flash SDPA, Mamba vs "
            "mamba-ssm) are pending. Running the torch reference (the CPU backend)."
        )
        cpu = platform.processor() or platform.machine()
        lines += ["# Kernel benchmark on the CPU", "",
                  f"{cpu}, {torch.get_num_threads()} threads, torch {torch.__version__}. "
                  "No GPU was available: the GPU targets (decode bandwidth, prefill vs flash "
                  "SDPA, Mamba vs mamba-ssm) are pending.", "",
                  "## Torch reference (paged) vs SDPA on contiguous K/V, Gemma 3 270M shapes", "",
                  "| case | dtype | batch x context | paged reference ms | SDPA contiguous ms | "
                  "ratio |", "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
        lines += cpu_rows()
        lines += ["", "## Mamba1 decode step on the CPU (fp32, d_state 16, state slots)", "",
                  "| backends | batch x d_inner | ours us | baseline us | ratio |",
                  "| --- | --- | --- | --- | --- |"]  # fmt: skip
        lines += mamba_rows(dev)
        lines += [
            "",
            "## Mamba1 and Mamba2 prefill scans",
            "",
            "Chunked vs sequential Triton scans (and mamba-ssm's): GPU only, pending.",
        ]
        lines += ["", "## Tile skipping (Triton interpreter, decode of 2 sequences)", "",
                  "Time with 16x more context at a fixed window or chunk; ~1x means the "
                  "kernel skips out-of-window tiles rather than masking them.", "",
                  "| kind | context 256 ms | context 4,096 ms | ratio |",
                  "| --- | --- | --- | --- |"]  # fmt: skip
        lines += skip_rows()
        out = ROOT / "benchmarks" / "results" / "kernels-cpu.md"
    if args.write:
        out.write_text("\n".join(lines) + "\n")
        print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
