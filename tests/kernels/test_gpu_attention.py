"""GPU checks of the Triton attention and cache-write kernels: realistic shapes, bf16.

Skipped without CUDA. The torch reference on the same GPU is the baseline
(itself checked against the fp64 oracle on the CPU); bf16 outputs are compared
at bf16 resolution, fp32 ones tightly (the kernel runs fp32 dots in IEEE mode).
"""

from __future__ import annotations

import pytest
import torch
from paged_factory import dense_oracle, make_paged_batch, strided_cache_views

from hybridkv.kernels import AttentionOptions, reshape_and_cache, unified_attention

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CUDA = "cuda"
MIXED = [(0, 300), (1000, 1), (2049, 1), (517, 129), (4000, 1), (3, 1), (77, 64)]
DECODES = [(1023 + 17 * i, 1) for i in range(16)]
KINDS = {
    "full": {},
    "sliding": {"sliding_window": 1000},
    "chunked": {"chunk_size": 777},
}


def _run(b, backend, **kw):
    return unified_attention(
        b.q, b.key_cache, b.value_cache, b.meta, b.opts, sinks=b.sinks, backend=backend, **kw
    )


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("batch", ["mixed", "decodes"])
@pytest.mark.parametrize("head_size", [64, 128, 256])
def test_bf16_realistic_shapes(kind, batch, head_size):
    opts = AttentionOptions(scale=head_size**-0.5, **KINDS[kind])
    seqs = MIXED if batch == "mixed" else DECODES
    b = make_paged_batch(
        seqs,
        num_heads=32,
        num_kv_heads=8,
        head_size=head_size,
        block_size=16,
        opts=opts,
        dtype=torch.bfloat16,
        device=CUDA,
    )
    got = _run(b, "triton").float()
    want = _run(b, "torch").float()
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("softcap", [None, 30.0])
@pytest.mark.parametrize("sinks", [False, True])
@pytest.mark.parametrize("segments", [None, 1, 4])
def test_fp32_against_the_oracle(softcap, sinks, segments):
    opts = AttentionOptions(scale=0.1, sliding_window=129, softcap=softcap)
    b = make_paged_batch(
        [*DECODES[:6], (40, 33)],
        num_heads=16,
        num_kv_heads=2,
        head_size=128,
        block_size=16,
        opts=opts,
        with_sinks=sinks,
        device=CUDA,
    )
    got = _run(b, "triton", num_segments=segments)
    torch.testing.assert_close(got.cpu().double(), dense_oracle(b), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("block_size", [16, 80, 528])
def test_large_and_odd_block_sizes(block_size):
    opts = AttentionOptions(scale=0.088, chunk_size=8192)
    b = make_paged_batch(
        [(9000, 1), (8100, 200), (12, 1)],
        num_heads=32,
        num_kv_heads=8,
        head_size=128,
        block_size=block_size,
        opts=opts,
        dtype=torch.float16,
        device=CUDA,
    )
    torch.testing.assert_close(
        _run(b, "triton").float(), _run(b, "torch").float(), rtol=2e-3, atol=2e-3
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_reshape_and_cache_on_gpu(dtype):
    buf, kc, vc = strided_cache_views(512, 16, 8, 128, dtype, device=CUDA)
    buf.zero_()
    ref = buf.clone()
    rk = ref.as_strided(kc.shape, kc.stride(), kc.storage_offset())
    rv = ref.as_strided(vc.shape, vc.stride(), vc.storage_offset())
    key = torch.randn(3000, 8, 128, device=CUDA).to(dtype)
    value = torch.randn(3000, 8, 128, device=CUDA).to(dtype)
    slots = torch.randperm(512 * 16, device=CUDA)[:3000]
    slots[::7] = -1
    reshape_and_cache(key, value, kc, vc, slots, backend="triton")
    reshape_and_cache(key, value, rk, rv, slots, backend="torch")
    assert torch.equal(buf.view(torch.uint8), ref.view(torch.uint8))
