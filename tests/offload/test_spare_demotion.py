"""The engine's demotion of ``evict_first`` blocks into spare room.

Tiny Llama 4 under ``hybrid``: a freed request's passed chunks (and the
full-attention blocks no kept point needs) are released ``evict_first``, and
``HybridPolicy.demotion_value`` offers them to the host tier as ``SPARE``. When
the pool reuses them (``Demotion.demote``), the host tier takes them only into
spare room (``hybridkv/tiers/spare.py``):

- with room, every unit is demoted, evict-first ones included, and hits load
  them back byte for byte;
- with room for the valued units only, the evict-first ones are skipped
  (counted apart, no disk write) and every valued unit is held;
- a later request's valued units evict the spare units first, never a valued
  one, and a spare unit the host evicts goes no lower (no spill to disk).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from factories import hit_len, toks
from tier_helpers import compute, tiered_manager

from hybridkv import KVCacheManager, Request
from hybridkv.offload import BlockBytes, TieredCache
from hybridkv.tiers import UnitKey
from hybridkv.tiers.memory import HostMemory
from hybridkv.tiers.spare import SPARE

MAX_LEN = 64
MakeMemory = Callable[[BlockBytes, int], HostMemory]


def _setup(
    make: MakeMemory, host_bytes: int = 1 << 24, disk: Path | None = None
) -> tuple[KVCacheManager, TieredCache]:
    kv, _, tiers, _ = tiered_manager(
        "tiny-llama4",
        policy="hybrid",
        host_bytes=host_bytes,
        disk=disk,
        max_len=MAX_LEN,
        make_memory=make,
    )
    return kv, tiers


def _freed_units(kv: KVCacheManager) -> tuple[set[UnitKey], set[UnitKey]]:
    """The free cached blocks' units: ``(valued, spare)`` by the policy's word."""
    policy = kv.coordinator.policy
    valued, spare = set(), set()
    for b in kv.block_pool.policy:
        if b.block_hash is None:
            continue
        assert b.group_id is not None
        value = policy.demotion_value(b)
        assert value is not None
        (spare if value == SPARE else valued).add(UnitKey(b.block_hash, b.group_id))
    return valued, spare


def _reuse_the_pool(kv: KVCacheManager) -> None:
    """The pool hands out every free block (demoting what it evicts)."""
    pool = kv.block_pool
    pool.free_blocks(pool.get_new_blocks(pool.num_free_blocks))


def _unit_sizes(make: MakeMemory, prompt: list[int]) -> dict[UnitKey, int]:
    """Bytes each of ``prompt``'s units takes in a host tier with room for all."""
    kv, tiers = _setup(make)
    compute(kv, tiers, Request("a", prompt))
    _reuse_the_pool(kv)
    host = tiers.host
    assert host is not None
    sizes = {}
    for key in list(host.keys()):  # evicted below
        before = host.used_bytes
        assert host.evict(key)
        sizes[key] = before - host.used_bytes
    tiers.close()
    return sizes


def test_with_room_evict_first_units_are_demoted_and_hit(host_memory: MakeMemory) -> None:
    kv, tiers = _setup(host_memory)
    prompt = toks(MAX_LEN - 8)
    want = compute(kv, tiers, Request("a", prompt))
    valued, spare = _freed_units(kv)
    assert spare and valued, "tiny Llama 4 releases passed chunks evict_first"
    later = Request("b", [*prompt, 1, 2])
    expected = hit_len(kv, later)
    _reuse_the_pool(kv)
    host = tiers.host
    assert host is not None
    assert set(host.keys()) == valued | spare
    assert host.stats.spare_skips == 0 and tiers.stats.demoted == len(valued | spare)
    assert tiers.prepare(later, wait=True)
    blocks, hit = kv.get_computed_blocks(later)
    assert hit == expected > 0
    for gid, table in enumerate(blocks.blocks):
        for b in table:
            if not b.is_null:
                parts = tiers.block_bytes.parts(gid, b.block_id)
                assert b"".join(bytes(p.numpy()) for p in parts) == want[(gid, b.block_hash)]
    kv.check_integrity()
    tiers.check_integrity()
    tiers.close()


def test_without_spare_room_only_the_valued_units_are_demoted(
    tmp_path: Path, host_memory: MakeMemory
) -> None:
    prompt = toks(MAX_LEN - 8)
    sizes = _unit_sizes(host_memory, prompt)
    kv, tiers = _setup(host_memory)  # which units are valued (same prompt, same policy)
    compute(kv, tiers, Request("a", prompt))
    valued, spare = _freed_units(kv)
    tiers.close()
    budget = sum(sizes[k] for k in valued)
    kv, tiers = _setup(host_memory, host_bytes=budget, disk=tmp_path)
    compute(kv, tiers, Request("a", prompt))
    _reuse_the_pool(kv)
    host = tiers.host
    assert host is not None and tiers.disk is not None
    assert set(host.keys()) == valued  # none evicted for an evict-first unit
    assert host.stats.spare_skips == len(spare) and host.stats.store_skips == 0
    assert host.stats.evictions == 0
    assert tiers.stats.spilled == 0 and tiers.disk.keys() == []  # no disk write for them
    tiers.check_integrity()
    tiers.close()


def test_valued_units_evict_spare_ones_first_and_those_go_no_lower(
    tmp_path: Path, host_memory: MakeMemory
) -> None:
    prompt, other = toks(MAX_LEN - 8), toks(MAX_LEN - 8, start=5000)
    sizes = _unit_sizes(host_memory, prompt)
    kv, tiers = _setup(host_memory, host_bytes=sum(sizes.values()), disk=tmp_path)
    compute(kv, tiers, Request("a", prompt))
    valued_a, spare_a = _freed_units(kv)
    _reuse_the_pool(kv)
    host = tiers.host
    assert host is not None and tiers.disk is not None
    assert set(host.keys()) == valued_a | spare_a  # room for all of it
    compute(kv, tiers, Request("b", other))
    valued_b, spare_b = _freed_units(kv)
    _reuse_the_pool(kv)
    held = set(host.keys())
    assert valued_a | valued_b <= held  # b's valued units took spare units' room
    gone = spare_a - held
    assert gone and host.stats.evictions == len(gone)  # only spare units were evicted
    assert host.stats.spare_skips == len(spare_b - held)
    assert tiers.stats.spilled == 0 and tiers.disk.keys() == []  # spare units go no lower
    tiers.check_integrity()
    tiers.close()
