"""The pieces of ``benchmarks/bench_vllm_cache.py`` (side by side with vLLM's manager).

Without vLLM: the align-mode chunk rule on hand-worked examples, the retention
options, vLLM's Mamba block-size rule, and that our side's replay (with its
peak sampling) decides exactly as ``replay_trace``. With the vLLM baseline
(``../shared/bench/vllm_baseline`` set up; skipped otherwise): the chunk rule
against vLLM's own scheduler method, the config translation, and a four-request
replay through vLLM's real manager whose hits are worked out by hand.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_vllm_cache import (  # noqa: E402
    Cell,
    retention_values,
    retentions_for,
    target_line,
    tuned_clause,
)
from ours_replay import closed_options, run_ours  # noqa: E402
from vllm_ref.chunking import mamba_chunk_tokens  # noqa: E402
from vllm_ref.config import block_sizes, check_block_size, vllm_mamba_block_size  # noqa: E402
from vllm_ref.source import default_harness, default_vllm_src  # noqa: E402

from hybridkv.layouts import shipped_layout  # noqa: E402
from hybridkv.sim import device_profile, replay_trace  # noqa: E402
from hybridkv.sim.cost_model import CostModel  # noqa: E402
from hybridkv.sim.replay import plan_replay, replay_max_model_len  # noqa: E402
from hybridkv.sim.trace import TraceRequest  # noqa: E402

HAVE_VLLM = (default_vllm_src() / "vllm").is_dir() and (
    default_harness() / "vllm_shim.py"
).is_file()
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM baseline source is not set up")


def chunks(prompt: int, *, block: int, budget: int, start: int = 0, junction: int = 0) -> list:
    """The chunk sizes of a whole prefill from ``start`` (no output token yet)."""
    out = []
    while start < prompt:
        n = mamba_chunk_tokens(
            start,
            min(prompt - start, budget),
            num_prompt_tokens=prompt,
            num_tokens=prompt,
            block_size=block,
            junction=junction,
            max_prefill_tokens=budget,
        )
        out.append(n)
        start += n
    return out


def test_chunks_floor_to_blocks_and_stop_at_the_last_cacheable_boundary() -> None:
    # 20 tokens, blocks of 4, budget 8: 8 + 8, then the last block (the state at 16 is
    # the last cacheable one: (20 - 1) // 4 * 4).
    assert chunks(20, block=4, budget=8) == [8, 8, 4]
    assert chunks(19, block=4, budget=8) == [8, 8, 3]
    # One chunk would cover all 18 tokens: it stops at 16 first.
    assert chunks(18, block=4, budget=100) == [16, 2]
    # A budget smaller than a block cannot floor to a block: it advances sub-block,
    # then re-aligns at the next boundary.
    assert chunks(40, block=16, budget=8) == [8, 8, 8, 8, 8]


def test_chunks_stop_at_the_junction_floored_to_a_block() -> None:
    # Hit at 4, junction 14 (inside the 12..16 block): stop at 12, then at the last
    # cacheable boundary 28, then the rest.
    assert chunks(30, block=4, budget=100, start=4, junction=14) == [8, 16, 2]
    # A block-aligned junction is a stop of its own.
    assert chunks(30, block=4, budget=100, start=0, junction=12) == [12, 16, 2]
    # A junction at or before the chunk start, or at its end, adds no stop.
    assert chunks(30, block=4, budget=100, start=12, junction=12) == [16, 2]


def test_chunk_from_mid_block_and_decode() -> None:
    kw = dict(num_prompt_tokens=30, num_tokens=30, block_size=4, junction=0)
    assert mamba_chunk_tokens(6, 8, max_prefill_tokens=8, **kw) == 2  # to the boundary at 8
    # Past the prompt (decode, one output token), nothing is clipped.
    kw = dict(num_prompt_tokens=30, num_tokens=31, block_size=4, junction=0)
    assert mamba_chunk_tokens(30, 1, max_prefill_tokens=8, **kw) == 1


def test_retention_options() -> None:
    assert retention_values("none, 0,800") == [None, 0, 800]
    assert retentions_for([None, 0, 160, 200], ["full", "mamba"], 80) == [None, 0, 160]
    assert retentions_for([None, 0, 160], ["full"], 16) == [0]


def test_vllm_block_size_rule() -> None:
    # jamba-v0.1: Mamba1 state (3 x 8192 + 8192 x 16) bf16 = 311,296 B; attention
    # 8 heads x 128 x 2 (K, V) x 2 B = 4,096 B per token -> 16 * ceil(76 / 16) = 80.
    assert vllm_mamba_block_size(4096, 311_296) == 80
    plan = plan_replay(shipped_layout("jamba-v0.1"), closed_options(2 * 10**9, "lru", 8192), 4096)
    assert check_block_size(plan.kv_cache_config) == ""


def _trace(hash_lists: list[list[int]]) -> list[TraceRequest]:
    return [
        TraceRequest(
            line=i + 1, arrival_s=0.0, input_length=512 * len(h), output_length=1, hash_ids=tuple(h)
        )
        for i, h in enumerate(hash_lists)
    ]


JUNCTION_TRACE = [[0, 1, 2], [0, 1, 3], [0, 1, 4], [0, 1, 2]]


def test_our_side_decides_as_replay_trace() -> None:
    layout = shipped_layout("jamba-v0.1")
    reqs = _trace(JUNCTION_TRACE)
    options = closed_options(2 * 10**9, "hybrid", 8192)
    ours = run_ours(layout, reqs, options, active_params=12e9, sample_every=1)
    cost = CostModel.from_layout(layout, device_profile("h100"), 12e9)
    plain = replay_trace(layout, reqs, options, cost)
    assert ours.sim.hit_tokens == plain.hit_tokens
    assert ours.sim.cached_blocks == plain.cached_blocks
    assert ours.sim.num_blocks == plain.num_blocks
    assert all(ours.peak_cached_blocks[k] >= n for k, n in plain.cached_blocks.items())


@pytest.fixture(scope="module")
def vl():
    if not HAVE_VLLM:
        pytest.skip("vLLM baseline source is not set up")
    from vllm_ref.source import load_vllm

    return load_vllm()


@needs_vllm
def test_chunk_rule_is_vllms(vl) -> None:
    from vllm_ref.chunking import vllm_chunk_rule

    rng = random.Random(0)
    for block, budget in ((80, 8192), (16, 8192), (4, 8), (16, 8)):
        theirs = vllm_chunk_rule(vl, block, budget)
        for _ in range(400):
            prompt = rng.randrange(1, 300)
            total = prompt + rng.choice((0, 1, 3))
            start = rng.choice((0, rng.randrange(total), rng.randrange(total) // block * block))
            kw = dict(
                num_prompt_tokens=prompt,
                num_tokens=total,
                block_size=block,
                junction=rng.choice((0, rng.randrange(total + 1))),
                max_prefill_tokens=budget,
            )
            n = min(total - start, budget)
            assert mamba_chunk_tokens(start, n, **kw) == theirs(start, n, **kw), (start, n, kw)


@needs_vllm
def test_config_translation(vl) -> None:
    from vllm_ref.config import check_same_grouping, to_vllm_config

    # The benchmark's regime (max_model_len of the longest request, ~123k): our planner
    # groups as vLLM does.
    for name, block in (("jamba-v0.1", 80), ("gemma-3-27b", 16)):
        options = closed_options(40 * 10**9, "lru", 8192)
        ours = plan_replay(shipped_layout(name), options, 123_193).kv_cache_config
        theirs = to_vllm_config(ours, vl, 800)
        assert theirs.num_blocks == ours.num_blocks
        assert theirs.prefix_cache_retention_interval == 800
        assert check_same_grouping(ours, theirs.kv_cache_groups, vl) == ""
        assert block_sizes(theirs) == (block, block)
    # At a short max_model_len our planner packs gemma-3-27b's layers into fewer, larger
    # groups than vLLM's heuristic: reported, not hidden.
    ours = plan_replay(shipped_layout("gemma-3-27b"), closed_options(8 * 10**9, "lru", 8192), 4096)
    theirs = to_vllm_config(ours.kv_cache_config, vl, 0)
    assert check_same_grouping(ours.kv_cache_config, theirs.kv_cache_groups, vl).startswith(
        "vLLM groups the layers differently: 7 groups"
    )


@needs_vllm
@pytest.mark.parametrize("retention", [0, None])
def test_vllm_replay_hits_by_hand(vl, retention) -> None:
    """jamba-v0.1, blocks of 80, hash ids of 512 tokens, 1,536-token prompts.

    A [0,1,2]: no hit; one chunk to the last cacheable boundary 1,520, then 16
    tokens; its Mamba state at 1,520 is kept (the prompt's last aligned state).
    B [0,1,3] shares 1,024 tokens: full attention hits 12 blocks (960), Mamba
    has no state at or below 960, so the hit is 0 and 960 is the junction: B's
    first chunk ends there and its state is kept. C [0,1,4]: hit 960 (B's
    state). D resends A: hit capped at 1,535, i.e. 1,520, where A's state is.
    """
    from vllm_ref.config import to_vllm_config
    from vllm_ref.replay import VllmCacheReplay

    layout = shipped_layout("jamba-v0.1")
    reqs = _trace(JUNCTION_TRACE)
    mml = replay_max_model_len(layout, reqs, None)
    plan = plan_replay(layout, closed_options(2 * 10**9, "lru", 8192), mml)
    config = to_vllm_config(plan.kv_cache_config, vl, retention)
    replay = VllmCacheReplay(
        vl, config, max_model_len=mml, scheduler_block_size=80, hash_block_size=80
    )
    hits = []
    for k, tr in enumerate(reqs):
        res = replay.run([tr], sample_every=1)
        hits.append(res.hit_tokens)
        assert res.prompt_tokens == 1536, k
    assert hits == [0, 0, 960, 1520]
    assert replay.junction_chunks == 1
    # Steps: A 2 chunks, B 3 (960, 560 to 1,520, 16), C 2 (560, 16), D 1 (16).
    assert replay.steps == 8


def test_tuned_rows_are_judged_against_vllms_best() -> None:
    # vLLM's best (R=480) hits 10 %; its state: 8 blocks at the end, 6 under pressure.
    def vllm(hit_tokens, state):
        return NS(
            hit_tokens=hit_tokens,
            token_hit_rate=hit_tokens / 1000,
            cached_blocks={"full": 10, "mamba": state},
            pressured_mean_blocks={"mamba": 6.0},
            peak_cached_blocks={"mamba": 9},
        )

    def ours(rate, end, mean):
        return NS(
            sim=NS(token_hit_rate=rate, cached_blocks={"full": 10, "mamba": end}),
            pressured_mean_blocks={"mamba": mean},
            peak_cached_blocks={"mamba": 12},
        )

    cell = Cell(
        "x", 1, 100, 10**9, 10**9, 16, ["full", "mamba"], [],
        {"0": vllm(50, 3), "480": vllm(100, 8)},
        {
            "hybrid": ours(0.12, 4, 4.0),  # the default: judged by target_line
            "hybrid (weight 3)": ours(0.16, 4, 5.0),  # 1.6x, less state
            "hybrid (weight 4)": ours(0.17, 9, 5.0),  # 1.7x, more state at the end
            "lru": ours(0.01, 90, 90.0),
        },
    )  # fmt: skip
    assert tuned_clause(cell) == (
        " Tuned, hybrid (weight 3): 1.60x, state end 4.00 GB, mean under pressure 5.00 GB"
        " (met with this knob)."
        " Tuned, hybrid (weight 4): 1.70x, state end 9.00 GB, mean under pressure 5.00 GB"
        " (not met with this knob)."
    )
    line = target_line(cell)  # the default's verdict first, then the tuned runs
    assert line.startswith("**Target (x @ ") and "NOT MET.** hybrid / vLLM best (480)" in line
    assert "= 1.20x" in line and line.endswith(tuned_clause(cell))
    del cell.ours["hybrid (weight 3)"], cell.ours["hybrid (weight 4)"]
    assert tuned_clause(cell) == ""
    assert target_line(cell).endswith("`policy/returning.py`).")  # ceiling 0 < 15 %


def test_closed_options_plan_for_the_given_model_length() -> None:
    assert closed_options(10**9, "hybrid", 8192).max_model_len is None  # the layout's own
    options = closed_options(10**9, "hybrid", 8192, 196_608)
    assert (options.max_model_len, options.max_num_seqs, options.arrivals) == (196_608, 1, "closed")
