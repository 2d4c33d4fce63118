"""Hypothesis properties of the planner over random layer mixes.

For any mix of full / sliding / chunked / Mamba layers (head sizes that differ
by powers of two, so pages can match), both unifications and both groupings:

- every layer is in exactly one group, and one tensor;
- one page size: every group's slots are the same size, and every unit's
  layers fill no more than one slot (exactly one, for attention);
- each tensor holds one slot of a group at most, and slot ``i`` of each group;
- unification changes only block sizes and Mamba padding, never the kind or
  the dimensions;
- ``auto`` never wastes more than ``vllm`` grouping, and respects its cap;
- padding layers are counted right.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from hybridkv.planning import plan_kv_cache
from hybridkv.planning.grouping import choose_grouping
from hybridkv.report.baselines import baselines
from hybridkv.specs import (
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
)

HEAD_DIMS = (32, 64, 128)


@st.composite
def layer_mixes(draw: st.DrawFn) -> dict[str, KVCacheSpec]:
    kinds = draw(
        st.lists(
            st.sampled_from(["full", "sliding", "chunked", "mamba1", "mamba2"]),
            min_size=1,
            max_size=4,
            unique=True,
        )
    )
    with_mamba = any(k.startswith("mamba") for k in kinds)
    # Packed unification with Mamba needs one attention page size (tested separately).
    one_head = draw(st.sampled_from(HEAD_DIMS)) if with_mamba else None
    specs: list[KVCacheSpec] = []
    for kind in kinds:
        n = draw(st.integers(1, 24))
        head = one_head or draw(st.sampled_from(HEAD_DIMS))
        heads = 1 if with_mamba else draw(st.sampled_from((1, 2)))
        if kind == "full":
            spec: KVCacheSpec = FullAttentionSpec(16, heads, head, "bfloat16")
        elif kind == "sliding":
            w = draw(st.sampled_from((8, 32, 100)))
            spec = SlidingWindowSpec(16, heads, head, "bfloat16", sliding_window=w)
        elif kind == "chunked":
            c = draw(st.sampled_from((16, 64)))
            spec = ChunkedLocalAttentionSpec(16, heads, head, "bfloat16", attention_chunk_size=c)
        elif kind == "mamba1":
            d = draw(st.sampled_from((16, 48)))
            spec = MambaSpec(16, ((3, d), (d, 4)), ("bfloat16", "float32"), mamba_type="mamba1")
        else:
            h = draw(st.sampled_from((2, 4)))
            spec = MambaSpec(16, ((3, h * 8 + 8), (h, 8, 4)), ("bfloat16", "bfloat16"))
        specs.extend([spec] * n)
    order = draw(st.permutations(range(len(specs))))
    return {f"layers.{i}": specs[j] for i, j in enumerate(order)}


@given(
    specs=layer_mixes(),
    unification=st.sampled_from(["vllm", "packed"]),
    grouping=st.sampled_from(["vllm", "auto"]),
    max_groups=st.integers(1, 10),
    mml=st.sampled_from((64, 1000, 4096)),
)
def test_plan_invariants(
    specs: dict[str, KVCacheSpec], unification: str, grouping: str, max_groups: int, mml: int
) -> None:
    plan = plan_kv_cache(
        specs,
        10**10,
        max_model_len=mml,
        max_num_batched_tokens=min(mml, 256),
        unification=unification,
        grouping=grouping,
        max_groups=max_groups,
    )
    cfg = plan.kv_cache_config
    slot = plan.slot_bytes
    g = plan.grouping.group_size

    # Every layer in exactly one group and exactly one tensor.
    grouped = [n for grp in cfg.kv_cache_groups for n in grp.layer_names]
    assert sorted(grouped) == sorted(specs)
    placed = [n for t in cfg.kv_cache_tensors for n in t.shared_by]
    assert sorted(placed) == sorted(specs)
    assert len(cfg.kv_cache_tensors) <= g

    # One slot size; each group's layers in a tensor fit one slot.
    assert {cfg.tensor_slot_bytes(t) for t in cfg.kv_cache_tensors} == {slot}
    group_of = {n: gi for gi, grp in enumerate(cfg.kv_cache_groups) for n in grp.layer_names}
    for t in cfg.kv_cache_tensors:
        used: dict[int, int] = {}
        for n in t.shared_by:
            used[group_of[n]] = (
                used.get(group_of[n], 0)
                + cfg.kv_cache_groups[group_of[n]].kv_cache_spec.page_size_bytes
            )
        assert all(u <= slot for u in used.values())
    for pg in plan.grouping.groups:
        assert len(pg.layers) <= g * pg.pack
        if isinstance(pg.spec, AttentionSpec):
            assert pg.pack * pg.spec.page_size_bytes == slot
        else:
            assert pg.spec.page_size_bytes == slot
        if unification == "vllm":
            assert pg.pack == 1

    # Unification keeps kinds and dimensions.
    for name, raw in specs.items():
        new = plan.unified.specs[name]
        assert type(new) is type(raw)
        if isinstance(raw, MambaSpec):
            assert replace(new, block_size=raw.block_size, page_size_padded=None) == raw
        else:
            assert replace(new, block_size=raw.block_size) == raw
            assert new.block_size % raw.block_size == 0

    # Padding layers as counted.
    assert plan.grouping.padding_layers == sum(
        g * pg.pack - len(pg.layers) for pg in plan.grouping.groups
    )

    # auto never wastes more than vllm and keeps to its cap.
    vllm = choose_grouping(
        plan.unified, "vllm", max_model_len=mml, max_num_batched_tokens=min(mml, 256)
    )
    assert baselines(plan).vllm_grouping == vllm
    if grouping == "auto":
        assert plan.grouping.waste_bytes_per_request <= vllm.waste_bytes_per_request
        assert plan.grouping.num_groups <= max(vllm.num_groups, max_groups)
        # The useful bytes are the same, so less waste is less memory per request.
        assert plan.grouping.bytes_per_request <= vllm.bytes_per_request
    else:
        assert plan.grouping == vllm
