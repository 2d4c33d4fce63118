"""``AdmissionBound``: proves, without a hit scan, that a waiting request cannot be admitted.

A scheduler retries the head of its waiting queue every step until it fits;
each retry is a prefix-hit scan of every group plus a block count
(``get_computed_blocks`` + ``allocate_slots``). Under memory pressure most
retries fail. This bound answers many of them exactly at O(groups) cost:

- *How far the hit can reach.* The last lookup of the request found its
  full-attention prefix ending at ``F`` (one full-attention group), so
  block ``F / bs`` was missing. A hit now ends at most at the first of that
  group's blocks from ``F / bs`` on whose hash is not in the index (blocks
  before it may have been evicted since: that only shrinks the hit). That
  end becomes the new ``F``.
- *Blocks needed for any hit ``h <= F``.* A new request's count is new
  blocks plus free hit blocks (never negative). Its new blocks in a group
  of block size ``bs`` are ``ceil((h + n) / bs) - h / bs`` with
  ``n = min(num_tokens - h, budget)``, which never grows with ``h``; so
  ``h = F`` (capped one token short of the prompt, rounded down to whole
  hit steps) gives a lower bound. Groups
  whose new-block rule differs (Mamba states) count 0.

If that lower bound exceeds the free blocks, ``allocate_slots`` would
return None: the retry can be skipped with the same outcome. Off when
prefix-cache stats are kept (each lookup is counted there) and for
layouts with no or several full-attention groups.
"""

from __future__ import annotations

from hybridkv.core.block_pool import BlockPool
from hybridkv.core.request import Request
from hybridkv.managers.base import SingleTypeKVCacheManager


class AdmissionBound:
    """Each waiting request's full-attention hit at its last lookup (module docstring)."""

    __slots__ = ("_base", "_full", "_hit_step", "_last", "max_model_len", "pool")

    def __init__(
        self,
        managers: list[SingleTypeKVCacheManager],
        pool: BlockPool,
        hit_step: int,
        max_model_len: int,
        enabled: bool,
    ) -> None:
        full = [m for m in managers if m.prefix_closed]
        self._full = full[0] if enabled and len(full) == 1 else None
        # Groups whose new blocks follow the table-position rule (not Mamba's).
        base_rule = SingleTypeKVCacheManager._num_new_real_blocks
        self._base = [m.block_size for m in managers if type(m)._num_new_real_blocks is base_rule]
        self._hit_step = hit_step
        self.pool = pool
        self.max_model_len = max_model_len
        self._last: dict[str, tuple[Request, int]] = {}

    def remember(self, request: Request, full_hit: int) -> None:
        """A lookup of ``request`` found its full-attention prefix ending at ``full_hit``."""
        if self._full is not None:
            self._last[request.request_id] = (request, full_hit)

    def forget(self, request_id: str) -> None:
        """The request got tables (admitted) or left: the next lookup starts afresh."""
        self._last.pop(request_id, None)

    def cannot_admit(self, request: Request, budget: int) -> bool:
        """True only if ``allocate_slots`` of the request's next lookup and
        ``min(num_tokens - hit, budget)`` tokens would return None."""
        m = self._full
        last = self._last.get(request.request_id)
        if m is None or last is None or last[0] is not request or budget <= 0:
            return False
        hashes = m.group_hashes(request.live_block_hashes)
        index = self.pool.cached[m.group_id]
        i = last[1] // m.block_size
        while i < len(hashes) and hashes[i] in index:
            i += 1  # cached since: the hit may have grown this far, no further
        if i >= len(hashes):
            return False
        full_hit = i * m.block_size
        self._last[request.request_id] = (request, full_hit)
        num_tokens = request.num_tokens
        # i < len(hashes) = num_tokens // bs: full_hit <= num_tokens - bs, below the
        # lookup's cap (num_tokens - 1) already.
        h = full_hit - full_hit % self._hit_step
        total = min(h + min(num_tokens - h, budget), self.max_model_len)
        need = sum(-(-total // bs) - h // bs for bs in self._base)
        return need > self.pool.num_free_blocks

    def check_integrity(self, live: set[str]) -> None:
        """Remembered requests are keyed by their own id and wait (no tables:
        ``live`` holds the ids that have them)."""
        for rid, (request, full_hit) in self._last.items():
            assert request.request_id == rid and full_hit >= 0, rid
            assert rid not in live, f"request {rid!r} has tables but is remembered as waiting"
