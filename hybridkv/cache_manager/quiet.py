"""``QuietHorizons``: the decode steps ``KVCacheManager.allocate_slots``
answers without visiting any group, and the other plain steps of live requests
(``KVCacheCoordinator.extend``).

A live request's *quiet horizon* (``KVCacheCoordinator.quiet_horizon``) is
``(cover, release_at, cache_at)``: while the tokens needing slots stay
``<= cover``, the computed tokens ``< release_at`` and the tokens to cache
``< cache_at``, an allocation allocates, releases and caches nothing. The
manager sets a request's horizon after every ``allocate_slots`` that gets past
this check (its tables may have changed) and drops it on ``free``::

    computed      10      11        12
    cover (12)    ok      ok        ok        slots for 12 tokens exist
    release (11)  ok      a window block falls out: not quiet

Any other plain step of a live request (no hit adopted, no lookahead) goes
to ``KVCacheCoordinator.extend``, which does what the general path would with
fewer calls, and the new horizon follows from that pass. Below ``release_at``
no group can release a block, so nothing is counted or released for it
(a *calm* step: it only extends tables and caches full blocks; ``release_at``
stays); at or past it, the releases are counted and applied as the general
path does.
"""

from __future__ import annotations

from hybridkv.coordinators import KVCacheCoordinator
from hybridkv.core.block import KVCacheBlock
from hybridkv.core.request import Request
from hybridkv.managers.base import NEVER

#: ``QuietHorizons.kind``: nothing to do; ``QuietHorizons.step``; the general path.
QUIET, STEP, GENERAL = 0, 1, 2


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

    def kind(self, request: Request, num_new_tokens: int) -> int:
        """What a plain step of ``num_new_tokens`` (no hit, no lookahead) of the
        live ``request`` must do: ``QUIET`` (nothing in any group), ``STEP``
        (``step``: it allocates, caches or releases) or ``GENERAL`` (no
        horizon, or past ``max_model_len``: ``allocate_slots``'s full path,
        which raises). Read-only."""
        h = self.horizons.get(request.request_id)
        if h is None:
            return GENERAL
        total = request.num_computed_tokens
        after = total + num_new_tokens
        n = request.num_tokens
        if n > self.max_model_len or after > self.max_model_len:
            return GENERAL
        if after <= h[0] and total < h[1] and min(after, n) < h[2]:
            return QUIET
        return STEP

    def step(self, request: Request, num_new_tokens: int) -> tuple[list[KVCacheBlock], ...] | None:
        """Apply a ``STEP``: the new blocks per group, the horizon updated;
        ``None`` (nothing changed) when they do not fit."""
        rid = request.request_id
        h = self.horizons[rid]
        done = self.coordinator.extend(request, num_new_tokens, request.num_computed_tokens >= h[1])
        if done is None:
            return None
        new, cover, release_at, cache_at = done
        if release_at is None:
            release_at = h[1]
        if not self.enable_caching:
            cache_at = NEVER
        self.horizons[rid] = (min(cover, self.max_model_len), release_at, cache_at)
        return new

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
