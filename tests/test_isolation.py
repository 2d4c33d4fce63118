"""Cache keys beyond tokens: cache salt, LoRA adapter, multimodal inputs.

All requests below share the same token ids (100, 101, ...); only the extra
keys differ. Block size 4.
"""

from __future__ import annotations

import pytest
from factories import admit, full, hit_ids, hit_len, manager, req, swa

from hybridkv import HASH_ALGOS, BlockStored


# -- cache salt --------------------------------------------------------------------------
@pytest.mark.parametrize("algo", HASH_ALGOS)
def test_salts_never_share_blocks(algo: str) -> None:
    kv = manager(32, full(4), hash_algo=algo)
    a = req("a", 12, cache_salt="tenant-1")
    admit(kv, a)  # [1, 2, 3] cached under tenant-1
    assert hit_len(kv, req("b", 13, cache_salt="tenant-2")) == 0
    assert hit_len(kv, req("c", 13)) == 0  # unsalted
    assert hit_ids(kv, req("d", 13, cache_salt="tenant-1")) == ([1, 2, 3],)
    # The other direction: unsalted blocks are invisible to salted requests.
    plain = req("p", 12)
    admit(kv, plain)
    assert kv.get_block_ids("p") == ([4, 5, 6],)
    assert hit_len(kv, req("e", 13, cache_salt="tenant-2")) == 0
    assert hit_ids(kv, req("f", 13)) == ([4, 5, 6],)
    # No block of one salt's chain equals any block of another's.
    chains = [req(f"h{i}", 12, cache_salt=s) for i, s in enumerate(("tenant-1", "tenant-2", None))]
    for r in chains:
        kv.get_computed_blocks(r)
    flat = [h for r in chains for h in r.block_hashes]
    assert len(set(flat)) == 9


def test_salt_isolation_holds_for_sliding_window_groups() -> None:
    # Only block 0 carries the salt, but the chain carries it on: a sliding
    # window hit (which does not read block 0) still cannot cross salts.
    kv = manager(32, full(4), swa(4, 5))
    admit(kv, req("a", 20, cache_salt="s1"))
    assert hit_len(kv, req("b", 21, cache_salt="s2")) == 0
    solo = manager(32, swa(4, 5))
    admit(solo, req("a", 20, cache_salt="s1"))
    assert hit_len(solo, req("b", 21, cache_salt="s2")) == 0
    assert hit_ids(solo, req("c", 21, cache_salt="s1")) == ([0, 0, 0, 0, 5],)


@pytest.mark.parametrize("int_hashes", [False, True])
def test_kv_events_carry_salted_hashes_never_the_salt(int_hashes: bool) -> None:
    pytest.importorskip("msgspec")
    from hybridkv.events.groups import GroupEventInfo
    from hybridkv.events.wire import BatchEncoder

    salt = "tenant-secret-7f3a"
    kv = manager(32, full(4), enable_kv_cache_events=True)
    salted = req("a", 12, cache_salt=salt)
    admit(kv, salted)
    plain = req("b", 12)
    admit(kv, plain)
    stored = kv.take_events()
    assert [ev.block_hashes for ev in stored] == [salted.block_hashes, plain.block_hashes]
    assert not set(salted.block_hashes) & set(plain.block_hashes)
    encoder = BatchEncoder([GroupEventInfo("full_attention", None)], "GPU", int_hashes)
    wire = encoder.encode(0.0, stored)
    assert salt.encode() not in wire and b"7f3a" not in wire
    assert all(salt not in repr(ev) for ev in stored)


# -- LoRA --------------------------------------------------------------------------------------
def test_lora_adapters_are_cached_apart() -> None:
    kv = manager(32, full(4), enable_kv_cache_events=True)
    admit(kv, req("a", 8, lora_name="math"))
    stored = kv.take_events()
    assert len(stored) == 1 and isinstance(stored[0], BlockStored)
    assert stored[0].lora_name == "math"
    assert hit_len(kv, req("b", 9, lora_name="code")) == 0
    assert hit_len(kv, req("c", 9)) == 0  # the base model
    assert hit_ids(kv, req("d", 9, lora_name="math")) == ([1, 2],)
    admit(kv, req("e", 8))  # base-model copy of the same tokens: new blocks
    assert kv.get_block_ids("e") == ([3, 4],)
    assert hit_ids(kv, req("f", 9)) == ([3, 4],)


# -- multimodal inputs ------------------------------------------------------------------------
def test_different_image_at_same_positions_stops_the_hit() -> None:
    # 16 tokens; the image placeholder covers tokens 4-7 (block 1).
    kv = manager(32, full(4))
    admit(kv, req("a", 16, mm_inputs=[("cat.png", 4, 4)]))
    assert kv.get_block_ids("a") == ([1, 2, 3, 4],)
    # Identical image: hit up to 12 (at most 15 tokens).
    assert hit_ids(kv, req("same", 16, mm_inputs=[("cat.png", 4, 4)])) == ([1, 2, 3],)
    # Another image: block 0 still hits, nothing from block 1 on.
    assert hit_ids(kv, req("dog", 16, mm_inputs=[("dog.png", 4, 4)])) == ([1],)
    # Same image placed one token later, or in the next block, or absent.
    assert hit_len(kv, req("shift", 16, mm_inputs=[("cat.png", 5, 3)])) == 4
    assert hit_len(kv, req("later", 16, mm_inputs=[("cat.png", 8, 4)])) == 4
    assert hit_len(kv, req("none", 16)) == 4


def test_image_spanning_blocks_keys_each_block_it_overlaps() -> None:
    # The image covers tokens 2-9: blocks 0, 1 and 2 all depend on it.
    kv = manager(32, full(4))
    admit(kv, req("a", 16, mm_inputs=[("cat.png", 2, 8)]))
    assert hit_len(kv, req("dog", 16, mm_inputs=[("dog.png", 2, 8)])) == 0
    assert hit_len(kv, req("same", 16, mm_inputs=[("cat.png", 2, 8)])) == 12
    # Two images: changing only the second (tokens 12-13, block 3) keeps 0-2.
    two = [("cat.png", 2, 8), ("sun.png", 12, 2)]
    admit(kv, req("b", 17, mm_inputs=two))
    other = [("cat.png", 2, 8), ("moon.png", 12, 2)]
    assert hit_len(kv, req("c", 17, mm_inputs=other)) == 12
    assert hit_len(kv, req("d", 17, mm_inputs=two)) == 16
