"""Helpers for tests that drive a ``TieredCache`` without the engine: a planned
tiny layout with real KV buffers, a copier whose jobs can be held back, and the
scheduler's "a step computed these tokens" call."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from factories import admit

from hybridkv import KVCacheManager, Request
from hybridkv.layouts import shipped_layout
from hybridkv.offload import BlockBytes, TieredCache
from hybridkv.offload.stream_order import StreamOrder
from hybridkv.planning import KVCacheBuffers, allocate_kv_cache, plan_kv_cache
from hybridkv.tiers import DiskTier, HostTier, ModelFingerprint, MooncakeTier
from hybridkv.tiers.copier import ThreadCopier
from hybridkv.tiers.memory import HostMemory
from hybridkv.tiers.torch_memory import TorchHostMemory
from hybridkv.tiers.transfer import Completion


class GatedCopier:
    """A copy thread whose jobs wait for ``gate``; with ``fail`` set they raise."""

    threaded = True

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.fail = False
        self._inner = ThreadCopier("test-gated-copy")

    def submit(self, fn: Callable[..., Any], *args: Any) -> Completion:
        def job() -> Any:
            assert self.gate.wait(30), "the test never opened the gate"
            if self.fail:
                raise OSError("injected copy failure")
            return fn(*args)

        return self._inner.submit(job)

    def drain(self) -> None:
        """Wait until every job submitted so far has run and settled (one thread,
        jobs in order; a transfer settles in its job's thread)."""
        self._inner.submit(lambda: None).wait(30)

    def close(self) -> None:
        self.gate.set()
        self._inner.close()


def blocked_until_opened(copier: GatedCopier, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a thread while ``copier``'s gate is closed: it must still be
    blocked after 0.3 s (waiting for the held copies); then open the gate and
    return its result."""
    out: list[Any] = []
    worker = threading.Thread(target=lambda: out.append(fn()))
    worker.start()
    worker.join(0.3)
    assert worker.is_alive(), "it did not wait for the copies"
    copier.gate.set()
    worker.join(30)
    assert out, "it did not finish once the copies ran"
    return out[0]


def tiered_manager(
    name: str,
    *,
    policy: str = "lru",
    host_bytes: int = 1 << 24,
    disk: Path | None = None,
    max_len: int = 64,
    memory: HostMemory | None = None,
    make_memory: Callable[[BlockBytes, int], HostMemory] | None = None,
    order: StreamOrder | None = None,
    device: str = "cpu",
) -> tuple[KVCacheManager, KVCacheBuffers, TieredCache, GatedCopier]:
    """A manager over shipped layout ``name`` with a host tier (copies held back by
    the returned ``GatedCopier``) and, with ``disk``, a disk tier under it. The host
    tier's memory: ``memory``, else ``make_memory(block_bytes, host_bytes)``, else a
    ``TorchHostMemory``."""
    config = plan_kv_cache(
        shipped_layout(name), 400_000, max_model_len=max_len, max_num_batched_tokens=max_len
    ).kv_cache_config
    kv = KVCacheManager(config, max_len, cache_policy=policy)
    buffers = allocate_kv_cache(config, torch.device(device))
    copier = GatedCopier()
    fingerprint = ModelFingerprint.from_kv_cache_config(config, "test weights")
    block_bytes = BlockBytes(config, buffers)
    mem = memory
    if mem is None:
        mem = make_memory(block_bytes, host_bytes) if make_memory else TorchHostMemory("cpu")
    host = HostTier(fingerprint, host_bytes, mem, copier=copier)
    lower = None if disk is None else DiskTier(fingerprint, disk, 1 << 24)
    return kv, buffers, TieredCache(kv, block_bytes, host, lower, order), copier


def fill(kv: KVCacheManager, tiers: TieredCache, r: Request, seed: int = 0) -> dict[Any, bytes]:
    """Fill ``r``'s blocks with random bytes (as its steps would); the bytes of each
    cached block by ``(group, hash)``."""
    out = {}
    gen = torch.Generator().manual_seed(seed)
    for gid, table in enumerate(kv.get_blocks(r.request_id).blocks):
        for b in table:
            if b.is_null:
                continue
            parts = tiers.block_bytes.parts(gid, b.block_id)
            for p in parts:
                p.copy_(torch.randint(0, 256, p.shape, dtype=torch.uint8, generator=gen))
            if b.block_hash is not None:
                out[(gid, b.block_hash)] = b"".join(bytes(p.cpu().numpy()) for p in parts)
    return out


def evict_and_wipe(kv: KVCacheManager, buffers: KVCacheBuffers) -> None:
    """The pool reuses every free block (waiting for the stores still reading
    them, demoting what the policy demotes), then every KV buffer is zeroed: only
    what the tiers hold can come back."""
    pool = kv.block_pool
    pool.free_blocks(pool.get_new_blocks(pool.num_free_blocks))
    for buf in buffers.buffers:
        buf.zero_()


def assert_restored(tiers: TieredCache, blocks: Any, want: dict[Any, bytes]) -> None:
    """Each non-null block of ``blocks`` (a hit's ``KVCacheBlocks``) holds the bytes
    ``want`` recorded for its ``(group, hash)`` (``fill``)."""
    for gid, table in enumerate(blocks.blocks):
        for b in table:
            if not b.is_null:
                got = b"".join(bytes(p.numpy()) for p in tiers.block_bytes.parts(gid, b.block_id))
                assert got == want[(gid, b.block_hash)]


def compute(kv: KVCacheManager, tiers: TieredCache, r: Request) -> dict[Any, bytes]:
    """Admit ``r``, fill its blocks with random bytes, run its step (``computed``)
    and free it: its cached blocks' bytes by ``(group, hash)``."""
    admit(kv, r)
    out = fill(kv, tiers, r)
    computed(tiers, r)
    kv.free(r)
    return out


def computed(tiers: TieredCache, r: Request) -> None:
    """The step that computed all of ``r``'s tokens ran (as ``Scheduler.update``
    tells the tiers): a write-through policy stores its blocks. Untimed."""
    tiers.after_step([(r, 0, r.num_tokens)], r.num_tokens, r.num_tokens, 0.0)


def store_replica(
    name: str,
    client: MooncakeTier,
    max_len: int,
    policy: str = "lru",
    events: bool = False,
    sweep: float = 0.0,
) -> tuple[KVCacheManager, KVCacheBuffers, TieredCache]:
    """A replica of layout ``name``: its own pool and buffers, the store alone under
    them, on ``client``'s connection (``tests/offload/conftest.py``'s ``store_clients``);
    ``sweep``: seconds between sweeps of what it wrote (``tiers/store_watch.py``)."""
    config = plan_kv_cache(
        shipped_layout(name), 400_000, max_model_len=max_len, max_num_batched_tokens=max_len
    ).kv_cache_config
    kv = KVCacheManager(config, max_len, enable_kv_cache_events=events, cache_policy=policy)
    buffers = allocate_kv_cache(config)
    fingerprint = ModelFingerprint.from_kv_cache_config(config, f"weights of {name}")
    store = MooncakeTier(fingerprint, client.client, 1 << 24, owns_client=False, sweep=sweep)
    return kv, buffers, TieredCache(kv, BlockBytes(config, buffers), None, store=store)
