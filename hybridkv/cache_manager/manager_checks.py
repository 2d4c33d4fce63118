"""The argument checks of ``KVCacheManager``'s scheduler API.

Each raises a ``ValueError`` that names the argument and what to pass
instead; none changes anything. ``KVCacheManager`` runs them before it acts,
so a bad call leaves the cache as it was.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any, cast

from hybridkv.cache_manager.kv_cache_blocks import KVCacheBlocks
from hybridkv.core.block import KVCacheBlock
from hybridkv.core.block_pool import BlockPool
from hybridkv.core.request import Request
from hybridkv.managers.base import SingleTypeKVCacheManager


def as_int(value: object, field: str) -> int:
    """An integer argument (numpy ints accepted); ``ValueError`` otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"{field} must be an int, got {value!r}")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(f"{field} must be an int, got {value!r}") from None


def check_request(request: object, max_model_len: int) -> None:
    """A ``Request`` of at most ``max_model_len`` tokens."""
    if not isinstance(request, Request):
        raise ValueError(f"request must be a hybridkv.Request, got {type(request).__name__}")
    if request.num_tokens > max_model_len:
        raise ValueError(
            f"request {request.request_id!r} has {request.num_tokens} tokens, more than "
            f"max_model_len={max_model_len}"
        )


def request_id_of(request: object) -> str:
    """The id of ``request``, a ``Request`` or a request id (str)."""
    if isinstance(request, str):
        return request
    if isinstance(request, Request):
        return request.request_id
    raise ValueError(f"request must be a hybridkv.Request or a request id (str), got {request!r}")


def check_same_request(live: Request, request: Request) -> None:
    """``request`` reuses a live request's id: fine only for the same tokens
    (a caller may rebuild its ``Request``; it then takes the old one's place)."""
    if live.live_token_ids != request.live_token_ids or live.num_computed_tokens != (
        request.num_computed_tokens
    ):
        raise ValueError(
            f"request: another Request with id {request.request_id!r} (other tokens or "
            "num_computed_tokens) holds blocks in this manager; request ids must be "
            "unique among live requests (free the old one first)"
        )


def check_counts(num_new_computed_tokens: int, num_lookahead_tokens: int) -> None:
    """Both counts are ``>= 0``."""
    if num_new_computed_tokens < 0:
        raise ValueError(f"num_new_computed_tokens must be >= 0, got {num_new_computed_tokens}")
    if num_lookahead_tokens < 0:
        raise ValueError(f"num_lookahead_tokens must be >= 0, got {num_lookahead_tokens}")


def check_fits(
    request: Request, total_computed: int, num_new_tokens: int, max_model_len: int
) -> None:
    """Raise: the request, or its computed tokens after this step, exceed
    ``max_model_len`` (called once the caller saw that one of them does)."""
    check_request(request, max_model_len)
    raise ValueError(
        f"request {request.request_id!r}: num_computed_tokens ({total_computed}) + "
        f"num_new_tokens ({num_new_tokens}) exceeds max_model_len={max_model_len}"
    )


def adopted_hit(
    request: Request,
    num_new_computed_tokens: int,
    new_computed_blocks: KVCacheBlocks | None,
    num_lookahead_tokens: int,
    **context: Any,
) -> tuple[list, ...] | None:
    """The counts are valid, and the prefix hit to adopt per group
    (``check_new_computed``, with ``context``), or None when there is none."""
    check_counts(num_new_computed_tokens, num_lookahead_tokens)
    if num_new_computed_tokens or (
        new_computed_blocks is not None and any(new_computed_blocks.blocks)
    ):
        return check_new_computed(request, num_new_computed_tokens, new_computed_blocks, **context)
    return None


def check_new_computed(
    request: Request,
    num_new_computed_tokens: int,
    new_computed_blocks: KVCacheBlocks | None,
    *,
    enable_caching: bool,
    is_live: bool,
    pool: BlockPool,
    managers: Sequence[SingleTypeKVCacheManager],
    bind: Callable[[Request], None],
) -> tuple[list, ...]:
    """A prefix hit to adopt: ``get_computed_blocks``' blocks for this new (or
    preempted) request, still valid, covering ``num_new_computed_tokens`` in
    every group. Returns the blocks per group. ``bind`` hashes the request
    (before its hashes are compared)."""
    rid = request.request_id
    if not enable_caching:
        raise ValueError("num_new_computed_tokens / new_computed_blocks need prefix caching")
    if new_computed_blocks is None:
        raise ValueError("num_new_computed_tokens > 0 needs new_computed_blocks")
    if is_live or request.num_computed_tokens:
        raise ValueError(
            f"request {rid!r} already has computed tokens or blocks; prefix hits "
            "(new_computed_blocks) apply only to a new or preempted request"
        )
    if num_new_computed_tokens >= request.num_tokens:
        raise ValueError(
            f"num_new_computed_tokens={num_new_computed_tokens} must be < the "
            f"request's {request.num_tokens} tokens"
        )
    if not isinstance(new_computed_blocks, KVCacheBlocks):
        raise ValueError(
            "new_computed_blocks must be the KVCacheBlocks of get_computed_blocks, got "
            f"{type(new_computed_blocks).__name__}"
        )
    blocks = new_computed_blocks.blocks
    if len(blocks) != len(managers):
        raise ValueError(
            f"new_computed_blocks has {len(blocks)} groups, the config has {len(managers)}"
        )
    bind(request)
    hashes = request.live_block_hashes
    own = new_computed_blocks.pool is pool
    if not own:
        check_own_blocks(pool, blocks)
    # Found by this pool for this request, and nothing left the index since.
    fresh = (
        own
        and new_computed_blocks.generation == pool.generation
        and (new_computed_blocks.hashes is hashes)
    )
    for m, group_blocks in zip(managers, blocks, strict=True):
        if len(group_blocks) * m.block_size != num_new_computed_tokens:
            raise ValueError(
                f"new_computed_blocks of group {m.group_id} cover "
                f"{len(group_blocks) * m.block_size} tokens, not "
                f"num_new_computed_tokens={num_new_computed_tokens}"
            )
        if fresh:
            continue
        view = m.group_hashes(hashes)
        for i, b in enumerate(group_blocks):
            if not b.is_null and (b.block_hash != view[i] or b.group_id != m.group_id):
                raise ValueError(
                    f"new_computed_blocks are stale (block {b.block_id} of group "
                    f"{m.group_id} was evicted or reused since get_computed_blocks); "
                    "call get_computed_blocks again"
                )
    # Lists from get_computed_blocks; a caller's own sequences work alike
    # (the coordinator and managers only read them, and copy them into tables).
    return cast("tuple[list[KVCacheBlock], ...]", blocks)


def check_own_blocks(pool: BlockPool, blocks: tuple[Sequence[KVCacheBlock], ...]) -> None:
    """Every block is one of ``pool``'s (not another manager's). One by one:
    only for blocks that did not come from this manager's ``get_computed_blocks``
    (those carry its pool)."""
    own = pool.blocks
    try:
        foreign: object = next(
            (b for group in blocks for b in group if own[b.block_id] is not b), None
        )
    except (AttributeError, IndexError, TypeError):
        foreign = "an object that is not a block of any pool"
    if foreign is not None:
        raise ValueError(
            f"new_computed_blocks hold {foreign!r}, which is not a block of this manager's "
            "pool (another manager's?); pass what this manager's get_computed_blocks returned"
        )
