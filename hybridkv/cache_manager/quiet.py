"""``QuietHorizons``: the decode steps ``KVCacheManager.allocate_slots``
answers without visiting any group.

A live request's *quiet horizon* (``KVCacheCoordinator.quiet_horizon``) is
``(cover, release_at, cache_at)``: while the tokens needing slots stay
``<= cover``, the computed tokens ``< release_at`` and the tokens to cache
``< cache_at``, an allocation allocates, releases and caches nothing. The
manager sets a request's horizon after every ``allocate_slots`` that gets past
this check (its tables may have changed) and drops it on ``free``::

    computed      10      11        12
    cover (12)    ok      ok        ok        slots for 12 tokens exist
    release (11)  ok      a window block falls out: not quiet
"""

from __future__ import annotations

from hybridkv.coordinators import KVCacheCoordinator
from hybridkv.core.request import Request
from hybridkv.managers.base import NEVER


class QuietHorizons:
    """Each live request's quiet horizon (module docstring), capped at
    ``max_model_len`` (the check then never passes it) and open-ended for
    caching when ``enable_caching`` is off."""

    def __init__(
        self, coordinator: KVCacheCoordinator, max_model_len: int, enable_caching: bool
    ) -> None:
        self.coordinator = coordinator
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        #: Request id -> ``(cover, release_at, cache_at)``.
        self.horizons: dict[str, tuple[int, int, int]] = {}

    def quiet(self, request: Request, num_new_tokens: int) -> bool:
        """True when a plain step of ``num_new_tokens`` (no hit, no lookahead)
        of the live ``request`` changes nothing in any group. Read-only."""
        h = self.horizons.get(request.request_id)
        if h is None:
            return False
        total = request.num_computed_tokens
        after = total + num_new_tokens
        n = request.num_tokens
        return after <= h[0] and total < h[1] and min(after, n) < h[2] and n <= self.max_model_len

    def horizon(self, request_id: str) -> tuple[int, int, int]:
        """The live request's horizon as of now."""
        cover, release_at, cache_at = self.coordinator.quiet_horizon(request_id)
        if not self.enable_caching:
            cache_at = NEVER
        return min(cover, self.max_model_len), release_at, cache_at

    def update(self, request_id: str) -> None:
        """The request's tables may have changed: take its horizon afresh."""
        self.horizons[request_id] = self.horizon(request_id)

    def forget(self, request_id: str) -> None:
        """The request was freed (or never admitted)."""
        self.horizons.pop(request_id, None)

    def check_integrity(self, live: set[str]) -> None:
        """Only live requests have a horizon, and each is the current one."""
        for rid, h in self.horizons.items():
            assert rid in live, f"request {rid!r} is freed but keeps a quiet horizon"
            assert h == self.horizon(rid), f"request {rid!r}: stale quiet horizon"
