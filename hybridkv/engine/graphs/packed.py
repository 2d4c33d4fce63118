"""``PackedInts``: the integer tensors a graphed step rewrites, in one device buffer.

Each replay's inputs (token ids, positions, slot mappings, query starts, sequence
lengths, Mamba state slots) used to be copied to the device one tensor at a time:
7-14 host-to-device copies a decode step. Packed by dtype, they are two (plus one
per attention group's block table, copied as far as the step's longest row;
``benchmarks/results/graph-host-ops.md`` counts them): the step writes its values
into a host mirror (numpy assignment, no tensor made) and ``upload`` copies the
mirror in one go, from pinned memory on CUDA (asynchronous, ordered on the stream
before the replay). Every named tensor is a view of the device buffer, so graphs
and metadata keep reading the same memory.

The mirror is rewritten by the next step only after this step's logits were read
back (the engine samples each step before scheduling the next), so an asynchronous
copy has always finished reading it. ``HostTable`` is the same for one attention
group's block table: rows written with numpy, one copy per step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch


class PackedInts:
    """Named int vectors of one dtype (``add`` them, ``build`` once; ``put``, ``upload``)."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self.spans: dict[str, tuple[int, int]] = {}
        self.initial: list[int] = []
        self.host: torch.Tensor | None = None
        self.mirror: Any = None  # the host buffer as a numpy array
        self.device: torch.Tensor | None = None
        self.pinned = False

    def add(self, name: str, values: Sequence[int]) -> None:
        """Reserve ``name``, of ``len(values)`` entries, holding ``values`` until ``put``."""
        if name in self.spans or self.device is not None:
            raise ValueError(f"{name!r}: added twice, or after build()")
        self.spans[name] = (len(self.initial), len(values))
        self.initial.extend(values)

    def build(self, device: torch.device) -> dict[str, torch.Tensor]:
        """Allocate the buffers (the host mirror pinned on CUDA), upload the initial
        values; returns each name's device view."""
        self.pinned = device.type == "cuda"
        host = torch.tensor(self.initial, dtype=self.dtype)
        self.host = host.pin_memory() if self.pinned else host
        self.mirror = self.host.numpy()
        self.device = torch.empty_like(self.host, device=device)
        self.upload()
        return {n: self.device[o : o + k] for n, (o, k) in self.spans.items()}

    def put(self, name: str, values: Sequence[int] | np.ndarray, fill: int = 0) -> None:
        """Write ``values`` (a list or a numpy array) at the start of ``name`` in the host
        mirror, ``fill`` after them."""
        offset, size = self.spans[name]
        n = len(values)
        if n > size:
            raise ValueError(f"{name!r}: {n} values for {size} entries")
        self.mirror[offset : offset + n] = values
        self.mirror[offset + n : offset + size] = fill

    def upload(self) -> None:
        """Copy the host mirror to the device buffer (one copy)."""
        assert self.device is not None and self.host is not None, "build() first"
        self.device.copy_(self.host, non_blocking=self.pinned)


class HostTable:
    """A block table's host mirror: a step's rows written with numpy and copied to the
    device table as far as its widest row (the rest of the device table is left as it
    was: no launch reads past a sequence's blocks). Pinned on CUDA, like ``PackedInts``.

    Rows are kept from step to step in ``shadow`` (every row at the table's full width):
    a row equal to the one written there last step (a list comparison, no numpy work) is
    not written again; a decode step changes the few rows that gained or dropped a block.
    ``written[i]`` is a copy of what row ``i`` holds (None: zeros).
    """

    def __init__(self, device_table: torch.Tensor) -> None:
        self.device = device_table  # [seqs, width] int32
        rows, width = device_table.shape
        self.pinned = device_table.device.type == "cuda"
        host = torch.zeros(rows * width, dtype=device_table.dtype)
        self.host = host.pin_memory() if self.pinned else host
        self.mirror = self.host.numpy()
        self.shadow = np.zeros((rows, width), self.mirror.dtype)
        self.written: list[list[int] | None] = [None] * rows
        self.used = 0  # rows [used:] of the shadow are zero

    def fill(self, rows: Sequence[Sequence[int]]) -> Any:
        """Write ``rows`` (one per sequence of the step, the rest of the table's rows
        zero) and copy them to the device; returns the written ``[seqs, widest]`` mirror
        (numpy), zero-padded."""
        seqs = self.device.shape[0]
        shadow, written = self.shadow, self.written
        for i, row in enumerate(rows):
            if row != written[i]:
                old, k = written[i], len(row)
                shadow[i, :k] = row
                if old is not None and len(old) > k:
                    shadow[i, k : len(old)] = 0
                written[i] = list(row)
        n = len(rows)
        if self.used > n:
            shadow[n : self.used] = 0
            written[n : self.used] = [None] * (self.used - n)
        self.used = n
        width = max(map(len, rows)) if rows else 1
        table = self.mirror[: seqs * width].reshape(seqs, width)
        table[:] = shadow[:, :width]
        host = self.host[: seqs * width].view(seqs, width)
        self.device[:, :width].copy_(host, non_blocking=self.pinned)
        return table
