"""The ``triton`` backend's Gemma elementwise ops against the torch reference.

Each kernel rounds where the reference rounds (``kernels/norms_triton.py``), so in
fp32 the outputs agree to summation order and, compiled, in bf16 / fp16 they agree
but for values that sit on a rounding boundary, where one ulp may separate them. On
a GPU machine the tensors go to CUDA (the kernels compile there); else Triton's
interpreter runs them on the CPU, where a cast from fp32 to bf16 truncates instead of
rounding to nearest (measured: 48 % of 1,024 random values differed from torch's
cast, every one toward zero, with or without ``fp_downcast_rounding="rtne"``): the
kernels round on the bits there (``_round``), and this file holds them to the same
bound on both.
"""

from __future__ import annotations

import os

import pytest
import torch

from hybridkv.kernels.torch_backend import TorchBackend
from hybridkv.kernels.triton_backend import TritonBackend

pytest.importorskip("triton")

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = torch.device("cuda" if torch.cuda.is_available() and not INTERPRET else "cpu")
REF, TRI = TorchBackend(), TritonBackend()
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    """fp32: summation order only; 16-bit: at most one ulp apart, in few places."""
    assert got.dtype == want.dtype and got.shape == want.shape
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        return
    ulp = torch.finfo(got.dtype).eps * want.float().abs().clamp_min(1e-3)
    diff = (got.float() - want.float()).abs()
    assert (diff <= ulp * 1.01 + 1e-6).all(), diff.max()
    assert (diff > 0).float().mean() < 0.02, "too many rounding differences"


def _rand(*shape: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype).to(DEVICE)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_h", [True, False])
@pytest.mark.parametrize("cols", [64, 640, 1000])
def test_add_rms_norm_matches_the_reference(dtype, with_h, cols):
    x, h = _rand(7, cols, dtype=dtype, seed=1), _rand(7, cols, dtype=dtype, seed=2)
    hs = (1 + _rand(cols, dtype=torch.float32, seed=3) * 0.1).contiguous()
    os_ = (1 + _rand(cols, dtype=torch.float32, seed=4) * 0.1).contiguous()
    args = (h, hs) if with_h else (None, None)
    want_x, want_y = REF.add_rms_norm(x, *args, os_, 1e-6)
    x_before = x.clone()
    got_x, got_y = TRI.add_rms_norm(x, *args, os_, 1e-6)
    _close(got_x, want_x)
    _close(got_y, want_y)
    assert torch.equal(x, x_before), "x is read, not written"
    if not with_h:
        assert got_x is x


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("heads", "dim"), [(4, 256), (2, 64), (3, 80)])
def test_norm_rope_matches_the_reference(dtype, heads, dim):
    t = 5
    x = _rand(t, heads, dim, dtype=dtype, seed=5)
    scale = (1 + _rand(dim, dtype=torch.float32, seed=6) * 0.1).contiguous()
    ang = _rand(t, 1, dim // 2, dtype=torch.float32, seed=7)
    ang = torch.cat([ang, ang], dim=-1)
    cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
    got, want = TRI.norm_rope(x, scale, cos, sin, 1e-6), REF.norm_rope(x, scale, cos, sin, 1e-6)
    _close(got, want)


def test_norm_rope_of_a_strided_view():
    # q of a fused qkv projection: a [T, H, D] view whose rows are wider than H * D.
    qkv = _rand(3, 6 * 64, dtype=torch.float32, seed=8)
    x = qkv[:, : 4 * 64].view(3, 4, 64)
    scale = torch.ones(64, device=DEVICE)
    cos = torch.ones(3, 1, 64, device=DEVICE)
    sin = torch.zeros(3, 1, 64, device=DEVICE)
    _close(TRI.norm_rope(x, scale, cos, sin, 1e-6), REF.norm_rope(x, scale, cos, sin, 1e-6))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", [128, 2048, 3000])
def test_gelu_tanh_mul_matches_the_reference(dtype, cols):
    gate, up = _rand(4, cols, dtype=dtype, seed=9) * 3, _rand(4, cols, dtype=dtype, seed=10)
    _close(TRI.gelu_tanh_mul(gate, up), REF.gelu_tanh_mul(gate, up))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("weight_dtype", [None, "same", torch.float32])
@pytest.mark.parametrize("shape", [(6, 64), (5, 3, 80), (2, 4096)])
def test_rms_norm_matches_the_reference(dtype, weight_dtype, shape):
    x = _rand(*shape, dtype=dtype, seed=13)
    w = None
    if weight_dtype is not None:
        wd = dtype if weight_dtype == "same" else weight_dtype
        w = (1 + _rand(shape[-1], dtype=torch.float32, seed=14) * 0.1).to(wd)
    got, want = TRI.rms_norm(x, w, 1e-5), REF.rms_norm(x, w, 1e-5)
    _close(got, want)


def test_rms_norm_of_a_strided_view():
    # Llama 4's q / k norm: [T, H, D] heads of a wider projection output.
    qkv = _rand(3, 6 * 64, dtype=torch.float32, seed=15)
    x = qkv[:, : 4 * 64].view(3, 4, 64)
    _close(TRI.rms_norm(x, None, 1e-6), REF.rms_norm(x, None, 1e-6))


def test_bad_shapes_are_refused():
    x = _rand(2, 8, dtype=torch.float32, seed=11)
    with pytest.raises(ValueError, match="out_scale"):
        TRI.add_rms_norm(x, None, None, torch.ones(7, device=DEVICE), 1e-6)
    with pytest.raises(ValueError, match="h_scale: required"):
        TRI.add_rms_norm(x, x, None, torch.ones(8, device=DEVICE), 1e-6)
    with pytest.raises(ValueError, match="head size 7 must be even"):
        y = _rand(2, 1, 7, dtype=torch.float32, seed=12)
        TRI.norm_rope(y, torch.ones(7, device=DEVICE), y, y, 1e-6)
    with pytest.raises(ValueError, match="must match"):
        TRI.gelu_tanh_mul(x, x[:, :4])
    with pytest.raises(ValueError, match="weight: dimension 0 is 7"):
        TRI.rms_norm(x, torch.ones(7, device=DEVICE), 1e-6)
