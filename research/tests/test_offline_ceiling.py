"""``research/offline_*.py`` and ``oracle_*.py``: the sequential model worked by hand, the
dual bound against brute force, and the oracle free set in the real simulator."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
from offline_bound import DualProblem, dual_bound
from offline_replay import lru_replay, planned_replay
from offline_units import build_units
from oracle_free_set import Clock, Needs, OracleFreeSet
from oracle_sim import hooked_manager, hooked_replay, oracle_replay, plan_needs, reach, sim_hashes

from hybridkv.core.block import KVCacheBlock
from hybridkv.layouts import shipped_layout
from hybridkv.sim import SimOptions
from hybridkv.sim.trace import TraceRequest

BS = 512  # one Mooncake hash id per block


def _req(line: int, ids: list[int], arrival: float = 0.0) -> TraceRequest:
    """A prompt of ``len(ids)`` blocks and one token (every block can hit)."""
    return TraceRequest(line, arrival, len(ids) * BS + 1, 4, hash_ids=(*ids, 10**6 + line))


def _ab_ab() -> list[TraceRequest]:
    """A, B, A, B: two 2-block prompts, each returning once."""
    return [_req(1, [1, 2]), _req(2, [3, 4]), _req(3, [1, 2]), _req(4, [3, 4])]


def test_units_by_hand():
    u = build_units([*_ab_ab(), _req(5, [1, 9])], BS, 1, 1)
    assert u.start.tolist() == [0, 2, 4, 6, 8, 10]
    assert u.prev.tolist() == [-1, -1, -1, -1, 0, 0, 1, 1, 2, -1]
    assert u.kmax.tolist() == [2, 2, 2, 2, 2]
    assert u.reach.tolist() == [0, 0, 2, 2, 1]
    assert u.unlimited_hits() == 5 * BS


@pytest.mark.parametrize(
    ("capacity", "opt"),
    [(6, 4 * BS), (5, 3 * BS), (3, 2 * BS), (2, BS), (1, 0)],
)
def test_ab_ab_optimum_and_bound(capacity, opt):
    # A hit of 2 blocks needs 2 KV pages and a state page; A's units span gaps 1-2
    # and B's gaps 2-3, so gap 2 holds both: 6 pages for every hit, 5 for A whole and
    # B's first block (its KV and the state after it), 3 for one whole hit.
    u = build_units(_ab_ab(), BS, 1, 1)
    _, best, trail = dual_bound(DualProblem(u, capacity), iterations=60)
    assert min(trail) == best.bound >= opt - 1e-6
    if capacity < 6:
        assert best.bound < u.unlimited_hits()  # the capacity binds in the relaxation
    assert planned_replay(u, capacity, u.reach, per_byte=False) <= opt
    assert lru_replay(u, capacity) <= opt


def test_planned_replay_by_hand():
    u = build_units(_ab_ab(), BS, 1, 1)
    # 3 pages: B (farthest) goes whole, A hits. 5 pages: only B's planned state goes
    # and B's KV alone cannot hit (the reach plan's weakness the bound shows).
    assert planned_replay(u, 3, u.reach, per_byte=False) == 2 * BS
    assert planned_replay(u, 5, u.reach, per_byte=False) == 2 * BS
    assert planned_replay(u, 5, np.array([0, 0, 2, 1]), per_byte=False) == 3 * BS
    # lru holds every boundary's state: 4 pages a prompt. At 6 pages each return
    # finds its deepest KV block and state gone (released first, evicted first) and
    # hits one block; at 5 the state after its first block is gone too.
    assert lru_replay(u, 8) == 4 * BS
    assert lru_replay(u, 6) == 2 * BS
    assert lru_replay(u, 5) == 0


def _brute_force(u, capacity: int) -> int:
    """The relaxation's integral optimum: every choice of depths whose pages fit."""
    p = DualProblem(u, capacity)
    best = 0
    for depth in itertools.product(*(range(int(d) + 1) for d in u.reach)):
        d = np.array(depth, dtype=np.int64)
        if p.usage(d)[1:].max(initial=0) <= capacity:
            best = max(best, int(d.sum()) * u.bs)
    return best


@pytest.mark.parametrize("seed", range(4))
def test_bound_holds_against_brute_force(seed):
    rng = random.Random(seed)
    convs = [[rng.randrange(1000) for _ in range(3)] for _ in range(3)]
    reqs = []
    for line in range(1, 8):
        c = rng.choice(convs)
        reqs.append(_req(line, c[: rng.randint(1, 3)]))
    u = build_units(reqs, BS, 1, 2)
    for capacity in (2, 4, 7, 12):
        opt = _brute_force(u, capacity)
        _, best, _ = dual_bound(DualProblem(u, capacity), iterations=40)
        assert best.bound >= opt - 1e-6
        assert planned_replay(u, capacity, u.reach, per_byte=False) <= opt
        assert planned_replay(u, capacity, u.reach, per_byte=True) <= opt
        assert lru_replay(u, capacity) <= opt


def _blocks(n: int) -> list[KVCacheBlock]:
    return [KVCacheBlock(i) for i in range(1, n + 1)]


def test_oracle_free_set_order_and_refresh():
    needs = Needs()
    for key, req in ((b"a", 5), (b"a", 9), (b"b", 7)):
        needs.add(0, key, 0, req)
    clock = Clock(now=1)
    blocks = _blocks(4)
    free = OracleFreeSet(blocks, needs, clock, kv_group=0)
    a, b, c, d = free.take(4)
    for blk, key in ((a, b"a"), (b, b"b"), (c, b"c")):
        blk.block_hash, blk.group_id = key, 0
    free.release([a, b, c])
    free.release([d], evict_first=True)
    free.check_integrity()
    assert free.num_free_blocks == 4
    assert free.take(2) == [d, c]  # evict-first, then never needed
    clock.now = 6  # a's next need moves from 5 to 9: b (7) is now nearer
    free.check_integrity()
    assert list(free) == [b, a]  # not re-ranked yet: a's stale need (5) is nearer
    assert free.take(1) == [a]
    free.remove(b)
    assert free.num_free_blocks == 0
    free.check_integrity()


def test_oracle_in_the_simulator_reaches_unlimited_with_room():
    # A conversation and a document, each returning: with ample memory the oracle
    # hits every reach, as unlimited lru does; the recorded hits add up.
    reqs = [
        _req(1, [1, 2, 3], 0.0),
        _req(2, [7, 8], 0.5),
        _req(3, [1, 2, 3, 4], 40.0),
        _req(4, [7, 8, 9], 41.0),
        _req(5, [1, 2, 3, 4, 5], 80.0),
    ]
    layout = shipped_layout("jamba-v0.1")
    hashes = sim_hashes(reqs, 80)
    depth = reach(reqs, hashes, 80)
    assert depth == build_units(reqs, 80, 1, 7).reach.tolist()
    hits: dict[int, int] = {}
    res = oracle_replay(layout, reqs, 4 * 10**9, plan_needs(hashes, depth), hits)
    assert res.hit_tokens == sum(hits.values()) == 80 * sum(depth)
    lru: dict[int, int] = {}
    ref = hooked_replay(layout, reqs, SimOptions(memory_bytes=4 * 10**9), hooked_manager(lru))
    assert ref.hit_tokens == sum(lru.values()) <= res.hit_tokens


def test_loss_by_gap_by_hand():
    from offline_ceiling import loss_by_gap

    reqs = _ab_ab()
    u = build_units(reqs, BS, 1, 1)
    rows = loss_by_gap(reqs, u, {2: 2 * BS, 3: 2 * BS}, {2: 2 * BS, 3: 0})
    # Both returns come back after one 1,025-token prompt: the first bucket. B lost
    # its 2 blocks (1,024 of 4,100 prompt tokens); the reach is 2,048 tokens.
    assert rows[2] == "| 0-2M | 49.95 | 1 | 24.98 | 0.00 |"
    assert all(r.endswith("| 0.00 | 0 | 0.00 | 0.00 |") for r in rows[3:])
