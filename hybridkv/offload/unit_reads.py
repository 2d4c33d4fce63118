"""``UnitReads``: device blocks' units read into host memory, a batch at a time.

A unit that leaves the device as a host copy rather than through the host
tier's own buffers (the disk tier, when the host has no room for a demoted
unit; the shared store's write-through) is read here, a batch at once:

- on the CPU each part is a numpy view of the KV buffers (copied when the
  caller must own it: a demoted block is about to be rewritten);
- on CUDA the batch goes through one pinned staging buffer: the copy stream
  waits for the work already queued on the current stream, every part is
  copied into its slice with ``non_blocking=True``, one event is recorded
  after them and waited for once. Not a synchronous ``.cpu()`` per part (a
  stream sync and a copy into pageable memory each). The parts returned are
  numpy views of the staging buffer, which they keep alive::

    staging (pinned)  [ u0 p0 | u0 p1 | u1 p0 | u1 p1 | ... ]   one event after
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from hybridkv.offload.block_bytes import BlockBytes


def stage(
    parts: Sequence[Sequence[torch.Tensor]], staging: torch.Tensor, stream: Any = None
) -> list[list[torch.Tensor]]:
    """Copy every unit's flat uint8 ``parts`` into consecutive slices of ``staging``
    (a uint8 tensor of at least their bytes); per unit, its parts' slices. With
    ``stream`` (CUDA) the copies are queued on it, ``non_blocking``: the caller
    records an event after them and waits for it before reading."""
    out: list[list[torch.Tensor]] = []
    off = 0
    for ps in parts:
        views = []
        for p in ps:
            n = p.numel()
            view = staging[off : off + n]
            view.copy_(p, non_blocking=stream is not None)
            views.append(view)
            off += n
        out.append(views)
    return out


class UnitReads:
    """Units of device blocks read into host memory, per batch (module docstring)."""

    def __init__(self, block_bytes: BlockBytes) -> None:
        self.block_bytes = block_bytes
        self._stream: Any = None  # the copy stream (CUDA), made at the first read
        #: Batches read through pinned staging (CUDA), and their events.
        self.staged_batches = 0

    def read(self, units: Sequence[tuple[int, int]], own: bool = False) -> list[list[np.ndarray]]:
        """Each ``(group, block id)`` unit's parts as host numpy arrays, in order.
        ``own``: arrays the caller owns (never views of the KV buffers; on CUDA
        they always are the staging buffer's)."""
        parts = [self.block_bytes.parts(g, b) for g, b in units]
        if not parts:
            return []
        device = parts[0][0].device
        if device.type == "cpu":
            return [[p.numpy().copy() if own else p.numpy() for p in ps] for ps in parts]
        total = sum(p.numel() for ps in parts for p in ps)
        staging = torch.empty(total, dtype=torch.uint8, pin_memory=True)
        if self._stream is None:
            self._stream = torch.cuda.Stream(device)
        self._stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(self._stream):
            views = stage(parts, staging, self._stream)
            event = torch.cuda.Event()
            event.record(self._stream)
        event.synchronize()
        self.staged_batches += 1
        return [[v.numpy() for v in vs] for vs in views]
