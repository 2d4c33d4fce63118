"""Mamba (state-space) spec: one fixed-size recurrent state per block.

``shapes`` holds the per-layer state tensors (Mamba1 and Mamba2 both have a
conv state and an SSM state), ``dtypes`` one dtype per shape. A block holds one
whole state: the running state of a request, or with prefix caching the
checkpoint of the state at the end of that block's tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridkv.specs.base import KVCacheSpec, cdiv, check_positive_int, prod
from hybridkv.specs.dtypes import DTYPE_BYTES, dtype_name

MAMBA_TYPES = ("mamba1", "mamba2")


@dataclass(frozen=True, slots=True)
class MambaSpec(KVCacheSpec):
    """State shapes of one Mamba layer; ``page_size_padded`` pads the page."""

    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]  # canonical names after validation; torch.dtypes accepted
    page_size_padded: int | None = None
    mamba_type: str = "mamba2"

    def __post_init__(self) -> None:
        KVCacheSpec.__post_init__(self)
        try:
            shapes = tuple(tuple(int(d) for d in s) for s in self.shapes)
        except TypeError as e:
            raise ValueError(f"shapes must be a sequence of shapes, got {self.shapes!r}") from e
        if not shapes:
            raise ValueError("shapes must hold at least one state shape")
        for s in shapes:
            if not s or any(d < 1 for d in s):
                raise ValueError(f"shapes: every dimension must be >= 1, got {s}")
        if isinstance(self.dtypes, str) or not hasattr(self.dtypes, "__iter__"):
            raise ValueError("dtypes must be a sequence with one dtype per shape")
        dtypes = tuple(dtype_name(d, "dtypes") for d in self.dtypes)
        if len(dtypes) != len(shapes):
            raise ValueError(
                f"dtypes has {len(dtypes)} entries but shapes has {len(shapes)}; "
                "give one dtype per state shape"
            )
        if self.mamba_type not in MAMBA_TYPES:
            raise ValueError(f"mamba_type must be one of {MAMBA_TYPES}, got {self.mamba_type!r}")
        object.__setattr__(self, "shapes", shapes)
        object.__setattr__(self, "dtypes", dtypes)
        if self.page_size_padded is not None:
            check_positive_int(self.page_size_padded, "page_size_padded")
            if self.page_size_padded < self.state_size_bytes:
                raise ValueError(
                    f"page_size_padded={self.page_size_padded} is smaller than the "
                    f"state itself ({self.state_size_bytes} bytes)"
                )

    @property
    def kind(self) -> str:
        return "mamba"

    @property
    def state_size_bytes(self) -> int:
        """Bytes of the state tensors themselves (no padding)."""
        return sum(prod(s) * DTYPE_BYTES[d] for s, d in zip(self.shapes, self.dtypes, strict=True))

    @property
    def page_size_bytes(self) -> int:
        if self.page_size_padded is not None:
            return self.page_size_padded
        return self.state_size_bytes

    def max_memory_usage_bytes(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        # With prefix caching a step that computes K tokens writes a checkpoint at
        # every block boundary it crosses, plus the running state it started from.
        self._check_lengths(max_model_len, max_num_batched_tokens)
        step = min(max_num_batched_tokens, max_model_len)
        return (cdiv(step, self.block_size) + 1) * self.page_size_bytes
