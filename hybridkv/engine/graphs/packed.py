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

With async scheduling the next step is filled while this one is in flight, so its copy
may not have read the mirror yet: on CUDA each upload records an event (``CopyFence``)
and the next write to the mirror waits for it (the copy runs first on the stream, right
after the step before it; on the CPU the copy is done when ``upload`` returns).
``HostTable`` is the same for one attention group's block table: rows written with
numpy, one copy per step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch


class CopyFence:
    """Makes a write to a pinned host mirror wait for the last copy from it (one CUDA
    event, recorded after each copy, waited for once); a no-op when copies are
    synchronous (``pinned`` False: the CPU)."""

    def __init__(self, pinned: bool) -> None:
        self.event = torch.cuda.Event() if pinned else None
        self.armed = False

    def record(self) -> None:
        if self.event is not None:
            self.event.record()
            self.armed = True

    def wait(self) -> None:
        if self.armed:
            assert self.event is not None
            self.event.synchronize()
            self.armed = False


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
        self.copied = CopyFence(False)  # made again by ``build``

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
        self.copied = CopyFence(self.pinned)
        self.upload()
        return {n: self.device[o : o + k] for n, (o, k) in self.spans.items()}

    def put(self, name: str, values: Sequence[int] | np.ndarray, fill: int = 0) -> None:
        """Write ``values`` (a list or a numpy array) at the start of ``name`` in the host
        mirror, ``fill`` after them."""
        self.copied.wait()  # the last upload may still be reading the mirror
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
        self.copied.record()


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
        self.copied = CopyFence(self.pinned)

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
        self.copied.wait()  # the last copy may still be reading the mirror
        table = self.mirror[: seqs * width].reshape(seqs, width)
        table[:] = shadow[:, :width]
        host = self.host[: seqs * width].view(seqs, width)
        self.device[:, :width].copy_(host, non_blocking=self.pinned)
        self.copied.record()
        return table
