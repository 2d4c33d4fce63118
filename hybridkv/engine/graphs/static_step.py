"""``StaticStep``: the tensors one captured graph reads and writes, and how a step
fills them.

A graph replays the launches of its capture over the same memory, so every input a
step changes lives in a tensor made once (``make``) and rewritten in place before
each replay (``fill``): token ids, positions, the rows whose logits are sampled, and
per attention group the ``AttentionMetadata`` device tensors (query starts, sequence
lengths, block table) and the slot mapping. The metadata's host values (lengths as
Python ints) stay those of the capture: the ``triton`` backend's launches depend on
them only through the launch plan, which suits any step of the same shape (its grid
covers every query block of ``tokens`` tokens in ``seqs`` sequences).

Padding is inert: padding tokens have slot -1 (no cache write) and belong to
padding sequences (decode: one token each, length 1; prefill: one dummy sequence
holding them all, with no context), whose block-table rows are zeros or left from
an earlier step (valid block ids: their keys are read and their rows dropped).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hybridkv.engine.graphs.shapes import StepShape
from hybridkv.engine.scheduler import ScheduledRequest
from hybridkv.kernels import AttentionMetadata
from hybridkv.models.batch import AttentionLayerInputs, ForwardBatch, StepValues
from hybridkv.planning import AttentionCache


def _capture_lengths(shape: StepShape) -> tuple[list[int], list[int]]:
    """(query lens, seq lens) the metadata is built with: they fix the launch plan."""
    if shape.decode:
        return [1] * shape.seqs, [shape.span] * shape.seqs
    return [shape.tokens - 1, 1], [max(shape.span, shape.tokens - 1), 1]


@dataclass
class StaticStep:
    """One graph's inputs (see the module docstring)."""

    shape: StepShape
    input_ids: torch.Tensor  # [tokens] int64
    positions: torch.Tensor  # [tokens] int64
    logits_indices: torch.Tensor  # [seqs that sample] int64
    metas: list[AttentionMetadata]  # per attention group, in group order
    slots: list[torch.Tensor]  # per attention group: [tokens] int64
    block_sizes: list[int]
    attention: dict[str, AttentionLayerInputs]

    @classmethod
    def make(cls, shape: StepShape, groups: Sequence[Any], buffers: Any, max_model_len: int,
             device: torch.device) -> StaticStep:  # fmt: skip
        """Tensors for ``shape`` over the engine's KV ``buffers`` (``groups``: the
        attention groups of its ``KVCacheConfig``)."""
        qlens, seq_lens = _capture_lengths(shape)
        metas, slots, sizes = [], [], []
        attention: dict[str, AttentionLayerInputs] = {}
        for g in groups:
            bs = g.kv_cache_spec.block_size
            width = -(-max(max_model_len, shape.tokens) // bs)
            table = torch.zeros((shape.seqs, width), dtype=torch.int32)
            meta = AttentionMetadata.build(qlens, seq_lens, table, device)
            slot = torch.full((shape.tokens,), -1, dtype=torch.int64, device=device)
            metas.append(meta)
            slots.append(slot)
            sizes.append(bs)
            for name in g.layer_names:
                cache = buffers.layers[name]
                assert isinstance(cache, AttentionCache)
                attention[name] = AttentionLayerInputs(meta, slot, cache)
        sampled = shape.seqs if shape.decode else 1
        return cls(
            shape=shape,
            input_ids=torch.zeros(shape.tokens, dtype=torch.int64, device=device),
            positions=torch.zeros(shape.tokens, dtype=torch.int64, device=device),
            logits_indices=torch.arange(sampled, dtype=torch.int64, device=device),
            metas=metas,
            slots=slots,
            block_sizes=sizes,
            attention=attention,
        )

    def forward(self, model: Any, ops: Any) -> torch.Tensor:
        """The step over the static tensors: logits ``[seqs that sample, vocab]``. A new
        ``StepValues`` each run: the RoPE tables are computed from the static positions
        inside the captured region, never carried over."""
        batch = ForwardBatch(
            input_ids=self.input_ids,
            positions=self.positions,
            query_starts_cpu=self.metas[0].query_starts_cpu,
            logits_indices=self.logits_indices,
            ops=ops,
            attention=self.attention,
            mamba={},
            step=StepValues(),
        )
        return model.compute_logits(model(batch)[self.logits_indices])

    def fill(self, work: Sequence[ScheduledRequest], block_ids: Sequence[Any]) -> None:
        """Write ``work``'s values (``block_ids``: the manager's per-group ids of each
        request) into the static tensors."""
        shape = self.shape
        positions: list[int] = []
        tokens: list[int] = []
        for s in work:
            positions.extend(range(s.start, s.start + s.num_tokens))
            tokens.extend(s.request.core.all_token_ids[s.start : s.start + s.num_tokens])
        n = len(tokens)
        pad = shape.tokens - n
        self.input_ids.copy_(torch.tensor(tokens + [0] * pad, dtype=torch.int64))
        self.positions.copy_(torch.tensor(positions + [0] * pad, dtype=torch.int64))
        if shape.decode:
            seq_lens = [s.start + 1 for s in work] + [1] * (shape.seqs - len(work))
        else:
            seq_lens = [work[0].start + n, pad]
            self.logits_indices.fill_(n - 1)
        for g, (meta, slot, bs) in enumerate(
            zip(self.metas, self.slots, self.block_sizes, strict=True)
        ):
            rows = [ids[g] for ids in block_ids]
            width = max(len(r) for r in rows)
            table = torch.tensor(
                [r + [0] * (width - len(r)) for r in rows]
                + [[0] * width] * (shape.seqs - len(rows)),
                dtype=torch.int32,
            )
            meta.block_table[:, :width].copy_(table)
            meta.seq_lens.copy_(torch.tensor(seq_lens, dtype=torch.int32))
            if not shape.decode:
                meta.query_start_loc.copy_(torch.tensor([0, n, shape.tokens], dtype=torch.int32))
            slot_ids: list[int] = []
            for r, s in zip(rows, work, strict=True):
                slot_ids.extend(
                    r[p // bs] * bs + p % bs for p in range(s.start, s.start + s.num_tokens)
                )
            slot.copy_(torch.tensor(slot_ids + [-1] * pad, dtype=torch.int64))
