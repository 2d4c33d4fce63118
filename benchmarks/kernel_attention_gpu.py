"""The attention and cache-write rows of ``bench_kernels.py`` on a GPU (issue 16's targets).

- ``decode_rows``: paged decode at 2k, 8k and 32k context, batch 1 to 256 (pairs
  holding more than ``MAX_DECODE_TOKENS`` keys are left out: K/V plus the SDPA
  baseline's copy must fit an 80 GB GPU), full, sliding 1024 and chunked 8192;
  achieved bandwidth on the K/V bytes the kernel must read, as a share of the
  measured copy bandwidth (target >= 60 %, aim 80 %). At a fixed window or chunk the
  8k and 32k rows show that cost follows the window, not the context.
- ``prefill_rows``: fresh prompts against flash SDPA (target within 1.5x).
- ``mixed_rows``: one batch of a prefill chunk on a cached prefix plus decodes,
  against SDPA for the same work (a causal prefill plus the decodes on contiguous
  K/V, timed apart and added up; target within 1.5x).
- ``cache_write_rows``: ``reshape_and_cache`` bytes read and written per second as a
  share of the copy bandwidth (target >= 70 %).
- ``call_cost_rows``: where a small call's time goes. ``decode_rows`` times each
  call alone between two CUDA events (host cost + launch latency + GPU time: what
  a lone call costs); the engine enqueues one call per layer back to back, so
  this also gives the time per call of 32 calls in a row, the host's own time per
  call, and apart from these, what the engine pays once per step and KV cache
  group rather than per layer: ``AttentionMetadata.build`` (its host-to-device
  copies) and the first call on new metadata (it plans the launches,
  ``launcher.py``). The decode rows never include those per-step costs: their
  metadata is built before the timing and reused by every timed call.

Every function takes its shapes as arguments with the issue's as defaults, so
``tests/test_bench_kernels_rows.py`` runs them at tiny sizes on the CPU
(Triton's interpreter) to keep this GPU-only code working.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from kernel_common import (
    KINDS,
    from_idle_seconds,
    graph_seconds,
    host_seconds,
    paged_decode,
    timed_back_to_back,
    visible_keys,
)
from kernel_common import timed as _timed

from hybridkv.kernels import AttentionMetadata, AttentionOptions, reshape_and_cache
from hybridkv.kernels import unified_attention as _attention

DECODE_CONTEXTS = (2048, 8192, 32768)
DECODE_BATCHES = (1, 16, 64, 256)
#: Largest batch x context timed (64 x 32k: 8.6 GB of bf16 K/V at 8 KV heads x 128).
MAX_DECODE_TOKENS = 64 * 32768
#: ``(chunk, cached prefix, decodes, decode context)`` of the mixed batches.
MIXED_CASES = ((2048, 2048, 64, 8192), (512, 30000, 16, 32768))
#: Timed calls per figure and warm-up calls before them (tests lower them).
REPS, WARMUP = 20, 3
#: 32 query heads over 8 KV heads of 128 (Llama 3 8B, Jamba, Scout's KV), block 16.
GEOMETRY = (32, 8, 128, 16)


def unified_attention(*args, **kwargs):  # type: ignore[no-untyped-def]
    """The op on the Triton backend (the benchmark times Triton, also under the interpreter)."""
    return _attention(*args, backend="triton", **kwargs)


def timed(fn, device: torch.device) -> float:  # type: ignore[no-untyped-def]
    return _timed(fn, device, REPS, WARMUP)


def _emit(rows: list[str], line: str) -> None:
    """Keep ``line`` for the report and show it now (a sweep runs for minutes)."""
    rows.append(line)
    print(line, flush=True)


def _free(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def decode_rows(
    device: torch.device,
    bw: float,
    quick: bool,
    contexts: tuple[int, ...] = DECODE_CONTEXTS,
    batches: tuple[int, ...] = DECODE_BATCHES,
    max_tokens: int = MAX_DECODE_TOKENS,
    geometry: tuple[int, int, int, int] = GEOMETRY,
) -> list[str]:
    rows = []
    hq, hkv, d, bs = geometry
    if quick:
        contexts, batches = contexts[:2], batches[1:3]
    for name, kind in KINDS.items():
        opts = AttentionOptions(scale=d**-0.5, **kind)
        for batch in batches:
            for ctx in contexts:
                if batch * ctx > max_tokens:
                    continue
                q, k, v, meta = paged_decode(batch, ctx, hq, hkv, d, bs, torch.bfloat16, device)
                call = partial(unified_attention, q, k, v, meta, opts)
                t = timed(call, device)
                tg, why = graph_seconds(call, device)
                del k, v, call
                n = visible_keys(ctx, kind)
                nbytes = batch * n * hkv * d * 2 * 2
                # Baseline: SDPA over contiguous K/V holding exactly the visible keys.
                kc = torch.randn(batch, hkv, n, d, device=device, dtype=torch.bfloat16)
                vc = torch.randn_like(kc)
                qc = q.view(batch, hq, 1, d)
                ts = timed(
                    partial(F.scaled_dot_product_attention, qc, kc, vc, enable_gqa=True), device
                )
                del kc, vc
                _free(device)
                _emit(
                    rows,
                    f"| {name} | {batch} | {ctx:,} | {t * 1e6:.1f} | {nbytes / t / 1e9:.0f} | "
                    f"{nbytes / t / bw:.0%} | "
                    + (f"{tg * 1e6:.1f} | {nbytes / tg / bw:.0%} | " if tg else f"n/a ({why}) | | ")
                    + f"{ts * 1e6:.1f} | {nbytes / ts / bw:.0%} |",
                )
    return rows


def _sdpa_flash(device: torch.device):  # type: ignore[no-untyped-def]
    """A context manager that pins SDPA to flash attention on CUDA (any backend elsewhere)."""
    from contextlib import nullcontext

    if device.type != "cuda":
        return nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.FLASH_ATTENTION)


def _paged_prompts(
    lens: list[tuple[int, int]], geometry: tuple[int, int, int, int], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, AttentionMetadata]:
    """bf16 paged K/V and queries for ``(context, new tokens)`` per sequence."""
    hq, hkv, d, bs = geometry
    per = [-(-(c + n) // bs) for c, n in lens]
    nb = sum(per) + 1
    kc = torch.randn(nb, bs, hkv, d, device=device, dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    ids = torch.randperm(nb - 1, device=device) + 1
    table = torch.zeros(len(lens), max(per), dtype=torch.int32, device=device)
    at = 0
    for i, p in enumerate(per):
        table[i, :p] = ids[at : at + p]
        at += p
    meta = AttentionMetadata.build([n for _, n in lens], [c + n for c, n in lens], table, device)
    q = torch.randn(sum(n for _, n in lens), hq, d, device=device, dtype=torch.bfloat16)
    return q, kc, vc, meta


def prefill_rows(
    device: torch.device,
    quick: bool,
    cases: tuple[tuple[int, int], ...] = ((1, 2048), (4, 2048), (1, 8192)),
    geometry: tuple[int, int, int, int] = GEOMETRY,
) -> list[str]:
    rows = []
    hq, _, d, _ = geometry
    for batch, length in cases[:1] if quick else cases:
        q, kc, vc, meta = _paged_prompts([(0, length)] * batch, geometry, device)
        qs = torch.randn(batch, hq, length, d, device=device, dtype=torch.bfloat16)
        ks = torch.randn(batch, hq, length, d, device=device, dtype=torch.bfloat16)
        vs = torch.randn_like(ks)
        with _sdpa_flash(device):
            ts = timed(partial(F.scaled_dot_product_attention, qs, ks, vs, is_causal=True), device)
        for name, kind in KINDS.items():
            opts = AttentionOptions(scale=d**-0.5, **kind)
            t = timed(partial(unified_attention, q, kc, vc, meta, opts), device)
            _emit(
                rows,
                f"| {name} | {batch} x {length:,} | {t * 1e3:.3f} | {ts * 1e3:.3f} | "
                f"{t / ts:.2f}x |",
            )
        del q, kc, vc, qs, ks, vs
        _free(device)
    return rows


def mixed_rows(
    device: torch.device,
    quick: bool,
    cases: tuple[tuple[int, int, int, int], ...] = MIXED_CASES,
    geometry: tuple[int, int, int, int] = GEOMETRY,
) -> list[str]:
    """``(chunk, cached prefix, decodes, decode context)`` per case: one batch."""
    rows = []
    hq, hkv, d, _ = geometry
    for chunk, prefix, decodes, ctx in cases[:1] if quick else cases:
        lens = [(prefix, chunk)] + [(ctx - 1, 1)] * decodes
        q, kc, vc, meta = _paged_prompts(lens, geometry, device)
        opts = AttentionOptions(scale=d**-0.5)
        t = timed(partial(unified_attention, q, kc, vc, meta, opts), device)
        del kc, vc
        # Baseline: the chunk's queries over its prefix + itself (causal, aligned to the
        # bottom right: flash runs it) and the decodes, on contiguous K/V.
        from torch.nn.attention.bias import causal_lower_right

        qp = torch.randn(1, hq, chunk, d, device=device, dtype=torch.bfloat16)
        kp = torch.randn(1, hkv, prefix + chunk, d, device=device, dtype=torch.bfloat16)
        qd = torch.randn(decodes, hq, 1, d, device=device, dtype=torch.bfloat16)
        kd = torch.randn(decodes, hkv, ctx, d, device=device, dtype=torch.bfloat16)
        mask = causal_lower_right(chunk, prefix + chunk)
        pre = partial(F.scaled_dot_product_attention, qp, kp, kp, attn_mask=mask, enable_gqa=True)
        dec = partial(F.scaled_dot_product_attention, qd, kd, kd, enable_gqa=True)
        with _sdpa_flash(device):
            ts = timed(pre, device) + timed(dec, device)
        del kp, kd
        _free(device)
        _emit(
            rows,
            f"| {chunk:,} on {prefix:,} + {decodes} x {ctx:,} | {t * 1e3:.3f} | "
            f"{ts * 1e3:.3f} | {t / ts:.2f}x |",
        )
    return rows


def cache_write_rows(
    device: torch.device,
    bw: float,
    quick: bool,
    tokens: tuple[int, ...] = (256, 8192, 65536),
    geometry: tuple[int, int, int, int] = GEOMETRY,
) -> list[str]:
    """``reshape_and_cache`` of ``T`` new tokens into shuffled slots of a pool twice as big."""
    rows = []
    _, hkv, d, bs = geometry
    for n in tokens[:2] if quick else tokens:
        nb = -(-2 * n // bs) + 1
        kc = torch.zeros(nb, bs, hkv, d, device=device, dtype=torch.bfloat16)
        vc = torch.zeros_like(kc)
        key = torch.randn(n, hkv, d, device=device, dtype=torch.bfloat16)
        value = torch.randn_like(key)
        slots = torch.randperm((nb - 1) * bs, device=device)[:n] + bs
        run = partial(reshape_and_cache, key, value, kc, vc, slots, backend="triton")
        t = timed(run, device)
        nbytes = 2 * 2 * n * hkv * d * 2  # K and V, read and written, bf16
        _emit(rows, f"| {n:,} | {t * 1e6:.1f} | {nbytes / t / 1e9:.0f} | {nbytes / t / bw:.0%} |")
        del kc, vc, key, value
        _free(device)
    return rows


#: ``(kind, batch, context)`` of ``call_cost_rows``' decodes.
CALL_COST_CASES = (
    ("full", 1, 2048),
    ("full", 1, 32768),
    ("sliding 1024", 1, 32768),
    ("full", 64, 2048),
    ("full", 64, 32768),
)


def _synced_seconds(fn, device: torch.device, reps: int = 10) -> float:  # type: ignore[no-untyped-def]
    """Median host seconds of ``fn`` from an idle device until the device is idle again."""
    return from_idle_seconds(fn, device, reps, until_done=True)


def _call_on_new_metadata(q, k, v, fresh: list[AttentionMetadata], opts):  # type: ignore[no-untyped-def]
    return unified_attention(q, k, v, fresh.pop(), opts)


def call_cost_rows(
    device: torch.device,
    quick: bool,
    cases: tuple[tuple[str, int, int], ...] = CALL_COST_CASES,
    write_tokens: int = 256,
    geometry: tuple[int, int, int, int] = GEOMETRY,
) -> list[str]:
    """Per call: alone (events), back to back, host only, host until the GPU is done;
    per step: the metadata build, and the first call on new metadata (host until done)."""
    rows = []
    hq, hkv, d, bs = geometry
    for name, batch, ctx in cases[:2] if quick else cases:
        opts = AttentionOptions(scale=d**-0.5, **KINDS[name])
        q, k, v, meta = paged_decode(batch, ctx, hq, hkv, d, bs, torch.bfloat16, device)
        run = partial(unified_attention, q, k, v, meta, opts)
        alone, in_row = timed(run, device), timed_back_to_back(run, device, reps=REPS)
        host, synced = host_seconds(run, device), _synced_seconds(run, device)
        table = meta.block_table.cpu()
        lens = (meta.query_lens_cpu, meta.seq_lens_cpu)

        def build(table=table, lens=lens):  # type: ignore[no-untyped-def]
            return AttentionMetadata.build(lens[0], lens[1], table, device)

        t_build = _synced_seconds(build, device)
        fresh = [build() for _ in range(10)]
        first = partial(_call_on_new_metadata, q, k, v, fresh, opts)
        t_first = _synced_seconds(first, device, reps=len(fresh))
        del k, v, fresh, first
        _free(device)
        _emit(
            rows,
            f"| decode {name} {batch} x {ctx:,} | {alone * 1e6:.1f} | {in_row * 1e6:.1f} | "
            f"{host * 1e6:.1f} | {synced * 1e6:.1f} | {t_build * 1e6:.1f} | "
            f"{t_first * 1e6:.1f} |",
        )
    n = write_tokens
    nb = -(-2 * n // bs) + 1
    kc = torch.zeros(nb, bs, hkv, d, device=device, dtype=torch.bfloat16)
    key = torch.randn(n, hkv, d, device=device, dtype=torch.bfloat16)
    slots = torch.randperm((nb - 1) * bs, device=device)[:n] + bs
    run = partial(reshape_and_cache, key, key, kc, torch.zeros_like(kc), slots, backend="triton")
    _emit(
        rows,
        f"| reshape_and_cache {n:,} tokens | {timed(run, device) * 1e6:.1f} | "
        f"{timed_back_to_back(run, device, reps=REPS) * 1e6:.1f} | "
        f"{host_seconds(run, device) * 1e6:.1f} "
        f"| {_synced_seconds(run, device) * 1e6:.1f} | n/a | n/a |",
    )
    return rows
