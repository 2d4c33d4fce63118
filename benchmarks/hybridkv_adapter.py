"""hybridkv's adapter for the shared vLLM-baseline replay harness.

``../shared/bench/vllm_baseline/bench_vllm.py`` replays one workload through
any object with these methods; ``HybridkvAdapter`` drives ``KVCacheManager``
exactly as the harness drives vLLM's (same calls, same order).
"""

from __future__ import annotations

from typing import Any

import torch

from hybridkv import (
    FullAttentionSpec,
    KVCacheBlocks,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheManager,
    KVCacheTensor,
    MambaSpec,
    Request,
    SlidingWindowSpec,
)
from hybridkv.core.block_pool import BlockPool


def make_config(kind: str, block_size: int, num_blocks: int, window: int) -> KVCacheConfig:
    """The harness's configs (``full``, ``hybrid``, ``hybrid_mamba``) in our types."""
    attn: dict[str, Any] = dict(num_kv_heads=8, head_size=128, dtype=torch.bfloat16)
    full = FullAttentionSpec(block_size=block_size, **attn)
    if kind == "full":
        groups = [KVCacheGroupSpec([f"model.layers.{i}.self_attn.attn" for i in range(4)], full)]
    elif kind == "hybrid":
        swa = SlidingWindowSpec(block_size=block_size, sliding_window=window, **attn)
        groups = [KVCacheGroupSpec([f"model.layers.{i}.self_attn.attn" for i in (0, 3, 6)], full)]
        for g in (1, 2):
            names = [f"model.layers.{i}.self_attn.attn" for i in (g, g + 3, g + 6)]
            groups.append(KVCacheGroupSpec(names, swa))
    elif kind == "hybrid_mamba":
        mamba = MambaSpec(block_size=block_size, shapes=((1, 1),), dtypes=(torch.float32,))
        groups = [
            KVCacheGroupSpec(["model.layers.0.self_attn.attn"], full),
            KVCacheGroupSpec(["model.layers.1.mixer"], mamba),
        ]
    else:
        raise ValueError(f"unknown config kind {kind!r}")
    tensors = [
        KVCacheTensor(size=g.kv_cache_spec.page_size_bytes * num_blocks, shared_by=[name])
        for g in groups
        for name in g.layer_names
    ]
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=tensors, kv_cache_groups=groups)


class EvictionCount:
    """What the harness reads as ``counter[0]`` after a replay: the cached blocks the
    pool evicted since this was made (``BlockPool.num_evicted_blocks``; vLLM's side
    counts its ``_maybe_evict_cached_block`` hits)."""

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        self.start = pool.num_evicted_blocks

    def __getitem__(self, index: int) -> int:
        if index != 0:
            raise IndexError(f"the count is item 0, not {index}")
        return self.pool.num_evicted_blocks - self.start


class HybridkvAdapter:
    """The harness's adapter interface over ``hybridkv.KVCacheManager``, under
    one cache policy (``lru`` or ``hybrid``)."""

    name = "hybridkv"

    def __init__(self, kv_cache_config: KVCacheConfig, a: Any, cache_policy: str = "lru") -> None:
        self.kv = KVCacheManager(
            kv_cache_config,
            max_model_len=a.max_model_len,
            enable_caching=True,
            hash_algo=a.hash_algo,
            log_stats=a.log_stats,
            cache_policy=cache_policy,
        )

    def new_request(self, rid: str, prompt: list[int]) -> Request:
        # Hash the prompt at creation, as vLLM's Request(block_hasher=...) does.
        req = Request(rid, prompt)
        req.bind_hasher(self.kv.hasher)
        return req

    def new_step(self) -> None:
        pass

    def end_step(self) -> None:
        pass

    def get_computed_blocks(self, req: Request) -> tuple[KVCacheBlocks, int]:
        return self.kv.get_computed_blocks(req)

    def allocate_prefill(
        self, req: Request, num_new_tokens: int, num_hit: int, hit_blocks: KVCacheBlocks
    ) -> KVCacheBlocks | None:
        return self.kv.allocate_slots(req, num_new_tokens, num_hit, hit_blocks)

    def allocate_decode(self, req: Request) -> KVCacheBlocks | None:
        return self.kv.allocate_slots(req, 1)

    def on_scheduled(self, req: Request, num_tokens: int) -> None:
        req.num_computed_tokens += num_tokens

    def append_token(self, req: Request, tok: int) -> None:
        req.append_output_token_ids(tok)

    def preempt(self, req: Request) -> None:
        self.kv.free(req)
        req.num_computed_tokens = 0
        req.num_preemptions += 1

    def free(self, req: Request) -> None:
        self.kv.free(req)

    @staticmethod
    def block_ids(blocks: KVCacheBlocks) -> tuple[list[int], ...]:
        return blocks.get_block_ids()

    def usage(self) -> float:
        return self.kv.usage

    def install_eviction_counter(self) -> EvictionCount:
        return EvictionCount(self.kv.block_pool)

    def num_free_blocks(self) -> int:
        return self.kv.block_pool.num_free_blocks
