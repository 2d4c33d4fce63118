"""The longest hit across the device and lower tiers, by the coordinator's rule.

``HybridKVCacheCoordinator`` finds the longest hit valid for every group as a
fixed point over the groups, each group answering the longest end whose needed
blocks (``first_needed_block``: every block for full attention, the window's
for sliding, the chunk's for chunked, the state at the end for Mamba) are all
cached. ``tiered_hit_length`` is the same fixed point over any notion of
"cached": ``present(group_id, block_index, block_hash)``, e.g. on the device *or*
in a tier (``hybridkv.offload``; the simulator's tiers, which also refuse a
request's own blocks not computed yet, by index). With device presence alone it
equals the coordinator's hit (``tests/sim/test_sim_tiers.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from hybridkv.managers.base import SingleTypeKVCacheManager

#: Whether group ``gid``'s block ``i`` with hash ``h`` is held: ``(gid, i, h) -> bool``.
Present = Callable[[int, int, bytes], bool]


def tiered_hit_length(
    managers: Sequence[SingleTypeKVCacheManager],
    block_hashes: list[bytes],
    max_length: int,
    present: Present,
) -> int:
    """The longest hit of at most ``max_length`` tokens whose needed blocks are all
    ``present(group, block index, hash)`` in every group (the coordinator's fixed
    point)."""
    length = max_length
    changed = True
    while changed:
        changed = False
        for m in managers:
            hashes = m.group_hashes(block_hashes)
            bs, gid = m.block_size, m.group_id
            end = min(length // bs, len(hashes))
            while end > 0:
                first = m.first_needed_block(end * bs)
                miss = next((i for i in range(first, end) if not present(gid, i, hashes[i])), None)
                if miss is None:
                    break
                end = miss
            if end * bs < length:
                length = end * bs
                changed = True
    return length
