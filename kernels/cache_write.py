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

from hybridkv.kernels.backend import Implementations, pinned, resolve_backend
from hybridkv.kernels.checks import (
    CACHE_DTYPES,
    INDEX_DTYPES,
    all_like,
    check_same_dtype,
    check_tensor,
)


def _well_formed(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> bool:
    """The common case of ``check_write``'s conditions, read once each (a step calls this per
    layer). True implies ``check_write`` passes; False says nothing (``check_write`` decides)."""
    if not all(type(x) is torch.Tensor for x in (key, value, key_cache, value_cache)):
        return False
    if type(slot_mapping) is not torch.Tensor:
        return False
    ks, cs = key.shape, key_cache.shape
    dt, dev = key.dtype, key.device
    return (
        len(ks) == 3
        and len(cs) == 4
        and dt in CACHE_DTYPES
        and key.stride(2) == 1
        and value.shape == ks
        and value.stride(2) == 1
        and cs[2] == ks[1]
        and cs[3] == ks[2]
        and key_cache.stride(3) == 1
        and value_cache.shape == cs
        and value_cache.stride(3) == 1
        and all_like(dt, dev, value, key_cache, value_cache)
        and slot_mapping.shape == ks[:1]
        and slot_mapping.dtype in INDEX_DTYPES
        and slot_mapping.device == dev
    )


def check_write(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """``ValueError`` naming the first argument of ``reshape_and_cache`` that is wrong."""
    if _well_formed(key, value, key_cache, value_cache, slot_mapping):
        return
    check_tensor("key", key, ndim=3, dtypes=CACHE_DTYPES, unit_last_stride=True)
    t, h, d = key.shape
    dev = key.device
    check_tensor("value", value, shape=(t, h, d), device=dev, unit_last_stride=True)
    check_tensor(
        "key_cache", key_cache, shape=(None, None, h, d), device=dev, unit_last_stride=True
    )
    check_tensor(
        "value_cache", value_cache, shape=tuple(key_cache.shape), device=dev, unit_last_stride=True
    )
    check_same_dtype(
        ("key", "value", "key_cache", "value_cache"), (key, value, key_cache, value_cache)
    )
    check_tensor("slot_mapping", slot_mapping, shape=(t,), dtypes=INDEX_DTYPES, device=dev)


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


#: Triton's and C's modules load at first use.
_IMPLS = Implementations(
    triton="hybridkv.kernels.cache_write_triton:launch",
    torch=_write_torch,
    native="hybridkv.kernels.cpu.ops:cache_write",
)


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
    check_write(key, value, key_cache, value_cache, slot_mapping)
    impl = _IMPLS[resolve_backend(backend, key.device, allowed=_IMPLS.names)]
    impl(key, value, key_cache, value_cache, slot_mapping)


reshape_and_cache_ref = pinned(reshape_and_cache, "torch")
reshape_and_cache_native = pinned(reshape_and_cache, "native")
reshape_and_cache_triton = pinned(reshape_and_cache, "triton")
