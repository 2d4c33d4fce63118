"""The KV cache spec base class: what one layer needs per block of tokens.

A spec is a frozen value object. ``page_size_bytes`` is the memory one block of
one layer occupies; layers whose specs are equal can share a group (one block
table per request). Validation raises ``ValueError`` naming the field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

_DTYPE_NAMES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
    "fp8_e5m2": torch.float8_e5m2,
    "int8": torch.int8,
    "uint8": torch.uint8,
}


def to_torch_dtype(value: Any, field: str = "dtype") -> torch.dtype:
    """Normalise a ``torch.dtype`` or its name (``"bfloat16"``, ``"fp16"``...)."""
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str) and value.lower() in _DTYPE_NAMES:
        return _DTYPE_NAMES[value.lower()]
    raise ValueError(
        f"{field}={value!r} is not a known dtype; use a torch.dtype or one of "
        f"{sorted(_DTYPE_NAMES)}"
    )


def check_positive_int(value: Any, field: str) -> None:
    """Raise ``ValueError`` unless ``value`` is an int >= 1 (bools rejected)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{field} must be a positive integer, got {value!r}")


def cdiv(a: int, b: int) -> int:
    """Ceiling division for non-negative ints."""
    return -(-a // b)


@dataclass(frozen=True, slots=True)
class KVCacheSpec:
    """Base of all specs. ``block_size`` is tokens per block (page)."""

    block_size: int

    def __post_init__(self) -> None:
        check_positive_int(self.block_size, "block_size")

    @property
    def page_size_bytes(self) -> int:
        """Bytes one block of one layer occupies."""
        raise NotImplementedError

    @property
    def kind(self) -> str:
        """Short name of the attention kind (``full``, ``sliding_window``...)."""
        raise NotImplementedError

    def max_memory_usage_bytes(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        """Worst-case bytes one request needs in one layer of this kind."""
        raise NotImplementedError

    def _check_lengths(self, max_model_len: int, max_num_batched_tokens: int) -> None:
        check_positive_int(max_model_len, "max_model_len")
        check_positive_int(max_num_batched_tokens, "max_num_batched_tokens")


def prod(shape: tuple[int, ...]) -> int:
    """Number of elements of a shape."""
    return math.prod(shape)
