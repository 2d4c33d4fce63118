"""What a test counts as reading the device back on the host, and a recorder of aten ops.

A host read is a sync on CUDA: it stalls a step's launches, and a CUDA graph capture
fails on it. ``RecordOps`` records every aten op dispatched inside it, in order.
"""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode

#: aten ops that read device memory back to the host.
HOST_READS = frozenset(
    {
        "aten._local_scalar_dense.default",
        "aten.nonzero.default",
        "aten.is_nonzero.default",
        "aten.equal.default",
        "aten.masked_select.default",
    }
)


class RecordOps(TorchDispatchMode):
    """Inside it, ``ops`` lists every aten op dispatched (``str(func)``), in order."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))
