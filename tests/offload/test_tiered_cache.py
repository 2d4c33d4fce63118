"""``TieredCache`` on a real planned layout, byte for byte, with copies held back.

A request's blocks are filled with known bytes, the pool reuses every block
(demoting them to the host tier) and the buffers are zeroed. A copier whose
jobs wait for a gate makes the loads stay in flight: the request is then not
ready, its blocks are held (out of the free set, counted by the manager's
check), and once the gate opens the device holds exactly the bytes computed
before, under the same hit as before the eviction. A load that fails is a
shorter hit (recomputed), and an abort waits for its loads before letting go.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from factories import hit_len, toks
from unit_fill import fill_and_free

from hybridkv import KVCacheManager, Request
from hybridkv.layouts import shipped_layout
from hybridkv.offload import BlockBytes, TieredCache
from hybridkv.planning import KVCacheBuffers, allocate_kv_cache, plan_kv_cache
from hybridkv.tiers import DiskTier, HostTier, ModelFingerprint
from hybridkv.tiers.copier import ThreadCopier
from hybridkv.tiers.torch_memory import TorchHostMemory
from hybridkv.tiers.transfer import Completion

MAX_LEN = 64


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

    def close(self) -> None:
        self.gate.set()
        self._inner.close()


def _setup(
    name: str, host_bytes: int = 1 << 24, disk: Path | None = None
) -> tuple[KVCacheManager, KVCacheBuffers, TieredCache, GatedCopier]:
    config = plan_kv_cache(
        shipped_layout(name), 400_000, max_model_len=MAX_LEN, max_num_batched_tokens=MAX_LEN
    ).kv_cache_config
    kv = KVCacheManager(config, MAX_LEN)
    buffers = allocate_kv_cache(config)
    copier = GatedCopier()
    fingerprint = ModelFingerprint.from_kv_cache_config(config, "test weights")
    host = HostTier(fingerprint, host_bytes, TorchHostMemory("cpu"), copier=copier)
    lower = None if disk is None else DiskTier(fingerprint, disk, 1 << 24)
    return kv, buffers, TieredCache(kv, BlockBytes(config, buffers), host, lower), copier


def _compute(kv: KVCacheManager, tiers: TieredCache, r: Request) -> dict[Any, bytes]:
    """Admit ``r``, fill its blocks with random bytes; its cached blocks' bytes by key."""
    return fill_and_free(kv, tiers.block_bytes, r)


def _evict_and_wipe(kv: KVCacheManager, buffers: KVCacheBuffers) -> None:
    pool = kv.block_pool
    pool.free_blocks(pool.get_new_blocks(pool.num_free_blocks))
    for buf in buffers.buffers:
        buf.zero_()


def _assert_restored(tiers: TieredCache, tables: Any, want: dict[Any, bytes]) -> None:
    """Every block of the hit holds the bytes computed for its key before."""
    for gid, table in enumerate(tables):
        for b in table:
            if not b.is_null:
                got = b"".join(bytes(p.numpy()) for p in tiers.block_bytes.parts(gid, b.block_id))
                assert got == want[(gid, b.block_hash)]


def _check(kv: KVCacheManager, tiers: TieredCache) -> None:
    kv.check_integrity()
    tiers.check_integrity()


@pytest.mark.parametrize("name", ["tiny-gemma3", "tiny-jamba", "tiny-llama4"])
def test_loads_in_flight_hold_their_blocks_and_restore_the_bytes(name: str) -> None:
    kv, buffers, tiers, copier = _setup(name)
    prompt = toks(MAX_LEN - 8)
    want = _compute(kv, tiers, Request("a", prompt))
    later = Request("b", [*prompt, 1, 2])
    expected = hit_len(kv, later)
    assert expected > 0
    _evict_and_wipe(kv, buffers)
    assert tiers.stats.demoted == len(want)
    assert hit_len(kv, later) == 0

    copier.gate.clear()
    free_before = kv.block_pool.num_free_blocks
    assert not tiers.prepare(later, wait=False)  # in flight: not ready
    assert not tiers.prepare(later, wait=False)
    assert kv.block_pool.num_free_blocks < free_before  # held, not free
    _check(kv, tiers)
    copier.gate.set()
    assert tiers.prepare(later, wait=True)
    assert kv.block_pool.num_free_blocks == free_before  # let go, cached
    blocks, hit = kv.get_computed_blocks(later)
    assert hit == expected and tiers.stats.hit_tokens == expected
    _assert_restored(tiers, blocks.blocks, want)
    _check(kv, tiers)
    tiers.close()


def test_a_failed_load_is_recomputed_and_an_abort_waits_for_its_loads() -> None:
    kv, buffers, tiers, copier = _setup("tiny-gemma3")
    prompt = toks(MAX_LEN - 8)
    _compute(kv, tiers, Request("a", prompt))
    _evict_and_wipe(kv, buffers)
    later = Request("b", [*prompt, 1, 2])

    copier.fail = True
    assert tiers.prepare(later, wait=True)
    assert hit_len(kv, later) == 0 and tiers.stats.hits == 0
    assert tiers.stats.load_failures > 0
    _check(kv, tiers)

    copier.fail = False
    copier.gate.clear()
    free_before = kv.block_pool.num_free_blocks
    assert not tiers.prepare(later, wait=False)
    opener = threading.Timer(0.2, copier.gate.set)
    opener.start()
    tiers.release(later)  # an abort: waits for the copies, then lets go
    opener.join()
    assert kv.block_pool.num_free_blocks == free_before
    _check(kv, tiers)
    tiers.close()


def test_what_the_host_evicts_is_spilled_to_disk_and_loads_back(tmp_path: Path) -> None:
    _, _, probe, _ = _setup("tiny-gemma3")
    unit = max(probe.block_bytes.unit_bytes)
    probe.close()
    # Room for 3 units: the demotion batch overflows to disk, and later ones evict to it.
    kv, buffers, tiers, _ = _setup("tiny-gemma3", host_bytes=3 * unit, disk=tmp_path)
    prompt = toks(MAX_LEN - 8)
    want = _compute(kv, tiers, Request("a", prompt))
    later = Request("b", [*prompt, 1, 2])
    expected = hit_len(kv, later)
    _evict_and_wipe(kv, buffers)
    assert tiers.disk is not None
    assert tiers.stats.spilled == len(want) - len(tiers.host.keys()) > 0
    deadline = time.monotonic() + 30  # disk writes land on the I/O thread
    while len(tiers.disk.keys()) < tiers.stats.spilled and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(tiers.disk.keys()) == tiers.stats.spilled
    assert tiers.prepare(later, wait=True)
    blocks, hit = kv.get_computed_blocks(later)
    assert hit == expected and tiers.stats.loads_disk > 0
    _assert_restored(tiers, blocks.blocks, want)
    _check(kv, tiers)
    tiers.close()
