"""``ForwardBatch``: what one engine step hands every layer of a model.

The runner builds it once per step; models only read it. The batch is
flattened (varlen): sequence ``s`` owns tokens
``query_starts[s]:query_starts[s+1]`` of ``input_ids`` and ``positions``.

- Attention layers look up their group's ``AttentionMetadata`` and slot
  mapping by layer name (``layers.{i}``): ``batch.attention[name]`` gives an
  ``AttentionLayerInputs`` whose ``metadata`` object is shared by every layer
  of the group (built once per step and group, never per layer).
- Mamba layers read ``batch.mamba[name]``: the state slot each sequence
  starts from (``initial_state_indices``, -1 = zeros) and, per token, the slot
  that receives the state after it (``save_state_indices``, -1 = none): the
  block-boundary checkpoints and the final state (``managers/mamba.py``).
- ``logits_indices`` are the rows whose logits are needed (the last new token
  of every sequence that samples this step), in sequence order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from hybridkv.kernels import AttentionMetadata
from hybridkv.planning import AttentionCache, MambaCache


@dataclass(frozen=True)
class AttentionLayerInputs:
    """One attention layer's view of the step: shared metadata, slots, its cache."""

    metadata: AttentionMetadata
    slot_mapping: torch.Tensor  # [T] int64, -1 = do not write
    cache: AttentionCache


@dataclass(frozen=True)
class MambaLayerInputs:
    """One Mamba layer's view of the step: state slots and its cache views."""

    query_start_loc: torch.Tensor  # [S + 1] int32
    initial_state_indices: torch.Tensor  # [S] int32, -1 = start from zeros
    save_state_indices: torch.Tensor  # [T] int32, -1 = no save after this token
    cache: MambaCache


@dataclass(frozen=True)
class ForwardBatch:
    """A step's flattened batch (see the module docstring)."""

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    query_starts_cpu: tuple[int, ...]  # S + 1 host ints
    logits_indices: torch.Tensor  # [N] int64
    attention: dict[str, AttentionLayerInputs] = field(default_factory=dict)
    mamba: dict[str, MambaLayerInputs] = field(default_factory=dict)
    kernel_backend: str | None = None
    #: Per-step values layers derive from the batch and share (RoPE cos/sin).
    derived: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def num_tokens(self) -> int:
        """Tokens in the step (``T``)."""
        return int(self.input_ids.shape[0])

    @property
    def num_seqs(self) -> int:
        """Sequences in the step (``S``)."""
        return len(self.query_starts_cpu) - 1
