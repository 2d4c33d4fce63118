"""Llama's ``rms_norm`` and Llama 4's ``rope_pairwise`` ops against transformers' modules.

The torch reference's norms are bit-identical to transformers' (the oracle tests
compare greedy tokens). The native backend gives the reference's bits (both ops
are declared fallbacks there); the Triton backend gives them for the pairwise RoPE
(a fallback) and runs ``rms_norm`` as its own kernel (``norms_triton.py``), which
rounds where the reference rounds but sums the squares in its own order: in fp32
it agrees to that order, in bf16 to at most one ulp (``test_norms_triton.py``
holds it at every shape; the Jamba and Llama 4 oracle tests run it).
"""

from __future__ import annotations

import pytest
import torch

from hybridkv.kernels import KernelBackend
from hybridkv.kernels.cpu.backend import NativeBackend
from hybridkv.kernels.torch_backend import TorchBackend
from hybridkv.kernels.triton_backend import TritonBackend
from hybridkv.models.llama4 import InterleavedRotary

DTYPES = [torch.float32, torch.bfloat16]


def _rows(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 3.0).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_is_bit_identical_to_llama4_and_jamba_norms(dtype: torch.dtype) -> None:
    from transformers.models.jamba.modeling_jamba import JambaRMSNorm
    from transformers.models.llama4.modeling_llama4 import Llama4TextRMSNorm

    x = _rows((37, 96), dtype, 0)
    weight = _rows((96,), dtype, 1)
    ops = TorchBackend()
    for ref in (Llama4TextRMSNorm(96, eps=1e-5), JambaRMSNorm(96, eps=1e-5)):
        ref.to(dtype)
        with torch.no_grad():
            ref.weight.copy_(weight)
            want = ref(x)
        got = ops.rms_norm(x, weight, 1e-5)
        assert got.dtype == want.dtype == dtype
        assert torch.equal(got, want), type(ref).__name__


@pytest.mark.parametrize("dtype", DTYPES)
def test_weightless_rms_norm_is_bit_identical_to_the_llama4_l2_norm(dtype: torch.dtype) -> None:
    from transformers.models.llama4.modeling_llama4 import Llama4TextL2Norm

    x = _rows((11, 3, 18), dtype, 2)  # [T, H, D]: per head
    got = TorchBackend().rms_norm(x, None, 1e-6)
    assert got.dtype == dtype
    assert torch.equal(got, Llama4TextL2Norm(1e-6)(x))


def test_interleaved_rope_rotates_pairs_and_keeps_their_length() -> None:
    x = _rows((5, 2, 8), torch.float32, 3)
    rotary = InterleavedRotary(8, {"rope_theta": 100.0, "rope_type": "default"})
    cos, sin = rotary.cos_sin(torch.tensor([0, 1, 2, 3, 40]))
    got = TorchBackend().rope_pairwise(x, cos, sin)
    assert torch.equal(got[0], x[0])  # position 0: no rotation
    pairs_in, pairs_out = x.unflatten(-1, (-1, 2)), got.unflatten(-1, (-1, 2))
    torch.testing.assert_close(pairs_out.norm(dim=-1), pairs_in.norm(dim=-1))
    # pair 0 turns by position x theta_0 = 1 radian per position: (1, 0) -> (cos p, sin p)
    unit = torch.zeros(5, 1, 8)
    unit[..., 0] = 1.0
    turned = TorchBackend().rope_pairwise(unit, cos, sin)[:, 0, :2]
    p = torch.tensor([0.0, 1.0, 2.0, 3.0, 40.0])
    torch.testing.assert_close(turned, torch.stack((p.cos(), p.sin()), dim=-1))


@pytest.mark.parametrize("backend", [NativeBackend, TritonBackend])
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_backend_gives_the_reference_bits(
    backend: type[KernelBackend], dtype: torch.dtype
) -> None:
    ops, ref = backend(), TorchBackend()
    x, weight = _rows((9, 4, 16), dtype, 4), _rows((16,), dtype, 5)
    rotary = InterleavedRotary(16, {"rope_theta": 500.0, "rope_type": "default"})
    cos, sin = rotary.cos_sin(torch.arange(3, 12))
    for w in (weight, None):
        got, want = ops.rms_norm(x, w, 1e-5), ref.rms_norm(x, w, 1e-5)
        if backend is NativeBackend:
            assert torch.equal(got, want)
        elif dtype == torch.float32:  # Triton's kernel: its own order of the sum of squares
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        else:  # one ulp
            ulp = torch.finfo(dtype).eps * want.float().abs()
            assert ((got.float() - want.float()).abs() <= ulp * 1.01).all()
    assert torch.equal(ops.rope_pairwise(x, cos, sin), ref.rope_pairwise(x, cos, sin))
