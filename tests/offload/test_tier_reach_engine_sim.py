"""The engine's host tier and the simulator's take the same units, at the same
classes, and evict the same ones, with the return bonus's reach engaged
(``host_return_share`` < 1) as without it.

Two managers of one planned layout, under ``hybrid`` with a host tier, are fed
the same seeded conversations (first turns and returning ones, admitted on the
device alone: no tier load, so both pools decide alike). One pool's evictions go
to the engine's ``TieredCache`` (``offload/demotion.py``: ``HostTier`` with
``tier_rules``' ranking), the other's to the simulator's (``TakeRecorder`` ->
``sim/tier_model.TieredCache`` -> ``TierIndex``), as ``hybridkv simulate
--host-memory`` wires it, with a disk tier under the host or without. After
every request both hosts hold the same units, in the same bytes, and have
evicted the same ones in the same order, and both disks hold the same units;
and the reach changes what the host keeps (the check is not blind to the share).

Not covered: tier hits. After a host hit the two pools differ by design (the
engine loads the hit's units into blocks it takes at the lookup; the simulator's
manager allocates the prompt as computed and times the loaded share as a copy).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from factories import admit

from hybridkv import KVCacheManager, Request
from hybridkv.layouts import shipped_layout
from hybridkv.offload import BlockBytes, TieredCache
from hybridkv.offload.tier_ranking import tier_rules, tier_weight
from hybridkv.planning import KVCachePlan, allocate_kv_cache, plan_kv_cache
from hybridkv.policy import HybridOptions, HybridTuning
from hybridkv.policy.options import for_host_tier
from hybridkv.sim import device_profile
from hybridkv.sim.tier_eviction import TakeLog, TakenBatch
from hybridkv.sim.tier_model import TieredCache as SimTiers
from hybridkv.tiers import DiskTier, HostTier, ModelFingerprint
from hybridkv.tiers.copier import InlineCopier
from hybridkv.tiers.torch_memory import TorchHostMemory

MAX_LEN = 640
DEVICE_BYTES = 3_000_000
HOST_BYTES = DEVICE_BYTES // 2
DISK_BYTES = DEVICE_BYTES

Key = tuple[bytes, int]


def options(reach: int) -> HybridOptions:
    tuned = HybridOptions(tuning=HybridTuning(return_bonus_tokens=reach))
    return for_host_tier(tuned, DEVICE_BYTES, HOST_BYTES)


def plan() -> KVCachePlan:
    return plan_kv_cache(shipped_layout("tiny-jamba"), DEVICE_BYTES, max_model_len=MAX_LEN)


def keys(tier: HostTier | DiskTier | None) -> set[Key]:
    return set() if tier is None else {(k.block_hash, k.group_id) for k in tier.keys()}  # noqa: SIM118


class Engine:
    """A manager whose evictions are demoted to the engine's host tier (and its
    victims spilled to the engine's disk tier in ``disk``)."""

    def __init__(self, hybrid: HybridOptions, disk: Path | None) -> None:
        config = plan().kv_cache_config
        self.kv = KVCacheManager(config, MAX_LEN, cache_policy="hybrid", hybrid=hybrid)
        rules = tier_rules(self.kv)
        assert rules is not None
        fingerprint = ModelFingerprint.from_kv_cache_config(config, "test weights")
        self.host = HostTier(
            fingerprint, HOST_BYTES, TorchHostMemory("cpu"), rules[0], copier=InlineCopier()
        )
        self.disk = (
            None
            if disk is None
            else DiskTier(fingerprint, disk, DISK_BYTES, InlineCopier(), rules[1])
        )
        self.gone: list[Key] = []
        buffers = allocate_kv_cache(config)
        self.tiers = TieredCache(self.kv, BlockBytes(config, buffers), self.host, self.disk)
        self.host.on_removed = lambda k: self.gone.append((k.block_hash, k.group_id))


class Sim:
    """A manager whose evictions are demoted to the simulator's host tier (and
    disk tier), wired as ``replay_trace`` wires them."""

    def __init__(self, hybrid: HybridOptions, disk: bool) -> None:
        kv_plan = plan()
        config = kv_plan.kv_cache_config
        self.kv = KVCacheManager(config, MAX_LEN, cache_policy="hybrid", hybrid=hybrid)
        self.taken: list[TakenBatch] = []
        self.kv.block_pool.on_take = TakeLog(self.taken, self.kv.policy.demotion_value)
        self.tiers = SimTiers(
            config,
            self.kv.coordinator.managers,
            self.kv.block_pool.cached,
            kv_plan.page_bytes,
            device_profile("h100"),
            HOST_BYTES,
            DISK_BYTES if disk else None,
            False,
            tier_weight(self.kv),
        )
        self.gone: list[Key] = []
        host = self.tiers.host
        store = host.store

        def noted(key, nbytes, cls, pinned=()):  # the host's victims, in eviction order
            victims = store(key, nbytes, cls, pinned)
            self.gone += [k for k, _ in victims or ()]
            return victims

        host.store = noted  # type: ignore[method-assign]

    def sync(self) -> None:
        self.tiers.sync((), self.taken)


def conversations(seed: int, n: int) -> list[Request]:
    """``n`` requests of 12 conversations: each turn is its conversation's last
    prompt plus 32-160 new tokens (a returning prompt), a first turn 96-320."""
    rng = random.Random(seed)
    prompts: dict[int, list[int]] = {}
    out = []
    for i in range(n):
        c = rng.randrange(12)
        prompt = prompts.get(c, [])
        if len(prompt) > MAX_LEN - 200:
            prompt = []  # the conversation ends; a new one takes its place
        start = 100_000 * (c + 1) + 1000 * i
        grow = rng.randint(32, 160) if prompt else rng.randint(96, 320)
        prompt = [*prompt, *range(start, start + grow)]
        prompts[c] = prompt
        out.append(Request(f"r{i}", list(prompt)))
    return out


def run(reach: int, seed: int, disk: Path | None) -> tuple[Engine, list[set[Key]]]:
    """Both sides over one seed's conversations, checked after each request: the
    engine and what its host held after each request."""
    hybrid = options(reach)
    engine, sim = Engine(hybrid, disk), Sim(hybrid, disk is not None)
    helds = []
    for r in conversations(seed, 160):
        twin = Request(r.request_id, list(r.prompt_token_ids))
        assert admit(engine.kv, r)[0] == admit(sim.kv, twin)[0]  # the device alone
        sim.sync()
        engine.tiers.after_step([(r, 0, r.num_tokens)], r.num_tokens, r.num_tokens, 0.0)
        engine.kv.free(r)
        sim.kv.free(twin)
        sim.sync()
        held = keys(engine.host)
        assert held == set(sim.tiers.host.units), f"after {r.request_id}"
        assert engine.host.used_bytes == sim.tiers.host.used_bytes
        assert engine.gone == sim.gone
        if sim.tiers.disk is not None:
            assert keys(engine.disk) == set(sim.tiers.disk.units), f"after {r.request_id}"
        helds.append(held)
    engine.kv.check_integrity()
    engine.tiers.check_integrity()
    sim.tiers.check_integrity()
    if engine.disk is not None:
        assert engine.tiers.stats.spilled > 20  # the disk took the host's victims
    engine.tiers.close()
    return engine, helds


@pytest.mark.parametrize(("seed", "with_disk"), [(0, False), (1, False), (2, False), (0, True)])
def test_engine_and_simulator_tiers_agree_with_and_without_a_reach(
    seed: int, with_disk: bool, tmp_path: Path
) -> None:
    kv = Engine(options(0), None).kv
    host_tokens = kv.block_pool.num_blocks * kv.policy.block_sizes[kv.policy.full_gid] // 2
    # A reach of twice the host's tokens: a stay of 2 host turnovers, 1 of them
    # the bonus (share 1/4 of 4).
    on_engine, on = run(2 * host_tokens, seed, tmp_path / "on" if with_disk else None)
    assert on_engine.kv.policy.host_return_share == pytest.approx(0.25)
    off_engine, off = run(0, seed, tmp_path / "off" if with_disk else None)
    assert off_engine.kv.policy.host_return_share == 1.0
    # the host evicted, and the reach changed what it kept
    assert len(on_engine.gone) > 20 and len(off_engine.gone) > 20
    assert on != off
