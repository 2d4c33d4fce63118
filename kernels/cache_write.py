"""``reshape_and_cache``: write new K/V tokens into a layer's paged views.

``key``/``value`` ``[T, Hkv, D]`` go to ``key_cache``/``value_cache``
``[num_blocks, block_size, Hkv, D]`` at ``slot_mapping[T]``, where
``slot = block_id * block_size + offset_in_block`` and ``-1`` skips the
token (padding, or a token whose block is not kept: sliding windows).
The cache views may be strided (several layers share one block slot in the
shared buffer); only the head dimension must have stride 1. K/V and the
caches share one dtype (no quantised caches yet).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hybridkv.kernels.backend import pinned, resolve_backend
from hybridkv.kernels.checks import CACHE_DTYPES, INDEX_DTYPES, check_same_dtype, check_tensor


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


def _check(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    check_tensor("key", key, ndim=3, dtypes=CACHE_DTYPES, unit_last_stride=True)
    t, h, d = key.shape
    dev = key.device
    check_tensor("value", value, shape=(t, h, d), device=dev, unit_last_stride=True)
    check_tensor("key_cache", key_cache, shape=(None, None, h, d), device=dev,
                 unit_last_stride=True)  # fmt: skip
    check_tensor("value_cache", value_cache, shape=tuple(key_cache.shape), device=dev,
                 unit_last_stride=True)  # fmt: skip
    check_same_dtype(("key", "value", "key_cache", "value_cache"),
                     (key, value, key_cache, value_cache))  # fmt: skip
    check_tensor("slot_mapping", slot_mapping, shape=(t,), dtypes=INDEX_DTYPES, device=dev)


def _launch(
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
    block_hd = min(1024, triton.next_power_of_2(num_heads * head_size))
    _reshape_and_cache_kernel[(num_tokens,)](
        key, value, key_cache, value_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        num_heads, head_size,
        BLOCK_SIZE=key_cache.shape[1],
        BLOCK_HD=block_hd,
    )  # fmt: skip


def _write_torch(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """The torch reference: one masked index_put per cache."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    block_size = key_cache.shape[1]
    blocks, offsets = slots // block_size, slots % block_size
    key_cache[blocks, offsets] = key[keep]
    value_cache[blocks, offsets] = value[keep]


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    backend: str | None = None,
) -> None:
    """Write ``key``/``value`` ``[T, Hkv, D]`` into the paged caches at ``slot_mapping``.

    Slots must be distinct among the kept tokens (two tokens writing one slot
    is a caller bug and leaves either value). Nothing but the addressed
    ``[Hkv, D]`` rows of the caches changes.
    """
    _check(key, value, key_cache, value_cache, slot_mapping)
    impl = resolve_backend(backend, key.device, allowed=("triton", "torch", "native"))
    if impl == "native":
        from hybridkv.kernels.cpu import cache_write as fn
    else:
        fn = _launch if impl == "triton" else _write_torch
    fn(key, value, key_cache, value_cache, slot_mapping)


reshape_and_cache_ref = pinned(reshape_and_cache, "torch")
reshape_and_cache_native = pinned(reshape_and_cache, "native")
reshape_and_cache_triton = pinned(reshape_and_cache, "triton")
