"""``TritonTiles``: every launch choice computes the same attention (dense fp64 oracle),
and bad choices are refused with the reason."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from paged_factory import dense_oracle, make_paged_batch

from hybridkv.kernels import AttentionOptions, unified_attention
from hybridkv.kernels.attention import TritonTiles

MIXED = [(0, 7), (11, 1), (6, 10), (25, 1), (40, 3)]
KINDS = {"full": {}, "sliding5": {"sliding_window": 5}, "chunked6": {"chunk_size": 6}}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "tiles",
    [
        TritonTiles(block_m=32, tile_n=16),
        TritonTiles(block_m=128, tile_n=128, num_warps=2, num_stages=1),
        TritonTiles(tile_n=32, num_stages=4, min_tiles_per_segment=1),
        TritonTiles(block_m=16, tile_n=16, longest_first=True),
    ],
    ids=["m32-n16", "m128-n128", "n32-split1", "longest-first"],
)
@pytest.mark.parametrize("segments", [None, 3])
def test_tiles_change_nothing_but_speed(kind, tiles, segments):
    opts = AttentionOptions(scale=0.3, softcap=4.0, **KINDS[kind])
    seqs = MIXED if segments is None else [(c, 1) for c, _ in MIXED]  # split: decodes
    b = make_paged_batch(
        seqs,
        num_heads=8,
        num_kv_heads=2,
        head_size=16,
        block_size=4,
        opts=opts,
        with_sinks=True,
        seed=1,
    )
    got = unified_attention(
        b.q,
        b.key_cache,
        b.value_cache,
        b.meta,
        b.opts,
        sinks=b.sinks,
        backend="triton",
        num_segments=segments,
        tiles=tiles,
    )
    torch.testing.assert_close(got.double(), dense_oracle(b), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"block_m": 24}, "block_m: must be a power of two, got 24"),
        ({"tile_n": 8}, r"tile_n: must be in \[16, 256\], got 8"),
        ({"num_warps": 32}, r"num_warps: must be in \[1, 16\], got 32"),
        ({"num_stages": 0}, r"num_stages: must be an integer in \[1, 8\], got 0"),
        ({"min_tiles_per_segment": 0}, "min_tiles_per_segment: must be an integer >= 1"),
        ({"tile_n": True}, "tile_n: must be a power of two, got True"),
        ({"longest_first": 1}, "longest_first: must be True, False or None, got 1"),
    ],
)
def test_bad_tiles_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TritonTiles(**kwargs)


def test_block_m_must_hold_one_kv_heads_queries_and_tiles_must_be_tiles():
    b = make_paged_batch(
        [(3, 2)],
        num_heads=64,
        num_kv_heads=2,
        head_size=16,
        block_size=4,
        opts=AttentionOptions(scale=0.3),
    )
    with pytest.raises(ValueError, match="must hold the 32 query heads of one KV head"):
        unified_attention(
            b.q,
            b.key_cache,
            b.value_cache,
            b.meta,
            b.opts,
            backend="triton",
            tiles=TritonTiles(block_m=16),
        )
    with pytest.raises(TypeError, match="tiles: must be a TritonTiles, got dict"):
        bad_tiles: Any = {"block_m": 16}
        unified_attention(
            b.q, b.key_cache, b.value_cache, b.meta, b.opts, backend="triton", tiles=bad_tiles
        )
    # The torch reference has no tiles: it ignores them, as it ignores num_segments.
    ref = unified_attention(
        b.q,
        b.key_cache,
        b.value_cache,
        b.meta,
        b.opts,
        backend="torch",
        tiles=TritonTiles(block_m=16),
    )
    torch.testing.assert_close(ref.double(), dense_oracle(b), rtol=2e-5, atol=2e-5)
