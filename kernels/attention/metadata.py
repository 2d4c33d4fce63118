"""Attention metadata: built once per step for a KV cache group, read by every layer.

A step's batch is flattened (varlen): sequence ``s`` owns query tokens
``query_start_loc[s]:query_start_loc[s+1]`` of ``q``, and has
``seq_lens[s]`` tokens in total (its cached context plus these new ones), so
its new tokens sit at positions ``seq_lens[s] - query_len .. seq_lens[s] - 1``.
``block_table[s, i]`` is the physical block holding positions
``i * block_size .. (i + 1) * block_size - 1``; entries outside the keys a
layer can see (before a sliding window, before the current chunk) may be the
null block 0.

Prefill chunks (query_len > 1, with or without a cached prefix) and decodes
(query_len == 1) mix freely. Host copies of the lengths ride along so that
the launcher and the torch reference never read device memory back.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import accumulate
from typing import Any

import torch

from hybridkv.kernels.checks import INDEX_DTYPES, check_tensor


@dataclass(frozen=True)
class AttentionOptions:
    """Per-layer attention settings (one frozen object, not a parameter list).

    - ``scale``: multiplies q·k before the softmax;
    - ``sliding_window``: ``W``; key ``k`` is visible from query ``q`` when
      ``q - W < k <= q`` (Hugging Face semantics), ``None`` for no window;
    - ``chunk_size``: ``C``; visible when ``k // C == q // C`` and ``k <= q``;
    - ``softcap``: ``c``; logits become ``c * tanh(s / c)`` (Gemma 2 style).
    """

    scale: float
    sliding_window: int | None = None
    chunk_size: int | None = None
    softcap: float | None = None

    def __post_init__(self) -> None:
        if not self.scale > 0:
            raise ValueError(f"scale: must be > 0, got {self.scale}")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window: must be >= 1 or None, got {self.sliding_window}")
        if self.chunk_size is not None and self.chunk_size < 1:
            raise ValueError(f"chunk_size: must be >= 1 or None, got {self.chunk_size}")
        if self.sliding_window is not None and self.chunk_size is not None:
            raise ValueError("sliding_window and chunk_size are exclusive: a layer has one kind")
        if self.softcap is not None and not self.softcap > 0:
            raise ValueError(f"softcap: must be > 0 or None, got {self.softcap}")

    def first_visible_key(self, query_pos: int) -> int:
        """The lowest key position query ``query_pos`` can see."""
        if self.sliding_window is not None:
            return max(0, query_pos - self.sliding_window + 1)
        if self.chunk_size is not None:
            return query_pos // self.chunk_size * self.chunk_size
        return 0


#: A gather plan's identity: (block size, sliding window, chunk size) of the layers using it.
PlanKey = tuple[int, int | None, int | None]
#: ``(blocks, offsets, mask, q_rows, q_valid)`` of the padded prefill batch (``reference.py``).
PrefillPlan = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
#: ``(blocks, offsets, valid, starts)`` of the padded decode batch (``reference.py``).
DecodePlan = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
#: ``(tables int32 [n, B], q_rows int64 [n], seq_lens int64 [n])`` of the decodes (``native.py``).
NativeDecodePlan = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


@dataclass(slots=True)
class AttentionPlans:
    """The index plans the attention kernels derive from one step's tables.

    Every layer of a KV cache group shares its ``AttentionMetadata``, so the
    first layer that needs a plan builds it and the others reuse it: a plan is
    built at most once per step and ``PlanKey``. The runner makes new metadata
    (with empty plans) every step. ``prefill[key]`` is None where padding the
    step's chunks to one shape would cost too much (one call per chunk);
    ``native_decode`` is None without decodes, and valid once
    ``native_decode_built``.

    The Triton launcher keeps here too: ``launches``, its launch choices per
    layer geometry (``launcher.py``), ``checked``, the ``(device, block_size)``
    pairs ``AttentionMetadata.check_once`` passed, and ``workspace``, the
    newest fp32 buffer per device for the split-KV partials (``partials``).
    Every layer of the step reuses its plan's partials: a layer's partials are
    read by its merge launch before the next layer's kernel writes them, as long
    as the layers that share this metadata run on one CUDA stream in order (the
    engine's case; not for layers launched on concurrent streams).
    """

    prefill: dict[PlanKey, PrefillPlan | None] = field(default_factory=dict)
    decode: dict[PlanKey, DecodePlan] = field(default_factory=dict)
    native_decode: NativeDecodePlan | None = None
    native_decode_built: bool = False
    launches: dict[Any, Any] = field(default_factory=dict)
    checked: set[tuple[torch.device, int]] = field(default_factory=set)
    workspace: dict[torch.device, torch.Tensor] = field(default_factory=dict)

    def clear(self) -> None:
        """Forget every plan (tests that change a planning constant mid-step)."""
        self.prefill.clear()
        self.decode.clear()
        self.native_decode, self.native_decode_built = None, False
        self.launches.clear()
        self.checked.clear()
        self.workspace.clear()

    def partials(self, numel: int, device: torch.device) -> torch.Tensor:
        """A flat fp32 buffer of at least ``numel`` elements on ``device``, allocated at
        the step's first split-KV launch (or a larger one) and reused after (see above)."""
        buf = self.workspace.get(device)
        if buf is None or buf.numel() < numel:
            buf = self.workspace[device] = torch.empty(numel, dtype=torch.float32, device=device)
        return buf


@dataclass(frozen=True)
class AttentionMetadata:
    """One step's varlen batch for one KV cache group (see the module docstring).

    ``derived`` holds the index plans the kernels derive from the tables
    (``AttentionPlans``), so the layers of a group that share this object
    compute each once per step.

    Device tensors: ``query_start_loc`` ``[S + 1]``, ``seq_lens`` ``[S]``,
    ``block_table`` ``[S, max_blocks]`` (int32 or int64). Host copies
    (Python ints): ``query_lens_cpu``, ``seq_lens_cpu`` and
    ``query_starts_cpu`` (``query_start_loc``'s values). The lengths' maxima
    are computed once per object (``cached_property``): the metadata is
    immutable and read by every layer.
    """

    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    query_lens_cpu: tuple[int, ...]
    seq_lens_cpu: tuple[int, ...]
    query_starts_cpu: tuple[int, ...]
    #: Per-step index plans of the kernels, shared by the group's layers.
    derived: AttentionPlans = field(
        default_factory=AttentionPlans, compare=False, repr=False, hash=False
    )

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def num_tokens(self) -> int:
        return self.query_starts_cpu[-1]

    @cached_property
    def max_query_len(self) -> int:
        return max(self.query_lens_cpu, default=0)

    @cached_property
    def min_query_len(self) -> int:
        return min(self.query_lens_cpu, default=0)

    @cached_property
    def max_seq_len(self) -> int:
        return max(self.seq_lens_cpu, default=0)

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1

    @classmethod
    def build(
        cls,
        query_lens: Sequence[int],
        seq_lens: Sequence[int],
        block_table: torch.Tensor,
        device: torch.device | str | None = None,
    ) -> AttentionMetadata:
        """Validate the lengths and put the tensors on ``device`` (default: the table's)."""
        q = tuple(map(int, query_lens))
        s = tuple(map(int, seq_lens))
        if len(q) != len(s):
            raise ValueError(f"query_lens has {len(q)} entries but seq_lens has {len(s)}")
        # One pass in C for the common case (a step builds this per KV cache group);
        # the loop below finds and words the first bad entry.
        if q and (min(q) < 1 or not all(map(operator.ge, s, q))):
            for i, (ql, sl) in enumerate(zip(q, s, strict=True)):
                if ql < 1:
                    raise ValueError(f"query_lens[{i}] = {ql}: every sequence needs >= 1 new token")
                if sl < ql:
                    raise ValueError(f"seq_lens[{i}] = {sl} is shorter than query_lens[{i}] = {ql}")
        check_tensor("block_table", block_table, ndim=2, dtypes=INDEX_DTYPES)
        if block_table.shape[0] != len(s):
            raise ValueError(f"block_table has {block_table.shape[0]} rows for {len(s)} sequences")
        dev = torch.device(device) if device is not None else block_table.device
        starts = (0, *accumulate(q))
        return cls(
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(s, dtype=torch.int32, device=dev),
            block_table=block_table.to(dev),
            query_lens_cpu=q,
            seq_lens_cpu=s,
            query_starts_cpu=starts,
        )

    def check_once(self, device: torch.device, block_size: int) -> None:
        """``check(block_size)`` and that the three tensors are on ``device``; a pair
        that passed once is not checked again (the object is immutable)."""
        if (device, block_size) in self.derived.checked:
            return
        for name in ("query_start_loc", "seq_lens", "block_table"):
            check_tensor(f"meta.{name}", getattr(self, name), device=device)
        self.check(block_size)
        self.derived.checked.add((device, block_size))

    def check(self, block_size: int) -> None:
        """Raise ``ValueError`` if a sequence needs more blocks than its table row holds."""
        need = -(-self.max_seq_len // block_size)
        if need > self.block_table.shape[1]:
            raise ValueError(
                f"block_table has {self.block_table.shape[1]} columns but a sequence of "
                f"{self.max_seq_len} tokens needs {need} blocks of {block_size}"
            )


@dataclass(frozen=True, slots=True)
class AttentionInputs:
    """One checked ``unified_attention`` call, as the launcher and the reference take it."""

    q: torch.Tensor  # [T, Hq, D]
    key_cache: torch.Tensor  # [num_blocks, block_size, Hkv, D]
    value_cache: torch.Tensor
    out: torch.Tensor  # [T, Hq, D], written
    meta: AttentionMetadata
    opts: AttentionOptions
    sinks: torch.Tensor | None  # [Hq]
