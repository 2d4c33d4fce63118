"""What ``KVCacheManager`` tells its cache policy about an admission.

A request admitted with a prefix lookup is handed to the policy as plain data
(``hybridkv.policy.Admission``): before its first allocation the policy names
its kept points (``CachePolicy.kept_points``), and once the allocation
succeeded it learns from it (``CachePolicy.admit``) and may answer the
request's returning turn, which the request keeps for a later resumption.
The manager decides nothing here: it only passes the data on.
"""

from __future__ import annotations

from hybridkv.cache_manager.kv_cache_blocks import KVCacheBlocks
from hybridkv.coordinators import KVCacheCoordinator
from hybridkv.core.request import Request
from hybridkv.policy import Admission, CachePolicy


def kept_points(
    coordinator: KVCacheCoordinator,
    request: Request,
    num_hit: int,
    blocks: KVCacheBlocks | None,
) -> tuple[Admission | None, tuple[int, ...]]:
    """A request about to be allocated: its admission and kept points when it
    is admitted with a prefix lookup (``blocks`` given, not live yet) under a
    policy that keeps points; else ``(None, ())`` (a call without a lookup
    keeps none)."""
    if not coordinator.hybrid or blocks is None or coordinator.has_request(request.request_id):
        return None, ()
    admission = admission_of(request, num_hit, blocks)
    return admission, coordinator.policy.kept_points(admission)


def admission_of(request: Request, num_hit: int, blocks: KVCacheBlocks | None) -> Admission:
    """What the policy learns from ``request`` admitted with a prefix lookup
    that found ``num_hit`` tokens (``blocks``: what it found; None: nothing)."""
    return Admission(
        request.request_id,
        num_hit,
        0 if blocks is None else blocks.full_hit_tokens,  # whole blocks, all hashed
        request.num_tokens,
        request.num_prompt_tokens,
        request.live_block_hashes,
        request.packed_prompt,
        request.num_preemptions > 0,
        request.returning,
    )


def admitted(policy: CachePolicy, admission: Admission, request: Request) -> None:
    """The allocation of ``admission`` succeeded: the policy learns from it;
    the request keeps the returning turn it answers (if any)."""
    turn = policy.admit(admission)
    if turn is not None:
        request.returning = turn
