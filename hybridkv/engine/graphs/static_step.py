"""``StaticStep``: the tensors one captured graph reads and writes, and how a step
fills them.

A graph replays the launches of its capture over the same memory, so every input a
step changes lives in a tensor made once (``make``) and rewritten in place before
each replay (``fill``): token ids, positions, the rows whose logits are sampled, and
per attention group the ``AttentionMetadata`` device tensors (query starts, sequence
lengths, block table) and the slot mapping. The metadata's host values (lengths as
Python ints) stay those of the capture: the ``triton`` backend's launches depend on
them only through the launch plan, which suits any step of the same shape (its grid
covers every query block of ``tokens`` tokens in ``seqs`` sequences), and through
``within_reach`` (a window or chunk no sequence outgrows runs as full attention),
decided on the span class, which bounds every replayed step's longest context.
Per Mamba group: the state slot each sequence starts from and, per token, the slot
that receives the state after it (the runner's rule, ``hybridkv.managers.snapshots``), read by
the Mamba kernels from device tensors; with the query starts, they are all a Mamba
layer's launch reads (its grid is the shape's sequences).

Padding is inert: padding tokens have slot -1 (no cache write) and belong to
padding sequences with no context (decode: one token each; small steps: one each but
the last, which holds the rest), whose block-table rows are zeros or left from an
earlier step (valid block ids: their keys are read and their rows dropped), and whose
logits are not returned; Mamba padding sequences start from zeros
(``initial_state_indices`` -1) and save nothing (``save_state_indices`` -1).
The forward runs with ``ForwardBatch.graphed``: routed experts take their dense form.
The int vectors live in two ``PackedInts`` buffers (int64 and int32; every attention
group shares the query starts and sequence lengths), so a fill makes two copies
plus one per attention group's block table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import accumulate, chain
from typing import Any

import numpy as np
import torch

from hybridkv.engine.graphs.packed import HostTable, PackedInts
from hybridkv.engine.graphs.shapes import StepShape
from hybridkv.engine.pending import PendingTokens, new_token_ids, put_pending
from hybridkv.engine.scheduler import ScheduledRequest
from hybridkv.kernels import AttentionMetadata
from hybridkv.managers.snapshots import resume_entry, save_slots
from hybridkv.models.batch import (
    AttentionLayerInputs,
    ForwardBatch,
    MambaLayerInputs,
    StepValues,
)
from hybridkv.planning import AttentionCache, MambaCache
from hybridkv.specs import AttentionSpec, MambaSpec


def _capture_lengths(shape: StepShape) -> tuple[list[int], list[int]]:
    """(query lens, seq lens) the metadata is built with: they fix the launch plan (a
    decode's split-KV for ``span`` keys; else a mixed batch's tiles)."""
    if shape.decode:
        return [1] * shape.seqs, [shape.span] * shape.seqs
    first = shape.tokens - (shape.seqs - 1)
    return [first] + [1] * (shape.seqs - 1), [max(shape.span, first)] + [1] * (shape.seqs - 1)


@dataclass
class StaticMamba:
    """One Mamba group's state-slot tensors (``MambaLayerInputs``), shared by its layers."""

    group: int  # index in the KV cache config's groups
    block_size: int
    initial: torch.Tensor  # [seqs] int32, -1 = from zeros
    save: torch.Tensor  # [tokens] int32, -1 = no save


@dataclass
class StaticStep:
    """One graph's inputs (see the module docstring). The vectors are views of two
    ``PackedInts`` (int64, int32), refilled by one copy each; block tables apart."""

    shape: StepShape
    input_ids: torch.Tensor  # [tokens] int64
    pending_at: torch.Tensor  # [seqs] int64: where a token of the step in flight goes
    pending_rows: torch.Tensor  # [seqs] int64: its row in that step's sampled ids
    positions: torch.Tensor  # [tokens] int64
    logits_indices: torch.Tensor  # [seqs] int64: the sampled rows first
    query_start_loc: torch.Tensor  # [seqs + 1] int32, every group's
    query_starts_cpu: tuple[int, ...]  # the capture's
    metas: list[AttentionMetadata]  # per attention group, in group order
    slots: list[torch.Tensor]  # per attention group: [tokens] int64
    block_sizes: list[int]
    attention_groups: list[int]  # each attention group's index in the config's groups
    mambas: list[StaticMamba]
    attention: dict[str, AttentionLayerInputs]
    mamba: dict[str, MambaLayerInputs]
    ints64: PackedInts
    ints32: PackedInts
    tables: list[HostTable]  # per attention group: its block table's host mirror

    @classmethod
    def make(cls, shape: StepShape, groups: Sequence[Any], buffers: Any, max_model_len: int,
             device: torch.device) -> StaticStep:  # fmt: skip
        """Tensors for ``shape`` over the engine's KV ``buffers`` (``groups``: the
        attention and Mamba groups of its ``KVCacheConfig``)."""
        qlens, seq_lens = _capture_lengths(shape)
        starts = [0, *accumulate(qlens)]
        t, s = shape.tokens, shape.seqs
        i64, i32 = PackedInts(torch.int64), PackedInts(torch.int32)
        for name, init in (("input_ids", [0] * t), ("positions", [0] * t),
                           ("logits_indices", list(range(s))), ("pending.at", [0] * s),
                           ("pending.rows", [0] * s)):  # fmt: skip
            i64.add(name, init)
        i32.add("query_start_loc", starts)
        i32.add("seq_lens", seq_lens)
        for i, g in enumerate(groups):
            if isinstance(g.kv_cache_spec, MambaSpec):
                i32.add(f"initial.{i}", [-1] * s)
                i32.add(f"save.{i}", [-1] * t)
            else:
                i64.add(f"slots.{i}", [-1] * t)
        v = {**i64.build(device), **i32.build(device)}
        qsl = v["query_start_loc"]
        metas, slots, sizes, indices, mambas = [], [], [], [], []
        attention: dict[str, AttentionLayerInputs] = {}
        mamba: dict[str, MambaLayerInputs] = {}
        for i, g in enumerate(groups):
            spec = g.kv_cache_spec
            bs = spec.block_size
            if isinstance(spec, MambaSpec):
                m = StaticMamba(i, bs, v[f"initial.{i}"], v[f"save.{i}"])
                mambas.append(m)
                for name in g.layer_names:
                    state = buffers.layers[name]
                    assert isinstance(state, MambaCache)
                    mamba[name] = MambaLayerInputs(qsl, m.initial, m.save, state)
                continue
            assert isinstance(spec, AttentionSpec)
            width = -(-max(max_model_len, t) // bs)
            table = torch.zeros((s, width), dtype=torch.int32)
            built = AttentionMetadata.build(qlens, seq_lens, table, device)  # checks the lengths
            meta = replace(built, query_start_loc=qsl, seq_lens=v["seq_lens"])
            slot = v[f"slots.{i}"]
            metas.append(meta)
            slots.append(slot)
            sizes.append(bs)
            indices.append(i)
            for name in g.layer_names:
                cache = buffers.layers[name]
                assert isinstance(cache, AttentionCache)
                attention[name] = AttentionLayerInputs(meta, slot, cache)
        return cls(
            shape=shape,
            input_ids=v["input_ids"],
            pending_at=v["pending.at"],
            pending_rows=v["pending.rows"],
            positions=v["positions"],
            logits_indices=v["logits_indices"],
            query_start_loc=qsl,
            query_starts_cpu=tuple(starts),
            metas=metas,
            slots=slots,
            block_sizes=sizes,
            attention_groups=indices,
            mambas=mambas,
            attention=attention,
            mamba=mamba,
            ints64=i64,
            ints32=i32,
            tables=[HostTable(meta.block_table) for meta in metas],
        )

    def forward(self, model: Any, ops: Any) -> torch.Tensor:
        """The step over the static tensors: logits ``[seqs, vocab]`` of the rows
        ``logits_indices`` names (the sampling requests' first; a decode shape's are
        ``0..seqs-1``, never refilled, so its rows are taken as they are). A new
        ``StepValues`` each run: the RoPE tables are computed from the static positions
        inside the captured region, never carried over."""
        batch = ForwardBatch(
            input_ids=self.input_ids,
            positions=self.positions,
            query_starts_cpu=self.query_starts_cpu,
            logits_indices=self.logits_indices,
            ops=ops,
            attention=self.attention,
            mamba=self.mamba,
            step=StepValues(),
            graphed=True,
        )
        hidden = model(batch)
        if not self.shape.decode:  # a decode step samples every row, in order: no gather
            hidden = hidden[self.logits_indices]
        return model.compute_logits(hidden)

    def fill(self, work: Sequence[ScheduledRequest], block_ids: Sequence[Any],
             pending: PendingTokens | None = None) -> int:  # fmt: skip
        """Write ``work``'s values (``block_ids``: the manager's per-group ids of each
        request) into the static tensors; returns how many requests sample (their
        logits are the first rows of the output, in batch order). Per-token values are
        numpy arrays over the batch (no Python loop per token or per block id). Tokens
        the step in flight samples (``pending``, async scheduling) are copied into
        ``input_ids`` on the device after the upload (``hybridkv.engine.pending``)."""
        shape, i64, i32 = self.shape, self.ints64, self.ints32
        count = len(work)
        ntok = np.fromiter((s.num_tokens for s in work), np.int64, count=count)
        start = np.fromiter((s.start for s in work), np.int64, count=count)
        n = int(ntok.sum())
        owner = np.repeat(np.arange(count), ntok)  # each token's request
        first = np.cumsum(ntok) - ntok  # each request's first token
        positions = np.arange(n) - np.repeat(first - start, ntok)
        if pending is None:
            tokens = np.fromiter(
                chain.from_iterable(
                    s.request.core.all_token_ids[s.start : s.start + s.num_tokens] for s in work
                ),
                np.int64,
                count=n,
            )
            at: list[int] = []
        else:
            ids, at, rows = new_token_ids(work, pending)
            tokens = np.array(ids, np.int64)
            i64.put("pending.at", at)
            i64.put("pending.rows", rows)
        pad, pad_seqs = shape.tokens - n, shape.seqs - count
        i64.put("input_ids", tokens)
        i64.put("positions", positions)
        seq_lens = start + ntok
        sampled = count
        if shape.decode:
            i32.put("seq_lens", seq_lens, 1)
        else:
            pad_lens = [1] * (pad_seqs - 1) + [pad - (pad_seqs - 1)]
            i32.put("seq_lens", [*seq_lens.tolist(), *pad_lens])
            starts = [0, *accumulate([*ntok.tolist(), *pad_lens])]
            rows = [starts[i + 1] - 1 for i, s in enumerate(work) if s.samples]
            sampled = len(rows)
            i64.put("logits_indices", rows)
            i32.put("query_start_loc", starts)
        for g, table, bs in zip(self.attention_groups, self.tables, self.block_sizes,
                                strict=True):  # fmt: skip
            ids = table.fill([b[g] for b in block_ids])
            # Each new token's KV slot: block * bs + position % bs.
            slots = ids[owner, positions // bs].astype(np.int64) * bs + positions % bs
            i64.put(f"slots.{g}", slots, -1)
        for m in self.mambas:
            self._fill_mamba(m, work, [ids[m.group] for ids in block_ids], positions)
        i64.upload()
        i32.upload()
        if at:
            assert pending is not None
            k = len(at)
            put_pending(self.input_ids, self.pending_at[:k], self.pending_rows[:k], pending)
        return sampled

    def _fill_mamba(self, m: StaticMamba, work: Sequence[ScheduledRequest],
                    rows: list[Any], positions: Any) -> None:  # fmt: skip
        """``m``'s slots for ``work`` (``rows``: each request's block ids in its group),
        the runner's rule (``hybridkv.managers.snapshots``); padding starts from zeros and
        saves nothing."""
        initial = []
        for r, s in zip(rows, work, strict=True):
            e = resume_entry(s.start, m.block_size)
            initial.append(r[e] if e >= 0 else -1)
        self.ints32.put(f"initial.{m.group}", initial, -1)
        bs = m.block_size
        blocks = torch.tensor(
            [r[p // bs] for r, s in zip(rows, work, strict=True)
             for p in range(s.start, s.start + s.num_tokens)],
            dtype=torch.int64,
        )  # fmt: skip
        ends = torch.tensor(list(accumulate(s.num_tokens for s in work)))
        save = save_slots(torch.from_numpy(positions), blocks, ends, bs)
        self.ints32.put(f"save.{m.group}", save.tolist(), -1)
