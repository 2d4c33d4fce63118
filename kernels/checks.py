"""Argument checks shared by the launchers and references.

Every public op validates its inputs before choosing a backend, so a bad
call fails the same way on every backend, with a ``ValueError`` naming the
argument, what it got and what it needs. Kernels may then assume what is
checked here (shapes, dtypes, devices, a unit stride in the last dimension).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

CACHE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)


def check_tensor(
    name: str,
    t: torch.Tensor,
    *,
    ndim: int | None = None,
    shape: Sequence[int | None] | None = None,
    dtypes: Sequence[torch.dtype] | None = None,
    device: torch.device | None = None,
    unit_last_stride: bool = False,
    contiguous: bool = False,
) -> None:
    """Raise ``ValueError`` unless ``t`` matches; ``None`` in ``shape`` is a wildcard."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if shape is not None:
        ndim = len(shape)
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(t.shape)}")
    if shape is not None:
        for i, (got, want) in enumerate(zip(t.shape, shape, strict=True)):
            if want is not None and got != want:
                raise ValueError(
                    f"{name}: dimension {i} is {got}, expected {want} "
                    f"(shape {tuple(t.shape)}, expected {_fmt(shape)})"
                )
    if dtypes is not None and t.dtype not in dtypes:
        raise ValueError(f"{name}: dtype {t.dtype} is not one of {tuple(dtypes)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: on {t.device}, expected {device} like the other inputs")
    if unit_last_stride and t.dim() > 0 and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name}: the last dimension must have stride 1, got {t.stride()}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name}: must be contiguous (strides {t.stride()})")


def all_like(dtype: torch.dtype, device: torch.device, *tensors: torch.Tensor) -> bool:
    """True when every tensor has ``dtype`` and lives on ``device`` (the ops' fast paths)."""
    return all(t.dtype == dtype and t.device == device for t in tensors)


def check_same_dtype(names: Sequence[str], tensors: Sequence[torch.Tensor]) -> None:
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) > 1:
        got = ", ".join(f"{n}={t.dtype}" for n, t in zip(names, tensors, strict=True))
        raise ValueError(f"{', '.join(names)} must share one dtype, got {got}")


def _fmt(shape: Sequence[int | None]) -> str:
    return "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
