"""Layer kinds of a model layout: what one layer stores in the KV cache.

A layout names, per layer, one of these frozen pydantic models (the YAML and
CLI boundary). ``to_spec(block_size, dtype, ssm_dtype)`` turns a kind into the
core's ``KVCacheSpec`` (``None`` for layers without a cache).

Mamba state shapes (one request, tensor parallel size 1):

- Mamba1: conv ``(d_conv - 1, d_inner)``, SSM ``(d_inner, d_state)``.
- Mamba2: conv ``(d_conv - 1, n_heads * head_dim + 2 * n_groups * d_state)``,
  SSM ``(n_heads, head_dim, d_state)``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from hybridkv.specs import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
)

PositiveInt = Annotated[int, Field(gt=0, strict=True)]


class _Kind(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def to_spec(self, block_size: int, dtype: str, ssm_dtype: str) -> KVCacheSpec | None:
        """The core spec of one layer of this kind (``None``: no cache)."""
        raise NotImplementedError

    @property
    def is_attention(self) -> bool:
        return False

    @property
    def is_mamba(self) -> bool:
        return False


class _Attention(_Kind):
    num_kv_heads: PositiveInt
    head_dim: PositiveInt

    @property
    def is_attention(self) -> bool:
        return True


class FullAttentionLayer(_Attention):
    """Attends to every earlier token (also Llama 4's NoPE layers)."""

    kind: Literal["full"] = "full"

    def to_spec(self, block_size: int, dtype: str, ssm_dtype: str) -> KVCacheSpec:
        return FullAttentionSpec(block_size, self.num_kv_heads, self.head_dim, dtype)


class SlidingWindowLayer(_Attention):
    """Attends to the last ``sliding_window`` tokens (itself included)."""

    kind: Literal["sliding_window"] = "sliding_window"
    sliding_window: PositiveInt

    def to_spec(self, block_size: int, dtype: str, ssm_dtype: str) -> KVCacheSpec:
        return SlidingWindowSpec(
            block_size, self.num_kv_heads, self.head_dim, dtype, self.sliding_window
        )


class ChunkedLocalLayer(_Attention):
    """Attends within its chunk of ``attention_chunk_size`` tokens (Llama 4)."""

    kind: Literal["chunked_local"] = "chunked_local"
    attention_chunk_size: PositiveInt

    def to_spec(self, block_size: int, dtype: str, ssm_dtype: str) -> KVCacheSpec:
        return ChunkedLocalAttentionSpec(
            block_size, self.num_kv_heads, self.head_dim, dtype, self.attention_chunk_size
        )


class _Mamba(_Kind):
    d_state: PositiveInt
    d_conv: PositiveInt = 4

    @property
    def is_mamba(self) -> bool:
        return True

    def state_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(conv state shape, SSM state shape) of one request."""
        raise NotImplementedError


class Mamba1Layer(_Mamba):
    """A Mamba1 (selective scan) layer: Jamba."""

    kind: Literal["mamba1"] = "mamba1"
    d_inner: PositiveInt

    def state_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return (max(self.d_conv - 1, 1), self.d_inner), (self.d_inner, self.d_state)

    def to_spec(self, block_size: int, dtype: str, ssm_dtype: str) -> KVCacheSpec:
        return MambaSpec(block_size, self.state_shapes(), (dtype, ssm_dtype), mamba_type="mamba1")


class Mamba2Layer(_Mamba):
    """A Mamba2 (SSD) layer: Bamba, GraniteMoeHybrid, Falcon-H1."""

    kind: Literal["mamba2"] = "mamba2"
    n_heads: PositiveInt
    head_dim: PositiveInt
    n_groups: PositiveInt = 1

    def state_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        conv_dim = self.n_heads * self.head_dim + 2 * self.n_groups * self.d_state
        return (max(self.d_conv - 1, 1), conv_dim), (self.n_heads, self.head_dim, self.d_state)

    def to_spec(self, block_size: int, dtype: str, ssm_dtype: str) -> KVCacheSpec:
        return MambaSpec(block_size, self.state_shapes(), (dtype, ssm_dtype), mamba_type="mamba2")


class NoCacheLayer(_Kind):
    """A layer without its own cache: MLP-only, or reusing another layer's KV."""

    kind: Literal["none"] = "none"

    def to_spec(self, block_size: int, dtype: str, ssm_dtype: str) -> KVCacheSpec | None:
        return None


LayerKind = Annotated[
    FullAttentionLayer
    | SlidingWindowLayer
    | ChunkedLocalLayer
    | Mamba1Layer
    | Mamba2Layer
    | NoCacheLayer,
    Field(discriminator="kind"),
]

KIND_NAMES = ("full", "sliding_window", "chunked_local", "mamba1", "mamba2", "none")
