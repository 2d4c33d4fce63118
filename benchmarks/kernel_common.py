"""Timing and input helpers shared by the kernel benchmarks (``bench_kernels.py``)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from hybridkv.kernels import AttentionMetadata, AttentionOptions

KINDS = {"full": {}, "sliding 1024": {"sliding_window": 1024}, "chunked 8192": {"chunk_size": 8192}}


def _event_seconds(fn: Callable[[], object], device: torch.device, calls: int, reps: int) -> float:
    """Median seconds per call of ``calls`` calls between two CUDA events (on the CPU:
    wall time), over ``reps`` repetitions."""
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3 / calls)
        else:
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            times.append((time.perf_counter() - t0) / calls)
    return statistics.median(times)


def timed(fn: Callable[[], object], device: torch.device, reps: int = 20, warmup: int = 3) -> float:
    """Median seconds of ``fn`` over ``reps`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    return _event_seconds(fn, device, 1, reps)


def timed_back_to_back(
    fn: Callable[[], object], device: torch.device, calls: int = 32, reps: int = 20
) -> float:
    """Median seconds per call of ``calls`` calls enqueued back to back between two
    events, as a step's layers run: ``max(host cost, GPU time)`` per call, where
    ``timed`` (one call between its events) gives host cost + launch latency + GPU
    time. On the CPU: wall time per call."""
    fn()
    return _event_seconds(fn, device, calls, reps)


def graph_seconds(
    fn: Callable[[], object], device: torch.device, calls: int = 16, reps: int = 10
) -> tuple[float | None, str]:
    """``(median seconds per call, '')`` of ``calls`` calls replayed from one CUDA graph:
    the GPU's time alone, without the host's cost per launch (how the engine's decode
    steps run, ``LLM(cuda_graphs=True)``); ``(None, why)`` when the calls cannot be
    captured (on the CPU: no graphs)."""
    if device.type != "cuda":
        return None, "no CUDA graphs on the CPU"
    from hybridkv.engine.graphs import CudaGraph

    def run() -> None:
        for _ in range(calls):
            fn()

    graph = CudaGraph(device, pool=None)
    try:
        graph.capture(run)  # warmed up first: compiles and plans stay out of it
    except Exception as e:  # reported in the table's cell, never hidden
        torch.cuda.synchronize(device)
        return None, f"{type(e).__name__}: {e}".splitlines()[0][:80]
    graph.replay()
    return _event_seconds(graph.replay, device, 1, reps) / calls, ""


def host_seconds(fn: Callable[[], object], device: torch.device, calls: int = 32) -> float:
    """Median host seconds per call (``perf_counter`` around ``calls`` enqueues, the
    device synchronized only after): the launch side's cost, whatever the GPU does."""
    fn()
    times = []
    for _ in range(5):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return statistics.median(times)


def copy_bandwidth(device: torch.device) -> float:
    """Device-to-device copy bandwidth (bytes read + written per second)."""
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * n / timed(lambda: dst.copy_(src), device)


def paged_decode(batch: int, ctx: int, hq: int, hkv: int, d: int, bs: int, dtype, device):
    """Random paged caches for ``batch`` decodes at context ``ctx`` (shuffled blocks)."""
    per = -(-ctx // bs)
    nb = batch * per + 1
    k = torch.randn(nb, bs, hkv, d, device=device, dtype=dtype)
    v = torch.randn_like(k)
    table = (torch.randperm(nb - 1, device=device)[: batch * per] + 1).view(batch, per)
    meta = AttentionMetadata.build([1] * batch, [ctx] * batch, table.int(), device=device)
    q = torch.randn(batch, hq, d, device=device, dtype=dtype)
    return q, k, v, meta


def visible_keys(ctx: int, kind: dict) -> int:
    last = ctx - 1
    lo = AttentionOptions(scale=1.0, **kind).first_visible_key(last)
    return ctx - lo


def from_idle_seconds(
    fn: Callable[[], object], device: torch.device, reps: int = 10, *, until_done: bool
) -> float:
    """Median host seconds of one ``fn`` started on an idle device: until it returns
    (what issuing it costs), or with ``until_done`` until the device is idle again."""
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if until_done and device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return statistics.median(times)
