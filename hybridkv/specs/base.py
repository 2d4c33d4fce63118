"""The KV cache spec base class: what one layer needs per block of tokens.

A spec is a frozen value object. ``page_size_bytes`` is the memory one block of
one layer occupies; layers whose specs are equal can share a group (one block
table per request). Validation raises ``ValueError`` naming the field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


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
