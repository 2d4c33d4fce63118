"""The contract every model family implements (``CausalLM``).

A model is built from its Hugging Face text config (``from_config``), gets its
weights from the strict loader (``hybridkv.models.loader``) and runs one
engine step at a time:

- ``forward(batch) -> hidden [T, hidden_size]`` (default: ``self.model(batch)``)
  over the flattened varlen batch (``ForwardBatch``); attention layers are named
  ``layers.{i}`` like the planner's layer names, so the runner's per-group
  metadata reaches them;
- ``compute_logits(hidden [N, hidden_size]) -> [N, vocab]`` in the model's dtype
  (no fp32 copy of a 262k vocabulary per step: the sampler compares bf16
  values exactly and upcasts only the rows it draws from; default:
  ``self.lm_head``; ``tie_weights`` shares it with ``model.embed_tokens`` when the
  config ties them);
- ``checkpoint_tensors(name, tensor)``: where a checkpoint tensor goes, as
  ``(parameter_name, tensor)`` pairs (several for fused or stacked weights), or
  ``IGNORED`` for a tensor the family deliberately does not use (for example
  the vision tower of a multimodal checkpoint). The default keeps the name and
  ignores a tied ``lm_head.weight``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from hybridkv.models.batch import ForwardBatch

IGNORED: list[tuple[str, torch.Tensor]] = []


class CausalLM(nn.Module):
    """Base class of the model families (see the module docstring)."""

    #: ``model_type`` values of the text configs this family reads.
    model_types: ClassVar[tuple[str, ...]] = ()
    #: True when ``forward`` reads nothing back from the device (no ``.item()``,
    #: ``nonzero`` or data-dependent shapes), so a step can be captured in a
    #: CUDA graph (``hybridkv.engine.graphs``).
    supports_cuda_graphs: ClassVar[bool] = False

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config

    # Families build ``self.model`` (a decoder stack with ``embed_tokens``) and
    # ``self.lm_head``; the defaults below rely on those two names.
    model: nn.Module
    lm_head: nn.Linear

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        return self.model(batch)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def tie_weights(self) -> None:
        """Re-share tied parameters (building on ``meta`` and materialising unties them)."""
        if getattr(self.config, "tie_word_embeddings", False):
            embed = self.model.get_submodule("embed_tokens")
            assert isinstance(embed, nn.Embedding)
            self.lm_head.weight = embed.weight

    def checkpoint_tensors(self, name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        """Parameter names (and tensors) for checkpoint tensor ``name``: the name itself,
        except ``lm_head.weight`` of a config that ties it to the embeddings (which the
        checkpoint also holds), ignored."""
        if name == "lm_head.weight" and getattr(self.config, "tie_word_embeddings", False):
            return IGNORED
        return [(name, tensor)]
