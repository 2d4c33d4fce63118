"""Small factories for the worked-example tests: specs, configs, requests, steps.

Every spec uses one KV head of size 8 in float16 unless told otherwise, so an
attention page is ``2 * bs * 1 * 8 * 2 = 32 * bs`` bytes. Configs are built
without backing tensors (bookkeeping only); group ``g`` holds one layer named
``f"layer{g}"``.
"""

from __future__ import annotations

from collections.abc import Sequence

from hybridkv import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheBlocks,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheManager,
    KVCacheSpec,
    MambaSpec,
    Request,
    SlidingWindowSpec,
)

HEADS = 1
HEAD_SIZE = 8
DTYPE = "float16"


# -- specs ---------------------------------------------------------------------
def full(bs: int) -> FullAttentionSpec:
    return FullAttentionSpec(bs, HEADS, HEAD_SIZE, DTYPE)


def swa(bs: int, window: int) -> SlidingWindowSpec:
    return SlidingWindowSpec(bs, HEADS, HEAD_SIZE, DTYPE, sliding_window=window)


def chunked(bs: int, chunk: int) -> ChunkedLocalAttentionSpec:
    return ChunkedLocalAttentionSpec(bs, HEADS, HEAD_SIZE, DTYPE, attention_chunk_size=chunk)


def mamba(bs: int) -> MambaSpec:
    # conv state (3, 4) + SSM state (2, 4), float32: (12 + 8) * 4 = 80 bytes.
    return MambaSpec(bs, shapes=((3, 4), (2, 4)), dtypes=("float32", "float32"))


# -- configs and managers --------------------------------------------------------
def config(num_blocks: int, *specs: KVCacheSpec) -> KVCacheConfig:
    """One group per spec, one layer per group, no backing tensors."""
    groups = [KVCacheGroupSpec([f"layer{g}"], s) for g, s in enumerate(specs)]
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)


def manager(
    num_blocks: int, *specs: KVCacheSpec, max_model_len: int = 1024, **kwargs: object
) -> KVCacheManager:
    return KVCacheManager(config(num_blocks, *specs), max_model_len, **kwargs)  # type: ignore[arg-type]


# -- requests --------------------------------------------------------------------
def toks(n: int, start: int = 100) -> list[int]:
    """``n`` distinct token ids ``start, start+1, ...``."""
    return list(range(start, start + n))


def req(rid: str, tokens: int | Sequence[int], **kwargs: object) -> Request:
    """A request; an int ``tokens`` means ``toks(tokens)``."""
    ids = toks(tokens) if isinstance(tokens, int) else list(tokens)
    return Request(rid, ids, **kwargs)  # type: ignore[arg-type]


# -- scheduler steps -------------------------------------------------------------
def run_step(kv: KVCacheManager, r: Request, n: int) -> KVCacheBlocks | None:
    """Allocate ``n`` more tokens; on success advance ``num_computed_tokens``."""
    new = kv.allocate_slots(r, n)
    if new is not None:
        r.num_computed_tokens += n
    return new


def prefill(kv: KVCacheManager, r: Request) -> KVCacheBlocks:
    """Allocate the whole prompt without looking up the prefix cache."""
    new = run_step(kv, r, r.num_tokens - r.num_computed_tokens)
    assert new is not None, "out of blocks while prefilling"
    return new


def admit(kv: KVCacheManager, r: Request) -> tuple[int, KVCacheBlocks]:
    """Look up the prefix, adopt the hit and prefill the rest of the prompt.

    Returns ``(num_hit, new_blocks)``; fails the test when out of blocks.
    """
    hit_blocks, num_hit = kv.get_computed_blocks(r)
    new = kv.allocate_slots(r, r.num_tokens - num_hit, num_hit, hit_blocks)
    assert new is not None, "out of blocks while admitting"
    r.num_computed_tokens = r.num_tokens
    return num_hit, new


def serve(kv: KVCacheManager, rid: str, tokens: list[int]) -> int:
    """A whole request: admit it with its prefix hit, compute the prompt, free it,
    check the manager; returns the hit."""
    r = Request(rid, tokens)
    num_hit, _ = admit(kv, r)
    kv.free(r)
    kv.check_integrity()
    return num_hit


def decode(kv: KVCacheManager, r: Request, token: int) -> KVCacheBlocks | None:
    """Append a sampled token and allocate its slot (one decode step)."""
    r.append_output_token_ids(token)
    return run_step(kv, r, 1)


def hit_len(kv: KVCacheManager, r: Request) -> int:
    """Length of the prefix hit ``get_computed_blocks`` reports for ``r``."""
    return kv.get_computed_blocks(r)[1]


def hit_ids(kv: KVCacheManager, r: Request) -> tuple[list[int], ...]:
    """Block ids of ``r``'s prefix hit, per group."""
    return kv.get_computed_blocks(r)[0].get_block_ids()


def free_ids(kv: KVCacheManager) -> list[int]:
    """Free queue, next-to-reuse first."""
    return [b.block_id for b in kv.block_pool.policy]


def ref_counts(kv: KVCacheManager) -> list[int]:
    """Ref count of every block, index = block id."""
    return [b.ref_cnt for b in kv.block_pool.blocks]


def free_classes(kv: KVCacheManager) -> dict[int, int]:
    """Value class of every free block that has one (cost-aware policy), by id."""
    return {b.block_id: b.free_class for b in kv.block_pool.policy if b.free_class is not None}


def cached_ids(kv: KVCacheManager) -> set[int]:
    """Ids of blocks that currently hold a hash."""
    return {b.block_id for b in kv.block_pool.blocks if b.block_hash is not None}
