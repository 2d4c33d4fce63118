"""The kernels on the planner's real shared buffers, driven by the real KVCacheManager.

tiny-gemma3 (3 sliding layers with W = 8, one full layer; all four share
buffers) is planned with block size 4 and allocated on the CPU. Two requests
that share a 16-token prefix go through chunked prefill (the second one
adopting the first one's cached blocks), then decode together. Every step
writes the new tokens' K/V of every layer with ``reshape_and_cache`` at the
slots the manager gave out, and attends with ``unified_attention`` through the
manager's block tables (sliding groups hold null blocks once tokens leave the
window). Outputs must match dense attention over each request's own K/V.
"""

from __future__ import annotations

import pytest
import torch

from hybridkv import KVCacheManager, Request
from hybridkv.kernels import (
    AttentionMetadata,
    AttentionOptions,
    reshape_and_cache,
    unified_attention,
)
from hybridkv.layouts import shipped_layout
from hybridkv.planning import AttentionCache, allocate_kv_cache, plan_kv_cache

HEADS, KV_HEADS, DIM, BS = 4, 2, 16, 4


def _dense(q, k, v, first_pos, window):
    # q: [n, Hq, D] at positions first_pos..; k/v: [L, Hkv, D] for positions 0..L-1.
    qpos = torch.arange(first_pos, first_pos + q.shape[0])[:, None]
    kpos = torch.arange(k.shape[0])[None, :]
    mask = (kpos <= qpos) & ((kpos > qpos - window) if window else True)
    kk = k.double().repeat_interleave(HEADS // KV_HEADS, 1)
    vv = v.double().repeat_interleave(HEADS // KV_HEADS, 1)
    s = torch.einsum("qhd,khd->hqk", q.double(), kk) * DIM**-0.5
    p = torch.softmax(s.masked_fill(~mask[None], float("-inf")), -1)
    return torch.einsum("hqk,khd->qhd", p, vv)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_prefix_shared_chunked_prefill_then_decode(backend):
    layout = shipped_layout("tiny-gemma3").model_copy(update={"cache_dtype": "float32"})
    plan = plan_kv_cache(
        layout, 400_000, block_size=BS, max_model_len=64, max_num_batched_tokens=16
    )
    config = plan.kv_cache_config
    caches = allocate_kv_cache(config, torch.device("cpu"))
    for buf in caches.buffers:
        buf.view(torch.float32).fill_(float("nan"))  # unwritten slots poison wrong reads
    kv = KVCacheManager(config, 64)
    group_of = {n: g for g, grp in enumerate(config.kv_cache_groups) for n in grp.layer_names}
    window = {
        n: getattr(config.kv_cache_groups[g].kv_cache_spec, "sliding_window", None)
        for n, g in group_of.items()
    }
    layers = sorted(group_of)
    gen = torch.Generator().manual_seed(0)
    total = 30
    shared = list(range(100, 116))
    prompts = {"a": [*shared, *range(200, 207)], "b": [*shared, *range(300, 305)]}
    # Dense K/V per request and layer; b's shared prefix equals a's.
    k_all = {
        r: {n: torch.randn(total, KV_HEADS, DIM, generator=gen) for n in layers} for r in prompts
    }
    v_all = {
        r: {n: torch.randn(total, KV_HEADS, DIM, generator=gen) for n in layers} for r in prompts
    }
    for n in layers:
        k_all["b"][n][:16] = k_all["a"][n][:16]
        v_all["b"][n][:16] = v_all["a"][n][:16]
    reqs = {r: Request(r, toks) for r, toks in prompts.items()}

    def step(work: list[tuple[str, int]]) -> None:
        """One engine step: ``(request, num_new_tokens)`` per scheduled request."""
        starts = [reqs[r].num_computed_tokens for r, _ in work]
        qs = {n: torch.randn(sum(c for _, c in work), HEADS, DIM, generator=gen) for n in layers}
        metas = {}
        slots: dict[int, list[int]] = {}
        for g in range(len(config.kv_cache_groups)):
            ids = [kv.get_block_ids(r)[g] for r, _ in work]
            table = torch.zeros(len(work), max(map(len, ids)), dtype=torch.int32)
            for i, row in enumerate(ids):
                table[i, : len(row)] = torch.tensor(row)
            metas[g] = AttentionMetadata.build(
                [c for _, c in work],
                [s + c for s, (_, c) in zip(starts, work, strict=True)],
                table,
            )
            slots[g] = [
                ids[i][p // BS] * BS + p % BS
                for i, (s, (_, c)) in enumerate(zip(starts, work, strict=True))
                for p in range(s, s + c)
            ]
        for n in layers:
            g = group_of[n]
            cache = caches.layers[n]
            assert isinstance(cache, AttentionCache)
            new_k = torch.cat(
                [k_all[r][n][s : s + c] for s, (r, c) in zip(starts, work, strict=True)]
            )
            new_v = torch.cat(
                [v_all[r][n][s : s + c] for s, (r, c) in zip(starts, work, strict=True)]
            )
            slot_t = torch.tensor(slots[g], dtype=torch.int64)
            reshape_and_cache(new_k, new_v, cache.key, cache.value, slot_t, backend=backend)
            opts = AttentionOptions(scale=DIM**-0.5, sliding_window=window[n])
            out = unified_attention(qs[n], cache.key, cache.value, metas[g], opts, backend=backend)
            row = 0
            for s, (r, c) in zip(starts, work, strict=True):
                want = _dense(
                    qs[n][row : row + c], k_all[r][n][: s + c], v_all[r][n][: s + c], s, window[n]
                )
                torch.testing.assert_close(out[row : row + c].double(), want, rtol=3e-5, atol=3e-5)
                row += c

    def alloc(r: str, n: int, hit: int = 0, blocks=None) -> None:
        assert kv.allocate_slots(reqs[r], n, hit, blocks) is not None

    alloc("a", 10)
    step([("a", 10)])
    reqs["a"].num_computed_tokens = 10
    alloc("a", 13)
    step([("a", 13)])
    reqs["a"].num_computed_tokens = 23
    hit_blocks, hit = kv.get_computed_blocks(reqs["b"])
    assert hit == 16
    alloc("b", 5, hit, hit_blocks)
    reqs["b"].num_computed_tokens = 16
    step([("b", 5)])
    reqs["b"].num_computed_tokens = 21
    for _ in range(5):  # decodes of both requests in one batch
        for r in reqs.values():
            r.append_output_token_ids(7)
            alloc(r.request_id, 1)
        step([("a", 1), ("b", 1)])
        for r in reqs.values():
            r.num_computed_tokens += 1
    kv.check_integrity()
    # The sliding groups really dropped blocks that left the window.
    sliding_g = group_of[next(n for n in layers if window[n])]
    assert 0 in kv.get_block_ids("a")[sliding_g]
