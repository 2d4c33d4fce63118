"""``ForwardBatch``: what one engine step hands every layer of a model.

The runner (``hybridkv.engine.runner``) builds it once per step; models only
read it. It lives with the models, which consume it, so that imports run one
way: engine -> models -> kernels. The batch is
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
- ``ops`` is the engine's ``KernelBackend``: every kernel a layer runs
  (``batch.ops.attention(...)``, ``batch.ops.add_rms_norm(...)``...).
- ``step`` holds the per-step values several layers share (``StepValues``).
- ``graphed``: the step runs from a CUDA graph (``hybridkv.engine.graphs``, or the
  CPU tests' stand-in): no layer may read a device value back to the host, so
  routed experts take their dense form (``layers/moe.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from hybridkv.kernels import AttentionMetadata, KernelBackend
from hybridkv.planning import AttentionCache, MambaCache

#: A RoPE table's identity: (form, head size, its rope parameters, extra cos_sin args).
RopeKey = tuple[object, ...]


@dataclass(slots=True)
class StepValues:
    """Values several layers derive from one step's batch and share.

    The runner makes a new, empty one for each step (so nothing outlives the
    step); the first layer that needs a value computes it and the others read
    it. ``rope``: cos/sin ``[T, 1, D]`` per RoPE form and parameters
    (``RopeFrequencies.for_step``).
    """

    rope: dict[RopeKey, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


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
    ops: KernelBackend
    attention: dict[str, AttentionLayerInputs] = field(default_factory=dict)
    mamba: dict[str, MambaLayerInputs] = field(default_factory=dict)
    step: StepValues = field(default_factory=StepValues, compare=False, repr=False)
    graphed: bool = False

    @property
    def num_tokens(self) -> int:
        """Tokens in the step (``T``)."""
        return int(self.input_ids.shape[0])

    @property
    def num_seqs(self) -> int:
        """Sequences in the step (``S``)."""
        return len(self.query_starts_cpu) - 1
