"""The store's own evictions as KV events: an object a replica wrote (a
``BlockStored`` with medium "STORE") that the store evicts to make room for
another model's writes becomes a ``BlockRemoved`` with medium "STORE", once the
replica's sweep finds it gone (``tiers/store_watch.py``), and only then."""

from __future__ import annotations

import time

import numpy as np
from factories import admit, toks
from tier_helpers import fill, store_replica

from hybridkv import Request
from hybridkv.core.events import BlockRemoved, BlockStored
from hybridkv.tiers import ModelFingerprint, MooncakeTier, UnitKey
from hybridkv.tiers.store_master import MooncakeMaster

MAX_LEN = 64


def test_an_evicted_object_is_one_block_removed_after_its_block_stored(
    fresh_mooncake_master: MooncakeMaster,
) -> None:
    url = fresh_mooncake_master.url + "&segment=16MiB&buffer=16MiB"
    client = MooncakeTier.connect(ModelFingerprint("unused", "unused", (), 1, ("unused",)), url)
    kv, _, tiers = store_replica("tiny-gemma3", client, MAX_LEN, events=True, sweep=0.05)
    other = ModelFingerprint("other model", "unused", (), 1, ("unused",))
    filler = MooncakeTier(other, client.client, 1 << 26, owns_client=False)
    try:
        r = Request("a", toks(MAX_LEN - 8))
        admit(kv, r)
        fill(kv, tiers, r)
        kv.free(r)
        assert tiers.store_writes is not None and tiers.store is not None
        tiers.store_writes.settle(wait=True)
        stored = [e for e in kv.take_events() if isinstance(e, BlockStored) and e.medium == "STORE"]
        ours = [UnitKey(e.block_hashes[0], e.group_id) for e in stored]
        assert ours and len(set(ours)) == len(ours)
        names = [tiers.store.name(k) for k in ours]

        def gone() -> set[UnitKey]:  # the store's truth, asked directly
            return {k for k, h in zip(ours, client.client.exists(names), strict=True) if not h}

        blob = np.zeros(512 << 10, np.uint8).tobytes()
        for r_ in range(8):  # another model's writes, past the 300 ms leases, until ours go
            filler.store_many([(UnitKey(bytes([r_, i]) * 16, 0), [blob], None) for i in range(40)])
            filler.poll()
            time.sleep(0.4)
            if gone():
                break
        assert gone(), "the store evicted none of the replica's objects"
        removed: list[UnitKey] = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            tiers.store_writes.settle()  # what every step's lookup or write runs
            for e in kv.take_events():
                assert not isinstance(e, BlockStored) or e.medium != "STORE"  # none again
                if isinstance(e, BlockRemoved) and e.medium == "STORE":
                    removed += [UnitKey(h, e.group_id) for h in e.block_hashes]
            truth = gone()
            if set(removed) == truth:
                break
            time.sleep(0.02)
        assert sorted(removed) == sorted(truth)  # each evicted object once; none still there
        kv.check_integrity()
        tiers.check_integrity()
    finally:
        filler.close()
        tiers.close()
        client.close()
