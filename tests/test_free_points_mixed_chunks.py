"""Free points with chunked groups of different sizes, by hand.

Full attention (block 1), chunked (block 1, chunk 3) and chunked (block 2,
chunk 6): the hit step is 2 tokens and the free-point period 6. Only the
6-token group's chunks start on the hit step, and the 3-token group keeps a
tail. Found by a 10,000-example state-machine run: when the 6-token group
alone dropped its tail, a running request released that group's blocks 0-1
once past token 6, so the freed request's tail point at 4 was no valid hit,
yet the 3-token group kept its block 3 for it (a dead block released as worth
keeping). Now no group drops its tail unless every chunked group can.
"""

from __future__ import annotations

from factories import chunked, config, full

from hybridkv import KVCacheManager, Request


def test_a_kept_tail_point_is_a_valid_hit_in_every_group() -> None:
    kv = KVCacheManager(
        config(32, full(1), chunked(1, 3), chunked(2, 6)),
        64,
        cache_policy="hybrid",
        hybrid_tail_tokens=4,
        hybrid_value_weight=0.0,
        hybrid_tail_align=0,
    )
    assert [m.tail for m in kv.coordinator.managers] == [4, 4, 4]
    r = Request("r", [0] * 6)
    blocks, hit = kv.get_computed_blocks(r)
    assert kv.allocate_slots(r, 6, hit, blocks) is not None
    r.num_computed_tokens = 6
    r.append_output_token_ids([0])
    assert kv.allocate_slots(r, 1) is not None  # past token 6: the 6-token group's chunk 2
    r.num_computed_tokens = 7
    r.append_output_token_ids([0])
    kv.free(r)
    kv.check_integrity()
    # The tail points 2, 4 and 6 are all hits: 4 needs the 6-token group's blocks 0-1.
    for n in (2, 4, 6):
        probe = Request(f"p{n}", [0] * n + [7])
        assert kv.get_computed_blocks(probe)[1] == n
