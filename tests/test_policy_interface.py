"""The cache policy's interface and settings (``hybridkv.policy``): rules, not numbers.

- ``HybridTuning`` / ``HybridOptions``: validated, named errors, overridable;
- each learner's switch turns it off (its neutral answer stays);
- the policy only answers: ``make_room`` changes nothing, ``release`` returns
  runs that the coordinator applies, managers are built with a ``Hold``;
- ``lru`` releases tail first across groups, as vLLM does.
"""

from __future__ import annotations

import pytest
from factories import admit, config, decode, full, mamba, serve, swa

from hybridkv import HybridOptions, HybridTuning, KVCacheManager, Request
from hybridkv.managers.points import Hold
from hybridkv.policy import HybridPolicy, LruPolicy, Shed
from hybridkv.policy.fine_alignment import FineAlignment
from hybridkv.policy.tail_alignment import TailAlignment
from hybridkv.policy.tuning import DEFAULT_TUNING, TUNING_FIELDS, parse_tuning

# -- settings ---------------------------------------------------------------


def test_tuning_overrides_are_checked_and_named() -> None:
    t = DEFAULT_TUNING.with_text(
        parse_tuning(["floor_ratio=16,learn_returning=off", "grid_agree=0.8"])
    )
    assert (t.floor_ratio, t.learn_returning, t.grid_agree) == (16, False, 0.8)
    assert t.replace(floor_ratio=32, learn_returning=True, grid_agree=0.9) == DEFAULT_TUNING
    with pytest.raises(ValueError, match="unknown tuning floor_rate; known: tail_tokens"):
        DEFAULT_TUNING.replace(floor_rate=1)
    with pytest.raises(ValueError, match=r"tuning floor_ratio must be an int, got '1\.5'"):
        DEFAULT_TUNING.with_text({"floor_ratio": "1.5"})
    with pytest.raises(ValueError, match="tuning learn_returning must be true or false"):
        DEFAULT_TUNING.with_text({"learn_returning": "maybe"})
    with pytest.raises(ValueError, match="tuning grid_agree must be a finite number >= 0"):
        HybridTuning(grid_agree=-0.1)
    with pytest.raises(ValueError, match="tuning learn_window must be >= 1"):
        HybridTuning(learn_window=0)
    with pytest.raises(ValueError, match="--tuning takes key=value items, got 'floor_ratio'"):
        parse_tuning(["floor_ratio"])
    assert len(TUNING_FIELDS) == len(set(TUNING_FIELDS))


def test_value_weight_is_the_costliest_kinds() -> None:
    t = HybridTuning(value_weight_chunked=5.0, value_weight_mamba=3.0, value_weight_sliding=0.5)
    assert t.value_weight({"chunked", "mamba", "sliding"}) == 5.0
    assert t.value_weight({"mamba", "sliding"}) == 3.0
    assert t.value_weight({"sliding"}) == t.value_weight(set()) == 0.5


def test_options_take_the_hybrid_keywords_and_name_them_in_errors() -> None:
    o = HybridOptions.from_knobs(hybrid_value_weight=2, hybrid_tuning={"tail_tokens": 64})
    assert (o.value_weight, o.tail, o.bonus) == (2, 64, DEFAULT_TUNING.return_bonus)
    assert HybridOptions(tail_tokens=8).tail == 8  # the knob wins over the tuning
    assert HybridOptions.from_knobs(o, hybrid_floor_tokens=0).value_weight == 2  # base kept
    with pytest.raises(ValueError, match="unknown hybrid option hybrid_tail"):
        HybridOptions.from_knobs(hybrid_tail=4)
    with pytest.raises(ValueError, match="hybrid_tail_tokens must be an int >= 0, got None"):
        HybridOptions.from_knobs(hybrid_tail_tokens=None)
    with pytest.raises(ValueError, match="hybrid_return_grade must be one of flat"):
        HybridOptions(return_grade="steep")
    with pytest.raises(ValueError, match="hybrid_tuning must be a HybridTuning or a dict"):
        HybridOptions.from_knobs(hybrid_tuning="floor_ratio=16")
    kv = KVCacheManager(config(16, full(4), swa(4, 5)), 64, hybrid=HybridOptions(tail_tokens=8))
    assert kv.hybrid_options.tail == 8


# -- switches ---------------------------------------------------------------


def test_each_learner_switch_keeps_its_neutral_answer() -> None:
    off = DEFAULT_TUNING.replace(learn_tail_alignment=False, learn_fine_alignment=False)
    on, quiet = TailAlignment(16, 512, None), TailAlignment(16, 512, None, off)
    for ta in (on, quiet):
        for i in range(DEFAULT_TUNING.learn_min_observed):
            ta.observe(512 * (i + 1), 512 * (i + 3))  # every branch on a 512 grid
    assert (on.align, quiet.align) == (512, 0)
    assert not quiet.fine.learning and FineAlignment(528, 512).learning


def test_the_returning_switch_reaches_the_policy_and_the_floor_is_fixed() -> None:
    def policy(**tuning: bool) -> HybridPolicy:
        kv = KVCacheManager(
            config(64, full(4), mamba(4)), 512, cache_policy="hybrid", hybrid_tuning=tuning
        )
        assert isinstance(kv.policy, HybridPolicy)
        return kv.policy

    assert policy().seen is not None and policy(learn_returning=False).seen is None
    with pytest.raises(ValueError, match="unknown tuning learn_floor"):
        policy(learn_floor=False)  # removed (policy-ablation.md): the floor is not learned


# -- the interface ------------------------------------------------------------


def test_policies_by_layout_and_managers_built_with_the_policys_hold() -> None:
    lru = KVCacheManager(config(16, full(4), swa(4, 5)), 64)
    assert isinstance(lru.policy, LruPolicy) and not lru.coordinator.hybrid
    assert all(m.hybrid is False and m.tail == 0 for m in lru.coordinator.managers)
    full_only = KVCacheManager(config(16, full(4)), 64, cache_policy="hybrid")
    assert isinstance(full_only.policy, LruPolicy)  # decides exactly as lru
    kv = KVCacheManager(
        config(16, full(4), swa(4, 5)), 64, cache_policy="hybrid", hybrid_tail_tokens=8
    )
    assert kv.policy.hold(1) == Hold(8, 4)
    assert all((m.hybrid, m.tail, m.hit_step) == (True, 8, 4) for m in kv.coordinator.managers)


def test_make_room_only_answers() -> None:
    """The newest request retaining blocks is named, with the points it keeps;
    when that is too few, the request stepping gives up every point and its
    tail, if it is alone; nothing changes until the coordinator applies it
    (test_shedding.py and test_min_memory.py have the applied cases)."""
    kv = KVCacheManager(
        config(17, full(4), swa(4, 5)),
        256,
        cache_policy="hybrid",
        hybrid_tail_tokens=0,
        hybrid_value_weight=0.0,
        hybrid_tail_align=0,
    )
    serve(kv, "a", list(range(4)))
    b = Request("b", list(range(20)))
    assert admit(kv, b)[0] == 4
    assert decode(kv, b, 999) is not None
    states = [m.states["b"] for m in kv.coordinator.managers]
    before = [(st.kept, list(st.retained), list(st.blocks)) for st in states]
    managers = kv.coordinator.managers
    assert kv.policy.make_room(managers, 1, "b") == Shed("b", (20,))
    # One block is not enough: b, alone, keeps no point and gives its tail up.
    assert kv.policy.make_room(managers, 2, "b") == Shed("b", (), holds_tail=False)
    assert admit(kv, Request("c", list(range(100, 104))))[0] == 0
    assert kv.policy.make_room(managers, 2, "b") is None  # c lives: preempted first
    assert kv.policy.make_room(managers, 2, "c") is None
    assert [(st.kept, list(st.retained), list(st.blocks)) for st in states] == before
    assert all(st.holds_tail for st in states)
    kv.check_integrity()


def test_lru_releases_group_by_group_tail_first() -> None:
    """vLLM 0.33's order: one run per group, in group order, each tail first."""
    kv = KVCacheManager(config(32, full(4), swa(4, 100)), 64)
    r = Request("r", list(range(12)))
    blocks, hit = kv.get_computed_blocks(r)
    assert kv.allocate_slots(r, 12, hit, blocks) is not None
    ids = kv.get_block_ids("r")
    managers = kv.coordinator.managers
    tables = [(m, m.states["r"]) for m in managers]
    runs = kv.policy.release("r", tables, None, 12)
    assert [[b.block_id for b in run.blocks] for run in runs] == [
        [ids[g][i] for i in (2, 1, 0)] for g in (0, 1)
    ]
    assert all(not run.evict_first and run.value is None for run in runs)


@pytest.mark.parametrize("policy", ["lru", "hybrid"])
def test_demotion_order_is_the_order_blocks_are_reused_in(policy: str) -> None:
    """What a lower tier would demote first is what the pool reuses first:
    under hybrid, the blocks no kept point needs (evict-first) lead."""
    kv = KVCacheManager(config(40, full(4), swa(4, 5)), 256, cache_policy=policy)
    serve(kv, "a", list(range(30)))
    serve(kv, "b", [*range(12), *range(100, 118)])
    order = list(kv.policy.demotion_order(kv.block_pool))
    assert len(order) == kv.block_pool.num_free_blocks
    if policy == "hybrid":
        first = kv.block_pool.policy.first.num_free_blocks  # type: ignore[attr-defined]
        assert 0 < first < len(order)
        assert all(b.free_class is None for b in order[:first])
        assert all(b.free_class is not None for b in order[first:] if b.block_hash is not None)
    assert kv.block_pool.policy.take(len(order)) == order  # the pool's own next blocks
