"""The engine's host tier and the simulator's take the same units, at the same
classes, and evict the same ones, with the return bonus's reach engaged
(``host_return_share`` < 1) as without it.

Two managers of one planned layout, under ``hybrid`` with a host tier, are fed
the same seeded conversations (first turns and returning ones, admitted on the
device alone: no tier load, so both pools decide alike). One pool's evictions go
to the engine's ``TieredCache`` (``offload/demotion.py``: ``HostTier`` with
``tier_rules``' ranking), the other's to the simulator's (``TakeRecorder`` ->
``sim/tier_model.TieredCache`` -> ``TierIndex``), as ``hybridkv simulate
--host-memory`` wires it. After every request both hosts hold the same units,
in the same bytes, and have evicted the same ones in the same order; and the
reach changes what the host keeps (the check is not blind to the share).
"""

from __future__ import annotations

import random

import pytest
from factories import admit

from hybridkv import KVCacheManager, Request
from hybridkv.layouts import shipped_layout
from hybridkv.offload import BlockBytes, TieredCache
from hybridkv.offload.tier_ranking import tier_rules, tier_weight
from hybridkv.planning import allocate_kv_cache, plan_kv_cache
from hybridkv.policy import HybridOptions, HybridTuning
from hybridkv.policy.options import for_host_tier
from hybridkv.sim import device_profile
from hybridkv.sim.tier_eviction import TakeLog, TakenBatch
from hybridkv.sim.tier_model import TieredCache as SimTiers
from hybridkv.tiers import HostTier, ModelFingerprint
from hybridkv.tiers.copier import InlineCopier
from hybridkv.tiers.torch_memory import TorchHostMemory

MAX_LEN = 640
DEVICE_BYTES = 3_000_000
HOST_BYTES = DEVICE_BYTES // 2


def options(reach: int) -> HybridOptions:
    tuned = HybridOptions(tuning=HybridTuning(return_bonus_tokens=reach))
    return for_host_tier(tuned, DEVICE_BYTES, HOST_BYTES)


def plan():
    return plan_kv_cache(shipped_layout("tiny-jamba"), DEVICE_BYTES, max_model_len=MAX_LEN)


class Engine:
    """A manager whose evictions are demoted to the engine's host tier."""

    def __init__(self, hybrid: HybridOptions) -> None:
        config = plan().kv_cache_config
        self.kv = KVCacheManager(config, MAX_LEN, cache_policy="hybrid", hybrid=hybrid)
        rules = tier_rules(self.kv)
        assert rules is not None
        self.host = HostTier(
            ModelFingerprint.from_kv_cache_config(config, "test weights"),
            HOST_BYTES,
            TorchHostMemory("cpu"),
            rules[0],
            copier=InlineCopier(),
        )
        self.gone: list[tuple[bytes, int]] = []
        self.tiers = TieredCache(self.kv, BlockBytes(config, allocate_kv_cache(config)), self.host)
        self.host.on_removed = lambda k: self.gone.append((k.block_hash, k.group_id))

    def held(self) -> set[tuple[bytes, int]]:
        return {(k.block_hash, k.group_id) for k in self.host.keys()}  # noqa: SIM118


class Sim:
    """A manager whose evictions are demoted to the simulator's host tier, wired
    as ``replay_trace`` wires it."""

    def __init__(self, hybrid: HybridOptions) -> None:
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
            None,
            False,
            tier_weight(self.kv),
        )
        self.gone: list[tuple[bytes, int]] = []
        host = self.tiers.host
        store = host.store

        def noted(key, nbytes, cls, pinned=()):  # the host's victims, in eviction order
            victims = store(key, nbytes, cls, pinned)
            self.gone += [k for k, _ in victims or ()]
            return victims

        host.store = noted  # type: ignore[method-assign]

    def sync(self) -> None:
        self.tiers.sync((), self.taken)

    def held(self) -> set[tuple[bytes, int]]:
        return set(self.tiers.host.units)


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


def run(reach: int, seed: int) -> tuple[Engine, Sim, list[set[tuple[bytes, int]]]]:
    hybrid = options(reach)
    engine, sim = Engine(hybrid), Sim(hybrid)
    helds = []
    for r in conversations(seed, 160):
        twin = Request(r.request_id, list(r.prompt_token_ids))
        assert admit(engine.kv, r)[0] == admit(sim.kv, twin)[0]
        sim.sync()
        engine.tiers.after_step([(r, 0, r.num_tokens)], r.num_tokens, r.num_tokens, 0.0)
        engine.kv.free(r)
        sim.kv.free(twin)
        sim.sync()
        held = engine.held()
        assert held == sim.held(), f"after {r.request_id}"
        assert engine.host.used_bytes == sim.tiers.host.used_bytes
        assert engine.gone == sim.gone
        helds.append(held)
    engine.kv.check_integrity()
    engine.host.check_integrity()
    sim.tiers.check_integrity()
    return engine, sim, helds


def device_tokens() -> int:
    kv = Engine(options(0)).kv
    return kv.block_pool.num_blocks * kv.policy.block_sizes[kv.policy.full_gid]


@pytest.mark.parametrize("seed", range(3))
def test_engine_and_simulator_hosts_agree_with_and_without_a_reach(seed: int) -> None:
    host_tokens = device_tokens() * HOST_BYTES // DEVICE_BYTES
    # A reach of twice the host's tokens: a stay of 2 host turnovers, 1 of them
    # the bonus (share 1/4 of 4).
    reach = 2 * host_tokens
    on_engine, on_sim, on = run(reach, seed)
    assert on_engine.kv.policy.host_return_share == pytest.approx(0.25)
    assert on_sim.kv.policy.host_return_share == pytest.approx(0.25)
    off_engine, _, off = run(0, seed)
    assert off_engine.kv.policy.host_return_share == 1.0
    # the host evicted, and the reach changed what it kept
    assert len(on_engine.gone) > 20 and len(off_engine.gone) > 20
    assert on != off
