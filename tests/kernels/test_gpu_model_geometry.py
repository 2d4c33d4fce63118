"""Triton attention at real models' head geometry, against the dense fp64 oracle (issue 16).

On a GPU: each model's heads, head size, scale and window / chunk / sinks; bf16
and fp16; block sizes 16, 80 and 528 (Gemma, Jamba, Bamba pages); one mixed
batch of decodes and prefill chunks at contexts up to 32k tokens, some
starting mid-block. Each output is checked against ``dense_oracle`` (pages
gathered back, full mask, fp64 on the CPU) at the dtype's resolution.

Without CUDA the same check runs once per model under Triton's interpreter at
a tiny batch (``TINY``), so the GPU cases' code is exercised in CI.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from paged_factory import dense_oracle, make_paged_batch

from hybridkv.kernels import AttentionOptions, unified_attention


@dataclass(frozen=True)
class Geometry:
    """One attention layer kind of a model (its HF config)."""

    heads: int
    kv_heads: int
    head_size: int
    scale: float
    window: int | None = None
    chunk: int | None = None
    sinks: bool = False

    def options(self) -> AttentionOptions:
        return AttentionOptions(scale=self.scale, sliding_window=self.window, chunk_size=self.chunk)


MODELS = {
    # query_pre_attn_scalar 168; local layers: sliding window 1024
    "gemma-3-27b-local": Geometry(32, 16, 128, 168**-0.5, window=1024),
    "gemma-3-270m-local": Geometry(4, 1, 256, 256**-0.5, window=512),
    "gemma-3-270m-global": Geometry(4, 1, 256, 256**-0.5),
    "llama-4-scout-chunked": Geometry(40, 8, 128, 128**-0.5, chunk=8192),
    "jamba-v0.1": Geometry(32, 8, 128, 128**-0.5),
    "gpt-oss-20b-sliding": Geometry(64, 8, 64, 64**-0.5, window=128, sinks=True),
}
#: (context, new tokens) per sequence: long decodes, prefill chunks on cached prefixes
#: (mid-block starts for every block size), a fresh prompt, a chunk crossing 8192.
MIXED_32K = [(32767, 1), (24000, 96), (8191, 1), (0, 200), (4095, 1), (8100, 150), (12000, 33)]
TINY = [(37, 1), (20, 9), (0, 12), (15, 1)]
TOL = {torch.bfloat16: 2e-2, torch.float16: 2e-3}
GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def check_geometry(
    g: Geometry,
    seqs: list[tuple[int, int]],
    dtype: torch.dtype,
    block_size: int,
    device: str,
    seed: int = 0,
) -> None:
    b = make_paged_batch(
        seqs,
        num_heads=g.heads,
        num_kv_heads=g.kv_heads,
        head_size=g.head_size,
        block_size=block_size,
        opts=g.options(),
        dtype=dtype,
        with_sinks=g.sinks,
        seed=seed,
        device=device,
    )
    got = unified_attention(
        b.q, b.key_cache, b.value_cache, b.meta, b.opts, sinks=b.sinks, backend="triton"
    )
    assert got.dtype == dtype and torch.isfinite(got).all()
    tol = TOL[dtype]
    torch.testing.assert_close(got.cpu().double(), dense_oracle(b), rtol=tol, atol=tol)


@GPU
@pytest.mark.parametrize("block_size", [16, 80, 528])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("model", MODELS)
def test_model_geometry_up_to_32k(model, dtype, block_size):
    check_geometry(MODELS[model], MIXED_32K, dtype, block_size, "cuda", seed=block_size)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU runs the full-size cases")
@pytest.mark.parametrize("model", MODELS)
def test_model_geometry_tiny_on_the_interpreter(model):
    g = MODELS[model]
    tiny = Geometry(
        g.heads // g.kv_heads * min(g.kv_heads, 2),
        min(g.kv_heads, 2),
        g.head_size,
        g.scale,
        window=None if g.window is None else 7,
        chunk=None if g.chunk is None else 16,
        sinks=g.sinks,
    )
    check_geometry(tiny, TINY, torch.float16, 5, "cpu")
