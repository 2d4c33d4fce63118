"""Worked examples of the planner: unification, grouping, num_blocks, capacity.

The figures are derived by hand in the comments (bf16: 2 bytes per element).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from factories import req, run_step

from hybridkv import FullAttentionSpec, KVCacheManager, MambaSpec, SlidingWindowSpec
from hybridkv.layouts import layout_from_dict, shipped_layout, shipped_names
from hybridkv.planning import (
    fit_memory,
    get_kv_cache_config,
    plan_kv_cache,
    plan_pages,
    unify_packed,
    unify_vllm,
)
from hybridkv.planning.grouping import buckets_of, choose_grouping, make_grouping
from hybridkv.report.baselines import baselines

GB = 10**9


def _groups(plan: object) -> list[tuple[str, int]]:
    return [(g.spec.kind, len(g.layers)) for g in plan.grouping.groups]  # type: ignore[attr-defined]


def test_toy_one_full_three_sliding() -> None:
    # min layer count is 1 and 3 >= 1.5 x 1: one layer per group, 4 groups, 1 buffer.
    layout = shipped_layout("toy-1full-3sliding")
    plan = plan_kv_cache(layout, 10**8, grouping="vllm")
    assert plan.grouping.group_size == 1
    assert sorted(_groups(plan)) == [("full", 1)] + [("sliding_window", 1)] * 3
    assert len(plan.kv_cache_config.kv_cache_tensors) == 1
    assert plan.grouping.padding_layers == 0
    spec = plan.grouping.groups[0].spec
    assert plan.page_bytes == spec.page_size_bytes  # page = kv_hidden x block_size


def test_ten_full_twenty_sliding_request_takes_eleven_blocks() -> None:
    # The design doc's case 2: 3 groups of 10 layers, 10 buffers each shared by
    # one layer of every group. Block 16, window 32: a 112-token request takes
    # 7 full blocks and 2 per sliding group (tokens 80-111).
    layout = shipped_layout("toy-10full-20sliding")
    for mode in ("vllm", "auto"):
        plan = plan_kv_cache(layout, 10**8, grouping=mode, max_model_len=4096)
        assert sorted(_groups(plan)) == [
            ("full", 10),
            ("sliding_window", 10),
            ("sliding_window", 10),
        ]
        cfg = plan.kv_cache_config
        assert len(cfg.kv_cache_tensors) == 10
        assert all(len(t.shared_by) == 3 for t in cfg.kv_cache_tensors)
        per_token = 2 * 2 * 64 * 2  # K+V, 2 heads, dim 64, bf16
        assert plan.page_bytes == 10 * per_token * 16
        assert cfg.num_blocks == 10**8 // plan.page_bytes
        kv = KVCacheManager(cfg, max_model_len=4096)
        # Compute 111 tokens, then the 112th: at that step the window is tokens
        # 80-111, and the sliding groups release blocks 0-4.
        r = req("a", 112)
        assert run_step(kv, r, 111) is not None
        assert run_step(kv, r, 1) is not None
        ids = kv.get_block_ids("a")
        counts = {
            (g.kv_cache_spec.kind, i): sum(b != 0 for b in ids[i])
            for i, g in enumerate(cfg.kv_cache_groups)
        }
        assert sorted(counts.values()) == [2, 2, 7]
        assert sum(counts.values()) == 11
        kv.check_integrity()


def test_gemma3_27b_vllm_vs_auto() -> None:
    layout = shipped_layout("gemma-3-27b")  # 52 sliding + 10 full
    vllm = plan_kv_cache(layout, 80 * GB, grouping="vllm")
    assert vllm.grouping.group_size == 10
    assert vllm.grouping.num_groups == 7
    assert vllm.grouping.padding_layers == 8
    # When a sliding layer costs a request as much memory as a full one (short
    # context), padding layers are all equal and auto finds 5 groups / 3 padding.
    short = plan_kv_cache(layout, 80 * GB, grouping="auto", max_model_len=1024)
    assert (short.grouping.num_groups, short.grouping.padding_layers) == (5, 3)
    assert short.grouping.group_size == 13
    assert short.hybrid.max_concurrency > baselines(short).vllm_hybrid.max_concurrency
    # At 128k a full-attention padding layer costs 8192 blocks per request and a
    # sliding one 577: the 5-group plan pads the full group (3 x 8192) and loses
    # to vLLM's (8 x 577), so auto keeps g = 10.
    long = plan_kv_cache(layout, 80 * GB, grouping="auto")
    assert long.grouping.group_size == 10
    g13 = next(c for c in long.choices if c.group_size == 13)
    assert g13.padding_layers == 3
    assert g13.waste_bytes_per_request > long.grouping.waste_bytes_per_request


def test_twenty_full_thirty_sliding() -> None:
    layout = shipped_layout("20full-30sliding")
    vllm = plan_kv_cache(layout, 80 * GB, grouping="vllm", max_model_len=8192)
    # 30 is not < 1.5 x 20, so g = 20: sliding splits 2 x 20 with 10 padding.
    assert (vllm.grouping.group_size, vllm.grouping.num_groups) == (20, 3)
    assert vllm.grouping.padding_layers == 10
    auto = plan_kv_cache(layout, 80 * GB, grouping="auto", max_model_len=8192)
    assert (auto.grouping.group_size, auto.grouping.num_groups) == (10, 5)
    assert auto.grouping.padding_layers == 0
    assert baselines(auto).gain_over_vllm_grouping > 1.0


def test_auto_uses_largest_when_counts_are_close() -> None:
    # gpt-oss-20b + an eagle drafter layer: 12 sliding + 13 full -> vLLM pads to (13, 13).
    kinds = {
        "s": {"kind": "sliding_window", "sliding_window": 128, "num_kv_heads": 8, "head_dim": 64},
        "f": {"kind": "full", "num_kv_heads": 8, "head_dim": 64},
    }
    layout = layout_from_dict(
        {
            "name": "x",
            "max_model_len": 4096,
            "layer_kinds": kinds,
            "layers": ["s", "f"] * 12 + ["f"],
        }
    )
    plan = plan_kv_cache(layout, GB, grouping="vllm")
    assert plan.grouping.group_size == 13
    assert plan.grouping.padding_layers == 1


def test_different_head_sizes_scale_or_pack() -> None:
    specs = {
        "big.0": FullAttentionSpec(16, 2, 128, "bfloat16"),
        "big.1": FullAttentionSpec(16, 2, 128, "bfloat16"),
        "small.0": SlidingWindowSpec(16, 2, 64, "bfloat16", sliding_window=64),
        "small.1": SlidingWindowSpec(16, 2, 64, "bfloat16", sliding_window=64),
    }
    base = unify_vllm(specs)
    assert base.specs["small.0"].block_size == 32  # half the page per token -> 2x tokens
    assert base.specs["big.0"].block_size == 16
    assert base.slot_bytes == specs["big.0"].page_size_bytes
    packed = unify_packed(specs, pack_attention=1)
    assert packed.specs["small.0"].block_size == 16  # two sliding layers share a slot
    assert packed.pack[packed.specs["small.0"]] == 2
    cfg = get_kv_cache_config(specs, 10**7, max_model_len=1024, unification="packed")
    shared = [t.shared_by for t in cfg.kv_cache_tensors]
    assert any({"small.0", "small.1"} <= set(s) for s in shared)


def test_pages_that_cannot_match_name_the_layers() -> None:
    specs = {
        "a": FullAttentionSpec(16, 1, 128, "bfloat16"),
        "b": SlidingWindowSpec(16, 1, 96, "bfloat16", sliding_window=64),
    }
    with pytest.raises(ValueError, match=r"layer 'b' has 6144-byte pages and layer 'a' 8192"):
        unify_vllm(specs)


def test_jamba_baseline_matches_vllm_formula() -> None:
    # Mamba1 state: conv (3, 8192) + SSM (8192, 16), bf16 = 311,296 B. One
    # attention token is 2 x 8 x 128 x 2 = 4096 B, so vLLM raises the block
    # size to 16 x cdiv(311296, 16 x 4096) = 80 and pads the state to 327,680 B.
    layout = shipped_layout("jamba-v0.1")
    plan = plan_kv_cache(layout, 80 * GB, unification="vllm")
    assert plan.unified.attention_block_size == 80
    assert plan.slot_bytes == 327_680
    mamba = next(g.spec for g in plan.grouping.groups if isinstance(g.spec, MambaSpec))
    assert mamba.state_size_bytes == 311_296
    assert mamba.page_size_bytes == 327_680
    assert mamba.block_size == 80
    # 4 attention + 28 Mamba layers: g = 4, 1 + 7 groups, no padding layers.
    assert (plan.grouping.group_size, plan.grouping.num_groups) == (4, 8)


def test_waste_of_a_mamba_and_attention_layout_by_hand() -> None:
    # 2 full-attention layers (fp16, 1 KV head of 8: 2 * 8 * 2 = 32 B per token)
    # and 3 Mamba layers (one fp32 state of 4 x 100: 1,600 B), max_model_len 1024.
    # vLLM unification: the block size grows from 16 to 16 * cdiv(1600, 16 * 32) = 64,
    # so a slot is 64 * 32 = 2,048 B and each Mamba page is padded 1,600 -> 2,048 B.
    # vLLM grouping: 2 full slots vs 3 Mamba slots (3 < 1.5 * 2 is false): g = 2,
    # a page is 2 * 2,048 = 4,096 B. Per request of 1024 tokens:
    #   full  [f0, f1]: 1024 / 64 = 16 blocks, all bytes used        waste 0
    #   mamba [m0, m2]: 2 blocks (state + checkpoint), 2 x 1,600 B used of 4,096
    #                   waste (4,096 - 3,200) * 2 = 1,792 (the padding of two states)
    #   mamba [m1]:     2 blocks, 1,600 B used of 4,096 (a padding layer too)
    #                   waste (4,096 - 1,600) * 2 = 4,992
    # Total waste 6,784 B of 4,096 * (16 + 2 + 2) = 81,920 B per request.
    attn = FullAttentionSpec(16, 1, 8, "float16")
    state = MambaSpec(16, shapes=((4, 100),), dtypes=("float32",))
    specs = {"f0": attn, "m0": state, "f1": attn, "m1": state, "m2": state}
    plan = plan_kv_cache(specs, 10**7, max_model_len=1024, grouping="vllm")
    assert plan.unified.slot_bytes == 2048 and plan.page_bytes == 4096
    assert [g.layers for g in plan.grouping.groups] == [("f0", "f1"), ("m0", "m2"), ("m1",)]
    assert plan.group_blocks_per_request() == [16, 2, 2]
    assert plan.grouping.waste_bytes_per_request == 1792 + 4992
    assert plan.grouping.bytes_per_request == 81920


def test_bamba_baseline_and_packed_block_sizes() -> None:
    # Mamba2 state: conv (3, 128 x 64 + 2 x 128) + SSM (128, 64, 128), bf16 =
    # 2 x (25,344 + 1,048,576) = 2,147,840 B -> 16 x cdiv(2147840, 65536) = 528.
    layout = shipped_layout("bamba-9b")
    base = plan_kv_cache(layout, 80 * GB, unification="vllm")
    assert base.unified.attention_block_size == 528
    packed = plan_kv_cache(layout, 80 * GB, unification="packed")
    # 3 attention layers share a slot: 16 x cdiv(2147840, 16 x 3 x 4096) = 176.
    assert packed.unified.attention_block_size == 176
    assert packed.slot_bytes == 3 * 176 * 4096
    assert packed.grouping.num_groups <= 32


def test_packed_keeps_jamba_blocks_small() -> None:
    layout = shipped_layout("jamba-v0.1")
    packed = plan_kv_cache(layout, 80 * GB, unification="packed")
    # All 4 attention layers in one slot: 16 x cdiv(311296, 16 x 4 x 4096) = 32.
    assert packed.unified.attention_block_size == 32
    attn = [g for g in packed.grouping.groups if not isinstance(g.spec, MambaSpec)]
    assert len(attn) == 1 and attn[0].pack == 4


def test_budget_too_small_names_the_minimum() -> None:
    layout = shipped_layout("gemma-3-27b")
    with pytest.raises(ValueError, match=r"cannot hold one request of max_model_len=131072.*GiB"):
        plan_kv_cache(layout, 10**9)
    ok = plan_kv_cache(layout, 80 * GB)
    need = (ok.grouping.bytes_per_request // ok.page_bytes + 1) * ok.page_bytes
    plan_kv_cache(layout, need)  # exactly the minimum fits
    with pytest.raises(ValueError, match="cannot hold"):
        plan_kv_cache(layout, need - 1)
    assert ok.min_memory_bytes == need


def test_plan_is_the_page_plan_fitted_to_memory() -> None:
    # plan_kv_cache = fit_memory(plan_pages(...)): the engine sizes its budget from
    # the PagePlan and fits that same plan, without planning again.
    layout = shipped_layout("tiny-jamba")
    pages = plan_pages(layout, block_size=4, grouping="auto")
    plan = fit_memory(pages, 1 << 22)
    assert plan == plan_kv_cache(layout, 1 << 22, block_size=4, grouping="auto")
    assert plan.grouping is pages.grouping and plan.unified is pages.unified
    assert plan.page_bytes == pages.page_bytes and plan.block_size == 4
    assert plan.num_blocks == (1 << 22) // pages.page_bytes
    fit_memory(pages, pages.min_memory_bytes)
    with pytest.raises(ValueError, match="cannot hold one request"):
        fit_memory(pages, pages.min_memory_bytes - 1)


def test_capacity_vs_naive() -> None:
    layout = shipped_layout("gemma-3-27b")
    plan = plan_kv_cache(layout, 80 * GB)
    base = baselines(plan)
    # Naive: 62 layers x 131072 tokens x 2 x 16 x 128 x 2 B per request.
    naive_req = 62 * 131072 * 2 * 16 * 128 * 2
    assert base.naive.bytes_per_request == naive_req
    assert base.naive.max_concurrency == pytest.approx(80 * GB / naive_req)
    # Hybrid: full group 8192 blocks, each sliding group cdiv(1023 + 8192, 16) + 1.
    per_block = 10 * 16 * 2 * 16 * 128 * 2
    blocks = 8192 + 6 * (-(-(1023 + 8192) // 16) + 1)
    assert plan.grouping.bytes_per_request == blocks * per_block
    assert plan.hybrid.max_concurrency == pytest.approx((plan.num_blocks - 1) / blocks)
    assert plan.hybrid.kv_tokens == int(plan.hybrid.max_concurrency * 131072)
    assert base.gain_over_naive > 4.0


def test_bad_arguments() -> None:
    layout = shipped_layout("tiny-gemma3")
    with pytest.raises(ValueError, match="block_size must be a positive integer"):
        plan_kv_cache(layout.kv_cache_specs(16), GB, max_model_len=64, block_size=0)  # specs too
    with pytest.raises(ValueError, match="grouping must be one of"):
        plan_kv_cache(layout, GB, grouping="best")
    with pytest.raises(ValueError, match="unification must be one of"):
        plan_kv_cache(layout, GB, unification="magic")
    with pytest.raises(ValueError, match="max_model_len is required"):
        plan_kv_cache(layout.kv_cache_specs(16), GB)
    with pytest.raises(ValueError, match="block_size must be a positive integer"):
        plan_kv_cache(layout, GB, block_size=0)


VLLM_SRC = Path.home() / ".cache" / "hybridkv-vllm-baseline" / "src" / "vllm-0.33.0"
REAL = [n for n in shipped_names() if not n.startswith(("tiny-", "toy-", "20full-"))]


@pytest.mark.skipif(
    not VLLM_SRC.is_dir(), reason="vLLM source absent (bash ../shared/bench/vllm_baseline/setup.sh)"
)
@pytest.mark.parametrize("name", [*REAL, "20full-30sliding", "toy-10full-20sliding"])
def test_vllm_grouping_is_vllms_own(name: str) -> None:
    # vLLM 0.33's grouping function, executed from its source on the same specs.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from vllm_ref.grouping import load_vllm_grouping, vllm_groups

    layout = shipped_layout(name)
    plan = plan_kv_cache(layout, 2**45, grouping="vllm", max_model_len=4096)
    ours = [list(g.layers) for g in plan.grouping.groups]
    assert vllm_groups(load_vllm_grouping(VLLM_SRC), plan.unified.specs) == ours


@pytest.mark.parametrize("name", shipped_names())
@pytest.mark.parametrize("unification", ["vllm", "packed"])
def test_every_shipped_layout_plans(name: str, unification: str) -> None:
    layout = shipped_layout(name)
    mml = min(layout.max_model_len, 1 << 20)  # Llama 4 Scout's 10M needs 482 GiB
    plan = plan_kv_cache(layout, 80 * GB, unification=unification, max_model_len=mml)
    cfg = plan.kv_cache_config
    assert sorted(n for g in cfg.kv_cache_groups for n in g.layer_names) == sorted(
        layout.kv_cache_specs(16)
    )
    assert plan.hybrid.max_concurrency >= 1.0
    vllm = baselines(plan).vllm_grouping
    assert plan.grouping.waste_bytes_per_request <= vllm.waste_bytes_per_request
    assert cfg.num_blocks == 80 * GB // plan.page_bytes


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("available_memory_bytes", 0),
        ("block_size", 0),
        ("alignment", 0),
        ("max_model_len", 0),
        ("max_num_batched_tokens", -1),
    ],
)
def test_non_positive_arguments_name_the_field(field: str, value: int) -> None:
    kwargs: dict[str, object] = {"available_memory_bytes": GB, field: value}
    with pytest.raises(ValueError, match=f"^{field} must be a positive integer"):
        plan_kv_cache(shipped_layout("tiny-jamba"), **kwargs)  # type: ignore[arg-type]


def test_specs_must_be_a_layout_or_a_dict_of_specs() -> None:
    for bad in (["full"], {"l0": "full"}):
        with pytest.raises(ValueError, match="must be a ModelLayout or a dict"):
            plan_kv_cache(bad, GB, max_model_len=64)  # type: ignore[arg-type]


def test_choose_grouping_is_the_planners_choice() -> None:
    # At 1024 tokens auto and vLLM's heuristic differ (13 vs 10 buffers, see above).
    layout = shipped_layout("gemma-3-27b")
    for mode, group_size in (("vllm", 10), ("auto", 13)):
        plan = plan_kv_cache(layout, 80 * GB, grouping=mode, max_model_len=1024)
        assert plan.grouping.group_size == group_size
        chosen = choose_grouping(
            plan.unified,
            mode,
            max_model_len=plan.max_model_len,
            max_num_batched_tokens=plan.max_num_batched_tokens,
        )
        assert chosen == plan.grouping
    buckets = buckets_of(plan.unified)
    with pytest.raises(ValueError, match="group_size must be >= 1"):
        make_grouping(buckets, 0, plan.slot_bytes, 1024, 1024)


def test_unification_notes_say_what_changed() -> None:
    # The specs of test_waste_of_a_mamba_and_attention_layout_by_hand: blocks 16 -> 64,
    # Mamba state 1,600 B padded to 2,048 B (+28.0%).
    attn = FullAttentionSpec(16, 1, 8, "float16")
    state = MambaSpec(16, shapes=((4, 100),), dtypes=("float32",))
    notes = unify_vllm({"f0": attn, "m0": state}).notes
    assert notes == (
        "attention block size raised from 16 to 64 tokens so that 1 attention layer "
        "page(s) hold a 1,600 B Mamba state",
        "Mamba state 1,600 B padded to the 2,048 B slot (+28.0%)",
    )
    # Attention only, pages of 32 and 64 B per token: the small one doubles its block.
    big = FullAttentionSpec(16, 2, 8, "float16")
    notes = unify_vllm({"a": attn, "b": big}).notes
    assert notes == ("full layers (512 B pages) use block size 32 to fill the 1024 B slot",)
    assert unify_vllm({"a": attn, "b": attn}).notes == ()


def test_packed_attention_only_packs_a_divisor_of_both_ratio_and_layers() -> None:
    # A 2,048 B page (4 heads) and three 512 B pages (1 head): ratio 4. Packing
    # may use only a divisor of 4 that is at most the 3 small layers: 2. The other
    # factor 2 is taken by the block size: 16 x 4 / 2 = 32, two layers per slot.
    big = FullAttentionSpec(16, 4, 8, "float16")
    small = SlidingWindowSpec(16, 1, 8, "float16", sliding_window=64)
    u = unify_packed({"big": big, "s0": small, "s1": small, "s2": small}, pack_attention=1)
    assert u.slot_bytes == 2048
    assert u.specs["s0"].block_size == 32
    assert u.pack[u.specs["s0"]] == 2
    assert u.specs["big"].block_size == 16 and u.pack[u.specs["big"]] == 1


def test_pack_attention_below_one_is_refused() -> None:
    attn = FullAttentionSpec(16, 1, 8, "float16")
    state = MambaSpec(16, shapes=((4, 100),), dtypes=("float32",))
    for specs in ({"f0": attn, "m0": state}, {"f0": attn}):
        with pytest.raises(ValueError, match="pack_attention must be >= 1, got 0"):
            unify_packed(specs, pack_attention=0)


def test_mamba_unification_sizes_by_hand() -> None:
    attn = FullAttentionSpec(16, 1, 8, "float16")  # 32 B per token
    state = MambaSpec(16, shapes=((4, 100),), dtypes=("float32",))  # 1,600 B
    # Two Mamba kinds: the slot holds the larger state (1,600 B, not 800 B):
    # block 16 x cdiv(1600, 16 x 32) = 64, slot 64 x 32 = 2,048 B.
    half = MambaSpec(16, shapes=((4, 50),), dtypes=("float32",))
    u = unify_vllm({"f0": attn, "m0": state, "m1": half})
    assert (u.slot_bytes, u.specs["f0"].block_size) == (2048, 64)
    assert u.specs["m1"].page_size_bytes == 2048
    # Block size 32 (above the 16 B alignment): the raised size stays a multiple of
    # 32. A 1,100 B state: 32 x cdiv(1100, 32 x 32) = 64 (not 16 x cdiv(1100, 512) = 48).
    a32 = FullAttentionSpec(32, 1, 8, "float16")
    s1100 = MambaSpec(32, shapes=((275,),), dtypes=("float32",))
    u = unify_vllm({"f0": a32, "m0": s1100})
    assert (u.slot_bytes, u.specs["f0"].block_size) == (2048, 64)
    # Two attention page sizes (32 and 64 B per token), vLLM unification: the block
    # size is set by the larger: 16 x cdiv(1600, 16 x 64) = 32, slot 32 x 64 = 2,048 B.
    # The small layers fill it with a 2x block (64 tokens), one layer per slot (vLLM
    # never packs), and the attention block size is the large-page spec's, 32.
    wide = FullAttentionSpec(16, 2, 8, "float16")
    u = unify_vllm({"a0": attn, "a1": attn, "b0": wide, "m0": state})
    assert u.slot_bytes == 2048
    assert {n: (s.block_size, u.pack[s]) for n, s in u.specs.items()} == {
        "a0": (64, 1),
        "a1": (64, 1),
        "b0": (32, 1),
        "m0": (32, 1),
    }
    assert u.attention_block_size == 32


def test_unification_notes_only_for_real_changes() -> None:
    attn = FullAttentionSpec(16, 1, 8, "float16")  # 512 B pages
    # A 400 B state fits a 16-token page: no block size change, only padding.
    fits = MambaSpec(16, shapes=((4, 25),), dtypes=("float32",))
    assert unify_vllm({"f0": attn, "m0": fits}).notes == (
        "Mamba state 400 B padded to the 512 B slot (+28.0%)",
    )
    # A 512 B state fills the page exactly: nothing to say.
    exact = MambaSpec(16, shapes=((4, 32),), dtypes=("float32",))
    assert unify_vllm({"f0": attn, "m0": exact}).notes == ()


@pytest.mark.parametrize(("cap", "block_size"), [(32, 32), (29, 32), (28, 48), (15, 48), (14, 80)])
def test_packed_jamba_respects_the_group_cap(cap: int, block_size: int) -> None:
    # Jamba's 4 attention layers pack 1, 2 or 4 per slot: blocks of 80, 48 and 32
    # tokens in 8, 15 and 29 groups. The smallest block wins among the packs whose
    # group count is within max_packed_groups (p = 1 is always allowed).
    layout = shipped_layout("jamba-v0.1")
    plan = plan_kv_cache(layout, 80 * GB, unification="packed", max_packed_groups=cap)
    assert plan.unified.attention_block_size == block_size
    assert plan.grouping.num_groups == {32: 29, 48: 15, 80: 8}[block_size]
