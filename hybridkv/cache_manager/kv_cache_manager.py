"""``KVCacheManager``: the scheduler-facing API (vLLM v1 names and semantics).

A scheduler step, per request::

    blocks, n_hit = kv.get_computed_blocks(req)           # new requests only
    new = kv.allocate_slots(req, n_new, n_hit, blocks)    # None: out of blocks
    ... run the model; req.num_computed_tokens += n_hit + n_new ...
    req.append_output_token_ids(tok)
    kv.free(req)                                          # finished / preempted

Contracts:
- ``get_computed_blocks`` never changes the cache (stats aside) and never
  returns more than ``num_tokens - 1`` tokens: the last prompt token must run
  to produce logits. A scheduler that may look a request up again (its
  allocation failed) passes ``record_stats=False`` and calls
  ``record_prefix_cache_stats`` once it is admitted, so that it counts once
  (vLLM #43736).
- ``allocate_slots`` is atomic: it either gives every group its blocks, or
  returns ``None`` with every ref count and the free set exactly as before.
- Out of blocks is ``None``, never an exception; bad arguments are
  ``ValueError``s that name the argument.
"""

from __future__ import annotations

import math
from typing import Any

from hybridkv.cache_manager.admission_bound import AdmissionBound
from hybridkv.cache_manager.admissions import admitted, kept_points
from hybridkv.cache_manager.assembly import build_cache
from hybridkv.cache_manager.kv_cache_blocks import KVCacheBlocks
from hybridkv.cache_manager.manager_checks import (
    adopted_hit,
    as_int,
    check_fits,
    check_request,
    check_same_request,
    request_id_of,
)
from hybridkv.cache_manager.quiet import QUIET, STEP, QuietHorizons
from hybridkv.core.events import KVCacheEvent
from hybridkv.core.eviction import PolicyFactory
from hybridkv.core.hashing import BlockHasher
from hybridkv.core.request import Request
from hybridkv.core.stats import PrefixCacheStats
from hybridkv.policy import CACHE_POLICIES, HybridOptions, check_cache_policy
from hybridkv.specs import KVCacheConfig
from hybridkv.specs.base import check_positive_int

__all__ = ["CACHE_POLICIES", "KVCacheManager"]


class KVCacheManager:
    """Paged KV blocks with automatic prefix caching over any mix of groups.

    ``cache_policy``: ``"lru"`` (every computed block cached, least recently
    used evicted first) or ``"hybrid"`` (only what a kept hit point needs,
    ranked by recency and recompute saved per page; ``hybridkv.policy``).
    ``hybrid``: its settings (``HybridOptions``); ``hybrid_*`` keywords
    (``HybridOptions.from_knobs``) set them one by one and change nothing under
    ``lru``. ``eviction_policy`` (a free-set class or factory) overrides the
    free set's ordering under either policy.
    """

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        max_model_len: int,
        *,
        enable_caching: bool = True,
        hash_algo: str = "sha256",
        enable_kv_cache_events: bool = False,
        log_stats: bool = False,
        hash_seed: int = 0,
        eviction_policy: PolicyFactory | None = None,
        cache_policy: str = "lru",
        hybrid: HybridOptions | None = None,
        **hybrid_knobs: Any,
    ) -> None:
        if not isinstance(kv_cache_config, KVCacheConfig):
            raise ValueError(f"kv_cache_config must be a KVCacheConfig, got {kv_cache_config!r}")
        check_positive_int(max_model_len, "max_model_len")
        check_cache_policy(cache_policy)
        self.cache_policy = cache_policy
        options = HybridOptions.from_knobs(hybrid, **hybrid_knobs)
        self.hybrid_options = options
        groups = kv_cache_config.kv_cache_groups
        self.kv_cache_config = kv_cache_config
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.log_stats = log_stats
        self.num_kv_cache_groups = len(groups)
        #: What a step that allocates nothing returns (shared; immutable groups).
        self._no_new = KVCacheBlocks.empty(len(groups))
        self.hash_block_size = math.gcd(*(g.kv_cache_spec.block_size for g in groups))
        # Validate the algorithm even when caching is off: a typo is a typo.
        self.hasher = BlockHasher(self.hash_block_size, hash_algo, hash_seed)
        self._verify_tokens = not self.hasher.is_cryptographic
        self.block_pool, self.coordinator = build_cache(
            kv_cache_config,
            self.hash_block_size,
            enable_caching=enable_caching,
            enable_kv_cache_events=enable_kv_cache_events,
            record_token_ids=self._verify_tokens,
            eviction_policy=eviction_policy,
            cache_policy=cache_policy,
            options=options,
        )
        #: The cache policy (``hybridkv.policy.CachePolicy``), the coordinator's.
        self.policy = self.coordinator.policy
        self.prefix_cache_stats: PrefixCacheStats | None = PrefixCacheStats() if log_stats else None
        # The Request object behind each live request id: another object with
        # the same id (other tokens) must not take over its blocks.
        self._live: dict[str, Request] = {}
        #: The decode steps answered without visiting any group.
        self._quiet = QuietHorizons(self.coordinator, max_model_len, enable_caching)
        #: Waiting requests' last full-attention hits (``cannot_admit``).
        self._admission = AdmissionBound(
            self.coordinator.managers,
            self.block_pool,
            self.coordinator.block_size_lcm,
            max_model_len,
            enabled=enable_caching and not log_stats,
        )

    # -- helpers -------------------------------------------------------------
    def _bind(self, request: Request) -> None:
        request.bind_hasher(self.hasher)

    @property
    def usage(self) -> float:
        """Fraction of usable blocks in use (cached free blocks count as free)."""
        return self.block_pool.usage

    def empty_kv_cache_blocks(self) -> KVCacheBlocks:
        """A ``KVCacheBlocks`` with no block in any group (shared, as vLLM's:
        what a step that allocates nothing returns)."""
        return self._no_new

    # -- the scheduler API ---------------------------------------------------
    def get_computed_blocks(
        self, request: Request, record_stats: bool = True
    ) -> tuple[KVCacheBlocks, int]:
        """The longest cached prefix valid for every group, and its length.

        Does not change the cache: the blocks are only taken by a following
        ``allocate_slots(request, ..., num_new_computed_tokens, blocks)``.
        ``record_stats``: count the lookup in the prefix-cache stats now (else
        the caller does, with ``record_prefix_cache_stats``).
        """
        check_request(request, self.max_model_len)
        if not self.enable_caching:
            return self.empty_kv_cache_blocks(), 0
        self._bind(request)
        max_length = request.num_tokens - 1
        token_ids = request.live_token_ids if self._verify_tokens else None
        blocks, num_hit = self.coordinator.find_longest_cache_hit(
            request.live_block_hashes, max_length, token_ids
        )
        if record_stats:
            self.record_prefix_cache_stats(request, num_hit)
        pool = self.block_pool
        full_hit = self.coordinator.last_full_hit_tokens
        self._admission.remember(request, max(full_hit, num_hit))
        hashes = request.live_block_hashes
        return KVCacheBlocks(blocks, full_hit, pool, pool.generation, hashes), num_hit

    def record_prefix_cache_stats(self, request: Request, num_hits: int) -> None:
        """Count one lookup of ``request`` that hit ``num_hits`` tokens (a preempted
        request's apart). The scheduler calls it when the request is admitted: a
        request looked up again after a failed allocation counts once."""
        if self.prefix_cache_stats is not None:
            self.prefix_cache_stats.record(
                request.num_tokens, num_hits, preempted=request.num_preemptions > 0
            )

    def cannot_admit(self, request: Request, budget: int) -> bool:
        """True only if admitting the waiting ``request`` now must fail:
        ``get_computed_blocks`` then ``allocate_slots`` of
        ``min(num_tokens - hit, budget)`` tokens would return None. Answered
        without a hit scan from the request's last lookup
        (``hybridkv.cache_manager.admission_bound``); False when unsure. Read-only."""
        check_request(request, self.max_model_len)
        if self.coordinator.has_request(request.request_id):
            return False
        return self._admission.cannot_admit(request, budget)

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
    ) -> KVCacheBlocks | None:
        """Give ``request`` slots for ``num_new_tokens`` more tokens.

        ``num_new_computed_tokens`` / ``new_computed_blocks`` adopt a prefix hit
        from ``get_computed_blocks`` (new requests only). ``num_lookahead_tokens``
        reserves extra slots (speculative decoding), never cached. Returns the
        newly allocated blocks per group, or ``None`` (nothing changed) when
        the free blocks do not suffice. Under ``cache_policy="hybrid"`` a
        running request's step first lets the policy have a live request
        give up kept points, when that makes room (``CachePolicy.make_room``).
        """
        if not isinstance(request, Request):
            raise ValueError(f"request must be a hybridkv.Request, got {type(request).__name__}")
        if type(num_new_tokens) is not int:
            num_new_tokens = as_int(num_new_tokens, "num_new_tokens")
        if num_new_tokens <= 0:
            raise ValueError(f"num_new_tokens must be > 0, got {num_new_tokens}")
        rid = request.request_id
        live = self._live.get(rid)
        if (
            live is request
            and new_computed_blocks is None
            and not num_new_computed_tokens
            and not num_lookahead_tokens
        ):
            kind = self._quiet.kind(request, num_new_tokens)
            if kind == QUIET:
                return self._no_new  # the common decode step: no group has anything to do
            if kind == STEP:  # a live request's plain step, in fewer calls
                new = self._quiet.step(request, num_new_tokens)
                if new is not None:
                    return KVCacheBlocks(new) if any(new) else self._no_new
        if live is not request and live is not None:
            check_same_request(live, request)
            self._live[rid] = request
        coordinator = self.coordinator
        hit_blocks = None
        if num_new_computed_tokens or num_lookahead_tokens or new_computed_blocks is not None:
            hit_blocks = adopted_hit(
                request,
                num_new_computed_tokens,
                new_computed_blocks,
                num_lookahead_tokens,
                enable_caching=self.enable_caching,
                is_live=coordinator.has_request(rid),
                pool=self.block_pool,
                managers=coordinator.managers,
                bind=self._bind,
            )
        total_computed = request.num_computed_tokens + num_new_computed_tokens
        num_computed_after = total_computed + num_new_tokens
        if num_computed_after > self.max_model_len or request.num_tokens > self.max_model_len:
            check_fits(request, total_computed, num_new_tokens, self.max_model_len)
        num_tokens_need_slot = min(num_computed_after + num_lookahead_tokens, self.max_model_len)
        admission, kept = kept_points(
            coordinator, request, num_new_computed_tokens, new_computed_blocks
        )
        new_blocks = coordinator.allocate(
            rid, num_tokens_need_slot, hit_blocks, total_computed, kept
        )
        if new_blocks is None:
            return None
        if live is None:
            self._live[rid] = request
            self._admission.forget(rid)
        if admission is not None:
            admitted(self.policy, admission, request)
        if self.enable_caching:
            self._bind(request)
            coordinator.cache_blocks(
                rid,
                request.live_block_hashes,
                request.live_token_ids,
                min(num_computed_after, request.num_tokens),
                request.lora_name,
            )
        self._quiet.update(rid)
        return KVCacheBlocks(new_blocks) if any(new_blocks) else self._no_new

    def free(self, request: Request | str) -> bool:
        """Release a request's blocks (tail first). Unknown request: False.

        ``request``: a ``Request`` or its id; anything else is a ``ValueError``.
        """
        rid = request_id_of(request)
        live = self._live.pop(rid, None)
        self._quiet.forget(rid)
        self._admission.forget(rid)
        if live is None:
            return self.coordinator.free(rid)
        return self.coordinator.free(rid, live.live_block_hashes, live.num_computed_tokens)

    def uncache_uncomputed(self, request: Request) -> int:
        """Take the request's blocks past ``num_computed_tokens`` out of the prefix
        cache; returns how many. Blocks are cached when allocated, before a step
        computes them: call this before freeing a request whose step failed, so
        no later request hits blocks that were never written."""
        return self.coordinator.uncache_from(request.request_id, request.num_computed_tokens)

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """The request's block table per group (0 = null block)."""
        return tuple([b.block_id for b in t] for t in self.coordinator.get_blocks(request_id))

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        """The request's block tables per group, as blocks."""
        return KVCacheBlocks(tuple(list(t) for t in self.coordinator.get_blocks(request_id)))

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block; fails (False) while any block is in use."""
        ok = self.block_pool.reset_prefix_cache()
        if ok and self.prefix_cache_stats is not None:
            self.prefix_cache_stats.reset = True
        return ok

    def take_events(self) -> list[KVCacheEvent]:
        """Drain the KV cache events (empty unless events are enabled)."""
        return self.block_pool.take_events()

    def make_prefix_cache_stats(self) -> PrefixCacheStats | None:
        """Stats since the last call (then reset); None without ``log_stats``."""
        stats = self.prefix_cache_stats
        if stats is None:
            return None
        self.prefix_cache_stats = PrefixCacheStats()
        return stats

    def check_integrity(self) -> None:
        """Assert pool and table invariants (ref counts equal holders:
        ``KVCacheCoordinator.check_integrity``) and this API's registries."""
        self.block_pool.check_integrity()
        self.coordinator.check_integrity()
        live = set(self.coordinator.managers[0].states)
        self._admission.check_integrity(live)
        assert set(self._live) <= live, "a freed request is still registered as live"
        self._quiet.check_integrity(live)
