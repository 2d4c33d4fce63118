"""Attention specs: full, sliding-window and chunked-local attention.

A block of an attention layer stores K and V for ``block_size`` tokens:
``page_size_bytes = 2 * block_size * num_kv_heads * head_size * dtype_bytes``.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridkv.specs.base import KVCacheSpec, cdiv, check_positive_int
from hybridkv.specs.dtypes import DTYPE_BYTES, dtype_name


@dataclass(frozen=True, slots=True)
class AttentionSpec(KVCacheSpec):
    """Common shape of attention layers (K and V per token)."""

    num_kv_heads: int
    head_size: int
    dtype: str  # a canonical name after validation (``dtypes.py``); torch.dtype accepted

    def __post_init__(self) -> None:
        KVCacheSpec.__post_init__(self)
        check_positive_int(self.num_kv_heads, "num_kv_heads")
        check_positive_int(self.head_size, "head_size")
        object.__setattr__(self, "dtype", dtype_name(self.dtype))

    @property
    def dtype_bytes(self) -> int:
        """Bytes of one cache element."""
        return DTYPE_BYTES[self.dtype]

    @property
    def page_size_bytes(self) -> int:
        return 2 * self.block_size * self.num_kv_heads * self.head_size * self.dtype_bytes


@dataclass(frozen=True, slots=True)
class FullAttentionSpec(AttentionSpec):
    """Every token attends to every earlier token: all blocks are kept."""

    @property
    def kind(self) -> str:
        return "full"

    def max_memory_usage_bytes(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        self._check_lengths(max_model_len, max_num_batched_tokens)
        return cdiv(max_model_len, self.block_size) * self.page_size_bytes


@dataclass(frozen=True, slots=True)
class SlidingWindowSpec(AttentionSpec):
    """Query position q sees key k when ``q - sliding_window < k <= q``."""

    sliding_window: int

    def __post_init__(self) -> None:
        AttentionSpec.__post_init__(self)
        check_positive_int(self.sliding_window, "sliding_window")

    @property
    def kind(self) -> str:
        return "sliding_window"

    def max_memory_usage_bytes(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        # A step sees the W-1 tokens before it plus the tokens it computes, and
        # the first of those may sit anywhere inside a block (+1 block).
        self._check_lengths(max_model_len, max_num_batched_tokens)
        tokens = min(self.sliding_window - 1 + max_num_batched_tokens, max_model_len)
        blocks = min(cdiv(tokens, self.block_size) + 1, cdiv(max_model_len, self.block_size))
        return blocks * self.page_size_bytes


@dataclass(frozen=True, slots=True)
class ChunkedLocalAttentionSpec(AttentionSpec):
    """Positions p and q see each other only when ``p // C == q // C``."""

    attention_chunk_size: int

    def __post_init__(self) -> None:
        AttentionSpec.__post_init__(self)
        check_positive_int(self.attention_chunk_size, "attention_chunk_size")

    @property
    def kind(self) -> str:
        return "chunked_local"

    def max_memory_usage_bytes(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        self._check_lengths(max_model_len, max_num_batched_tokens)
        tokens = min(self.attention_chunk_size + max_num_batched_tokens, max_model_len)
        blocks = min(cdiv(tokens, self.block_size) + 1, cdiv(max_model_len, self.block_size))
        return blocks * self.page_size_bytes
