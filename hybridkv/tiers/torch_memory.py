"""``TorchHostMemory``: a ``HostTier`` of tensors (the engine extra: imports torch).

A stored entry is one uint8 host tensor holding the parts' bytes back to
back (each part contiguous; its bytes viewed as uint8, so any dtype).

- On CUDA (``device`` a CUDA device): host buffers are pinned
  (``pin_memory=True``, PyTorch's caching host allocator) and every copy runs
  on one copy stream, ordered after the work already queued on the current
  stream (``wait_stream``), with ``non_blocking=True``; a transfer's
  completion is a CUDA event recorded after its copies. A consumer stream must
  wait on ``transfer.completion.event`` before reading a load's destination
  (or call ``transfer.wait()``, which synchronizes the event). The source
  tensors of a store are kept alive until its event has passed.
- On the CPU: plain host buffers, copies on the tier's copy thread (a memcpy
  with the GIL released between host tensors; ``Tensor.copy_`` for a part on
  another device).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hybridkv.tiers.copier import Copier, InlineCopier, ThreadCopier
from hybridkv.tiers.transfer import Completion


class EventCompletion:
    """Copies queued on a CUDA stream, done when ``event`` has passed."""

    __slots__ = ("event", "keep", "result")
    threaded = False

    def __init__(self, event: torch.cuda.Event, result: Any, keep: Any) -> None:
        self.event = event
        self.result = result
        self.keep = keep  # tensors that must outlive the copies

    def done(self) -> bool:
        if self.event.query():
            self.keep = None
            return True
        return False

    def wait(self, timeout: float | None) -> None:
        self.event.synchronize()  # no timeout on a CUDA event: the copy is bounded
        self.keep = None

    def outcome(self) -> tuple[Any, BaseException | None]:
        return self.result, None


def _copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Host-side copy of uint8 views: a memcpy with the GIL released (ctypes) when
    both are in host memory (``Tensor.copy_`` costs several us per call and
    starts OpenMP threads that the copy thread then competes with)."""
    if dst.device.type == "cpu" and src.device.type == "cpu":
        if dst.numel():
            ctypes.memmove(dst.data_ptr(), src.data_ptr(), dst.numel())
    else:
        dst.copy_(src)


def _flat_bytes(t: torch.Tensor, name: str) -> torch.Tensor:
    if type(t) is torch.Tensor and t.dtype is torch.uint8 and t.dim() == 1 and t.is_contiguous():
        return t  # already flat bytes (the engine's unit parts)
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (call .contiguous() on it first)")
    return t.reshape(-1).view(torch.uint8)


class TorchHostMemory:
    """Tensors in host buffers; pinned memory and a copy stream on CUDA (module docstring)."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        if self.cuda:
            self.stream = torch.cuda.Stream(self.device)

    def make_copier(self) -> Copier:
        # On CUDA nothing runs on the copier: the copy stream does the copies.
        return InlineCopier() if self.cuda else ThreadCopier("hybridkv-host-copy")

    def nbytes(self, parts: Sequence[Any]) -> tuple[int, ...]:
        return tuple(_flat_bytes(p, f"part {i}").numel() for i, p in enumerate(parts))

    def footprint(self, sizes: tuple[int, ...]) -> int:
        return sum(sizes)

    def allocate(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.cuda)

    def _on_stream(
        self, pairs: list[tuple[torch.Tensor, torch.Tensor]], result: Any, keep: Any
    ) -> Completion:
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            for dst, src in pairs:
                dst.copy_(src, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.stream)
        return EventCompletion(event, result, keep)

    def begin_store(self, buf: torch.Tensor, parts: Sequence[Any], copier: Copier) -> Completion:
        pairs, off = [], 0
        for i, part in enumerate(parts):
            src = _flat_bytes(part, f"part {i}")
            pairs.append((buf[off : off + src.numel()], src))
            off += src.numel()
        if self.cuda:
            return self._on_stream(pairs, None, list(parts))

        def copy_in() -> None:
            for dst, src in pairs:
                _copy(dst, src)

        return copier.submit(copy_in)

    def begin_load(
        self, buf: torch.Tensor, sizes: tuple[int, ...], into: Sequence[Any] | None, copier: Copier
    ) -> Completion:
        offs = [sum(sizes[:i]) for i in range(len(sizes))]
        if into is None:
            views = [buf[o : o + n] for o, n in zip(offs, sizes, strict=True)]
            return copier.submit(lambda: tuple(v.clone() for v in views))
        targets = [_flat_bytes(t, f"into[{i}]") for i, t in enumerate(into)]
        got = tuple(t.numel() for t in targets)
        if got != sizes:
            raise ValueError(f"into has parts of {got} bytes; the entry's are {sizes}")
        pairs = [(t, buf[o : o + n]) for t, o, n in zip(targets, offs, sizes, strict=True)]
        if self.cuda:
            return self._on_stream(pairs, tuple(into), None)

        def copy_out() -> tuple[Any, ...]:
            for dst, src in pairs:
                _copy(dst, src)
            return tuple(into or ())

        return copier.submit(copy_out)

    def plan_load_many(
        self, entries: Sequence[tuple[Any, tuple[int, ...]]], into: Sequence[Sequence[Any]]
    ) -> Callable[[Copier], Completion]:
        """Every entry's parts into ``into``: on CUDA one stream switch, the copies
        queued back to back and one event after them (not one of each per entry:
        about 47 us of host work an entry on an H100 host); on the CPU one job."""
        pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        for k, ((buf, sizes), targets) in enumerate(zip(entries, into, strict=True)):
            flat = [_flat_bytes(t, f"into[{k}][{j}]") for j, t in enumerate(targets)]
            got = tuple(t.numel() for t in flat)
            if got != sizes:
                raise ValueError(f"into[{k}] has parts of {got} bytes; the entry's are {sizes}")
            off = 0
            for t, n in zip(flat, sizes, strict=True):
                pairs.append((t, buf[off : off + n]))
                off += n
        if self.cuda:
            return lambda _copier: self._on_stream(pairs, None, None)

        def copy_out() -> None:
            for dst, src in pairs:
                _copy(dst, src)

        return lambda copier: copier.submit(copy_out)

    def plan_store_many(
        self, bufs: Sequence[Any], parts: Sequence[Sequence[Any]], sizes: Sequence[tuple[int, ...]]
    ) -> Callable[[Copier], Completion]:
        """Every entry's parts into its buffer: on CUDA one stream switch, the
        device-to-pinned copies queued back to back and one event after them (the
        sources kept alive until it has passed); on the CPU one job."""
        pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        for k, (buf, ps, ns) in enumerate(zip(bufs, parts, sizes, strict=True)):
            off = 0
            for j, (p, n) in enumerate(zip(ps, ns, strict=True)):
                pairs.append((buf[off : off + n], _flat_bytes(p, f"parts[{k}][{j}]")))
                off += n
        if self.cuda:
            keep = [p for ps in parts for p in ps]
            return lambda _copier: self._on_stream(pairs, None, keep)

        def copy_in() -> None:
            for dst, src in pairs:
                _copy(dst, src)

        return lambda copier: copier.submit(copy_in)
