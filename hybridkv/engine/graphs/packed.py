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
copy has always finished reading it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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

    def put(self, name: str, values: Sequence[int], fill: int = 0) -> None:
        """Write ``values`` at the start of ``name`` in the host mirror, ``fill`` after them."""
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
