"""What a test counts as reading the device back on the host, and a recorder of aten ops.

A host read is a sync on CUDA: it stalls a step's launches, and a CUDA graph capture
fails on it. ``RecordOps`` records every aten op dispatched inside it, in order.
"""

from __future__ import annotations

from torch.overrides import TorchFunctionMode
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


#: Tensor methods that hand a tensor's values to Python or numpy (a sync on CUDA).
VALUE_READS = frozenset(
    {"tolist", "item", "__int__", "__float__", "__bool__", "__index__", "numpy", "cpu"}
)


class CountValueReads(TorchFunctionMode):
    """Inside it, ``reads`` lists the ``VALUE_READS`` called on tensors (by name), except
    while ``paused`` is set: the Python-level view, which also sees a CPU tensor's
    ``tolist`` (no aten op is dispatched for it)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []
        self.paused = False

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = getattr(func, "__name__", "")
        if name in VALUE_READS and not self.paused:
            self.reads.append(name)
        return func(*args, **(kwargs or {}))
