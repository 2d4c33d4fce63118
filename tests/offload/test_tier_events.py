"""KV events of the tiers: each tier is a ``medium``, with full events for every group kind.

A request is computed with events on (under ``lru`` its blocks are written
through to the host tier after the step, ``TieredCache.after_step``), the pool
reuses every block, and a host tier too small for them evicts to disk. A subscriber that mirrors the
events per medium must then see exactly what each tier holds, and every tier
``BlockStored`` must carry the same parent, tokens and block size as the device
event that cached the key (no placeholders, for full, sliding, chunked and Mamba
groups alike). On the wire the tiers are "CPU" and "STORAGE" (vLLM's names).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from factories import admit, toks
from tier_helpers import computed

from hybridkv import KVCacheManager, Request
from hybridkv.core.events import BlockRemoved, BlockStored, KVCacheEvent
from hybridkv.layouts import shipped_layout
from hybridkv.offload import BlockBytes, TieredCache
from hybridkv.planning import allocate_kv_cache, plan_kv_cache
from hybridkv.tiers import DiskTier, HostTier, ModelFingerprint
from hybridkv.tiers.memory import HostMemory

MAX_LEN = 64
#: ``conftest.host_memory``: ``(block_bytes, budget bytes) -> the host tier's memory``.
MakeMemory = Callable[[BlockBytes, int], HostMemory]


def _setup(
    name: str, make: MakeMemory, host_units: int, disk: Path | None, events: bool = True
) -> Any:
    config = plan_kv_cache(
        shipped_layout(name), 400_000, max_model_len=MAX_LEN, max_num_batched_tokens=MAX_LEN
    ).kv_cache_config
    kv = KVCacheManager(config, MAX_LEN, enable_kv_cache_events=events)
    block_bytes = BlockBytes(config, allocate_kv_cache(config))
    fingerprint = ModelFingerprint.from_kv_cache_config(config, "test weights")
    budget = host_units * max(block_bytes.unit_bytes)
    host = HostTier(fingerprint, budget, make(block_bytes, budget))
    lower = None if disk is None else DiskTier(fingerprint, disk, 1 << 24)
    return kv, TieredCache(kv, block_bytes, host, lower)


def _run(kv: KVCacheManager, tiers: TieredCache) -> list[KVCacheEvent]:
    """Compute two requests, each followed by the pool reusing every block (the
    second round's stores evict the first's from the host); the events."""
    pool = kv.block_pool
    for rid, seed in (("a", 1), ("b", 2)):
        r = Request(rid, toks(MAX_LEN - 8, start=seed * 1000))
        admit(kv, r)
        computed(tiers, r)
        kv.free(r)
        pool.free_blocks(pool.get_new_blocks(pool.num_free_blocks))
    if tiers.disk is not None:  # the disk writes land on the I/O thread
        deadline = time.monotonic() + 30
        while tiers.disk.stats.stores < tiers.stats.spilled and time.monotonic() < deadline:
            time.sleep(0.01)
    assert tiers.events is not None
    tiers.events.flush(wait=True)
    return kv.take_events()


def _mirror(events: list[KVCacheEvent]) -> dict[str | None, set[tuple[int, bytes]]]:
    held: dict[str | None, set[tuple[int, bytes]]] = {None: set(), "CPU": set(), "STORAGE": set()}
    for ev in events:
        if isinstance(ev, BlockStored):
            held[ev.medium].update((ev.group_id, h) for h in ev.block_hashes)
        elif isinstance(ev, BlockRemoved):
            for h in ev.block_hashes:
                held[ev.medium].remove((ev.group_id, h))  # never a removal before its store
    return held


@pytest.mark.parametrize("name", ["tiny-gemma3", "tiny-jamba", "tiny-llama4"])
def test_a_mirror_of_the_events_holds_what_each_tier_holds(
    name: str, tmp_path: Path, host_memory: MakeMemory
) -> None:
    kv, tiers = _setup(name, host_memory, host_units=3, disk=tmp_path)
    events = _run(kv, tiers)
    held = _mirror(events)
    assert tiers.disk is not None
    host = {(k.group_id, k.block_hash) for k in tiers.host.keys()}  # noqa: SIM118 (a list)
    disk = {(k.group_id, k.block_hash) for k in tiers.disk.keys()}  # noqa: SIM118 (a list)
    assert held["CPU"] == host and host
    assert held["STORAGE"] == disk and disk
    assert held[None] == set()  # the device reused every block
    # The host evicted (to disk): removals were announced for the CPU medium.
    assert any(isinstance(e, BlockRemoved) and e.medium == "CPU" for e in events)
    # Every group kind of the layout has its tier events.
    groups = {g for g, _ in held["CPU"] | held["STORAGE"]}
    assert groups == set(range(len(kv.kv_cache_config.kv_cache_groups)))
    tiers.check_integrity()
    tiers.close()


@pytest.mark.parametrize("name", ["tiny-gemma3", "tiny-jamba", "tiny-llama4"])
def test_a_tier_event_carries_the_device_event_fields(name: str, host_memory: MakeMemory) -> None:
    kv, tiers = _setup(name, host_memory, host_units=1 << 10, disk=None)
    events = _run(kv, tiers)
    device = {
        (e.group_id, h): (i, e)
        for e in events
        if isinstance(e, BlockStored) and e.medium is None
        for i, h in enumerate(e.block_hashes)
    }
    tier = [e for e in events if isinstance(e, BlockStored) and e.medium == "CPU"]
    assert len(tier) == len(device)  # every cached key was written through, once
    for e in tier:
        [h] = e.block_hashes
        i, d = device[(e.group_id, h)]
        bs = d.block_size
        assert e.block_size == bs and e.lora_name == d.lora_name
        assert e.token_ids == d.token_ids[i * bs : (i + 1) * bs]
        assert e.parent_block_hash == (d.block_hashes[i - 1] if i else d.parent_block_hash)
    tiers.close()


def test_the_wire_names_each_tier_and_keeps_the_device_medium(host_memory: MakeMemory) -> None:
    pytest.importorskip("msgspec")
    from hybridkv.events.groups import group_event_infos
    from hybridkv.events.wire import wire_events

    kv, tiers = _setup("tiny-gemma3", host_memory, host_units=1 << 10, disk=None)
    events = _run(kv, tiers)
    infos = group_event_infos(kv.kv_cache_config)
    media = {w.medium for w in wire_events(events, infos, "GPU", int_hashes=False)}
    assert media == {"GPU", "CPU"}
    tiers.close()


def test_without_events_the_tiers_record_nothing(host_memory: MakeMemory) -> None:
    kv, tiers = _setup("tiny-gemma3", host_memory, host_units=1 << 10, disk=None, events=False)
    assert tiers.events is None and kv.block_pool.on_stored is None
    r = Request("a", toks(MAX_LEN - 8))
    admit(kv, r)
    computed(tiers, r)
    kv.free(r)
    pool = kv.block_pool
    pool.free_blocks(pool.get_new_blocks(pool.num_free_blocks))
    assert tiers.stats.written_through > 0 and kv.take_events() == []
    tiers.close()


def test_keys_no_tier_holds_are_forgotten(host_memory: MakeMemory) -> None:
    """The remembered fields do not grow past what the device and the tiers hold."""
    kv, tiers = _setup("tiny-gemma3", host_memory, host_units=2, disk=None)
    _run(kv, tiers)
    assert tiers.events is not None
    kept = {(k.group_id, k.block_hash) for k in tiers.host.keys()}  # noqa: SIM118 (a list)
    assert set(tiers.events._meta) == kept
    tiers.close()
