"""Unified attention on the native CPU backend: decodes in C, prefill chunks in torch.

Decode rows (query_len 1) go to the C kernel (``kernels/cpu``), which reads
the paged caches in place through the block table: no gather, online
softmax in fp32, window/chunk/softcap/sinks as in the reference. Prefill
chunks are matmul-bound and keep the torch reference's batched SDPA
(``reference.run_prefills``).
"""

from __future__ import annotations

import torch

from hybridkv.kernels.attention.metadata import AttentionInputs, NativeDecodePlan
from hybridkv.kernels.attention.reference import run_prefills
from hybridkv.kernels.cpu import decode_attention


def _decode_plan(a: AttentionInputs) -> NativeDecodePlan | None:
    """``(tables int32 [n, B], q_rows int64 [n], seq_lens int64 [n])`` of the step's decodes,
    built once per step (kept in ``meta.derived``), or None without decodes."""
    meta = a.meta
    plans = meta.derived
    if plans.native_decode_built:
        return plans.native_decode
    decodes = [s for s, ql in enumerate(meta.query_lens_cpu) if ql == 1]
    plan = None
    if decodes:
        rows = torch.tensor(decodes)
        plan = (
            meta.block_table.index_select(0, rows).to(torch.int32).contiguous(),
            torch.tensor([meta.query_starts_cpu[s] for s in decodes], dtype=torch.int64),
            torch.tensor([meta.seq_lens_cpu[s] for s in decodes], dtype=torch.int64),
        )
    plans.native_decode, plans.native_decode_built = plan, True
    return plan


def run_native(
    a: AttentionInputs, num_segments: int | None = None, tiles: object | None = None
) -> None:
    """Write attention of ``a.q`` into ``a.out`` (arguments checked, CPU tensors).

    Decode rows run in C; prefill rows run the torch reference's batched SDPA
    (the native backend's declared fallback). No split-KV or Triton tiles:
    ``num_segments`` and ``tiles`` do not apply."""
    plan = _decode_plan(a)
    if plan is not None:
        tables, q_rows, seq_lens = plan
        sinks = a.sinks.float().contiguous() if a.sinks is not None else None
        o = a.opts
        decode_attention(
            a.q,
            a.key_cache,
            a.value_cache,
            tables,
            q_rows,
            seq_lens,
            o.scale,
            o.softcap,
            o.sliding_window,
            o.chunk_size,
            sinks,
            a.out,
        )
    run_prefills(a)
