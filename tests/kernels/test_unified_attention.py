"""Unified paged attention: torch reference and Triton kernel against a dense fp64 oracle."""

from __future__ import annotations

import pytest
import torch
from paged_factory import dense_oracle, gqa_batch, make_paged_batch

from hybridkv.kernels.attention import AttentionOptions, reference, unified_attention
from hybridkv.kernels.attention.metadata import AttentionInputs

# (context_len, query_len) per sequence; block_size 4 in most cases, so prefill
# chunks start mid-block, windows and chunks end mid-block, and chunk
# boundaries fall inside blocks.
BATCHES = {
    "prefill": [(0, 13)],
    "cached_prefix_mid_block": [(5, 9)],
    "decodes": [(17, 1), (2, 1), (30, 1)],
    "mixed": [(0, 7), (11, 1), (6, 10), (25, 1), (0, 1)],
    # Prefill chunks close enough in shape to share one padded call (reference).
    "prefills_together": [(0, 9), (3, 8), (6, 7), (12, 1)],
}
KINDS = {
    "full": {},
    "sliding5": {"sliding_window": 5},
    "sliding7": {"sliding_window": 7},
    "chunked6": {"chunk_size": 6},
    "chunked4": {"chunk_size": 4},
}
TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def _run(batch, backend, **kw):
    return unified_attention(
        batch.q,
        batch.key_cache,
        batch.value_cache,
        batch.meta,
        batch.opts,
        sinks=batch.sinks,
        backend=backend,
        **kw,
    )


def _assert_close(got, want, dtype):
    tol = TOL[dtype]
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("gqa", [1, 2, 4, 8])
@pytest.mark.parametrize("softcap", [None, 3.0])
@pytest.mark.parametrize("sinks", [False, True])
def test_reference_matches_oracle(batch, kind, gqa, softcap, sinks):
    opts = AttentionOptions(scale=0.3, softcap=softcap, **KINDS[kind])
    b = gqa_batch(BATCHES[batch], gqa, opts, sinks=sinks, seed=gqa)
    _assert_close(_run(b, "torch"), dense_oracle(b), torch.float32)


@pytest.mark.parametrize("head_size", [64, 128, 256])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_reference_head_sizes_and_dtypes(head_size, dtype):
    opts = AttentionOptions(scale=head_size**-0.5, sliding_window=9)
    b = make_paged_batch(
        BATCHES["mixed"],
        num_heads=8,
        num_kv_heads=2,
        head_size=head_size,
        block_size=16,
        opts=opts,
        dtype=dtype,
    )
    _assert_close(_run(b, "torch").float(), dense_oracle(b), dtype)


@pytest.mark.parametrize("block_size", [1, 3, 16, 80])
def test_reference_odd_block_sizes(block_size):
    opts = AttentionOptions(scale=0.25, chunk_size=7)
    b = make_paged_batch(
        [(40, 9), (3, 1), (0, 21)],
        num_heads=4,
        num_kv_heads=1,
        head_size=16,
        block_size=block_size,
        opts=opts,
    )
    _assert_close(_run(b, "torch"), dense_oracle(b), torch.float32)


def test_a_sequence_never_reads_another_ones_blocks():
    # Same sequence alone and inside a batch: identical rows.
    opts = AttentionOptions(scale=0.3, sliding_window=6)
    both = make_paged_batch(
        [(9, 5), (14, 1)], num_heads=4, num_kv_heads=2, head_size=16, block_size=4, opts=opts
    )
    out = _run(both, "torch")
    want = dense_oracle(both)
    _assert_close(out, want, torch.float32)
    assert not torch.equal(out[:5], out[5:6].expand(5, -1, -1))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("softcap", [None, 3.0])
def test_batched_prefills_equal_one_call_per_chunk(kind, softcap, monkeypatch):
    opts = AttentionOptions(scale=0.3, softcap=softcap, **KINDS[kind])
    seqs = BATCHES["prefills_together"]
    b = make_paged_batch(
        seqs, num_heads=4, num_kv_heads=2, head_size=16, block_size=4, opts=opts, seed=7
    )
    prefills = [i for i, (_, ql) in enumerate(seqs) if ql > 1]
    together = _run(b, "torch")
    assert reference._prefill_plan(_inputs(b), prefills) is not None  # the padded path ran
    monkeypatch.setattr(reference, "PREFILL_PAD_LIMIT", 0.0)  # force one call per chunk
    b.meta.derived.clear()
    alone = _run(b, "torch")
    assert reference._prefill_plan(_inputs(b), prefills) is None
    torch.testing.assert_close(together, alone, rtol=1e-6, atol=1e-6)
    _assert_close(together, dense_oracle(b), torch.float32)


def _inputs(b):
    out = torch.empty_like(b.q)
    return AttentionInputs(b.q, b.key_cache, b.value_cache, out, b.meta, b.opts, b.sinks)


# --- Triton under TRITON_INTERPRET=1 (tiny shapes) or on a GPU -----------------------

TRITON_BATCHES = ["cached_prefix_mid_block", "decodes", "mixed"]


@pytest.mark.parametrize("batch", TRITON_BATCHES)
@pytest.mark.parametrize("kind", ["full", "sliding5", "chunked6"])
@pytest.mark.parametrize("gqa", [1, 4])
def test_triton_matches_reference(batch, kind, gqa):
    opts = AttentionOptions(scale=0.3, **KINDS[kind])
    b = gqa_batch(BATCHES[batch], gqa, opts, sinks=False, seed=7)
    got = _run(b, "triton")
    _assert_close(got, dense_oracle(b), torch.float32)
    torch.testing.assert_close(got, _run(b, "torch"), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize(
    ("kind", "softcap", "sinks", "gqa"),
    [("full", 3.0, False, 2), ("sliding7", None, True, 8), ("chunked4", 2.0, True, 1)],
)
def test_triton_softcap_sinks_gqa(kind, softcap, sinks, gqa):
    opts = AttentionOptions(scale=0.3, softcap=softcap, **KINDS[kind])
    b = gqa_batch(BATCHES["mixed"], gqa, opts, sinks=sinks, seed=3)
    _assert_close(_run(b, "triton"), dense_oracle(b), torch.float32)


@pytest.mark.parametrize("segments", [2, 3])
@pytest.mark.parametrize("kind", ["full", "sliding7", "chunked6"])
@pytest.mark.parametrize("sinks", [False, True])
def test_triton_split_kv(segments, kind, sinks):
    opts = AttentionOptions(scale=0.3, **KINDS[kind])
    b = make_paged_batch(
        [(70, 1), (5, 1), (129, 1)],
        num_heads=4,
        num_kv_heads=2,
        head_size=16,
        block_size=4,
        opts=opts,
        with_sinks=sinks,
        seed=11,
    )
    _assert_close(_run(b, "triton", num_segments=segments), dense_oracle(b), torch.float32)


@pytest.mark.parametrize("segments", [1, 4])
@pytest.mark.parametrize("window", [None, 64])
def test_triton_split_kv_at_gemma3_decode_heads(segments, window):
    # Gemma 3 270M's decode (4 query heads on 1 KV head of 256, block 16) split as the
    # fill rule splits its graphed step (4 segments), with sequences of fewer key tiles
    # than segments (a graph plans for its span class: some segments have no keys).
    opts = AttentionOptions(scale=256**-0.5, sliding_window=window)
    b = make_paged_batch(
        [(140, 1), (20, 1), (70, 1), (0, 1)],
        num_heads=4,
        num_kv_heads=1,
        head_size=256,
        block_size=16,
        opts=opts,
        seed=13,
    )
    _assert_close(_run(b, "triton", num_segments=segments), dense_oracle(b), torch.float32)


def test_triton_fp16_and_odd_block_size():
    opts = AttentionOptions(scale=0.25, sliding_window=11)
    b = make_paged_batch(
        [(23, 6), (40, 1)],
        num_heads=4,
        num_kv_heads=2,
        head_size=32,
        block_size=5,
        opts=opts,
        dtype=torch.float16,
        seed=5,
    )
    got = _run(b, "triton")
    assert got.dtype == torch.float16
    _assert_close(got.float(), dense_oracle(b), torch.float16)


@pytest.mark.parametrize("head_size", [64, 128, 256])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_triton_head_sizes(head_size, dtype):
    opts = AttentionOptions(scale=head_size**-0.5, sliding_window=9, softcap=20.0)
    b = make_paged_batch(
        [(10, 5), (21, 1)],
        num_heads=4,
        num_kv_heads=2,
        head_size=head_size,
        block_size=4,
        opts=opts,
        dtype=dtype,
        with_sinks=True,
        seed=head_size,
    )
    _assert_close(_run(b, "triton").float(), dense_oracle(b), dtype)
