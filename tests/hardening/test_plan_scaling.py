"""Planning stays near-linear in the layer count (no timing here: counts).

Before, every candidate group size ``g`` built its groups' layer lists, so a
plan held ``layers x candidates`` layer names (20,000 layers: 4.8 GB). Now the
candidates are costed from counts and only the vLLM grouping and the chosen
one are built: the layer names held in planned groups are at most ``2 x
layers``, whatever the count. The closed-form cost must equal the cost summed
over really built groups, for every candidate of every shipped layout. The
timings are in ``benchmarks/bench_plan_scaling.py``.
"""

from __future__ import annotations

import itertools
import random

import pytest

from hybridkv.layouts import ModelLayout, shipped_layout, shipped_names
from hybridkv.layouts.hf_import import _period
from hybridkv.planning import grouping as grouping_module
from hybridkv.planning import plan_kv_cache
from hybridkv.planning.grouping import (
    _real_bytes,
    blocks_per_request,
    buckets_of,
    grouping_candidates,
    make_grouping,
)
from hybridkv.planning.planner import _unify


def big_layout(num_layers: int) -> ModelLayout:
    kinds = {
        "local": {
            "kind": "sliding_window",
            "sliding_window": 1024,
            "num_kv_heads": 1,
            "head_dim": 64,
        },
        "global": {"kind": "full", "num_kv_heads": 1, "head_dim": 64},
    }
    return ModelLayout(
        name=f"big-{num_layers}",
        max_model_len=131072,
        layer_kinds=kinds,
        pattern=["local"] * 5 + ["global"],
        num_layers=num_layers,
    )


@pytest.mark.parametrize("num_layers", [600, 6000])
def test_layer_names_held_by_planned_groups_are_linear(
    num_layers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = []
    original = grouping_module.PlannedGroup

    def counting(spec, layers, pack):  # type: ignore[no-untyped-def]
        held.append(len(layers))
        return original(spec, layers, pack)

    monkeypatch.setattr(grouping_module, "PlannedGroup", counting)
    plan = plan_kv_cache(big_layout(num_layers), 400 << 30, block_size=16)
    assert len(plan.choices) == num_layers * 5 // 6  # every candidate g was costed ...
    assert sum(held) <= 2 * num_layers  # ... but only two groupings were built
    assert sum(len(g.layers) for g in plan.grouping.groups) == num_layers


@pytest.mark.parametrize("name", shipped_names())
@pytest.mark.parametrize("unification", ["vllm", "packed"])
def test_closed_form_cost_equals_the_built_groups(name: str, unification: str) -> None:
    layout = shipped_layout(name)
    mml, mnbt = layout.max_model_len, min(8192, layout.max_model_len)
    unified = _unify(layout.kv_cache_specs(16), unification, 16, mml, mnbt, 32)
    choices, _ = grouping_candidates(unified, mml, mnbt)
    buckets = buckets_of(unified)
    for cost in choices:
        built = make_grouping(buckets, cost.group_size, unified.slot_bytes, mml, mnbt)
        page = cost.group_size * unified.slot_bytes
        padding = waste = total = 0
        for g in built.groups:  # summed group by group, as the cost is defined
            blocks = blocks_per_request(g.spec, mml, mnbt)
            padding += cost.group_size * g.pack - len(g.layers)
            waste += (page - len(g.layers) * _real_bytes(g.spec)) * blocks
            total += page * blocks
        assert (built.num_groups, padding, waste, total) == (
            cost.num_groups,
            cost.padding_layers,
            cost.waste_bytes_per_request,
            cost.bytes_per_request,
        )


def naive_period(entries: list[str]) -> int | None:
    n = len(entries)
    for p in range(1, n // 2 + 1):
        if all(entries[i] == entries[i % p] for i in range(n)):
            return p
    return None


def test_linear_period_matches_the_definition() -> None:
    for n in range(13):
        for t in itertools.product("ab", repeat=n):
            assert _period(list(t)) == naive_period(list(t)), t
    rng = random.Random(0)
    for _ in range(2000):
        pattern = [rng.choice("abc") for _ in range(rng.randint(1, 5))]
        entries = (pattern * 40)[: rng.randint(1, 40)]
        if rng.random() < 0.3:
            entries[rng.randrange(len(entries))] = "d"
        assert _period(entries) == naive_period(entries), entries
