"""Native CPU kernels (``hybridkv.kernels.cpu``) against the torch code they replace.

The fused Gemma ops round where the eager ops round, so in bf16 they must
agree with them element for element except where fp32 summation order or a
1-ulp exp flips a rounding (at most 1 bf16 ulp, in under 1% of elements);
in fp32 they agree to a few ulps. Decode attention is checked against the
fp64 dense oracle on the NaN-poisoned paged factory, like the other backends.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from paged_factory import dense_oracle, gqa_batch, make_paged_batch
from test_unified_attention import BATCHES, KINDS

from hybridkv.kernels import (
    KernelBackendError,
    reshape_and_cache_native,
    reshape_and_cache_ref,
    resolve_backend,
    unified_attention,
)
from hybridkv.kernels.attention import AttentionOptions
from hybridkv.kernels.cpu import add_norm_, build, geglu, native_status, norm_rope_
from hybridkv.models.layers import GemmaRMSNorm, RotaryEmbedding

pytestmark = pytest.mark.skipif(
    native_status() is not None, reason=f"native CPU kernels unavailable: {native_status()}"
)
DTYPES = [torch.bfloat16, torch.float32]


def _assert_matches_eager(got: torch.Tensor, want: torch.Tensor, flips: float = 0.01) -> None:
    """fp32: a few ulps; bf16: at most 1 ulp apart, in under ``flips`` of the elements."""
    assert got.dtype == want.dtype and got.shape == want.shape
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=4e-6, atol=4e-6)
        return
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=1e-6)
    assert got.numel() == 0 or (got != want).float().mean().item() < flips


def _norm(dim: int, seed: int) -> GemmaRMSNorm:
    norm = GemmaRMSNorm(dim, 1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(dim, generator=torch.Generator().manual_seed(seed)))
    return norm


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [0, 1, 37, 300])
def test_add_norm_matches_residual_and_norms(dtype, rows):
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 640, generator=g).to(dtype)
    h = (torch.randn(rows, 640, generator=g) * 5).to(dtype)
    post, pre = _norm(640, 1), _norm(640, 2)
    with torch.no_grad():
        want_x = x + post(h)
        want_y = pre(want_x)
    got_x = x.clone()
    got_y = add_norm_(got_x, h, post.scale_fp32(), pre.scale_fp32(), 1e-6)
    _assert_matches_eager(got_x, want_x)
    assert got_y is not None
    _assert_matches_eager(got_y, want_y)


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_norm_halves(dtype):
    x = torch.randn(9, 96).to(dtype)
    h = torch.randn(9, 96).to(dtype)
    norm = _norm(96, 3)
    with torch.no_grad():
        _assert_matches_eager(add_norm_(x.clone(), None, None, norm.scale_fp32(), 1e-6), norm(x))
        only_residual = x.clone()
        assert add_norm_(only_residual, h, norm.scale_fp32(), None, 1e-6) is None
        _assert_matches_eager(only_residual, x + norm(h))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("heads", "dim"), [(1, 64), (4, 256), (3, 40)])
@pytest.mark.parametrize("with_norm", [True, False])
def test_norm_rope_matches_eager(dtype, heads, dim, with_norm):
    t = 70
    g = torch.Generator().manual_seed(dim)
    # A row of a wider projection, as q sits in a fused qkv output.
    wide = torch.randn(t, heads * dim + 32, generator=g).to(dtype)
    x = wide[:, : heads * dim].view(t, heads, dim)
    rotary = RotaryEmbedding(dim, {"rope_theta": 10000.0, "rope_type": "default"})
    cos, sin = rotary.cos_sin(torch.arange(t) * 37 + 5, dtype)
    norm = _norm(dim, 4)
    with torch.no_grad():
        want = RotaryEmbedding.rotate(norm(x) if with_norm else x, cos, sin)
    got = norm_rope_(x, norm.scale_fp32() if with_norm else None, cos, sin, 1e-6)
    assert got.data_ptr() == wide.data_ptr()  # in place
    _assert_matches_eager(got, want)
    assert torch.equal(wide[:, heads * dim :], wide[:, heads * dim :].clone())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("rows", "cols"), [(1, 100), (16, 2048), (40, 1000)])
def test_geglu_matches_eager(dtype, rows, cols):
    g = torch.Generator().manual_seed(cols)
    gate = (torch.randn(rows, cols, generator=g) * 4).to(dtype)
    up = torch.randn(rows, cols, generator=g).to(dtype)
    want = F.gelu(gate, approximate="tanh") * up
    got = geglu(gate, up)
    if dtype == torch.float32:
        # 1 + tanh(u) cancels for very negative gates: both sides keep ~1 ulp of 1.
        torch.testing.assert_close(got, want, rtol=4e-6, atol=1e-6)
    else:
        # Gates this wide (std 4) are often negative enough that 1 + tanh(u) keeps
        # only ~2^-15 relative accuracy on either side (another tanh than ATen's),
        # which flips a bf16 rounding in a few % of elements, by 1 ulp.
        _assert_matches_eager(got, want, flips=0.05)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cache_write_matches_reference(dtype):
    b = make_paged_batch(
        [(3, 6), (9, 1)],
        num_heads=4,
        num_kv_heads=2,
        head_size=16,
        block_size=4,
        opts=AttentionOptions(scale=0.5),
        dtype=dtype,
    )
    k = torch.randn(7, 2, 16).to(dtype)
    v = torch.randn(7, 2, 16).to(dtype)
    slots = torch.tensor([5, 6, -1, 9, 10, 11, 21])
    want_k, want_v = b.key_cache.clone(), b.value_cache.clone()
    reshape_and_cache_ref(k, v, want_k, want_v, slots)
    reshape_and_cache_native(k, v, b.key_cache, b.value_cache, slots)
    assert torch.equal(b.key_cache.nan_to_num(7.0), want_k.nan_to_num(7.0))
    assert torch.equal(b.value_cache.nan_to_num(7.0), want_v.nan_to_num(7.0))


@pytest.mark.parametrize("batch", ["decodes", "mixed", "prefills_together"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("gqa", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("softcap", [None, 3.0])
@pytest.mark.parametrize("sinks", [False, True])
def test_native_attention_matches_oracle(batch, kind, gqa, softcap, sinks):
    opts = AttentionOptions(scale=0.3, softcap=softcap, **KINDS[kind])
    b = gqa_batch(BATCHES[batch], gqa, opts, sinks=sinks, seed=gqa)
    got = unified_attention(
        b.q, b.key_cache, b.value_cache, b.meta, b.opts, sinks=b.sinks, backend="native"
    )
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), dense_oracle(b), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("head_size", [24, 64, 256])
@pytest.mark.parametrize("dtype", DTYPES)
def test_native_attention_head_sizes_and_dtypes(head_size, dtype):
    # 24: a head that is not a whole number of 16-wide partial sums.
    opts = AttentionOptions(scale=head_size**-0.5, sliding_window=9)
    b = make_paged_batch(
        [(40, 1), (3, 1), (100, 1), (0, 5)],
        num_heads=8,
        num_kv_heads=2,
        head_size=head_size,
        block_size=16,
        opts=opts,
        dtype=dtype,
    )
    got = unified_attention(b.q, b.key_cache, b.value_cache, b.meta, b.opts, backend="native")
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.double(), dense_oracle(b), rtol=tol, atol=tol)


def test_bad_inputs_raise():
    x = torch.randn(4, 64)
    w = torch.ones(64)
    with pytest.raises(ValueError, match="bf16 or fp32"):
        add_norm_(x.half(), None, None, w, 1e-6)
    with pytest.raises(ValueError, match="unit last stride"):
        add_norm_(x.t(), None, None, torch.ones(4), 1e-6)
    with pytest.raises(ValueError, match="differs"):
        add_norm_(x, torch.randn(3, 64), w, None, 1e-6)
    with pytest.raises(ValueError, match="h_weight"):
        add_norm_(x, x, None, None, 1e-6)
    with pytest.raises(ValueError, match=r"fp32 \[64\] weight"):
        add_norm_(x, None, None, torch.ones(64, dtype=torch.bfloat16), 1e-6)
    with pytest.raises(ValueError, match="even"):
        norm_rope_(torch.randn(2, 1, 5), None, torch.ones(2, 5), torch.ones(2, 5), 1e-6)
    with pytest.raises(ValueError, match="differ in shape"):
        geglu(torch.randn(2, 8), torch.randn(2, 9))
    b = make_paged_batch(
        [(4, 1)],
        num_heads=2,
        num_kv_heads=1,
        head_size=16,
        block_size=4,
        opts=AttentionOptions(scale=1.0),
        dtype=torch.float16,
    )
    with pytest.raises(ValueError, match="bf16 or fp32"):
        unified_attention(b.q, b.key_cache, b.value_cache, b.meta, b.opts, backend="native")
    big = make_paged_batch(
        [(4, 1)],
        num_heads=256,
        num_kv_heads=1,
        head_size=256,
        block_size=4,
        opts=AttentionOptions(scale=1.0),
    )
    with pytest.raises(ValueError, match="backend='torch'"):
        unified_attention(
            big.q, big.key_cache, big.value_cache, big.meta, big.opts, backend="native"
        )


def test_backend_resolution():
    cpu = torch.device("cpu")
    assert resolve_backend("native", cpu, allowed=("triton", "torch", "native")) == "native"
    # Ops without a native kernel (the Mamba ops) refuse it: no silent remap to torch
    # (the engine's native backend declares their torch fallback instead).
    with pytest.raises(KernelBackendError, match="offers only"):
        resolve_backend("native", cpu)
    with pytest.raises(KernelBackendError, match="CPU tensors only"):
        resolve_backend("native", torch.device("cuda"), allowed=("native",))


def test_build_errors_are_clear(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(build.NativeBuildError, match="C compiler"):
        build._compiler()
    with pytest.raises(build.NativeBuildError, match="failed"):
        build._build("false", tmp_path / "lib.so")  # `false` exits 1: a failing compiler
    assert not (tmp_path / "lib.so").exists()


def test_cache_key_follows_the_source(tmp_path, monkeypatch):
    monkeypatch.setenv("HYBRIDKV_CACHE", str(tmp_path))
    first = build._library_path(build._compiler())
    assert len(build.SOURCES) >= 3  # every csrc/*.c is part of the library and of its key
    for i, source in enumerate(build.SOURCES):
        edited = tmp_path / f"edited{i}.c"
        edited.write_text(source.read_text() + "\n/* edit */\n")
        sources = list(build.SOURCES)
        sources[i] = edited
        with monkeypatch.context() as m:
            m.setattr(build, "SOURCES", tuple(sources))
            assert build._library_path(build._compiler()) != first
    assert build._library_path(build._compiler()) == first


def test_a_second_load_reuses_the_cached_build(monkeypatch):
    """A process that finds the library built for its sources loads it without
    compiling (the host tier's row copy and the kernels share it)."""
    build.library()  # built (or found) once
    path = build._library_path(build._compiler())
    stamp = path.stat().st_mtime_ns

    def no_build(cc, target):
        raise AssertionError("rebuilt a library that was cached")

    monkeypatch.setattr(build, "_build", no_build)
    build.library.cache_clear()
    try:
        assert build.library()._name == str(path)
        assert hasattr(build.library(), "hkv_copy_rows")
    finally:
        build.library.cache_clear()
    assert path.stat().st_mtime_ns == stamp
