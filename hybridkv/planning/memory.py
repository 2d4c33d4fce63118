"""Shared-buffer memory: raw KV buffers and per-layer views into them.

``allocate_kv_cache(config, device)`` allocates one raw ``uint8`` buffer per
``KVCacheTensor`` and gives every layer strided views into its buffer:

- attention: ``key`` and ``value``, each ``[num_blocks, block_size,
  num_kv_heads, head_size]``; in a block's slot, a layer's page is its K half
  then its V half;
- Mamba: ``conv`` ``[num_blocks, *conv_shape]`` and ``ssm``
  ``[num_blocks, *ssm_shape]``; the SSM state follows the conv state (its
  offset rounded up to its element size).

Every view's block stride is the tensor's slot size (``size // num_blocks``),
so block ``b`` of a layer lives in bytes ``[b * slot + offset, ... + page)``
of its buffer, where ``offset`` is the sum of the pages of the layers of the
same group listed before it in ``shared_by`` (layers of different groups all
start at 0: they never hold the same block id). ``layer_byte_range`` gives
that range; tests use it to prove that views never overlap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hybridkv.common.extras import require
from hybridkv.specs import AttentionSpec, KVCacheConfig, KVCacheSpec, MambaSpec
from hybridkv.specs.base import prod
from hybridkv.specs.dtypes import to_torch_dtype

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class AttentionCache:
    """K and V views of one attention layer: ``[num_blocks, bs, heads, dim]``."""

    key: torch.Tensor
    value: torch.Tensor


@dataclass(frozen=True)
class MambaCache:
    """Conv-state and SSM-state views of one Mamba layer: ``[num_blocks, ...]``."""

    conv: torch.Tensor
    ssm: torch.Tensor


LayerCache = AttentionCache | MambaCache


@dataclass(frozen=True)
class KVCacheBuffers:
    """The raw buffers (one per ``KVCacheTensor``) and every layer's views."""

    buffers: list[torch.Tensor]
    layers: dict[str, LayerCache]


@dataclass(frozen=True)
class _Placement:
    tensor: int
    offset: int
    slot: int
    spec: KVCacheSpec


def _placements(config: KVCacheConfig) -> dict[str, _Placement]:
    spec_of = {n: g.kv_cache_spec for g in config.kv_cache_groups for n in g.layer_names}
    group_of = {n: gi for gi, g in enumerate(config.kv_cache_groups) for n in g.layer_names}
    out: dict[str, _Placement] = {}
    for ti, t in enumerate(config.kv_cache_tensors):
        slot = config.tensor_slot_bytes(t)
        offsets: dict[int, int] = {}
        for name in t.shared_by:
            gi = group_of[name]
            off = offsets.get(gi, 0)
            out[name] = _Placement(ti, off, slot, spec_of[name])
            offsets[gi] = off + spec_of[name].page_size_bytes
    return out


def layer_byte_range(config: KVCacheConfig, layer: str, block_id: int) -> tuple[int, int, int]:
    """``(tensor index, start, end)``: the bytes block ``block_id`` of ``layer`` owns."""
    p = _placements(config)[layer]
    start = block_id * p.slot + p.offset
    return p.tensor, start, start + p.spec.page_size_bytes


def _view(
    buf: torch.Tensor,
    dtype: torch.dtype,
    num_blocks: int,
    slot: int,
    offset: int,
    shape: tuple[int, ...],
) -> torch.Tensor:
    elem = dtype.itemsize
    if slot % elem or offset % elem:
        raise ValueError(
            f"a {dtype} view needs {elem}-byte alignment, but the slot is {slot} bytes "
            f"and the offset {offset}"
        )
    typed = buf.view(dtype)
    inner = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        inner[i] = inner[i + 1] * shape[i + 1]
    return typed.as_strided((num_blocks, *shape), (slot // elem, *inner), offset // elem)


def _attention_views(
    buf: torch.Tensor, spec: AttentionSpec, n: int, p: _Placement, dtype: torch.dtype | None
) -> AttentionCache:
    dt = to_torch_dtype(spec.dtype) if dtype is None else dtype
    if dt.itemsize != spec.dtype_bytes:
        raise ValueError(f"dtype {dt} does not have the element size of the spec's {spec.dtype}")
    shape = (spec.block_size, spec.num_kv_heads, spec.head_size)
    half = spec.page_size_bytes // 2
    return AttentionCache(
        key=_view(buf, dt, n, p.slot, p.offset, shape),
        value=_view(buf, dt, n, p.slot, p.offset + half, shape),
    )


def _mamba_views(buf: torch.Tensor, spec: MambaSpec, n: int, p: _Placement) -> MambaCache:
    if len(spec.shapes) != 2:
        raise ValueError(
            f"Mamba views need (conv, ssm) state shapes, got {len(spec.shapes)} shapes"
        )
    (conv_shape, ssm_shape), (conv_name, ssm_name) = spec.shapes, spec.dtypes
    conv_dt, ssm_dt = to_torch_dtype(conv_name), to_torch_dtype(ssm_name)
    conv_bytes = prod(conv_shape) * conv_dt.itemsize
    ssm_elem = ssm_dt.itemsize
    ssm_off = -(-conv_bytes // ssm_elem) * ssm_elem
    if ssm_off + prod(ssm_shape) * ssm_elem > spec.page_size_bytes:
        raise ValueError(
            f"the SSM state at offset {ssm_off} (aligned to {ssm_elem} bytes) overruns the "
            f"{spec.page_size_bytes}-byte Mamba page; pad the page (page_size_padded)"
        )
    return MambaCache(
        conv=_view(buf, conv_dt, n, p.slot, p.offset, conv_shape),
        ssm=_view(buf, ssm_dt, n, p.slot, p.offset + ssm_off, ssm_shape),
    )


def allocate_kv_cache(
    kv_cache_config: KVCacheConfig,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
) -> KVCacheBuffers:
    """Allocate the config's buffers (zeroed) and build every layer's views.

    ``dtype`` overrides the attention views' dtype (same element size only,
    e.g. viewing an fp8 cache as ``uint8``); ``None`` uses each spec's dtype.
    This is where the planner meets torch: it is imported here, not at module
    import (``hybridkv.planning`` itself runs without torch).
    """
    torch = require("torch", "engine", "allocate_kv_cache")
    if not kv_cache_config.kv_cache_tensors:
        raise ValueError("the KVCacheConfig describes no tensors (kv_cache_tensors is empty)")
    n = kv_cache_config.num_blocks
    buffers = [
        torch.zeros(t.size, dtype=torch.uint8, device=device)
        for t in kv_cache_config.kv_cache_tensors
    ]
    layers: dict[str, LayerCache] = {}
    for name, p in _placements(kv_cache_config).items():
        buf = buffers[p.tensor]
        if isinstance(p.spec, AttentionSpec):
            layers[name] = _attention_views(buf, p.spec, n, p, dtype)
        elif isinstance(p.spec, MambaSpec):
            layers[name] = _mamba_views(buf, p.spec, n, p)
        else:
            raise ValueError(f"layer {name!r}: no view for spec {p.spec!r}")
    return KVCacheBuffers(buffers, layers)
