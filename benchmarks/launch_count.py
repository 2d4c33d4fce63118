"""Counting what a step launches, without running its kernels (maintained tools).

- ``intercepted()``: inside, every Triton launch ``kernel[grid](...)`` is recorded
  as a ``Launch`` instead of run, and the kernel backend's device checks accept CPU
  tensors, so a step's launches can be counted on a machine without a GPU;
- ``AtenOps``: a dispatch mode that records every aten op a step runs;
  ``NO_KERNEL`` names the ops that launch no kernel (views, allocations).

Used by ``graph_host_ops.py`` and by research/ (``kernel_resources.py``,
``step_launches.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode
from triton.runtime.jit import JITFunction

from hybridkv.kernels import backend

#: Aten ops that launch no kernel.
NO_KERNEL = {
    "view", "_unsafe_view", "reshape", "t", "empty", "empty_like", "empty_strided",
    "as_strided", "detach", "unsqueeze", "squeeze", "slice", "select", "expand",
    "transpose", "permute", "split", "split_with_sizes", "unbind", "alias", "lift_fresh",
    "_local_scalar_dense",
}  # fmt: skip


@dataclass(frozen=True)
class Launch:
    """One intercepted ``kernel[grid](*args, **kwargs)``."""

    fn: JITFunction
    args: tuple
    kwargs: dict


@contextmanager
def intercepted() -> Iterator[list[Launch]]:
    """Inside, every Triton launch is recorded into the yielded list instead of run,
    and the backend checks accept CPU tensors without the interpreter."""
    got: list[Launch] = []

    def getitem(self: JITFunction, grid: Any) -> Callable[..., None]:
        def launch(*args: Any, **kwargs: Any) -> None:
            got.append(Launch(self, args, kwargs))

        return launch

    saved_getitem, saved_checks = JITFunction.__getitem__, backend._CHECKS
    JITFunction.__getitem__ = getitem  # type: ignore[method-assign]
    backend._CHECKS = {name: (lambda *a, **k: None) for name in saved_checks}
    try:
        yield got
    finally:
        JITFunction.__getitem__ = saved_getitem  # type: ignore[method-assign]
        backend._CHECKS = saved_checks


class AtenOps(TorchDispatchMode):
    """Records the name of every aten op run inside it (``ops``)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))
