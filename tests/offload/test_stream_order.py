"""On CUDA the step's stream waits on a tier copy's event; the host does not wait.

The rule (``StreamOrder``) is checked on the CPU with fakes: a host memory whose
copies complete as "stream events" that fire only when the test says, a fake
event whose ``synchronize`` (a host wait) fails the test, and a fake current
stream that records ``wait_event``. A tier hit is then ready at once (the
step's stream is ordered after its loads), the device holds the bytes, and the
tier entries stay pinned by their loads until the events have passed. The
pool's reuse of a block whose write-through store is in flight orders the
stream the same way. A last test runs the same on a real GPU (skipped without
CUDA).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from factories import hit_len, toks
from tier_helpers import compute, tiered_manager

from hybridkv import Request
from hybridkv.offload.stream_order import StreamOrder
from hybridkv.tiers import UnitKey
from hybridkv.tiers.copier import Copier, InlineCopier
from hybridkv.tiers.torch_memory import EventCompletion, TorchHostMemory
from hybridkv.tiers.transfer import Completion

MAX_LEN = 64


class FakeEvent:
    def __init__(self) -> None:
        self.fired = False

    def query(self) -> bool:
        return self.fired

    def synchronize(self) -> None:
        raise AssertionError("the host waited on a stream copy")


class FakeStream:
    def __init__(self) -> None:
        self.waited: list[FakeEvent] = []

    def wait_event(self, event: FakeEvent) -> None:
        self.waited.append(event)


class StreamMemory(TorchHostMemory):
    """Copies done at once, completing as events that fire on ``fire()``."""

    def __init__(self) -> None:
        super().__init__("cpu")
        self.events: list[FakeEvent] = []

    def _queued(self, done: Completion) -> Completion:
        result, error = done.outcome()
        assert error is None
        event = FakeEvent()
        self.events.append(event)
        return EventCompletion(event, result, None)  # type: ignore[arg-type]

    def begin_store(self, buf: torch.Tensor, parts: Any, copier: Copier) -> Completion:
        return self._queued(super().begin_store(buf, parts, InlineCopier()))

    def begin_load(
        self, buf: torch.Tensor, sizes: tuple[int, ...], into: Any, copier: Copier
    ) -> Completion:
        return self._queued(super().begin_load(buf, sizes, into, InlineCopier()))

    def plan_load_many(self, entries: Any, into: Any) -> Any:
        start = super().plan_load_many(entries, into)
        return lambda _copier: self._queued(start(InlineCopier()))

    def plan_store_many(self, bufs: Any, parts: Any, sizes: Any) -> Any:
        start = super().plan_store_many(bufs, parts, sizes)
        return lambda _copier: self._queued(start(InlineCopier()))

    def fire(self) -> None:
        for e in self.events:
            e.fired = True


def test_a_step_is_ordered_after_stream_copies_without_a_host_wait() -> None:
    memory, stream = StreamMemory(), FakeStream()
    order = StreamOrder(lambda: stream)
    kv, buffers, tiers, _ = tiered_manager(
        "tiny-gemma3", max_len=MAX_LEN, memory=memory, order=order
    )
    prompt = toks(MAX_LEN - 8)
    want = compute(kv, tiers, Request("a", prompt))  # stores "on the stream", not landed
    pool = kv.block_pool
    pool.free_blocks(pool.get_new_blocks(pool.num_free_blocks))  # reuse: ordered, not waited
    # one event per group's store batch (``HostTier.store_parts``), waited on once
    groups = len(kv.coordinator.managers)
    assert len(set(map(id, stream.waited))) == len(stream.waited) == tiers.pending.waited
    assert 0 < len(stream.waited) <= groups < len(want)
    memory.fire()
    tiers.poll()  # the stores settle: committed
    assert len(tiers.host.keys()) == len(want)
    for buf in buffers.buffers:
        buf.zero_()

    later = Request("b", [*prompt, 1, 2])
    stream.waited.clear()
    assert tiers.prepare(later, wait=False)  # ready at once: the stream waits
    assert tiers.stats.load_wait_seconds == 0 and order.stream_waits > 0
    # one event per group's batch (``HostTier.load_parts``), not one per unit
    assert 0 < len(stream.waited) <= groups < tiers.stats.loads_cpu
    tiers.check_integrity()  # each entry pinned by its load, still in flight
    blocks, hit = kv.get_computed_blocks(later)
    assert hit == hit_len(kv, later) > 0
    for gid, table in enumerate(blocks.blocks):
        for b in table:
            if not b.is_null:
                got = b"".join(bytes(p.numpy()) for p in tiers.block_bytes.parts(gid, b.block_id))
                assert got == want[(gid, b.block_hash)]
    gid, b = next((g, b) for g, t in enumerate(blocks.blocks) for b in t if not b.is_null)
    key = UnitKey(b.block_hash, gid)
    assert not tiers.host.evict(key)  # its load is in flight: pinned
    memory.fire()
    tiers.poll()
    assert tiers.host.evict(key)  # settled: the pin is gone
    tiers.check_integrity()
    tiers.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_current_stream_waits_for_the_copies() -> None:
    device = torch.device("cuda")
    order = StreamOrder(lambda: torch.cuda.current_stream(device))
    kv, buffers, tiers, _ = tiered_manager(
        "tiny-gemma3",
        max_len=MAX_LEN,
        memory=TorchHostMemory(device),
        order=order,
        device="cuda",
    )
    prompt = toks(MAX_LEN - 8)
    want = compute(kv, tiers, Request("a", prompt))
    pool = kv.block_pool
    pool.free_blocks(pool.get_new_blocks(pool.num_free_blocks))
    for buf in buffers.buffers:
        buf.zero_()  # queued after the stores on the current stream
    later = Request("b", [*prompt, 1, 2])
    # The copy stream starts after the work queued on the current stream: a long
    # sleep there keeps the loads in flight when the step is ordered after them
    # (without it an H100 finished the copies first, and nothing was left to order).
    torch.cuda._sleep(1_000_000_000)
    assert tiers.prepare(later, wait=True)
    blocks, hit = kv.get_computed_blocks(later)
    assert hit > 0 and order.stream_waits > 0
    for gid, table in enumerate(blocks.blocks):
        for b in table:
            if not b.is_null:
                parts = tiers.block_bytes.parts(gid, b.block_id)
                got = b"".join(bytes(p.cpu().numpy()) for p in parts)
                assert got == want[(gid, b.block_hash)]
    tiers.check_integrity()
    tiers.close()
