"""Triton kernel of ``qk_norm_rope_cache``: Gemma's q and k norm + RoPE and the k/v cache
write as one launch (the ``triton`` backend's op).

Why: a Gemma 3 attention layer ran ``norm_rope`` twice (q, then k) and
``reshape_and_cache`` once, three small kernels per layer of a decode step that on an
H100 each cost a few microseconds whatever they read (issue 47). Here one program per
(token, head) of ``Hq + Hkv`` heads: a query head is normed, rotated and stored in
``q_out``; a key head is normed, rotated and stored straight into the key cache at
the token's slot, and the matching value row copied into the value cache (a slot of
-1 writes nothing). The rotated ``k`` is never materialised: attention reads keys
from the cache.

Numerics: the head's norm + RoPE is ``norms_triton._norm_rope_row``, the code of the
``norm_rope`` kernel, launched with the same options (no FMA contraction), so each
value is bit-identical to ``norm_rope`` followed by ``reshape_and_cache``. Imported at
the first call (``triton`` is optional).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hybridkv.kernels.backend import interpreter_enabled
from hybridkv.kernels.norms_triton import NO_FMA, _norm_rope_row
from hybridkv.kernels.qk_norm_rope_cache import QKNormRope


@triton.jit
def _qk_norm_rope_cache_kernel(  # type: ignore[no-untyped-def]
    q_ptr, k_ptr, v_ptr, q_scale_ptr, k_scale_ptr, cos_ptr, sin_ptr, q_out_ptr,
    key_cache_ptr, value_cache_ptr, slot_ptr,
    D, HQ, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_ct, stride_st, stride_ot, stride_oh,
    stride_kcb, stride_kct, stride_kch, stride_vcb, stride_vct, stride_vch, eps,
    BLOCK_SIZE: tl.constexpr, BLOCK_D: tl.constexpr, RNE_BF16: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    mask = d < D
    cos_row = cos_ptr + t * stride_ct
    sin_row = sin_ptr + t * stride_st
    if h < HQ:
        out = _norm_rope_row(q_ptr + t * stride_qt + h * stride_qh, q_scale_ptr, cos_row,
                             sin_row, D, eps, BLOCK_D, RNE_BF16)  # fmt: skip
        tl.store(q_out_ptr + t * stride_ot + h * stride_oh + d, out, mask=mask)
    else:
        slot = tl.load(slot_ptr + t).to(tl.int64)
        if slot >= 0:
            j = h - HQ
            block = slot // BLOCK_SIZE
            off = slot % BLOCK_SIZE
            key = _norm_rope_row(k_ptr + t * stride_kt + j * stride_kh, k_scale_ptr, cos_row,
                                 sin_row, D, eps, BLOCK_D, RNE_BF16)  # fmt: skip
            kc = key_cache_ptr + block * stride_kcb + off * stride_kct + j * stride_kch
            tl.store(kc + d, key, mask=mask)
            value = tl.load(v_ptr + t * stride_vt + j * stride_vh + d, mask=mask)
            vc = value_cache_ptr + block * stride_vcb + off * stride_vct + j * stride_vch
            tl.store(vc + d, value, mask=mask)


def launch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    norm: QKNormRope,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> torch.Tensor:
    """The launch (arguments checked by ``qk_norm_rope_cache.check``): a new ``q_out``."""
    t, hq, d = q.shape
    hkv = k.shape[1]
    cos, sin = norm.cos.reshape(t, d), norm.sin.reshape(t, d)
    out = torch.empty((t, hq, d), dtype=q.dtype, device=q.device)
    if t:
        qs, ks, vs = q.stride(), k.stride(), v.stride()
        kcs, vcs = key_cache.stride(), value_cache.stride()
        _qk_norm_rope_cache_kernel[(t, hq + hkv)](
            q, k, v, norm.q_scale, norm.k_scale, cos, sin, out, key_cache, value_cache,
            slot_mapping, d, hq, qs[0], qs[1], ks[0], ks[1], vs[0], vs[1], cos.stride(0),
            sin.stride(0), out.stride(0), out.stride(1), kcs[0], kcs[1], kcs[2], vcs[0],
            vcs[1], vcs[2], norm.eps,
            BLOCK_SIZE=key_cache.shape[1], BLOCK_D=triton.next_power_of_2(d),
            RNE_BF16=interpreter_enabled(), **NO_FMA,
        )  # fmt: skip
    return out
