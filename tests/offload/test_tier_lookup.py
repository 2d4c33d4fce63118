"""``tiers_may_hold``: the tiers are skipped only when no tier has an entry for a
block a hit could read, so the skip never changes a hit (checked against the
cross-tier fixed point on random tier contents)."""

from __future__ import annotations

import random

import pytest
from factories import admit, toks

from hybridkv import KVCacheManager, Request
from hybridkv.coordinators.tiered_hit import tiered_hit_length
from hybridkv.layouts import shipped_layout
from hybridkv.offload.tier_lookup import tiers_may_hold
from hybridkv.planning import plan_kv_cache
from hybridkv.tiers import HostTier, ModelFingerprint, UnitKey
from hybridkv.tiers.copier import InlineCopier

MAX_LEN = 256


def _setup(name: str) -> tuple[KVCacheManager, HostTier]:
    config = plan_kv_cache(
        shipped_layout(name), 400_000, max_model_len=MAX_LEN, max_num_batched_tokens=MAX_LEN
    ).kv_cache_config
    kv = KVCacheManager(config, MAX_LEN)
    host = HostTier(
        ModelFingerprint.from_kv_cache_config(config, "w"), 1 << 20, copier=InlineCopier()
    )
    return kv, host


def _hashes(kv: KVCacheManager, r: Request) -> list[bytes]:
    r.bind_hasher(kv.hasher)
    return r.live_block_hashes


def _put(host: HostTier, keys: list[UnitKey]) -> None:
    for t in host.store_many([(k, [b"x"], None) for k in keys]):
        assert t.wait()


@pytest.mark.parametrize("name", ["tiny-gemma3", "tiny-jamba", "tiny-llama4"])
def test_only_the_requests_own_blocks_within_the_limit_count(name: str) -> None:
    kv, host = _setup(name)
    managers = kv.coordinator.managers
    r = Request("r", toks(96))
    hashes = _hashes(kv, r)
    limit = r.num_tokens - 1  # the last block is never a hit
    other = _hashes(kv, Request("o", toks(96, start=5000)))
    _put(host, [UnitKey(h, m.group_id) for m in managers for h in m.group_hashes(other)])
    assert not tiers_may_hold(managers, (host, None), hashes, limit)
    last = managers[0].group_hashes(hashes)[-1]  # the block the limit leaves out
    _put(host, [UnitKey(last, managers[0].group_id)])
    assert not tiers_may_hold(managers, (host, None), hashes, limit)
    assert tiers_may_hold(managers, (host, None), hashes, r.num_tokens)
    for m in managers:  # one unit of any group within the limit is enough
        kv2, host2 = _setup(name)
        mine = kv2.coordinator.managers[m.group_id].group_hashes(
            _hashes(kv2, Request("r", toks(96)))
        )
        _put(host2, [UnitKey(mine[0], m.group_id)])
        assert tiers_may_hold(kv2.coordinator.managers, (None, host2), hashes, limit)


@pytest.mark.parametrize("name", ["tiny-gemma3", "tiny-jamba", "tiny-llama4"])
def test_when_skipped_the_cross_tier_hit_is_the_devices(name: str) -> None:
    rng = random.Random(0)
    kv, host = _setup(name)
    managers = kv.coordinator.managers
    pool = kv.block_pool
    branches = set()
    for trial in range(60):
        if rng.random() < 0.5:  # some blocks on the device too
            warm = Request(f"w{trial}", toks(rng.randint(20, 120), start=rng.choice([0, 7, 900])))
            admit(kv, warm)
            kv.free(warm)
        r = Request(f"r{trial}", toks(rng.randint(2, 120), start=rng.choice([0, 7, 900])))
        hashes = _hashes(kv, r)
        limit = r.num_tokens - 1
        # Random units of random requests (sometimes this one's) in the tier.
        src = (
            hashes
            if rng.random() < 0.5
            else _hashes(kv, Request("x", toks(80, start=rng.randint(0, 99))))
        )
        keys = [
            UnitKey(h, m.group_id)
            for m in managers
            for h in m.group_hashes(src)
            if rng.random() < 0.3
        ]
        _put(host, [k for k in keys if not host.contains(k)])

        def present(gid: int, _i: int, h: bytes) -> bool:
            return h in pool.cached[gid] or host.contains(UnitKey(h, gid))

        def on_device(gid: int, _i: int, h: bytes) -> bool:
            return h in pool.cached[gid]

        skipped = not tiers_may_hold(managers, (host, None), hashes, limit)
        branches.add(skipped)
        if skipped:
            assert tiered_hit_length(managers, hashes, limit, present) == tiered_hit_length(
                managers, hashes, limit, on_device
            )
        else:  # the skip is a superset test: something of the request is held
            assert any(
                host.contains(UnitKey(h, m.group_id))
                for m in managers
                for h in m.group_hashes(hashes)[: limit // m.block_size]
            )
    assert branches == {True, False}
