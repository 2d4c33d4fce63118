"""Unified paged attention: one call for a varlen batch of prefill chunks and decodes.

``unified_attention(q, key_cache, value_cache, meta, opts)`` computes causal
attention of the new tokens ``q [T, Hq, D]`` over each sequence's cached and
new keys, read through the group's block table (``meta``, built once per step
and shared by every layer of the group). Per layer, ``opts`` adds a sliding
window, chunked local attention, a logit softcap, and ``sinks`` adds per-head
attention sinks. Triton on CUDA, the torch reference on CPU, or
``backend="native"`` for the C decode kernel on CPU (see ``hybridkv.kernels.backend``).
"""

from __future__ import annotations

import torch

from hybridkv.kernels.attention.metadata import (
    AttentionInputs,
    AttentionMetadata,
    AttentionOptions,
)
from hybridkv.kernels.attention.reference import run_reference
from hybridkv.kernels.attention.tiles import TritonTiles
from hybridkv.kernels.backend import Implementations, pinned, resolve_backend
from hybridkv.kernels.checks import CACHE_DTYPES, all_like, check_same_dtype, check_tensor

__all__ = [
    "AttentionMetadata",
    "AttentionOptions",
    "TritonTiles",
    "unified_attention",
    "unified_attention_native",
    "unified_attention_ref",
    "unified_attention_triton",
]


def _run_reference(
    a: AttentionInputs, num_segments: int | None, tiles: TritonTiles | None = None
) -> None:
    run_reference(a)  # no split-KV or tiles: num_segments and tiles do not apply


#: Each implementation writes ``a.out``; Triton's and C's modules load at first use.
_IMPLS = Implementations(
    triton="hybridkv.kernels.attention.launcher:launch_unified_attention",
    torch=_run_reference,
    native="hybridkv.kernels.attention.native:run_native",
)


def unified_attention(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    meta: AttentionMetadata,
    opts: AttentionOptions,
    *,
    sinks: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    backend: str | None = None,
    num_segments: int | None = None,
    tiles: TritonTiles | None = None,
) -> torch.Tensor:
    """Attention output ``[T, Hq, D]`` in ``q``'s dtype (written into ``out`` if given).

    - ``q``: ``[T, Hq, D]``, ``T == meta.num_tokens``, ``Hq`` a multiple of ``Hkv``;
    - ``key_cache``/``value_cache``: ``[num_blocks, block_size, Hkv, D]``, same
      dtype as ``q`` (fp16, bf16 or fp32), any block/token/head strides;
    - ``sinks``: ``[Hq]`` per-head sink logits (gpt-oss), or ``None``;
    - ``num_segments``: force the Triton split-KV factor (tests, tuning); the
      torch reference has no split and ignores it;
    - ``tiles``: override the Triton launcher's tile, warp and stage choices
      (``TritonTiles``, tuning runs); the other backends ignore it.
    """
    _check(q, key_cache, value_cache, meta, sinks, out)
    if num_segments is not None and num_segments < 1:
        raise ValueError(f"num_segments: must be >= 1, got {num_segments}")
    if tiles is not None and not isinstance(tiles, TritonTiles):
        raise TypeError(f"tiles: must be a TritonTiles, got {type(tiles).__name__}")
    impl = _IMPLS[resolve_backend(backend, q.device, allowed=_IMPLS.names)]
    a = AttentionInputs(
        q,
        key_cache,
        value_cache,
        out if out is not None else torch.empty_like(q),
        meta,
        opts,
        sinks,
    )
    impl(a, num_segments, tiles)
    return a.out


def _well_formed(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    meta: AttentionMetadata,
    out: torch.Tensor | None,
) -> bool:
    """The common case of ``_check``'s conditions, read once each (a decode step calls
    this per layer; the host time is the step's). True implies ``_check`` passes but
    for ``meta.check_once`` and ``sinks``; False says nothing (``_check`` decides)."""
    if not (
        type(q) is torch.Tensor
        and type(key_cache) is torch.Tensor
        and type(value_cache) is torch.Tensor
    ):
        return False
    qs, ks = q.shape, key_cache.shape
    dt, dev = q.dtype, q.device
    ok = (
        len(qs) == 3
        and len(ks) == 4
        and dt in CACHE_DTYPES
        and q.stride(2) == 1
        and ks[3] == qs[2]
        and ks[2] > 0
        and qs[1] % ks[2] == 0
        and qs[0] == meta.num_tokens
        and key_cache.stride(3) == 1
        and value_cache.shape == ks
        and value_cache.stride(3) == 1
        and all_like(dt, dev, key_cache, value_cache)
    )
    if ok and out is not None:
        ok = (
            type(out) is torch.Tensor
            and out.shape == qs
            and out.dtype == dt
            and out.device == dev
            and out.stride(2) == 1
        )
    return ok


def _check(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    meta: AttentionMetadata,
    sinks: torch.Tensor | None,
    out: torch.Tensor | None,
) -> None:
    if _well_formed(q, key_cache, value_cache, meta, out):
        meta.check_once(q.device, key_cache.shape[1])
        if sinks is not None:
            _check_sinks(sinks, q.shape[1], q.device)
        return
    check_tensor("q", q, ndim=3, dtypes=CACHE_DTYPES, unit_last_stride=True)
    t, hq, d = q.shape
    dev = q.device
    check_tensor(
        "key_cache", key_cache, shape=(None, None, None, d), device=dev, unit_last_stride=True
    )
    check_tensor(
        "value_cache", value_cache, shape=tuple(key_cache.shape), device=dev, unit_last_stride=True
    )
    check_same_dtype(("q", "key_cache", "value_cache"), (q, key_cache, value_cache))
    hkv = key_cache.shape[2]
    if hq % hkv:
        raise ValueError(f"q has {hq} heads, not a multiple of the cache's {hkv} KV heads")
    if t != meta.num_tokens:
        raise ValueError(f"q has {t} tokens but meta describes {meta.num_tokens}")
    meta.check_once(dev, key_cache.shape[1])  # once per step and device: meta is immutable
    if sinks is not None:
        _check_sinks(sinks, hq, dev)
    if out is not None:
        check_tensor(
            "out", out, shape=(t, hq, d), dtypes=(q.dtype,), device=dev, unit_last_stride=True
        )


def _check_sinks(sinks: torch.Tensor, hq: int, dev: torch.device) -> None:
    dtypes = (torch.float32, torch.float16, torch.bfloat16)
    check_tensor("sinks", sinks, shape=(hq,), device=dev, dtypes=dtypes)


unified_attention_ref = pinned(unified_attention, "torch")
unified_attention_triton = pinned(unified_attention, "triton")
unified_attention_native = pinned(unified_attention, "native")
