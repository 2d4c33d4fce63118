"""``qk_norm_rope_cache``: Gemma's q/k per-head norm + RoPE and the k/v cache write, one op.

The contract, for ``q [T, Hq, D]``, ``k``/``v`` ``[T, Hkv, D]`` (strided views of one
projection output are fine: only the head dimension needs stride 1) and ``norm`` a
``QKNormRope``::

    q_out = norm_rope(q, norm.q_scale, norm.cos, norm.sin, norm.eps)   # returned, new
    reshape_and_cache(norm_rope(k, norm.k_scale, norm.cos, norm.sin, norm.eps), v,
                      key_cache, value_cache, slot_mapping)            # the caches, in place

``composed`` is that sequence on a backend's own ops (the ``torch`` and ``native``
backends); the ``triton`` backend runs it as one kernel (``qk_norm_rope_cache_triton.py``),
bit-identical to the sequence. ``check`` validates once, for both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from hybridkv.kernels.cache_write import check_write
from hybridkv.kernels.checks import check_tensor


@dataclass(frozen=True, slots=True)
class QKNormRope:
    """How q and k are normed and rotated: fp32 scales ``1 + weight`` ``[D]`` of q's and
    k's norms, ``cos``/``sin`` ``[T, 1, D]`` or ``[T, D]`` in q's dtype (rotate_half
    layout), the norms' ``eps``."""

    q_scale: torch.Tensor
    k_scale: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    eps: float


def check(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    norm: QKNormRope,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """``ValueError`` naming the first argument that breaks the contract (module docstring)."""
    check_write(k, v, key_cache, value_cache, slot_mapping)
    t, _, d = k.shape
    check_tensor("q", q, shape=(t, None, d), dtypes=(k.dtype,), device=k.device,
                 unit_last_stride=True)  # fmt: skip
    if d % 2:
        raise ValueError(f"q, k: head size {d} must be even (RoPE rotates halves)")
    for name, s in (("q_scale", norm.q_scale), ("k_scale", norm.k_scale)):
        check_tensor(name, s, shape=(d,), dtypes=(torch.float32,), device=k.device,
                     contiguous=True)  # fmt: skip
    for name, c in (("cos", norm.cos), ("sin", norm.sin)):
        if c.shape not in ((t, 1, d), (t, d)):
            want = f"({t}, 1, {d}) or ({t}, {d})"
            raise ValueError(f"{name}: shape {tuple(c.shape)}, expected {want}")
        check_tensor(name, c, dtypes=(k.dtype,), device=k.device, unit_last_stride=True)


def composed(
    ops: Any,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    norm: QKNormRope,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> torch.Tensor:
    """The op as ``ops.norm_rope`` twice and ``ops.cache_write`` (the contract itself;
    ``ops``: the calling ``KernelBackend``, of which this is the method)."""
    check(q, k, v, norm, key_cache, value_cache, slot_mapping)
    q_out = ops.norm_rope(q, norm.q_scale, norm.cos, norm.sin, norm.eps)
    k = ops.norm_rope(k, norm.k_scale, norm.cos, norm.sin, norm.eps)
    ops.cache_write(k, v, key_cache, value_cache, slot_mapping)
    return q_out
