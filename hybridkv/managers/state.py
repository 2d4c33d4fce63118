"""``RequestBlockState``: one request's block table in one group, and how much is settled."""

from __future__ import annotations

from hybridkv.core.block import KVCacheBlock

#: A token count no request reaches ("never", for ``next_release_at``).
NEVER = 1 << 62


class RequestBlockState:
    """One request's block table in one group, and how much of it is settled.

    ``num_cached``: leading entries already entered into (or taken from) the
    prefix cache. ``num_skipped``: leading entries already nulled out.
    ``kept``: the request's kept points (``hybrid`` policy, ascending token
    positions); ``retained``: ``(index, block)`` of skipped blocks a kept
    point needs, still held by the request until it is freed.
    ``holds_tail``: the request holds its tail (``hybrid``; ``Hold.tail``);
    False once it gave the tail up to make room (``Shed.holds_tail``): it then
    holds only what its query reads, as under ``lru``.
    """

    __slots__ = ("blocks", "holds_tail", "kept", "num_cached", "num_skipped", "retained")

    def __init__(
        self,
        blocks: list[KVCacheBlock],
        num_cached: int,
        num_skipped: int,
        kept: tuple[int, ...] = (),
    ) -> None:
        self.blocks = blocks
        self.num_cached = num_cached
        self.num_skipped = num_skipped
        self.kept = kept
        self.retained: list[tuple[int, KVCacheBlock]] = []
        self.holds_tail = True
