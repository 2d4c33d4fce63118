"""Decode attention's launches timed at the graphed Gemma 3 270M step's shape, beside
``decode_attention_bytes.py``'s predictions (``--measure`` there; issue 47).

Per variant (``decode_attention_bytes.VARIANTS``: the lease's plan, the span class,
the fill rule, tiles of 64 keys) one step's 18 attention calls (15 of a 512-key window,
3 full) over 18 separate bf16 K/V caches (the engine's: no layer hits another's K/V in
L2), 64 decodes at one context, planned as a graph plans them (host lengths the span
class, device lengths real), captured in one CUDA graph and replayed: microseconds per
step between two CUDA events. Each variant's outputs are compared with the first's
(every variant computes the same attention). Off CUDA the calls run once, eagerly,
under the interpreter: the code path only (``research/tests``), no timing worth reading.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hybridkv.kernels.attention import AttentionOptions, unified_attention

REPS = 20


def _layer(geo: Any, contexts: list[int], width: int, device: torch.device,
           gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(key, value, table) of one layer: each sequence its own blocks, shuffled; the
    table ``width`` blocks wide (a graph's: its span class's)."""
    bs = geo.block_size
    per = [-(-n // bs) for n in contexts]
    blocks = sum(per) + 1
    shape = (blocks, bs, geo.kv_heads, geo.head)
    k = torch.randn(shape, generator=gen, device=device, dtype=torch.bfloat16)
    v = torch.randn(shape, generator=gen, device=device, dtype=torch.bfloat16)
    ids = (torch.randperm(blocks - 1, generator=gen, device=device) + 1).tolist()
    table = torch.zeros(len(contexts), width, dtype=torch.int32)
    at = 0
    for i, n in enumerate(per):
        table[i, :n] = torch.tensor(ids[at : at + n], dtype=torch.int32)
        at += n
    return k, v, table


def step_fn(geo: Any, variant: Any, contexts: list[int], device: torch.device,
            seed: int = 0) -> tuple[Callable[[], None], list[torch.Tensor]]:  # fmt: skip
    """The step's attention calls for ``variant`` and the outputs they write: one cache
    and block table per layer (as separate KV cache groups), the same queries."""
    from decode_attention_bytes import metadata, table_width

    gen = torch.Generator(device=device).manual_seed(seed)  # K/V made on the device
    width = table_width(contexts, variant.span, geo.block_size)
    layers = [_layer(geo, contexts, width, device, gen) for _ in geo.windows]
    q = torch.randn(len(contexts), geo.heads, geo.head, generator=gen, device=device)
    q = q.to(torch.bfloat16)
    metas = [metadata(contexts, variant.span, t, device) for _, _, t in layers]
    opts = [AttentionOptions(scale=geo.head**-0.5, sliding_window=w) for w in geo.windows]
    outs = [torch.empty_like(q) for _ in geo.windows]

    def run() -> None:
        for (k, v, _), m, o, out in zip(layers, metas, opts, outs, strict=True):
            unified_attention(q, k, v, m, o, out=out, backend="triton", tiles=variant.tiles)

    return run, outs


def time_us(run: Callable[[], None], device: torch.device, reps: int = REPS) -> float:
    """Microseconds per call of ``run``: replayed from a CUDA graph on CUDA, else once."""
    if device.type != "cuda":
        t = time.perf_counter()
        run()
        return (time.perf_counter() - t) * 1e6
    run()  # compiles and plans
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / reps


def measure_lines(geo: Any, variants: Sequence[Any], predict_us: Callable[[Any, list[int]], float],
                  contexts: Sequence[int] = (276, 384), batch: int = 64,
                  device: torch.device | None = None) -> list[str]:  # fmt: skip
    """The measured table: per context and variant, us per step against the prediction."""
    from decode_attention_bytes import programs_per_sm

    dev = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU (interpreter)"
    lines = [f"### Measured on {name}: 18 layers' attention in one CUDA graph, us per step",
             "", "| contexts | variant | measured | predicted | measured / predicted | "
             "max abs diff vs the first variant |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for n in contexts:
        ctx = [n] * batch
        first: list[torch.Tensor] | None = None
        for v in variants:
            with programs_per_sm(v.per_sm):  # the plan is made (and cached) in here
                run, outs = step_fn(geo, v, ctx, dev)
                us = time_us(run, dev)
            if first is None:
                first = [o.float().cpu() for o in outs]
            diff = max(
                (o.float().cpu() - f).abs().max().item() for o, f in zip(outs, first, strict=True)
            )
            pred = predict_us(v, ctx)
            lines.append(f"| {batch} x {n} | {v.name} | {us:.1f} | {pred:.1f} | "
                         f"{us / pred:.2f}x | {diff:.2e} |")  # fmt: skip
    return lines
