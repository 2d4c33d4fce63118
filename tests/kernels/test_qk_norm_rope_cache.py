"""``qk_norm_rope_cache``: the fused Triton kernel against the ops it replaces.

The kernel claims more than closeness: it runs the ``norm_rope`` kernel's code for
each head and copies rows, so its outputs are **bit-identical** to Triton's
``norm_rope`` on q and k followed by ``reshape_and_cache`` (compared with
``torch.equal`` below), and as close to the torch reference as ``norm_rope`` is
(``test_norms_triton.py``'s bound). Tiny shapes, under Triton's interpreter on the
CPU (compiled on a GPU machine); q/k/v are views of one projection output (the
merged ``qkv_proj``) or separate tensors, the caches strided views of a shared
buffer, and two tokens have slot -1 (written nowhere).
"""

from __future__ import annotations

import os

import pytest
import torch
from paged_factory import strided_cache_views
from test_norms_triton import _close

from hybridkv.kernels import QKNormRope, reshape_and_cache_ref, reshape_and_cache_triton
from hybridkv.kernels.torch_backend import TorchBackend
from hybridkv.kernels.triton_backend import TritonBackend

pytest.importorskip("triton")

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = torch.device("cuda" if torch.cuda.is_available() and not INTERPRET else "cpu")
REF, TRI = TorchBackend(), TritonBackend()
EPS = 1e-6


def _inputs(t: int, hq: int, hkv: int, d: int, dtype: torch.dtype, merged: bool, seed: int):
    g = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(dtype).to(DEVICE)

    if merged:  # views of one [T, (Hq + 2 Hkv) D] projection output
        qkv = rand(t, (hq + 2 * hkv) * d)
        q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
        q, k, v = q.view(t, hq, d), k.view(t, hkv, d), v.view(t, hkv, d)
    else:
        q, k, v = rand(t, hq, d), rand(t, hkv, d), rand(t, hkv, d)
    scales = [(1 + torch.randn(d, generator=g) * 0.1).to(DEVICE) for _ in range(2)]
    ang = torch.randn(t, 1, d // 2, generator=g) * 3
    ang = torch.cat([ang, ang], dim=-1).to(DEVICE)
    cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
    buf, kc, vc = strided_cache_views(6, 4, hkv, d, dtype, device=DEVICE)
    buf.copy_(torch.randn(buf.shape, generator=g).to(dtype))
    slots = torch.randperm(6 * 4, generator=g)[:t]
    slots[[1, t - 1]] = -1
    return q, k, v, scales, cos, sin, buf, kc, vc, slots.to(DEVICE)


def _views(buf: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor):
    return (
        buf.as_strided(kc.shape, kc.stride(), kc.storage_offset()),
        buf.as_strided(vc.shape, vc.stride(), vc.storage_offset()),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("hq", "hkv", "d"), [(4, 1, 256), (2, 2, 64), (6, 2, 80)])
@pytest.mark.parametrize("merged", [True, False])
def test_fused_is_bit_identical_to_norm_rope_then_cache_write(dtype, hq, hkv, d, merged):
    q, k, v, (qs, ks), cos, sin, buf, kc, vc, slots = _inputs(5, hq, hkv, d, dtype, merged, 1)
    want_buf = buf.clone()
    wk, wv = _views(want_buf, kc, vc)
    want_q = TRI.norm_rope(q, qs, cos, sin, EPS)
    reshape_and_cache_triton(TRI.norm_rope(k, ks, cos, sin, EPS), v, wk, wv, slots)
    q_before, k_before = q.clone(), k.clone()
    got_q = TRI.qk_norm_rope_cache(q, k, v, QKNormRope(qs, ks, cos, sin, EPS), kc, vc, slots)
    assert torch.equal(got_q, want_q)
    assert torch.equal(buf.view(torch.uint8), want_buf.view(torch.uint8))
    assert torch.equal(q, q_before) and torch.equal(k, k_before), "q, k are read only"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_matches_the_torch_reference(dtype):
    q, k, v, (qs, ks), cos, sin, buf, kc, vc, slots = _inputs(7, 4, 1, 256, dtype, True, 2)
    before, ref_buf = buf.clone(), buf.clone()
    rk, rv = _views(ref_buf, kc, vc)
    norm = QKNormRope(qs, ks, cos, sin, EPS)
    want_q = REF.qk_norm_rope_cache(q, k, v, norm, rk, rv, slots)
    got_q = TRI.qk_norm_rope_cache(q, k, v, norm, kc, vc, slots)
    _close(got_q, want_q)
    _close(buf, ref_buf)
    # The composed reference is norm_rope and reshape_and_cache, nothing more.
    seq_buf = ref_buf.clone()
    sk, sv = _views(seq_buf, kc, vc)
    reshape_and_cache_ref(REF.norm_rope(k, ks, cos, sin, EPS), v, sk, sv, slots)
    assert torch.equal(seq_buf, ref_buf)
    # Padding tokens (slot -1) wrote nothing: their rows hold what they held.
    written = torch.zeros(buf.shape, dtype=torch.bool, device=buf.device)
    for view in _views(written, kc, vc):
        for s in slots.tolist():
            if s >= 0:
                view[s // 4, s % 4] = True
    assert torch.equal(buf[~written], before[~written])
    assert not torch.equal(buf[written], before[written])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda a: {**a, "q_scale": a["q_scale"][:-2]}, "q_scale: dimension 0"),
        (lambda a: {**a, "cos": a["cos"][:, :, :-2]}, "cos: shape"),
        (lambda a: {**a, "q": a["q"].to(torch.float16)}, "q: dtype"),
        (lambda a: {**a, "k_scale": a["k_scale"].half()}, "k_scale: dtype"),
        (lambda a: {**a, "slot_mapping": a["slot_mapping"][:-1]}, "slot_mapping"),
    ],
)
@pytest.mark.parametrize("backend", [REF, TRI])
def test_bad_arguments_are_refused_by_name(change, message, backend):
    q, k, v, (qs, ks), cos, sin, _, kc, vc, slots = _inputs(3, 2, 1, 16, torch.float32, True, 3)
    args = dict(q=q, k=k, v=v, q_scale=qs, k_scale=ks, cos=cos, sin=sin, eps=EPS,
                key_cache=kc, value_cache=vc, slot_mapping=slots)  # fmt: skip
    a = change(args)
    norm = QKNormRope(*(a.pop(n) for n in ("q_scale", "k_scale", "cos", "sin", "eps")))
    with pytest.raises(ValueError, match=message):
        backend.qk_norm_rope_cache(norm=norm, **a)


def test_odd_head_size_is_refused():
    q, k, v, (qs, ks), cos, sin, *_, slots = _inputs(3, 2, 1, 16, torch.float32, True, 4)
    odd = [x[..., :15] for x in (q, k, v)]
    _, kc7, vc7 = strided_cache_views(6, 4, 1, 15, torch.float32, device=DEVICE)
    with pytest.raises(ValueError, match="head size 15 must be even"):
        norm = QKNormRope(qs[:15], ks[:15], cos[..., :15], sin[..., :15], EPS)
        TRI.qk_norm_rope_cache(*odd, norm, kc7, vc7, slots)
