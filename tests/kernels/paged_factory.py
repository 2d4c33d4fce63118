"""Random paged KV caches for kernel tests, shaped like the planner's shared buffers.

``make_paged_batch`` builds one attention layer's K/V views inside a raw
buffer whose block slot is larger than the layer's page (another layer's page
follows it), shuffles physical block ids, and fills the null block 0 and all
unused slots with NaN, so that a kernel that reads outside its sequence's
visible blocks poisons its output. Blocks a sequence cannot see (before the
window or chunk of its first new token) point at the null block, as the
managers leave them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hybridkv.kernels.attention import AttentionMetadata, AttentionOptions


@dataclass
class PagedBatch:
    q: torch.Tensor  # [T, Hq, D]
    key_cache: torch.Tensor  # [num_blocks, bs, Hkv, D] strided view
    value_cache: torch.Tensor
    meta: AttentionMetadata
    opts: AttentionOptions
    sinks: torch.Tensor | None


def strided_cache_views(
    num_blocks: int,
    block_size: int,
    heads: int,
    dim: int,
    dtype: torch.dtype,
    extra: int = 3,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """K and V views in a NaN-filled buffer whose slot holds ``extra`` more rows per block."""
    page = block_size * heads * dim
    slot = 2 * page + extra * heads * dim
    buf = torch.full((num_blocks * slot,), float("nan"), dtype=dtype, device=device)
    key = buf.as_strided((num_blocks, block_size, heads, dim), (slot, heads * dim, dim, 1))
    value = buf.as_strided(
        (num_blocks, block_size, heads, dim), (slot, heads * dim, dim, 1), storage_offset=page
    )
    return buf, key, value


def make_paged_batch(
    seqs: list[tuple[int, int]],
    *,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    block_size: int,
    opts: AttentionOptions,
    dtype: torch.dtype = torch.float32,
    with_sinks: bool = False,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> PagedBatch:
    """``seqs``: ``(context_len, query_len)`` per sequence."""
    gen = torch.Generator().manual_seed(seed)
    per_seq = [-(-(c + q) // block_size) for c, q in seqs]
    num_blocks = 1 + sum(per_seq) + 3
    _, key_cache, value_cache = strided_cache_views(
        num_blocks, block_size, num_kv_heads, head_size, dtype, device=device
    )
    shape = (num_blocks, block_size, num_kv_heads, head_size)
    key_cache.copy_(torch.randn(shape, generator=gen).to(dtype))
    value_cache.copy_(torch.randn(shape, generator=gen).to(dtype))
    ids = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    table = torch.zeros((len(seqs), max(per_seq) + 2), dtype=torch.int32)
    for s, ((ctx, ql), nb) in enumerate(zip(seqs, per_seq, strict=True)):
        mine = torch.tensor(ids[:nb], dtype=torch.int32)
        del ids[:nb]
        # Blocks wholly before the first new token's window or chunk are null.
        first_visible = opts.first_visible_key(ctx)
        ends = (torch.arange(nb) + 1) * block_size
        table[s, :nb] = torch.where(ends > first_visible, mine, 0)
        # Slots past the sequence's end hold garbage, as in a partly filled last block.
        filled = ctx + ql - (nb - 1) * block_size
        key_cache[int(mine[-1]), filled:] = float("nan")
        value_cache[int(mine[-1]), filled:] = float("nan")
    key_cache[0] = float("nan")
    value_cache[0] = float("nan")
    t = sum(q for _, q in seqs)
    q = torch.randn((t, num_heads, head_size), generator=gen).to(dtype).to(device)
    meta = AttentionMetadata.build(
        [q for _, q in seqs], [c + q for c, q in seqs], table, device=device
    )
    sinks = torch.randn((num_heads,), generator=gen).to(device) if with_sinks else None
    return PagedBatch(q, key_cache, value_cache, meta, opts, sinks)


def gqa_batch(
    seqs: list[tuple[int, int]], gqa: int, opts: AttentionOptions, *, sinks: bool, seed: int
) -> PagedBatch:
    """The oracle grids' batch: 2 KV heads of 16, ``gqa`` query heads per KV
    head, blocks of 4, float32."""
    return make_paged_batch(
        seqs,
        num_heads=2 * gqa,
        num_kv_heads=2,
        head_size=16,
        block_size=4,
        opts=opts,
        with_sinks=sinks,
        seed=seed,
    )


def dense_oracle(b: PagedBatch) -> torch.Tensor:
    """Gather pages back into contiguous K/V, build the full mask, softmax in fp64."""
    b = PagedBatch(
        b.q.cpu(),
        b.key_cache.cpu(),
        b.value_cache.cpu(),
        AttentionMetadata.build(
            b.meta.query_lens_cpu, b.meta.seq_lens_cpu, b.meta.block_table.cpu()
        ),
        b.opts,
        None if b.sinks is None else b.sinks.cpu(),
    )
    bs = b.key_cache.shape[1]
    hq, hkv = b.q.shape[1], b.key_cache.shape[2]
    out = torch.empty(b.q.shape, dtype=torch.float64)
    start = 0
    for s, (ql, sl) in enumerate(zip(b.meta.query_lens_cpu, b.meta.seq_lens_cpu, strict=True)):
        pos = torch.arange(sl)
        blocks = b.meta.block_table[s, pos // bs].long()
        k = b.key_cache[blocks, pos % bs].double()  # [sl, Hkv, D]
        v = b.value_cache[blocks, pos % bs].double()
        qpos = torch.arange(sl - ql, sl)[:, None]
        kpos = pos[None, :]
        mask = kpos <= qpos
        if b.opts.sliding_window is not None:
            mask &= kpos > qpos - b.opts.sliding_window
        if b.opts.chunk_size is not None:
            mask &= kpos // b.opts.chunk_size == qpos // b.opts.chunk_size
        null = blocks == 0
        assert not (mask & null[None, :]).any(), "the factory nulled a visible block"
        k[null] = 0.0
        v[null] = 0.0
        g = hq // hkv
        qs = b.q[start : start + ql].double()  # [ql, Hq, D]
        kk = k.repeat_interleave(g, dim=1)  # [sl, Hq, D]
        vv = v.repeat_interleave(g, dim=1)
        scores = torch.einsum("qhd,khd->hqk", qs, kk) * b.opts.scale
        if b.opts.softcap is not None:
            scores = b.opts.softcap * torch.tanh(scores / b.opts.softcap)
        scores = scores.masked_fill(~mask[None], float("-inf"))
        if b.sinks is not None:
            sink = b.sinks.double()[:, None, None].expand(hq, ql, 1)
            probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
        else:
            probs = torch.softmax(scores, dim=-1)
        out[start : start + ql] = torch.einsum("hqk,khd->qhd", probs, vv)
        start += ql
    return out
