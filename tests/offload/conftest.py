"""The host tier's two memories: every offload test runs over both; two store
clients for the tests of the store tier (one per replica).

``torch``: ``TorchHostMemory`` (one buffer per entry, each unit's parts copied
one by one; the CUDA path's shape). ``slab``: ``SlabMemory`` (slots of one slab,
each group's units of a batch copied as rows: the engine's CPU path).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from hybridkv.offload import BlockBytes
from hybridkv.tiers import ModelFingerprint, MooncakeTier
from hybridkv.tiers.memory import HostMemory
from hybridkv.tiers.slab_memory import SlabMemory
from hybridkv.tiers.store_master import MooncakeMaster
from hybridkv.tiers.torch_memory import TorchHostMemory

#: ``(block_bytes, budget bytes) -> the host tier's memory``.
MakeMemory = Callable[[BlockBytes, int], HostMemory]


@pytest.fixture(params=["torch", "slab"])
def host_memory(request: pytest.FixtureRequest) -> MakeMemory:
    if request.param == "torch":
        return lambda _block_bytes, _budget: TorchHostMemory("cpu")
    return lambda block_bytes, budget: SlabMemory(block_bytes.widths, budget)


@pytest.fixture(scope="module")
def store_clients(mooncake_master: MooncakeMaster) -> Iterator[list[MooncakeTier]]:
    """Two store clients for the module (joining and leaving cost 1-2 s each), each
    lending a 16 MiB segment; ``tier_helpers.store_replica`` builds a replica on one."""
    fp = ModelFingerprint("unused", "unused", (), 1, ("unused",))
    url = mooncake_master.url + "&segment=16MiB&buffer=16MiB"
    tiers = [MooncakeTier.connect(fp, url) for _ in range(2)]
    yield tiers
    for t in tiers:
        t.close()
