"""Replays through the real scheduler and manager: exact hit rates, arrivals, preemption."""

from __future__ import annotations

import pytest

import hybridkv.sim.replay as replay_module
from hybridkv.layouts import load_layout, shipped_layout
from hybridkv.sim import CostModel, SimOptions, device_profile, load_trace, replay_trace
from hybridkv.sim.replay import replay_max_model_len
from hybridkv.sim.table import render_results

H100 = device_profile("h100")
BLOCK = 512  # bytes of one block of the one-full layout (see conftest)


def mooncake(ts: int, n_in: int, n_out: int, hash_ids: list[int]) -> dict:
    return {"timestamp": ts, "input_length": n_in, "output_length": n_out, "hash_ids": hash_ids}


# Hand-computed hits (16-token blocks, one full-attention group, cache never full):
#   r0 [0, 1]     1024 tokens: nothing cached yet                       hit 0
#   r1 [0, 1, 2]  1300 tokens: shares ids 0, 1 = 1024 tokens            hit 1024
#   r2 [0, 3]      600 tokens: shares id 0 = 512 tokens                 hit 512
#   r3 [0, 1]     1024 tokens: all cached, but the last token must run:
#                 at most 1023 tokens, whole blocks -> 63 * 16         hit 1008
HAND_ROWS = [
    mooncake(0, 1024, 4, [0, 1]),
    mooncake(0, 1300, 4, [0, 1, 2]),
    mooncake(0, 600, 4, [0, 3]),
    mooncake(0, 1024, 4, [0, 1]),
]
HAND_PROMPT = 1024 + 1300 + 600 + 1024
HAND_HIT = 0 + 1024 + 512 + 1008


def run(layout_path, trace_path, **kw):
    layout = load_layout(layout_path)
    options = SimOptions(**{"memory_bytes": 10_000 * BLOCK, **kw})
    cost = CostModel.from_layout(layout, H100, active_params=1e9)
    return replay_trace(layout, load_trace(trace_path), options, cost)


@pytest.mark.parametrize("max_num_seqs", [1, 64])
def test_hit_rate_equals_the_hand_computed_one(one_full, write_trace, max_num_seqs):
    # With 64 seats all four run in one step: blocks are cached when allocated,
    # so later requests of the same step hit them too (as in the engine).
    r = run(one_full, write_trace(HAND_ROWS), arrivals="closed", max_num_seqs=max_num_seqs)
    assert (r.prompt_tokens, r.hit_tokens) == (HAND_PROMPT, HAND_HIT)
    assert r.token_hit_rate == HAND_HIT / HAND_PROMPT
    assert r.prefill_tokens == HAND_PROMPT - HAND_HIT
    assert (r.output_tokens, r.decode_tokens) == (16, 4 * 3)  # the last sample is never computed
    assert r.preemptions == 0
    # Cached at the end: the full blocks of the computed tokens (prompt + 3 outputs):
    # r0 64 (ids 0, 1); r1 1303 // 16 = 81, 64 of them hit: 17 new; r2 603 // 16 = 37,
    # 32 hit: 5 new; r3 computes its last block again (hit capped at 1008): a duplicate.
    assert r.cached_blocks == {"full": 64 + 17 + 5 + 1}
    assert r.num_blocks == 10_000
    assert r.page_bytes == BLOCK
    if max_num_seqs == 1:
        # One request at a time, each a prefill step then 3 decode steps; blocks
        # held after each step's allocation: r0 64 then 65 (1025 tokens) x3; r1
        # 82 (1300 tokens, its 64 hit blocks included) x4; r2 38 x4; r3 as r0.
        steps = [64, 65, 65, 65] + [82] * 4 + [38] * 4 + [64, 65, 65, 65]
        assert r.steps == len(steps)
        assert r.in_use_mean == pytest.approx(sum(steps) / len(steps) / 9_999)
        assert r.in_use_p50 == pytest.approx(65 / 9_999)  # sorted: 8th and 9th are 65


def test_token_prompt_traces_hit_on_their_shared_prefix(one_full, write_trace):
    rows = [
        {"prompt_token_ids": list(range(40)), "output_length": 2},
        {"timestamp": 1000, "prompt_token_ids": [*range(35), 999, 998], "output_length": 2},
    ]
    r = run(one_full, write_trace(rows))
    assert r.hit_tokens == 32  # two whole blocks of the 35 shared tokens


def test_closed_loop_releases_everything_at_zero_trace_arrivals_wait(one_full, write_trace):
    rows = [mooncake(100_000 * i, 512, 8, [i]) for i in range(4)]  # 100 s apart
    path = write_trace(rows)
    timed = run(one_full, path)
    closed = run(one_full, path, arrivals="closed")
    # Trace arrivals: nothing overlaps, every request finds an idle device.
    assert timed.makespan_s > 300
    assert timed.ttft_p99_s == pytest.approx(timed.ttft_p50_s)
    # Closed loop: all arrive at 0 and run together; queueing shows in TTFT.
    assert closed.makespan_s < 1
    assert closed.ttft_p50_s <= closed.ttft_p99_s
    assert timed.hit_tokens == closed.hit_tokens == 0


def test_a_tiny_budget_preempts_and_still_finishes_every_request(one_full, write_trace):
    # 8 requests of 100 prompt + 400 output tokens (32 blocks at the end) in 40
    # blocks: five are admitted on their 7-block prompts, then decoding grows them.
    rows = [mooncake(0, 100, 400, [10 + i]) for i in range(8)]
    r = run(one_full, write_trace(rows), memory_bytes=40 * BLOCK, arrivals="closed")
    assert r.preemptions > 0
    computed_once = r.prompt_tokens - r.hit_tokens + r.output_tokens - 8
    assert r.prefill_tokens + r.decode_tokens >= computed_once
    assert r.output_tokens == 8 * 400
    assert r.peak_blocks_in_use == 39  # every usable block (block 0 is the null block)
    assert 0 < r.in_use_mean <= 1.0 and 0 < r.in_use_p50 <= 1.0  # never above the peak


def test_sliding_layout_reports_blocks_by_kind(write_trace):
    layout = shipped_layout("toy-1full-3sliding")
    rows = [mooncake(0, 300, 4, [0]), mooncake(10, 300, 4, [0])]
    options = SimOptions(memory_bytes=2**24)
    cost = CostModel.from_layout(layout, H100, active_params=1e6)
    r = replay_trace(layout, load_trace(write_trace(rows)), options, cost)
    assert set(r.cached_blocks) == {"full", "sliding_window"}
    # r0 computes 300 + 3 tokens: 18 full blocks; r1 hits 288 of them and fills a
    # block 18 of its own only with 304 computed tokens (it computes 303 too).
    assert r.hit_tokens == 288
    assert r.cached_blocks["full"] == 18
    assert r.cached_blocks["sliding_window"] > 0
    assert set(r.peak_blocks_by_kind) == {"full", "sliding_window"}


def test_policy_is_passed_to_the_manager(one_full, write_trace, monkeypatch):
    seen = []
    real = replay_module.KVCacheManager

    def spy(*args, **kwargs):
        seen.append(kwargs["cache_policy"])
        return real(*args, **{**kwargs, "cache_policy": "lru"})

    monkeypatch.setattr(replay_module, "KVCacheManager", spy)
    run(one_full, write_trace(HAND_ROWS[:1]), policy="hybrid")
    assert seen == ["hybrid"]


def test_max_model_len_is_the_longest_request_or_an_error(one_full, write_trace):
    layout = load_layout(one_full)  # max_model_len 4096
    reqs = load_trace(write_trace([mooncake(0, 1000, 24, [0, 1]), mooncake(0, 10, 1, [2])]))
    assert replay_max_model_len(layout, reqs, None) == 1024
    assert replay_max_model_len(layout, reqs, 2048) == 2048
    with pytest.raises(
        ValueError, match=r"line 1: the request needs 1,024 tokens .* --max-model-len 1,000"
    ):
        replay_max_model_len(layout, reqs, 1000)
    long = load_trace(write_trace([mooncake(0, 4096, 1, list(range(8)))], "long.jsonl"))
    with pytest.raises(ValueError, match="more than one-full's max_model_len 4,096"):
        replay_max_model_len(layout, long, None)


def test_full_match_is_what_full_attention_alone_matched(write_trace):
    # A (2,000 tokens, ids 0-3), then C (3,001 tokens of its own), then B, which
    # shares A's first 1,024 tokens (ids 0, 1). Sliding window 32, 16-token blocks,
    # one output token each.
    layout = shipped_layout("toy-1full-3sliding")
    rows = [mooncake(0, 2000, 1, [0, 1, 2, 3]), mooncake(1, 3000, 1, [10 + i for i in range(6)])]
    rows.append(mooncake(2, 2000, 1, [0, 1, 50, 51]))
    cost = CostModel.from_layout(layout, H100, active_params=1e6)

    def replay(policy):
        options = SimOptions(
            memory_bytes=2**24, policy=policy, arrivals="closed", max_num_seqs=1, max_model_len=4096
        )
        return replay_trace(layout, load_trace(write_trace(rows)), options, cost)

    # lru keeps every block, so B hits all that full attention matched.
    lru = replay("lru")
    assert (lru.hit_tokens, lru.full_match_tokens) == (1024, 1024)
    # hybrid keeps A's windows only at its kept points: its prompt's end (2,000)
    # and the tail's boundaries from 1,488 (the floor, every 3,072 tokens, has
    # none). The windows before are released evict-first, and C's blocks reuse
    # them. A's full-attention blocks stay (its kept points need them), so B's
    # full-attention match is 1,024 again, but no window is kept at or below it.
    hyb = replay("hybrid")
    assert (hyb.hit_tokens, hyb.full_match_tokens) == (0, 1024)
    assert hyb.full_match_rate == 1024 / (2000 + 3000 + 2000)
    assert hyb.to_json()["full_match_tokens"] == 1024
    table = render_results([lru, hyb], "t.jsonl")
    assert "full match" in table.splitlines()[1]
    assert "14.63%" in table.splitlines()[3]  # 1024 / 7000 on the hybrid row


def test_on_finished_sees_each_step_that_finished_requests(one_full, write_trace):
    # Closed loop, 8 at a time: 5 requests of 8 output tokens finish in one step; the
    # hook runs after their blocks are freed (none held) and changes no result.
    rows = [mooncake(0, 512, 8, [i]) for i in range(5)]
    layout = load_layout(one_full)
    options = SimOptions(memory_bytes=10_000 * BLOCK, arrivals="closed", max_num_seqs=8)
    cost = CostModel.from_layout(layout, H100, active_params=1e9)
    seen = []

    def hook(manager, n):
        seen.append((n, manager.block_pool.num_free_blocks))

    with_hook = replay_trace(layout, load_trace(write_trace(rows)), options, cost, on_finished=hook)
    plain = replay_trace(layout, load_trace(write_trace(rows)), options, cost)
    usable = with_hook.num_blocks - 1
    assert seen == [(5, usable)]
    assert with_hook.hit_tokens == plain.hit_tokens and with_hook.steps == plain.steps


def test_retained_share_counts_the_windows_hybrid_keeps_behind_running_requests(write_trace):
    # A (2,000 tokens, ids 0-3), then B (3,000 tokens, ids 0-5, 4 outputs), one at a
    # time. Window 32, 16-token blocks, 3 sliding groups. B is admitted with a hit of
    # 2,000 (A's prompt end): its kept point H = 2,000 needs blocks 123-124 of each
    # sliding group ((2,000 - 31) // 16 = 123). B prefills its 1,000 tokens in one
    # step; from its first decode its window has passed H, so it retains those
    # 2 x 3 = 6 blocks in each of its 3 decode steps. lru retains nothing.
    layout = shipped_layout("toy-1full-3sliding")
    rows = [mooncake(0, 2000, 1, [0, 1, 2, 3]), mooncake(1, 3000, 4, [0, 1, 2, 3, 4, 5])]
    cost = CostModel.from_layout(layout, H100, active_params=1e6)
    path = write_trace(rows)
    for policy, retained in (("lru", 0), ("hybrid", 6 * 3)):
        options = SimOptions(
            memory_bytes=2**24, policy=policy, arrivals="closed", max_num_seqs=1, max_model_len=4096
        )
        r = replay_trace(layout, load_trace(path), options, cost)
        assert (r.hit_tokens, r.steps) == (2000, 5)  # A: 1 step; B: 1 prefill + 3 decodes
        assert r.running_mean == 1.0
        assert r.retained_mean * r.steps * (r.num_blocks - 1) == pytest.approx(retained)
        assert r.to_json()["retained_mean"] == r.retained_mean
