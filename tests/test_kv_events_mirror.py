"""A subscriber rebuilds the cache's keys from the published events, exactly.

A seeded random workload runs straight through ``KVCacheManager`` (shared
prefixes, hits, duplicates computed side by side, decodes, frees, evictions
under pressure, ``reset_prefix_cache``), publishing each step's events through
``ZmqEventPublisher`` on loopback. ``MirrorSubscriber`` (tests/kv_subscriber.py,
independent of our encoder) keeps a set of ``(group_idx, hash)``; at every
checkpoint it must equal the keys of the pool's blocks. Both cache policies,
one group and a three-group hybrid layout (full + sliding + Mamba).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

zmq = pytest.importorskip("zmq")
pytest.importorskip("msgspec")

from factories import config, full, mamba, manager, req, swa  # noqa: E402
from kv_subscriber import MirrorSubscriber, pool_keys  # noqa: E402

from hybridkv import KVCacheManager, Request  # noqa: E402
from hybridkv.events import KVEventsConfig, open_publisher  # noqa: E402

LAYOUTS = {
    "one-group": (full(4),),
    "full+sliding+mamba": (full(4), swa(4, 6), mamba(4)),
}
KINDS = {
    "one-group": ["full_attention"],
    "full+sliding+mamba": ["full_attention", "sliding_window", "mamba"],
}
WINDOWS = {"one-group": [None], "full+sliding+mamba": [None, 6, None]}
NUM_BLOCKS = {"one-group": 20, "full+sliding+mamba": 40}
VOCAB = 40


def duplicated_blocks(kv: KVCacheManager) -> dict[int, tuple[int, bytes]]:
    """Block id -> key, for every block of a key that has more than one block."""
    pool = kv.block_pool
    out = {}
    for (g, h), dups in pool.duplicates.items():
        for b in [pool.cached[g][h], *dups.values()]:
            out[b.block_id] = (g, h)
    return out


@dataclass
class Workload:
    """Random requests over a few shared prefixes, driven like a tiny scheduler."""

    kv: KVCacheManager
    rng: random.Random
    running: list[Request] = field(default_factory=list)
    num_created: int = 0
    silent_evictions: int = 0  # a duplicated key lost a block and stayed cached
    resets: int = 0

    def __post_init__(self) -> None:
        self.prefixes = [[self.rng.randrange(VOCAB) for _ in range(10)] for _ in range(3)]

    def _new_request(self) -> Request:
        self.num_created += 1
        suffix = [self.rng.randrange(VOCAB) for _ in range(self.rng.randrange(0, 7))]
        return req(f"r{self.num_created}", self.rng.choice(self.prefixes) + suffix)

    def _admit(self, lookup: bool) -> None:
        r = self._new_request()
        if lookup:
            blocks, hit = self.kv.get_computed_blocks(r)
            new = self.kv.allocate_slots(r, r.num_tokens - hit, hit, blocks)
        else:  # computed again without a lookup: its full blocks become duplicates
            hit, new = 0, self.kv.allocate_slots(r, r.num_tokens)
        if new is not None:
            r.num_computed_tokens = r.num_tokens
            self.running.append(r)

    def _decode(self) -> None:
        r = self.rng.choice(self.running)
        r.append_output_token_ids([self.rng.randrange(VOCAB)])
        if self.kv.allocate_slots(r, 1) is None or r.num_tokens >= 60:
            self._finish(r)
        else:
            r.num_computed_tokens += 1

    def _finish(self, r: Request) -> None:
        self.kv.free(r)
        self.running.remove(r)

    def step(self) -> None:
        before = duplicated_blocks(self.kv)
        roll = self.rng.random()
        if roll < 0.02 and self.running:
            for r in list(self.running):
                self._finish(r)
            assert self.kv.reset_prefix_cache()
            self.resets += 1
        elif roll < 0.30 or not self.running:
            self._admit(lookup=self.rng.random() < 0.6)
        elif roll < 0.75:
            self._decode()
        else:
            self._finish(self.rng.choice(self.running))
        blocks = self.kv.block_pool.blocks
        for bid, (g, h) in before.items():
            key_still_cached = h in self.kv.block_pool.cached[g]
            if (blocks[bid].block_hash, blocks[bid].group_id) != (h, g) and key_still_cached:
                self.silent_evictions += 1


@pytest.mark.parametrize("policy", ["lru", "hybrid"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_subscriber_mirrors_the_pools_keys(layout: str, policy: str) -> None:
    specs = LAYOUTS[layout]
    kv = manager(
        NUM_BLOCKS[layout],
        *specs,
        max_model_len=64,
        cache_policy=policy,
        enable_kv_cache_events=True,
    )
    ctx = zmq.Context()
    sub = MirrorSubscriber(ctx, topic="kv", replay_endpoint=None)
    events = KVEventsConfig(endpoint=sub.endpoint, replay_endpoint="tcp://127.0.0.1:*", topic="kv")
    pub = open_publisher(events, config(NUM_BLOCKS[layout], *specs), "cpu")
    sub.replay_endpoint = pub.replay_endpoint
    try:
        work = Workload(kv, random.Random(f"{layout}/{policy}"))
        for step in range(400):
            work.step()
            pub.publish(kv.take_events())
            if step % 25 == 24:
                sub.catch_up(pub.num_batches)
                assert sub.keys == pool_keys(kv.block_pool), f"step {step}: mirror drifted"
                kv.check_integrity()
        sub.catch_up(pub.num_batches)
        assert sub.keys == pool_keys(kv.block_pool)
        # The workload did what it is meant to test.
        assert work.silent_evictions > 0, "no duplicated key lost a block"
        assert work.resets > 0 and sub.counts["AllBlocksCleared"] == work.resets
        assert sub.counts["BlockRemoved"] > 0 and sub.counts["BlockStored"] > 0
        assert sub.live > 0 and sub.last_seq == pub.num_batches - 1
        stored = [e for b in sub.batches for e in b[1] if e["type"] == "BlockStored"]
        for ev in stored:  # vLLM's group fields, per group
            g = ev["group_idx"]
            assert ev["kv_cache_spec_kind"] == KINDS[layout][g]
            assert ev.get("kv_cache_spec_sliding_window") == WINDOWS[layout][g]
            assert ev["medium"] == "CPU" and ev["lora_id"] is None
            assert len(ev["token_ids"]) == ev["block_size"] * len(ev["block_hashes"])
    finally:
        pub.close()
        sub.close()
        ctx.term()
    pub.buffer.check_integrity()
