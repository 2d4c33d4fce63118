"""Run the Triton test cases compiled on a GPU, unchanged: CPU tensors in, the kernel on CUDA.

Without CUDA, ``tests/conftest.py`` turns on Triton's interpreter and every
``backend="triton"`` case runs on CPU tensors. On a GPU machine (CUDA present,
``TRITON_INTERPRET`` not ``1``) the same cases would be refused: compiled
Triton needs CUDA tensors, and the tests build theirs on the CPU. ``install``
makes them run compiled on the GPU instead (issue 16: "the whole interpreter
suite run on CUDA tensors"):

- the ``triton`` and ``mamba_ssm`` backend checks accept CPU tensors;
- each call of a ``triton``/``mamba_ssm`` implementation (``Implementations``)
  goes through ``call_on(device, impl, ...)``: every CPU storage an argument
  reaches (through dataclasses, tuples, lists and dicts) is copied to the
  device once, each tensor becomes the same view (offset, sizes, strides) of
  its copy, so strided views of one shared buffer stay views of one buffer;
  after the call every copied storage is written back (what the kernel wrote
  in place lands where the test looks) and the result comes back to the CPU
  (a view of a copied storage as the same view of the original);
- a call that reaches no CPU storage (its tensors are on the device already:
  the GPU-only tests, the engine on CUDA) runs untouched and its result stays
  on the device.

Tests of the CPU-only refusal ("triton on CPU tensors without the
interpreter") ask for the ``native_triton_checks`` fixture, which restores the
original checks around them. Nothing here changes a test's expectations;
``tests/test_triton_on_cuda.py`` checks the copying with ``device="cpu"``.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

#: Backend names whose implementations run on the device.
DEVICE_BACKENDS = ("triton", "mamba_ssm")


class _Mover:
    """One call's copies: CPU storage -> device bytes, and back."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        # key: the CPU storage's data pointer -> (CPU bytes, device bytes)
        self.storages: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.by_device_ptr: dict[int, torch.Tensor] = {}  # device storage ptr -> CPU bytes
        self.memo: dict[int, Any] = {}

    def tensor(self, t: torch.Tensor) -> torch.Tensor:
        if t.device.type != "cpu":
            return t
        storage = t.untyped_storage()
        if storage.nbytes() == 0:
            return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=self.device)
        key = storage.data_ptr()
        pair = self.storages.get(key)
        if pair is None:
            host = torch.empty(0, dtype=torch.uint8).set_(storage)
            moved = torch.empty(host.numel(), dtype=torch.uint8, device=self.device)
            moved.copy_(host)
            pair = self.storages[key] = (host, moved)
            self.by_device_ptr[moved.untyped_storage().data_ptr()] = host
        view = torch.empty(0, dtype=t.dtype, device=self.device)
        return view.set_(pair[1].untyped_storage(), t.storage_offset(), t.size(), t.stride())

    def to_device(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            return self.tensor(obj)
        if isinstance(obj, (str, bytes, int, float, bool, type(None), torch.dtype)):
            return obj
        done = self.memo.get(id(obj))
        if done is not None:
            return done
        # A container whose contents all stay as they are is returned itself, not a
        # copy: state a callee keeps in it (the plans ``AttentionMetadata.derived``
        # caches for the step's other layers) must land in the caller's object.
        out: Any
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            self.memo[id(obj)] = obj  # a cycle back to obj meets obj itself
            names = [f.name for f in dataclasses.fields(obj)]
            old = [getattr(obj, n) for n in names]
            new = [self.to_device(v) for v in old]
            if all(a is b for a, b in zip(old, new, strict=True)):
                return obj
            out = copy.copy(obj)
            for n, v in zip(names, new, strict=True):
                object.__setattr__(out, n, v)
        elif isinstance(obj, dict):
            moved = {k: self.to_device(v) for k, v in obj.items()}
            unchanged = all(moved[k] is v for k, v in obj.items())
            out = obj if unchanged else moved
        elif isinstance(obj, (tuple, list)):
            items = [self.to_device(v) for v in obj]
            if all(a is b for a, b in zip(obj, items, strict=True)):
                out = obj
            elif isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a named tuple
                out = type(obj)(*items)
            else:
                out = type(obj)(items)
        else:
            return obj
        self.memo[id(obj)] = out
        return out

    def write_back(self) -> None:
        for host, moved in self.storages.values():
            host.copy_(moved)

    def to_host(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            host = self.by_device_ptr.get(obj.untyped_storage().data_ptr())
            if host is None:
                return obj.cpu()
            view = torch.empty(0, dtype=obj.dtype)
            return view.set_(host.untyped_storage(), obj.storage_offset(), obj.size(), obj.stride())
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):
            return type(obj)(*(self.to_host(v) for v in obj))
        if isinstance(obj, (tuple, list)):
            return type(obj)(self.to_host(v) for v in obj)
        return obj


def call_on(device: torch.device | str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` with every CPU storage the arguments reach on ``device``
    (module docstring); the storages are written back and the result comes back."""
    mover = _Mover(torch.device(device))
    moved_args = mover.to_device(args)
    moved_kwargs = mover.to_device(kwargs)
    result = fn(*moved_args, **moved_kwargs)
    if not mover.storages:
        # Nothing was copied: the caller passed device tensors (a GPU-only test or
        # the engine on CUDA), so the result stays where the caller works, and the
        # call is not synchronized (a test may count what a call does on the host).
        return result
    if mover.device.type == "cuda":
        torch.cuda.synchronize(mover.device)
    mover.write_back()
    return mover.to_host(result)


def _on_device(device: torch.device, impl: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        return call_on(device, impl, *args, **kwargs)

    return run


def _accepting_cpu(check: Callable[[str, torch.device], None], device: torch.device) -> Any:
    def accept(source: str, dev: torch.device) -> None:
        check(source, device if dev.type == "cpu" else dev)

    return accept


class Shim:
    """What ``install`` changed, so that ``native`` can undo it for a while."""

    def __init__(self, device: torch.device) -> None:
        from hybridkv.kernels import backend

        self.backend = backend
        self.original_getitem = backend.Implementations.__getitem__
        self.original_checks = backend._CHECKS
        original_getitem = self.original_getitem

        def getitem(impls: Any, name: str) -> Callable[..., Any]:
            impl = original_getitem(impls, name)
            return _on_device(device, impl) if name in DEVICE_BACKENDS else impl

        self.getitem = getitem
        checks = dict(backend._CHECKS)
        for name in DEVICE_BACKENDS:
            checks[name] = _accepting_cpu(checks[name], device)
        self.checks = checks

    def on(self) -> None:
        self.backend.Implementations.__getitem__ = self.getitem  # type: ignore[method-assign]
        self.backend._CHECKS = self.checks

    def off(self) -> None:
        self.backend.Implementations.__getitem__ = self.original_getitem  # type: ignore[method-assign]
        self.backend._CHECKS = self.original_checks

    @contextmanager
    def native(self) -> Iterator[None]:
        """The original checks and implementations for the block's duration."""
        self.off()
        try:
            yield
        finally:
            self.on()


def install(device: torch.device | str = "cuda") -> Shim:
    """Route every ``triton``/``mamba_ssm`` call to ``device`` (module docstring)."""
    shim = Shim(torch.device(device))
    shim.on()
    return shim
