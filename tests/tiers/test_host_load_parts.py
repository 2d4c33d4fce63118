"""``HostTier.load_parts``: batches of entries loaded into parts given per entry,
one transfer and one completion per batch, over every host memory: round
trips, checks before anything is pinned, pins held while in flight (no
eviction), pins taken over from a ``pin_batch``, and a load as a use (the
LRU order; the ranked host's move to spare room)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import pytest
import torch
from tier_factories import GateCopier, fingerprint, key

from hybridkv.policy import unit_class
from hybridkv.tiers import HostTier, UnitKey
from hybridkv.tiers.copier import Copier, InlineCopier
from hybridkv.tiers.memory import BytesMemory
from hybridkv.tiers.ranking import RankRule
from hybridkv.tiers.slab_memory import SlabMemory
from hybridkv.tiers.torch_memory import TorchHostMemory

SIZES = (24, 40)  # two parts an entry


def _bytes(i: int) -> list[Any]:
    return [bytearray([i, j]) * (n // 2) for j, n in enumerate(SIZES)]


def _tensors(i: int) -> list[Any]:
    return [torch.frombuffer(p, dtype=torch.uint8) for p in _bytes(i)]


def _arrays(i: int) -> list[Any]:
    return [np.frombuffer(bytes(p), np.uint8).copy() for p in _bytes(i)]


#: (memory for ``n`` entries, an entry's parts, empty parts to load into)
MEMORIES: dict[str, tuple[Callable[[int], Any], Callable[[int], list[Any]], Callable[[], Any]]] = {
    "bytes": (lambda n: BytesMemory(), _bytes, lambda: [bytearray(n) for n in SIZES]),
    "torch": (
        lambda n: TorchHostMemory("cpu"),
        _tensors,
        lambda: [torch.zeros(n, dtype=torch.uint8) for n in SIZES],
    ),
    "slab": (
        lambda n: SlabMemory(SIZES, n * sum(SIZES)),
        _arrays,
        lambda: [np.zeros(n, np.uint8) for n in SIZES],
    ),
}


def _tier(kind: str, n: int, copier: Copier | None = None, **kw: Any) -> HostTier:
    memory = MEMORIES[kind][0](n)
    return HostTier(fingerprint(), n * sum(SIZES), memory, copier=copier or InlineCopier(), **kw)


def _fill(t: HostTier, kind: str, ids: list[int]) -> None:
    parts = MEMORIES[kind][1]
    assert all(x.wait() for x in t.store_many([(key(i), parts(i), 1.0) for i in ids]))


def _raw(parts: list[Any]) -> bytes:
    return b"".join(bytes(p.numpy() if isinstance(p, torch.Tensor) else p) for p in parts)


@pytest.mark.parametrize("kind", sorted(MEMORIES))
def test_batches_round_trip_one_transfer_each(kind: str) -> None:
    t = _tier(kind, 6)
    _fill(t, kind, [1, 2, 3, 4])
    empty = MEMORIES[kind][2]
    first, second = [empty() for _ in range(3)], [empty()]
    a, b = t.load_parts([([key(3), key(1), key(4)], first), ([key(2)], second)])
    assert a is not b and a.keys == (key(3), key(1), key(4)) and b.keys == (key(2),)
    assert a.wait() and b.wait()
    for i, got in zip([3, 1, 4, 2], [*first, *second], strict=True):
        assert _raw(got) == _raw(_bytes(i))
    assert t.stats.loads == 4 and t.copies.load.batches == 2 and t.copies.load.calls == 1
    assert t.copies.load.bytes == 4 * sum(SIZES)
    (none,) = t.load_parts([([], [])])  # an empty batch: done at once
    assert none.wait() and none.keys == ()
    t.check_integrity()
    t.close()


@pytest.mark.parametrize("kind", sorted(MEMORIES))
def test_a_bad_batch_pins_and_copies_nothing(kind: str) -> None:
    t = _tier(kind, 4)
    _fill(t, kind, [1, 2])
    empty = MEMORIES[kind][2]
    out = [empty(), empty()]
    with pytest.raises(KeyError, match="lacks it"):
        t.load_parts([([key(1)], [out[0]]), ([key(9)], [out[1]])])
    short = [empty()[0][:8], empty()[1]]
    with pytest.raises(ValueError, match=r"into\[1\]"):
        t.load_parts([([key(1), key(2)], [out[0], short])])
    with pytest.raises(ValueError, match="2 keys and 1 into"):
        t.load_parts([([key(1), key(2)], [out[0]])])
    assert not any(_raw(p).strip(b"\0") for p in out)  # nothing copied
    t.check_integrity()  # nothing pinned
    assert t.evict(key(1)) and t.evict(key(2))
    t.close()


def test_entries_stay_pinned_until_the_batch_lands() -> None:
    gate = GateCopier()
    t = _tier("torch", 4, gate)
    stored = t.store_many([(key(i), _tensors(i), 1.0) for i in (1, 2, 3, 4)])
    gate.run()
    assert all(x.wait() for x in stored)
    out = [MEMORIES["torch"][2]() for _ in range(2)]
    (loading,) = t.load_parts([([key(1), key(2)], out)])
    assert not loading.done()
    t.check_integrity()  # one pin each, held by the transfer
    assert not t.evict(key(1)) and not t.evict(key(2))
    # a store that needs room evicts what is not being loaded, never key(1) or key(2)
    assert t.store(key(5), _tensors(5)).error is None
    gate.run()
    assert {key(1), key(2)} <= set(t.keys()) and not t.contains(key(3))
    assert loading.wait() and [_raw(p) for p in out] == [_raw(_bytes(1)), _raw(_bytes(2))]
    t.check_integrity()
    assert t.evict(key(1))  # landed: the pins are gone
    t.close()


def test_a_pin_batch_is_taken_over() -> None:
    t = _tier("bytes", 4)
    _fill(t, "bytes", [1, 2])
    batch = t.pin_batch([key(2), key(7), key(1)])
    out = [MEMORIES["bytes"][2]() for _ in range(2)]
    with pytest.raises(ValueError, match="exactly the keys"):
        t.load_parts([([key(1)], out[:1])], pins=batch)
    t.check_integrity()  # the refused load took nothing over
    (loaded,) = t.load_parts([([key(1), key(2)], out)], pins=batch)
    assert batch.released and loaded.wait()
    t.check_integrity()  # one pin each while it was held, none now
    assert t.evict(key(1)) and t.evict(key(2))
    t.close()


def test_a_load_is_a_use() -> None:
    """Plain LRU: the loaded entries are the last victims. Ranked with hits going
    to spare room (the host under ``hybrid``): a loaded entry becomes spare."""
    t = _tier("bytes", 3)
    _fill(t, "bytes", [1, 2, 3])
    (loaded,) = t.load_parts([([key(1)], [MEMORIES["bytes"][2]()])])
    assert loaded.wait()
    assert t.store(key(4), _bytes(4)).wait()
    assert not t.contains(key(2)) and t.contains(key(1))  # key(2) was least recent
    t.close()

    rule = RankRule(1.0, partial(unit_class, page_bytes=sum(SIZES)), hits_to_spare=True)
    ranked = _tier("bytes", 3, ranking=rule)
    _fill(ranked, "bytes", [1, 2, 3])
    (loaded,) = ranked.load_parts([([key(2)], [MEMORIES["bytes"][2]()])])
    assert loaded.wait()
    entry = ranked._ledger.get(key(2))
    assert entry is not None and entry.spare  # on the device again: spare room only
    assert ranked.store(key(4), _bytes(4), 1.0).wait()
    assert not ranked.contains(key(2))  # spare room goes first
    ranked.check_integrity()
    ranked.close()


def _unit(i: int) -> UnitKey:
    return key(i, group=1)


def test_keys_of_several_groups_in_one_call() -> None:
    t = _tier("torch", 4)
    stored = t.store_many([(_unit(i), _tensors(i), None) for i in (1, 2)])
    stored += t.store_many([(key(3), _tensors(3), None)])
    assert all(x.wait() for x in stored)
    out = [MEMORIES["torch"][2]() for _ in range(3)]
    g1, g0 = t.load_parts([([_unit(2), _unit(1)], out[:2]), ([key(3)], out[2:])])
    assert g1.wait() and g0.wait()
    assert [_raw(p) for p in out] == [_raw(_bytes(i)) for i in (2, 1, 3)]
    t.check_integrity()
    t.close()
