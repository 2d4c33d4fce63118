"""The Triton attention launcher's rules (``launch_rules.py``), with exact values.

The H200 sweep's shapes (32 query / 8 KV heads, head 128, bf16, block 16) must
get the choices it measured best (``benchmarks/results/attention-tuning-nvidia-h200.md``),
except where the docstring says a shape's new choice is untested (16 x 8k).
Pure functions and ``plan_launch`` only: nothing here launches a kernel, and a
``cuda`` device is only a name (``plan_launch`` reads ``device.type``; the SM count is
given, an H100's or H200's 132).
"""

from __future__ import annotations

import pytest
import torch

from hybridkv.kernels.attention import AttentionMetadata, AttentionOptions, TritonTiles
from hybridkv.kernels.attention.launch_rules import (
    MIN_SEGMENT_TILES,
    PROGRAMS_PER_SM,
    BatchKind,
    LaunchChoice,
    auto_segments,
    choose_blocks,
    choose_launch,
    fill_segments,
    next_power_of_2,
    num_warps,
    tile_n,
)
from hybridkv.kernels.attention.launcher import plan_launch, visible_span, within_reach

CUDA = torch.device("cuda")
SMS = 132  # H100 and H200
DECODE, PREFILL, MIXED = BatchKind.DECODE, BatchKind.PREFILL, BatchKind.MIXED


def _meta(lens: list[tuple[int, int]], block_size: int = 16) -> AttentionMetadata:
    """``(context, new tokens)`` per sequence; the table's contents do not matter here."""
    cols = max(-(-(c + n) // block_size) for c, n in lens)
    table = torch.zeros(len(lens), cols, dtype=torch.int32)
    return AttentionMetadata.build([n for _, n in lens], [c + n for c, n in lens], table)


def _plan(lens, device=CUDA, dtype=torch.bfloat16, head=128, heads=(32, 8), **opts):
    meta = _meta(lens)
    sms = SMS if device.type == "cuda" else 0
    hq, hkv = heads
    return plan_launch(
        meta, AttentionOptions(scale=0.1, **opts), hq, hkv, head, dtype, device, sms=sms
    )


# (shape, (context, new) per sequence, window, expected choice) - the sweep's shapes.
H200_SHAPES = [
    ("prefill 1 x 8k", [(0, 8192)], None, LaunchChoice(128, 32, 32, 4, 3, 1)),
    ("prefill 4 x 2k", [(0, 2048)] * 4, None, LaunchChoice(128, 32, 32, 4, 3, 1)),
    (
        "mixed 2k chunk + 64 x 8k",
        [(2048, 2048)] + [(8191, 1)] * 64,
        None,
        LaunchChoice(64, 16, 32, 4, 3, 1),
    ),
    ("decode 64 x 32k", [(32767, 1)] * 64, None, LaunchChoice(16, 4, 128, 4, 3, 16)),
    ("decode 1 x 32k", [(32767, 1)], None, LaunchChoice(16, 4, 128, 4, 3, 16)),
    ("decode 256 x 2k", [(2047, 1)] * 256, None, LaunchChoice(16, 4, 128, 4, 3, 1)),
    # Untested combination (the sweep's best: tile_n 64, 2 stages, 3 segments).
    ("decode 16 x 8k", [(8191, 1)] * 16, None, LaunchChoice(16, 4, 128, 4, 3, 4)),
    ("sliding 1024, 64 x 32k", [(32767, 1)] * 64, 1024, LaunchChoice(16, 4, 32, 2, 3, 1)),
]


@pytest.mark.parametrize(
    ("lens", "window", "want"), [s[1:] for s in H200_SHAPES], ids=[s[0] for s in H200_SHAPES]
)
def test_the_h200_shapes_get_the_measured_choices(lens, window, want):
    assert _plan(lens, sliding_window=window).choice == want


def test_grids_and_partials():
    p = _plan([(0, 8192)])
    assert (p.grid, p.head_pad, p.partial_rows) == ((8192 // 32 + 1, 8, 1), 128, 0)
    p = _plan([(2048, 2048)] + [(8191, 1)] * 64)
    assert p.grid == (2112 // 16 + 65, 8, 1)
    p = _plan([(32767, 1)] * 64)
    # 64 tokens x 32 query heads x 16 segments; merge: one program per (token, head).
    assert (p.grid, p.reduce_grid, p.partial_rows) == ((64 // 4 + 64, 8, 16), (64, 32), 32768)


def test_the_split_follows_the_visible_span_not_the_context():
    assert visible_span(_meta([(32767, 1)]), AttentionOptions(scale=1.0, chunk_size=8192)) == 8192
    # 64 sequences x 8 KV heads fill the GPU (the fill rule adds nothing).
    assert _plan([(32767, 1)] * 64, chunk_size=8192).choice.segments == 4
    assert _plan([(32767, 1)] * 64, sliding_window=4096).choice.segments == 2
    assert _plan([(32767, 1)] * 64, sliding_window=1024).choice == LaunchChoice(16, 4, 32, 2, 3, 1)
    # One segment per 2048 keys, rounded down, at most 16 (launches that fill the GPU).
    spans = (1, 2047, 2048, 4095, 6144, 10**6)
    assert [auto_segments(DECODE, s, SMS, 512, 128) for s in spans] == [1, 1, 1, 1, 3, 16]


def test_no_split_off_cuda_or_with_prefill_rows():
    assert _plan([(32767, 1)], device=torch.device("cpu")).choice.segments == 1
    assert auto_segments(MIXED, 32768, SMS, 8, 32) == auto_segments(PREFILL, 32768, SMS, 8, 32)
    assert auto_segments(PREFILL, 32768, SMS, 8, 32) == 1
    assert auto_segments(DECODE, 32768, 0, 8, 128) == 1  # sms 0: not CUDA
    assert _plan([(32767, 1), (100, 5)]).choice.segments == 1


def test_head_sizes_above_128_keep_register_safe_tiles():
    # Prefill: rows capped at 64, 32 keys, 8 warps (64 rows x 256 >= 64 x 128).
    assert _plan([(0, 8192)], head=256).choice == LaunchChoice(64, 16, 32, 8, 3, 1)
    assert _plan([(0, 100), (7, 1)], head=256).choice == LaunchChoice(64, 16, 32, 8, 3, 1)
    # Decode: 16 rows x 256 < 64 x 128: 4 warps; the split still follows the span, and
    # fills the GPU: a 512 window is 16 tiles of 32 keys, 8 segments of 2 for 8 programs.
    assert _plan([(32767, 1)], head=256).choice == LaunchChoice(16, 4, 32, 4, 3, 16)
    assert _plan([(32767, 1)], head=256, sliding_window=512).choice == LaunchChoice(
        16, 4, 32, 4, 3, 8
    )


def test_fp32_decodes_take_half_the_keys_and_small_heads_the_head_128_rules():
    assert _plan([(32767, 1)], dtype=torch.float32).choice.tile_n == 64
    assert _plan([(32767, 1)], dtype=torch.float16).choice.tile_n == 128
    assert _plan([(32767, 1)], head=64).choice == LaunchChoice(16, 4, 128, 4, 3, 16)
    assert _plan([(0, 50)], head=64).choice == LaunchChoice(128, 32, 32, 4, 3, 1)


def test_rows_hold_one_kv_heads_query_heads():
    assert choose_blocks(DECODE, 32, 128) == (32, 1)
    assert choose_blocks(PREFILL, 256, 128) == (256, 1)
    assert choose_blocks(MIXED, 3, 128) == (64, 21)
    assert choose_blocks(PREFILL, 1, 256) == (64, 64)
    with pytest.raises(ValueError, match="must hold the 32 query heads of one KV head"):
        choose_blocks(DECODE, 32, 128, block_m=16)


def test_the_single_choices():
    assert [tile_n(DECODE, 128, 2, s) for s in (1024, 1025)] == [32, 128]
    assert tile_n(PREFILL, 128, 2, 10**6) == tile_n(MIXED, 64, 4, 10**6) == 32
    assert [num_warps(DECODE, 128, 16, s) for s in (1024, 1025)] == [2, 4]
    assert num_warps(PREFILL, 128, 128, 10**6) == 4
    assert [num_warps(PREFILL, 256, m, 10**6) for m in (16, 32, 64)] == [4, 8, 8]
    assert [next_power_of_2(n) for n in (0, 1, 2, 3, 16, 17, 1000)] == [1, 1, 2, 4, 16, 32, 1024]
    assert BatchKind.of(1, 1) is DECODE
    assert BatchKind.of(0, 0) is DECODE  # an empty batch launches nothing
    assert BatchKind.of(5, 1) is MIXED and BatchKind.of(5, 2) is PREFILL


def test_tiles_and_num_segments_override_the_rules():
    tiles = TritonTiles(block_m=32, tile_n=64, num_warps=8, num_stages=1, min_tiles_per_segment=4)
    # Segments of 4 x 64 = 256 keys: 3 for 1000 keys (a launch that fills the GPU)...
    full = choose_launch(DECODE, 1000, 4, 128, 2, SMS, 1000, tiles)
    assert full == LaunchChoice(32, 8, 64, 8, 1, 3)
    # ...and the fill rule's shortest segment too: 16 tiles in 4 of 4 tiles.
    assert choose_launch(DECODE, 1000, 4, 128, 2, SMS, 8, tiles).segments == 4
    assert choose_launch(DECODE, 1000, 4, 128, 2, SMS, 8, tiles, num_segments=5).segments == 5
    # A forced split applies off CUDA too (the interpreter tests it).
    assert choose_launch(PREFILL, 10, 4, 128, 2, 0, 1, None, num_segments=2).segments == 2


def test_a_window_or_chunk_no_sequence_outgrows_launches_as_full_attention():
    # W >= the longest sequence hides no key (q - W < 0 <= k); C >= it holds every
    # position in chunk 0. Exactly the keys of full attention: the full path runs.
    full = AttentionOptions(scale=0.1)
    for lens, longest in (([(0, 2048)], 2048), ([(4000, 1), (100, 1)], 4001)):
        meta = _meta(lens)
        for kind in ({"sliding_window": longest}, {"chunk_size": longest}, {"chunk_size": 8192}):
            assert within_reach(meta, AttentionOptions(scale=0.1, **kind)) == full
        for kind in ({"sliding_window": longest - 1}, {"chunk_size": longest - 1}):
            opts = AttentionOptions(scale=0.1, softcap=30.0, **kind)
            assert within_reach(meta, opts) is opts
    soft = AttentionOptions(scale=0.3, sliding_window=5000, softcap=30.0)
    assert within_reach(_meta([(0, 9)]), soft) == AttentionOptions(scale=0.3, softcap=30.0)


def test_a_decode_launch_under_the_gpu_splits_until_it_fills_it():
    room = PROGRAMS_PER_SM * SMS
    # Gemma 3 270M's graphed step: 64 sequences x 1 KV head at ~260-384 keys (tiles of
    # 32 at head 256): 64 programs fill under the 264 two programs per SM allow.
    gemma = _plan([(289, 1)] * 64, head=256, heads=(4, 1))
    assert gemma.choice.segments == room // 64 == 4
    assert gemma.grid == (64 // 4 + 64, 1, 4) and gemma.reduce_grid == (64, 4)
    # The same at its span class (512): planned for more keys, the same split.
    assert _plan([(511, 1)] * 64, head=256, heads=(4, 1)).choice.segments == 4
    # Short contexts keep at least MIN_SEGMENT_TILES tiles a segment, or no split.
    assert _plan([(95, 1)] * 64, head=256, heads=(4, 1)).choice.segments == 96 // 32 // 2 == 1
    assert _plan([(127, 1)] * 64, head=256, heads=(4, 1)).choice.segments == 2
    # Head 128, 8 KV heads: batch 1 at 2k (8 programs, 16 tiles of 128) takes 8 segments,
    # batch 16 (128 programs) 2; at 64 sequences (512 programs) the GPU is full: none.
    assert [_plan([(2047, 1)] * b).choice.segments for b in (1, 16, 64)] == [8, 2, 1]
    # The span's rule wins where it asks for more (16 x 8k: 4).
    assert _plan([(8191, 1)] * 16).choice.segments == 4
    # No automatic split off CUDA, whatever the batch.
    assert _plan([(289, 1)] * 64, device=torch.device("cpu"), head=256, heads=(4, 1)).grid[2] == 1


def test_fill_segments_bounds():
    assert fill_segments(132, 64, 10) == 4  # 264 // 64, and 10 tiles hold 5 of 2
    assert fill_segments(132, 64, 7) == 7 // MIN_SEGMENT_TILES == 3
    assert fill_segments(132, 264, 100) == fill_segments(132, 1000, 100) == 1
    assert fill_segments(132, 1, 1) == fill_segments(132, 0, 0) == 1
    assert fill_segments(132, 8, 256, min_tiles=4) == 33  # capped later by MAX_SEGMENTS
