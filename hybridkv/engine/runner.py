"""``ModelRunner``: turns a scheduled step into a ``ForwardBatch``, runs it, samples.

Per step and KV cache group it builds the block table once (from the
manager's per-group block ids, ``StepBlockIds``: read again where they changed)
and derives what every layer of the group reads: for attention groups one
``AttentionMetadata`` and a slot mapping (``block_ids[p // bs] * bs + p % bs``
for each new token position ``p``); for Mamba groups the state slot each sequence starts from (entry
``(start - 1) // bs``, -1 for a fresh sequence) and, per token, the slot
receiving the state after it (the entry of every block boundary crossed and
of the last token; -1 where that entry is the null block, i.e. not kept):
``hybridkv.managers.snapshots`` owns that rule. Each step also gets the engine's kernel
backend (``batch.ops``) and a fresh ``StepValues`` for the values its layers
share. A step scheduled while the one before it is in flight (async scheduling) takes
the inputs that step samples from the device (``hybridkv.engine.pending``).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate, chain
from typing import TYPE_CHECKING

import numpy as np
import torch

from hybridkv.cache_manager.kv_cache_manager import KVCacheManager
from hybridkv.engine.block_ids import StepBlockIds
from hybridkv.engine.pending import PendingTokens, new_token_ids, put_pending
from hybridkv.engine.scheduler import ScheduledRequest
from hybridkv.kernels import AttentionMetadata, KernelBackend
from hybridkv.managers.snapshots import resume_entry, save_slots
from hybridkv.models.base import CausalLM
from hybridkv.models.batch import (
    AttentionLayerInputs,
    ForwardBatch,
    MambaLayerInputs,
    StepValues,
)
from hybridkv.planning import AttentionCache, KVCacheBuffers, MambaCache
from hybridkv.specs import AttentionSpec, KVCacheConfig, MambaSpec

if TYPE_CHECKING:
    from hybridkv.engine.graphs import StepGraphs


def _table(rows: list[list[int]]) -> np.ndarray:
    """The rows as one int64 table, each padded with block 0 (the null block) to the
    longest; written with numpy from the rows' ids in order (a step builds this per
    group: a nested list made into a tensor took four times as long)."""
    lens = np.fromiter(map(len, rows), np.int64, count=len(rows))
    table = np.zeros((len(rows), max(1, int(lens.max()))), np.int64)
    kept = np.arange(table.shape[1]) < lens[:, None]  # row-major: the rows' ids in order
    table[kept] = np.fromiter(chain.from_iterable(rows), np.int64, count=int(lens.sum()))
    return table


class ModelRunner:
    """Runs a model over the planned KV buffers (see the module docstring)."""

    def __init__(
        self,
        model: CausalLM,
        config: KVCacheConfig,
        buffers: KVCacheBuffers,
        manager: KVCacheManager,
        device: torch.device,
        ops: KernelBackend,
    ) -> None:
        self.model = model
        self.config = config
        self.buffers = buffers
        self.manager = manager
        self.device = device
        self.ops = ops
        #: Each step's block ids per request and group (read again where they changed).
        self.step_ids = StepBlockIds()
        #: Steps replayed from CUDA graphs (``LLM(cuda_graphs=True)``), or None.
        self.graphs: StepGraphs | None = None

    def block_ids(self, work: Sequence[ScheduledRequest]) -> list[tuple[list[int], ...]]:
        """``work``'s block ids per group, from ``self.manager`` (``StepBlockIds``)."""
        return self.step_ids(self.manager, work)

    def build_batch(
        self, work: Sequence[ScheduledRequest], pending: PendingTokens | None = None
    ) -> ForwardBatch:
        """The step's ``ForwardBatch`` (block tables built once per group); ``pending``:
        the step in flight's sampled ids, the inputs of tokens not yet known here."""
        qlens = [s.num_tokens for s in work]
        starts = [s.start for s in work]
        seq_lens = [a + n for a, n in zip(starts, qlens, strict=True)]
        qstarts = [0, *accumulate(qlens)]
        tokens, at, rows = new_token_ids(work, pending)
        # Per token (numpy: a few calls, not a torch op per vector): its sequence, position.
        lens = np.array(qlens, np.int64)
        seq_of = np.repeat(np.arange(len(work)), lens)
        pos = np.arange(qstarts[-1]) - np.repeat(np.array(qstarts[:-1]) - np.array(starts), lens)
        positions = torch.from_numpy(pos)
        sampling = [i for i, s in enumerate(work) if s.samples]
        dev = self.device
        batch_attn: dict[str, AttentionLayerInputs] = {}
        batch_mamba: dict[str, MambaLayerInputs] = {}
        ids = self.block_ids(work)
        qsl = torch.tensor(qstarts, dtype=torch.int32, device=dev)
        for g, group in enumerate(self.config.kv_cache_groups):
            spec = group.kv_cache_spec
            bs = spec.block_size
            table = _table([row[g] for row in ids])
            slots = table[seq_of, pos // bs]
            if isinstance(spec, AttentionSpec):
                block_table = torch.from_numpy(table.astype(np.int32))
                meta = AttentionMetadata.build(qlens, seq_lens, block_table, dev)
                slot_mapping = torch.from_numpy(slots * bs + pos % bs).to(dev)
                for name in group.layer_names:
                    cache = self.buffers.layers[name]
                    assert isinstance(cache, AttentionCache)
                    batch_attn[name] = AttentionLayerInputs(meta, slot_mapping, cache)
            elif isinstance(spec, MambaSpec):
                entries = [resume_entry(s0, bs) for s0 in starts]
                init = [row[g][e] if e >= 0 else -1 for row, e in zip(ids, entries, strict=True)]
                ends = torch.tensor(qstarts[1:])
                save = save_slots(positions, torch.from_numpy(slots), ends, bs).to(dev)
                init_t = torch.tensor(init, dtype=torch.int32, device=dev)
                for name in group.layer_names:
                    cache = self.buffers.layers[name]
                    assert isinstance(cache, MambaCache)
                    batch_mamba[name] = MambaLayerInputs(qsl, init_t, save, cache)
            else:
                raise ValueError(f"group {g}: no runner support for spec {type(spec).__name__}")
        input_ids = torch.tensor(tokens, dtype=torch.int64, device=dev)
        if at:
            assert pending is not None
            put = [torch.tensor(v, dtype=torch.int64, device=dev) for v in (at, rows)]
            put_pending(input_ids, put[0], put[1], pending)
        return ForwardBatch(
            input_ids=input_ids,
            positions=positions.to(dev),
            query_starts_cpu=tuple(qstarts),
            logits_indices=torch.tensor(
                [qstarts[i + 1] - 1 for i in sampling], dtype=torch.int64, device=dev
            ),
            ops=self.ops,
            attention=batch_attn,
            mamba=batch_mamba,
            step=StepValues(),
        )

    @torch.inference_mode()
    def execute(
        self, work: Sequence[ScheduledRequest], pending: PendingTokens | None = None
    ) -> torch.Tensor:
        """Logits ``[N, vocab]`` (model dtype) of the sequences that sample, in batch order
        (``pending``: as for ``build_batch``)."""
        if self.graphs is not None:
            logits = self.graphs.run(work, pending)
            if logits is not None:
                return logits
        batch = self.build_batch(work, pending)
        hidden = self.model(batch)
        return self.model.compute_logits(hidden[batch.logits_indices])
