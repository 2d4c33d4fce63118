"""Torch reference of unified paged attention (the CPU backend).

Vectorised, no per-token Python loop: all decodes of a step run as one
padded batch, and so do its prefill chunks when padding them to one shape
costs little (at most ``PREFILL_PAD_LIMIT`` times the real query x key area;
otherwise one call per chunk over exactly the keys its window or chunk can
see). ``scaled_dot_product_attention`` runs in
the cache dtype (it accumulates fp16/bf16 in fp32) where no softcap or sinks
are asked for; otherwise an explicit fp32 softmax, sinks entering as extra
logits in the denominator. Keys outside the visible range never enter the
softmax. Prefill chunks gather exactly their visible range; decodes gather
exactly their visible keys (a plan built once per step and window, cached on
the metadata), padding with a real key; either way garbage (even NaN) in null
or stale blocks is never read into the output.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hybridkv.kernels.attention.metadata import (
    AttentionInputs,
    AttentionOptions,
    DecodePlan,
    PlanKey,
    PrefillPlan,
)

#: Prefill chunks of a step share one padded attention call while the padded
#: ``n x max_query x max_keys`` area is at most this many times the real one.
PREFILL_PAD_LIMIT = 1.5


def run_reference(a: AttentionInputs) -> None:
    """Write attention of ``a.q`` over the paged caches into ``a.out`` (arguments checked)."""
    decodes = [s for s, ql in enumerate(a.meta.query_lens_cpu) if ql == 1]
    if decodes:
        _decode_batch(a, decodes)
    run_prefills(a)


def run_prefills(a: AttentionInputs) -> None:
    """Write the prefill chunks' rows (query_len > 1) of ``a.out``; decode rows untouched."""
    prefills = [s for s, ql in enumerate(a.meta.query_lens_cpu) if ql > 1]
    if len(prefills) > 1 and _prefill_plan(a, prefills) is not None:
        _prefill_batch(a, prefills)
        return
    for s in prefills:
        _prefill_one(a, s)


def _prefill_one(a: AttentionInputs, s: int) -> None:
    meta, opts = a.meta, a.opts
    ql, sl, start = meta.query_lens_cpu[s], meta.seq_lens_cpu[s], meta.query_starts_cpu[s]
    bs = a.key_cache.shape[1]
    first_q = sl - ql
    lo, hi = opts.first_visible_key(first_q), sl
    b_lo, b_hi = lo // bs, -(-hi // bs)
    ids = meta.block_table[s, b_lo:b_hi].long()
    cut = slice(lo - b_lo * bs, hi - b_lo * bs)
    k = a.key_cache[ids].flatten(0, 1)[cut]  # [L, Hkv, D]
    v = a.value_cache[ids].flatten(0, 1)[cut]
    qpos = torch.arange(first_q, sl, device=a.q.device)
    kpos = torch.arange(lo, hi, device=a.q.device)
    mask = _visible(qpos[:, None], kpos[None, :], opts)  # [ql, L]
    o = _attend(a.q[start : start + ql][None], k[None], v[None], mask[None], opts, a.sinks)
    a.out[start : start + ql] = o[0].to(a.out.dtype)


def _prefill_plan(a: AttentionInputs, prefills: list[int]) -> PrefillPlan | None:
    """Padded gather plan of a step's prefill chunks (cached on the metadata), or
    None when padding would exceed ``PREFILL_PAD_LIMIT``.

    Returns ``(blocks, offsets, mask, q_rows, q_valid)``: key ``j`` of chunk
    ``i`` is ``cache[blocks[i, j], offsets[i, j]]`` (padding repeats the chunk's
    last key: real data, masked out); its queries are rows ``q_rows[i]`` of
    ``q`` (padding repeats the last query, whose output is dropped:
    ``q_valid``); ``mask [n, Q, L]`` is what each query sees.
    """
    meta, opts = a.meta, a.opts
    bs = a.key_cache.shape[1]
    key: PlanKey = (bs, opts.sliding_window, opts.chunk_size)
    plans = meta.derived.prefill
    if key in plans:
        return plans[key]
    qls = [meta.query_lens_cpu[s] for s in prefills]
    sls = [meta.seq_lens_cpu[s] for s in prefills]
    los = [opts.first_visible_key(sl - ql) for sl, ql in zip(sls, qls, strict=True)]
    width = max(sl - lo for sl, lo in zip(sls, los, strict=True))
    qmax = max(qls)
    real = sum(ql * (sl - lo) for ql, sl, lo in zip(qls, sls, los, strict=True))
    plan: PrefillPlan | None = None
    if len(prefills) * qmax * width <= PREFILL_PAD_LIMIT * real:
        dev = a.q.device
        sl_t = torch.tensor(sls, device=dev)[:, None]
        ql_t = torch.tensor(qls, device=dev)[:, None]
        kpos = torch.tensor(los, device=dev)[:, None] + torch.arange(width, device=dev)
        k_valid = kpos < sl_t
        kpos = torch.where(k_valid, kpos, sl_t - 1)
        j = torch.arange(qmax, device=dev)[None, :]
        q_valid = j < ql_t
        j = torch.minimum(j, ql_t - 1)
        qpos = sl_t - ql_t + j  # [n, Q]
        starts = torch.tensor([meta.query_starts_cpu[s] for s in prefills], device=dev)[:, None]
        mask = _visible(qpos[:, :, None], kpos[:, None, :], opts) & k_valid[:, None, :]
        rows = torch.tensor(prefills, device=dev)[:, None]
        blocks = meta.block_table[rows, kpos // bs].long()
        plan = (blocks, kpos % bs, mask, starts + j, q_valid)
    plans[key] = plan
    return plan


def _prefill_batch(a: AttentionInputs, prefills: list[int]) -> None:
    plan = _prefill_plan(a, prefills)
    assert plan is not None
    blocks, offsets, mask, q_rows, q_valid = plan
    k = _gather(a.key_cache, blocks, offsets)  # [n, L, Hkv, D]
    v = _gather(a.value_cache, blocks, offsets)
    o = _attend(a.q[q_rows], k, v, mask, a.opts, a.sinks)  # [n, Q, Hq, D]
    a.out[q_rows[q_valid]] = o[q_valid].to(a.out.dtype)


def _decode_plan(a: AttentionInputs, decodes: list[int]) -> DecodePlan:
    """Token-level gather plan of a step's decodes, cached on the metadata.

    Returns ``(blocks, offsets, valid, starts)``: key ``j`` of decode ``i`` is
    ``cache[blocks[i, j], offsets[i, j]]``; padding entries repeat the last
    (just written) key so every gathered row is real data, and ``valid`` masks
    them out of the softmax.
    """
    meta, opts = a.meta, a.opts
    bs = a.key_cache.shape[1]
    key: PlanKey = (bs, opts.sliding_window, opts.chunk_size)
    plans = meta.derived.decode
    found = plans.get(key)
    if found is not None:
        return found
    dev = a.q.device
    seq_lens = [meta.seq_lens_cpu[s] for s in decodes]
    los = [opts.first_visible_key(sl - 1) for sl in seq_lens]
    width = max(sl - lo for sl, lo in zip(seq_lens, los, strict=True))
    sl_t = torch.tensor(seq_lens, device=dev)[:, None]
    pos = torch.tensor(los, device=dev)[:, None] + torch.arange(width, device=dev)
    valid = pos < sl_t
    pos = torch.where(valid, pos, sl_t - 1)
    rows = torch.tensor(decodes, device=dev)[:, None]
    blocks = meta.block_table[rows, pos // bs].long()
    starts = torch.tensor([meta.query_starts_cpu[s] for s in decodes], device=dev)
    plan = (blocks, pos % bs, valid, starts)
    plans[key] = plan
    return plan


def _token_rows(cache: torch.Tensor) -> tuple[torch.Tensor, int] | None:
    """``cache [NB, bs, H, D]`` as a view of token rows ``[R, H, D]`` and the rows
    per block (token ``(b, o)`` is row ``b * rows_per_block + o``), or None where
    the block stride is not a whole number of token strides. A view, never a
    copy: the caches are strided views into buffers shared by several layers.
    """
    nb, bs = cache.shape[:2]
    sb, so = cache.stride()[:2]
    if so <= 0 or sb % so:
        return None
    per_block = sb // so
    rows = (nb - 1) * per_block + bs
    view = cache.as_strided((rows, *cache.shape[2:]), (so, *cache.stride()[2:]))
    return view, per_block


def _gather(cache: torch.Tensor, blocks: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """``cache[blocks, offsets]``: one ``index_select`` of whole token rows where the
    layout allows (~4x faster than indexing by block and offset)."""
    found = _token_rows(cache)
    if found is None:
        return cache[blocks, offsets]
    view, per_block = found
    rows = (blocks * per_block + offsets).flatten()
    return view.index_select(0, rows).unflatten(0, blocks.shape)


def _decode_batch(a: AttentionInputs, decodes: list[int]) -> None:
    blocks, offsets, valid, starts = _decode_plan(a, decodes)
    k = _gather(a.key_cache, blocks, offsets)  # [n, L, Hkv, D]
    v = _gather(a.value_cache, blocks, offsets)
    o = _attend(a.q[starts][:, None], k, v, valid[:, None, :], a.opts, a.sinks)  # [n, 1, Hq, D]
    a.out[starts] = o[:, 0].to(a.out.dtype)


def _visible(qpos: torch.Tensor, kpos: torch.Tensor, opts: AttentionOptions) -> torch.Tensor:
    mask = kpos <= qpos
    if opts.sliding_window is not None:
        mask &= kpos > qpos - opts.sliding_window
    if opts.chunk_size is not None:
        mask &= kpos // opts.chunk_size == qpos // opts.chunk_size
    return mask


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    opts: AttentionOptions,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    """Masked attention in fp32.

    ``q [n, Lq, Hq, D]``, ``k``/``v`` ``[n, L, Hkv, D]``, ``mask [n, Lq, L]``
    -> ``[n, Lq, Hq, D]``.
    """
    hq, hkv = q.shape[2], k.shape[2]
    if opts.softcap is None and sinks is None:
        # SDPA accumulates in fp32 for fp16/bf16 inputs, so no upcast is needed.
        o = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            attn_mask=mask[:, None],
            scale=opts.scale,
            enable_gqa=hq != hkv,
        )
        return o.transpose(1, 2)
    qf = q.float().transpose(1, 2)  # [n, Hq, Lq, D]
    kf = k.float().transpose(1, 2)  # [n, Hkv, L, D]
    vf = v.float().transpose(1, 2)
    g = hq // hkv
    kf = kf.repeat_interleave(g, dim=1)
    vf = vf.repeat_interleave(g, dim=1)
    scores = torch.matmul(qf, kf.transpose(-1, -2)) * opts.scale  # [n, Hq, Lq, L]
    if opts.softcap is not None:
        scores = torch.tanh(scores / opts.softcap) * opts.softcap
    scores = scores.masked_fill(~mask[:, None], float("-inf"))
    if sinks is not None:
        sink = sinks.float()[None, :, None, None].expand(*scores.shape[:-1], 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, vf).transpose(1, 2)
