"""Swap preemption: a preempted request's units go to the host tier and come back.

On a planned tiny Jamba layout (Mamba blocks of 32 tokens): a request computed
to 48 tokens is swapped out, the device then reuses every block and is wiped,
and its resume loads its hit back through the normal load path. A Mamba group
needs the state at the hit point, and the running state at 48 is not a kept
snapshot: the swap restores exactly up to the last kept state (32 under
``lru``, which keeps every boundary; at most that under ``hybrid``), never past
it, with the bytes computed before; a reload whose copies fail is recomputed,
never read stale. ``"recompute"`` never swaps; with ``preemption_mode`` None
the swap rule copies only units the pool's reuse would lose (under ``lru``,
not written through yet here), when the cost model finds it cheaper; under
``hybrid`` the pool demotes them on reuse, so nothing is copied
(``test_swap_rule.py``). The scheduler calls ``swap_out`` once the request's
blocks are freed.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from factories import admit, toks
from tier_helpers import assert_restored, evict_and_wipe, fill, tiered_manager

from hybridkv import Request
from hybridkv.offload import BlockBytes
from hybridkv.offload.load_cost import ALPHA, MIN_PREFILL_TOKENS, LoadCost, LoadCostPrior
from hybridkv.tiers.memory import HostMemory

MAX_LEN = 128
MAMBA_BLOCK = 32  # tiny-jamba's planned block size (every group's)
#: ``conftest.host_memory``: ``(block_bytes, budget bytes) -> the host tier's memory``.
MakeMemory = Callable[[BlockBytes, int], HostMemory]


@pytest.mark.parametrize("policy", ["lru", "hybrid"])
def test_a_swap_restores_up_to_the_last_kept_mamba_state(
    policy: str, host_memory: MakeMemory
) -> None:
    kv, buffers, tiers, _ = tiered_manager(
        "tiny-jamba", policy=policy, max_len=MAX_LEN, make_memory=host_memory
    )
    r = Request("a", toks(48 + 8))
    hit, _ = admit(kv, r)
    assert hit == 0
    r.num_computed_tokens = 48  # preempted after 48 of its 56 tokens (mid Mamba block)
    want = fill(kv, tiers, r)
    point = tiers.swap.swap_point(r)
    assert point % MAMBA_BLOCK == 0 and 0 < point <= 48
    if policy == "lru":
        assert point == MAMBA_BLOCK  # every boundary's state is kept
    kv.free(r)  # as the scheduler preempts: freed, then offered to the swap
    assert tiers.swap.swap_point(r) == point
    assert tiers.swap_out(r, "swap")
    assert tiers.stats.swaps == 1 and tiers.stats.swapped_tokens == point
    assert tiers.stats.swapped_units == 2  # the state at 32 and one attention block
    evict_and_wipe(kv, buffers)
    r.num_computed_tokens = 0  # resumed
    assert tiers.prepare(r, wait=True)
    blocks, resumed = kv.get_computed_blocks(r)
    assert resumed == point  # exactly the swap point: the running state was not saved
    assert_restored(tiers, blocks, want)
    tiers.check_integrity()
    kv.check_integrity()
    tiers.close()


@pytest.mark.parametrize(
    ("policy", "mode", "seconds_per_token", "swapped"),
    [
        ("lru", None, 1.0, True),  # lost on reuse, recompute dear: copied
        ("lru", None, 1e-12, False),  # recompute cheap: declined
        ("lru", "recompute", 1.0, False),
        ("lru", "swap", 1e-12, True),
        ("hybrid", None, 1.0, False),  # demoted on reuse: nothing to copy
        ("hybrid", "swap", 1e-12, True),
    ],
)
def test_the_mode_or_the_rule_decides(
    policy: str, mode: str | None, seconds_per_token: float, swapped: bool, host_memory: MakeMemory
) -> None:
    kv, _, tiers, _ = tiered_manager(
        "tiny-jamba", policy=policy, max_len=MAX_LEN, make_memory=host_memory
    )
    tiers.cost.observe_step(100, 100, 100 * seconds_per_token)  # recompute: measured
    r = Request("a", toks(48 + 8))
    admit(kv, r)
    r.num_computed_tokens = 48
    stores = tiers.host.stats.stores
    kv.free(r)
    assert tiers.swap_out(r, mode) == swapped
    tiers.pending.wait_all()
    assert (tiers.host.stats.stores > stores) == swapped
    assert tiers.stats.swaps_declined == (mode is None and policy == "lru" and not swapped)
    assert tiers.stats.swaps_unneeded == (mode is None and policy == "hybrid")
    tiers.check_integrity()
    tiers.close()


def test_the_cost_model() -> None:
    cost = LoadCost(cuda=False)
    assert cost.load_cheaper(1 << 40, 1)  # nothing measured: load, as before the model
    cost.observe_step(64, 0, 1.0)  # decodes only: not a recompute figure
    cost.observe_step(MIN_PREFILL_TOKENS - 1, MIN_PREFILL_TOKENS - 1, 1.0)  # too few tokens
    assert cost.recompute_seconds(10) is None
    cost.observe_step(100, 100, 1.0)  # 10 ms per token
    assert cost.recompute_seconds(10) == pytest.approx(0.1)
    prior = LoadCostPrior().cpu
    assert cost.load_bandwidth == prior  # the start figure, until a load is measured
    cost.observe_load(1000, 1e-6)  # 1 GB/s measured, averaged into the prior
    bw = cost.load_bandwidth
    assert bw == pytest.approx(prior + ALPHA * (1e9 - prior))
    assert LoadCost(cuda=True).load_bandwidth == LoadCostPrior().cuda
    assert cost.load_cheaper(int(bw * 0.05), 10)  # 50 ms of copy vs 100 ms of recompute
    assert not cost.load_cheaper(int(bw * 0.05), 10, copies=2)  # out and back: 100 ms
    assert not cost.load_cheaper(int(bw * 0.2), 10)


def test_a_failed_reload_recomputes(host_memory: MakeMemory) -> None:
    kv, buffers, tiers, copier = tiered_manager(
        "tiny-jamba", max_len=MAX_LEN, make_memory=host_memory
    )
    r = Request("a", toks(48 + 8))
    admit(kv, r)
    r.num_computed_tokens = 48
    kv.free(r)
    assert tiers.swap_out(r, "swap")
    evict_and_wipe(kv, buffers)
    copier.fail = True  # every load's copy fails
    r.num_computed_tokens = 0
    assert tiers.prepare(r, wait=True)
    assert kv.get_computed_blocks(r)[1] == 0  # nothing stale: recomputed from the start
    assert tiers.stats.load_failures > 0 and tiers.stats.hits == 0
    tiers.check_integrity()
    kv.check_integrity()
    tiers.close()
