"""``HostTier.store_parts``: batches of units stored from parts given per unit,
one transfer and one completion per batch, over every host memory: round
trips, a held key touched and not copied, units skipped for room, checks
before anything is reserved, a failed batch keeps nothing, entries in flight
never evicted for a later store; on CUDA one event per batch into pinned
buffers (skipped without CUDA)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_host_load_parts import MEMORIES, SIZES, _bytes, _raw, _tier
from tier_factories import GateCopier, fingerprint, key

from hybridkv.tiers import HostTier, TierFullError
from hybridkv.tiers.copier import InlineCopier
from hybridkv.tiers.torch_memory import EventCompletion, TorchHostMemory


def _loaded(t: HostTier, kind: str, i: int) -> bytes:
    out = MEMORIES[kind][2]()
    loading = t.load(key(i), into=out)
    assert loading is not None and loading.wait()
    return _raw(out)


@pytest.mark.parametrize("kind", sorted(MEMORIES))
def test_batches_round_trip_one_transfer_each(kind: str) -> None:
    t, parts = _tier(kind, 6), MEMORIES[kind][1]
    (a, skipped_a), (b, skipped_b) = t.store_parts(
        [
            ([key(3), key(1), key(4)], [parts(3), parts(1), parts(4)], [1.0] * 3),
            ([key(2)], [parts(2)], [None]),
        ]
    )
    assert a is not b and a.keys == (key(3), key(1), key(4)) and b.keys == (key(2),)
    assert a.wait() and b.wait() and skipped_a == skipped_b == []
    for i in (1, 2, 3, 4):
        assert _loaded(t, kind, i) == _raw(_bytes(i))
    assert t.stats.stores == 4 and t.copies.store.batches == 2 and t.copies.store.calls == 1
    assert t.copies.store.bytes == 4 * sum(SIZES)
    t.check_integrity()
    t.close()


@pytest.mark.parametrize("kind", sorted(MEMORIES))
def test_a_held_key_is_touched_not_copied_and_no_room_is_a_skip(kind: str) -> None:
    t, parts = _tier(kind, 3), MEMORIES[kind][1]
    ((first, _),) = t.store_parts([([key(1), key(2)], [parts(1), parts(2)], [1.0, 1.0])])
    assert first.wait()
    # key(1) held: touched (now the most recent), not copied; key(3) fills the last slot
    ((again, skipped),) = t.store_parts([([key(1), key(3)], [parts(9), parts(3)], [1.0, 1.0])])
    assert again.keys == (key(3),) and again.wait() and skipped == []
    assert _loaded(t, kind, 1) == _raw(_bytes(1))  # not overwritten by parts(9)
    # key(1) was stored before key(2), but its store again was a use: key(2) goes first
    ((fourth, _),) = t.store_parts([([key(4)], [parts(4)], [1.0])])
    assert fourth.wait() and not t.contains(key(2)) and t.contains(key(1))
    # with key(1) and key(3) pinned: the first unit evicts key(4), the second finds no room
    t.pin(key(1))
    t.pin(key(3))
    ((last, skipped),) = t.store_parts([([key(5), key(6)], [parts(5), parts(6)], [1.0, 1.0])])
    assert last.keys == (key(5),) and last.wait()
    assert [(k, type(e)) for k, e in skipped] == [(1, TierFullError)]
    assert set(t.keys()) == {key(1), key(3), key(5)} and t.stats.store_skips == 1
    t.unpin(key(1))
    t.unpin(key(3))
    ((empty, _),) = t.store_parts([([key(5)], [parts(5)], [None])])  # nothing copied: done
    assert empty.keys == () and empty.settled
    t.check_integrity()
    t.close()


@pytest.mark.parametrize("kind", sorted(MEMORIES))
def test_a_bad_batch_reserves_nothing(kind: str) -> None:
    t, parts = _tier(kind, 4), MEMORIES[kind][1]
    with pytest.raises(ValueError, match="2 keys and 1 units"):
        t.store_parts([([key(1), key(2)], [parts(1)], [None, None])])
    bad: list[Any] = [parts(2)[0], object()]
    with pytest.raises(ValueError, match="part 1"):
        t.store_parts([([key(1)], [parts(1)], [None]), ([key(2)], [bad], [None])])
    assert t.used_bytes == 0 and not t.keys()
    t.check_integrity()
    t.close()


def test_a_failed_batch_keeps_nothing() -> None:
    gate = GateCopier()
    t = _tier("torch", 4, gate)
    parts = MEMORIES["torch"][1]
    meta = [torch.empty(n, dtype=torch.uint8, device="meta") for n in SIZES]  # copies fail
    (ok, _), (failing, _) = t.store_parts(
        [([key(1)], [parts(1)], [None]), ([key(2), key(3)], [parts(2), meta], [None, None])]
    )
    assert failing.keys == (key(2), key(3))
    gate.run()
    assert ok.wait() and t.contains(key(1))
    assert not failing.wait() and failing.error is not None
    assert not t.contains(key(2)) and not t.contains(key(3)) and t.stats.store_failures == 2
    assert t.used_bytes == sum(SIZES)
    t.check_integrity()
    t.close()


def test_units_in_flight_are_never_evicted_for_a_later_store() -> None:
    gate = GateCopier()
    t = _tier("torch", 3, gate)
    parts = MEMORIES["torch"][1]
    ((storing, _),) = t.store_parts([([key(1), key(2)], [parts(1), parts(2)], [1.0, 1.0])])
    assert not storing.done() and not t.contains(key(1))
    t.check_integrity()  # one pin each, held by the batch's transfer
    assert not t.evict(key(1))
    ((later, skipped),) = t.store_parts([([key(3), key(4)], [parts(3), parts(4)], [1.0, 1.0])])
    assert later.keys == (key(3),) and [k for k, _ in skipped] == [1]  # no room: skipped
    gate.run()
    assert storing.wait() and later.wait()
    assert {key(1), key(2), key(3)} == set(t.keys())
    t.check_integrity()
    t.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (pinned memory, copy stream)")
def test_a_batched_store_is_one_event_into_pinned_memory_on_cuda() -> None:
    """``HostTier.store_parts`` on CUDA: the batch's device-to-host copies on the
    copy stream after the work queued before it, one event, pinned buffers."""
    memory = TorchHostMemory("cuda")
    tier = HostTier(fingerprint(), 1 << 26, memory, copier=InlineCopier())
    src = [torch.zeros((1 << 16,), dtype=torch.uint8, device="cuda") for _ in range(8)]
    for i, s in enumerate(src):
        s.add_(i)  # queued on the current stream, before the copy stream's copies
    keys = [key(i) for i in range(8)]
    ((stored, skipped),) = tier.store_parts([(keys, [[s] for s in src], [None] * 8)])
    assert isinstance(stored.completion, EventCompletion) and skipped == []
    assert stored.wait() and stored.keys == tuple(keys)
    for i in range(8):
        buf, sizes = tier._entries[key(i)]
        assert buf.is_pinned() and sizes == (1 << 16,) and bool((buf == i).all())
    out = [torch.zeros_like(s) for s in src]
    (loaded,) = tier.load_parts([(keys, [[o] for o in out])])
    assert loaded.wait() and all(torch.equal(o, s) for o, s in zip(out, src, strict=True))
    tier.check_integrity()
    tier.close()
