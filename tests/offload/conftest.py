"""The host tier's two memories: every offload test runs over both.

``torch``: ``TorchHostMemory`` (one buffer per entry, each unit's parts copied
one by one; the CUDA path's shape). ``slab``: ``SlabMemory`` (slots of one slab,
each group's units of a batch copied as rows: the engine's CPU path).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from hybridkv.offload import BlockBytes
from hybridkv.tiers.memory import HostMemory
from hybridkv.tiers.slab_memory import SlabMemory
from hybridkv.tiers.torch_memory import TorchHostMemory

#: ``(block_bytes, budget bytes) -> the host tier's memory``.
MakeMemory = Callable[[BlockBytes, int], HostMemory]


@pytest.fixture(params=["torch", "slab"])
def host_memory(request: pytest.FixtureRequest) -> MakeMemory:
    if request.param == "torch":
        return lambda _block_bytes, _budget: TorchHostMemory("cpu")
    return lambda block_bytes, budget: SlabMemory(block_bytes.widths, budget)
