"""A host-tier load staged on the CPU does not wake the copy thread: the scheduler
either waits for it at once (the waiter runs the copy in its own thread, with no
hand-off) or, before a step that runs without it, calls ``start_loads`` and the
copy thread lands it meanwhile. Real ``SlabMemory`` and ``ThreadCopier``."""

from __future__ import annotations

import time

import torch
from factories import hit_len, toks
from tier_helpers import compute

from hybridkv import KVCacheManager, Request
from hybridkv.layouts import shipped_layout
from hybridkv.offload import BlockBytes, TieredCache
from hybridkv.planning import allocate_kv_cache, plan_kv_cache
from hybridkv.tiers import HostTier, ModelFingerprint
from hybridkv.tiers.slab_memory import SlabMemory

MAX_LEN = 64


def _tiers() -> tuple[KVCacheManager, TieredCache]:
    config = plan_kv_cache(
        shipped_layout("tiny-gemma3"),
        400_000,
        max_model_len=MAX_LEN,
        max_num_batched_tokens=MAX_LEN,
    ).kv_cache_config
    kv = KVCacheManager(config, MAX_LEN, cache_policy="lru")
    buffers = allocate_kv_cache(config, torch.device("cpu"))
    block_bytes = BlockBytes(config, buffers)
    fingerprint = ModelFingerprint.from_kv_cache_config(config, "test weights")
    host = HostTier(fingerprint, 1 << 24, SlabMemory(block_bytes.widths, 1 << 24))
    return kv, TieredCache(kv, block_bytes, host)


def _staged_hit() -> tuple[KVCacheManager, TieredCache, Request, int]:
    kv, tiers = _tiers()
    prompt = toks(MAX_LEN - 8)
    compute(kv, tiers, Request("a", prompt))
    tiers.pending.wait_all()
    later = Request("b", [*prompt, 1, 2])
    expected = hit_len(kv, later)
    pool = kv.block_pool
    pool.free_blocks(pool.get_new_blocks(pool.num_free_blocks))  # nothing cached on the device
    assert expected > 0 and hit_len(kv, later) == 0
    return kv, tiers, later, expected


def test_a_staged_load_waits_for_its_waiter_or_start_loads() -> None:
    kv, tiers, later, expected = _staged_hit()
    assert not tiers.prepare(later, wait=False)
    time.sleep(0.1)
    assert not tiers.prepare(later, wait=False)  # the copy thread was not woken for it
    tiers.start_loads()  # (what the scheduler does before a step without it)
    deadline = time.monotonic() + 10
    while not tiers.prepare(later, wait=False):
        assert time.monotonic() < deadline, "the copy thread never landed the load"
        time.sleep(0.001)
    assert hit_len(kv, later) == expected and tiers.stats.hits == 1
    kv.check_integrity()
    tiers.check_integrity()
    tiers.close()


def test_a_staged_load_lands_when_waited_for() -> None:
    kv, tiers, later, expected = _staged_hit()
    assert not tiers.prepare(later, wait=False)
    assert tiers.prepare(later, wait=True)  # the waiter runs the copy itself
    assert hit_len(kv, later) == expected and tiers.stats.loads_cpu > 0
    kv.check_integrity()
    tiers.check_integrity()
    tiers.close()
