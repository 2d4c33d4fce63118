"""The Triton kernel of ``reshape_and_cache`` (``cache_write.py``), one program per token.

Imported only when the Triton backend runs the op (``triton`` is optional).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def _next_power_of_2(n: int) -> int:
    # Plain Python: Triton's ``next_power_of_2`` (a constexpr_function) costs microseconds.
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


@triton.jit
def _reshape_and_cache_kernel(  # type: ignore[no-untyped-def]
    key_ptr, value_ptr, key_cache_ptr, value_cache_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kcb, stride_kct, stride_kch,
    stride_vcb, stride_vct, stride_vch,
    num_heads, head_size,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_HD: tl.constexpr,
):  # fmt: skip
    # One program per token: copies its [Hkv, D] K and V rows (flattened) to its slot.
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot < 0:
        return
    block = slot // BLOCK_SIZE
    off = slot % BLOCK_SIZE
    for start in range(0, num_heads * head_size, BLOCK_HD):
        i = start + tl.arange(0, BLOCK_HD)
        mask = i < num_heads * head_size
        h = i // head_size
        d = i % head_size
        k = tl.load(key_ptr + t * stride_kt + h * stride_kh + d, mask=mask)
        v = tl.load(value_ptr + t * stride_vt + h * stride_vh + d, mask=mask)
        kc = key_cache_ptr + block * stride_kcb + off * stride_kct + h * stride_kch + d
        vc = value_cache_ptr + block * stride_vcb + off * stride_vct + h * stride_vch + d
        tl.store(kc, k, mask=mask)
        tl.store(vc, v, mask=mask)


def launch(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """The Triton launch (arguments already checked)."""
    num_tokens, num_heads, head_size = key.shape
    if num_tokens == 0:
        return
    # One stride() tuple per tensor and a plain-Python power of two: this runs per
    # layer and step, and its host time is most of a small write's cost.
    block_hd = min(1024, _next_power_of_2(num_heads * head_size))
    ks, vs, kcs, vcs = key.stride(), value.stride(), key_cache.stride(), value_cache.stride()
    _reshape_and_cache_kernel[(num_tokens,)](
        key, value, key_cache, value_cache, slot_mapping,
        ks[0], ks[1], vs[0], vs[1],
        kcs[0], kcs[1], kcs[2],
        vcs[0], vcs[1], vcs[2],
        num_heads, head_size,
        BLOCK_SIZE=key_cache.shape[1],
        BLOCK_HD=block_hd,
    )  # fmt: skip
