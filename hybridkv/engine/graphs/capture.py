"""How a step is captured and replayed: ``CudaGraph`` on a GPU, ``EagerReplay`` for tests.

Both take the step as a function of static inputs (``StaticStep.forward``) and hand
back its output tensor; ``replay`` refreshes that tensor in place after the inputs
were rewritten.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

#: Warm-up runs before a capture (compiles Triton kernels, builds the launch plans
#: and split-KV workspaces the step's metadata keeps).
WARMUP_RUNS = 2


class Graph(Protocol):
    def capture(self, fn: Callable[[], Any]) -> Any: ...

    def replay(self) -> None: ...


class CudaGraph:
    """A ``torch.cuda.CUDAGraph`` of ``fn``, warmed up on a side stream first; the
    graphs of one engine share a memory pool (they never run concurrently; ``pool``
    None: a pool of its own)."""

    def __init__(self, device: torch.device, pool: Any) -> None:
        self.device = device
        self.pool = pool
        self.graph: Any = None

    def capture(self, fn: Callable[[], Any]) -> Any:
        main = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                fn()
        main.wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        # thread_local: only this thread's unsafe CUDA calls are errors during the
        # capture (the server's other threads may go on using CUDA meanwhile).
        with torch.cuda.graph(self.graph, pool=self.pool, capture_error_mode="thread_local"):
            out = fn()
        return out

    def replay(self) -> None:
        self.graph.replay()


class EagerReplay:
    """Runs ``fn`` again at each replay and writes its result where the first run's
    went: a graph without the launch savings. Python runs again, but over the same
    static inputs, whose host-side values stay those of the capture, so a step that
    depended on anything a replay does not rewrite gives other tokens (the CPU tests)."""

    def __init__(self) -> None:
        self.fn: Callable[[], torch.Tensor] | None = None
        self.out: torch.Tensor | None = None

    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        self.fn = fn
        self.out = fn()
        return self.out

    def replay(self) -> None:
        assert self.fn is not None and self.out is not None
        self.out.copy_(self.fn())
