"""``hybridkv walkthrough``: a worked prefix-caching example on a hybrid model.

The walkthrough drives the manager the way a
scheduler would, on a toy hybrid layout (one full-attention group and one
sliding-window group), and prints every decision: block tables with null
blocks, prefix hits, the free queue, eviction.
"""

from __future__ import annotations

from collections.abc import Callable

from hybridkv import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheManager,
    Request,
    SlidingWindowSpec,
)

BLOCK = 4
WINDOW = 6


def _config(num_blocks: int) -> KVCacheConfig:
    full = FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=8, dtype="bfloat16")
    swa = SlidingWindowSpec(
        block_size=BLOCK, num_kv_heads=2, head_size=8, dtype="bfloat16", sliding_window=WINDOW
    )
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(["layers.0.attn", "layers.2.attn"], full),
            KVCacheGroupSpec(["layers.1.attn", "layers.3.attn"], swa),
        ],
    )


def _tables(kv: KVCacheManager, rid: str) -> str:
    full, swa = kv.get_block_ids(rid)
    return f"full {full}  sliding {swa}"


def _free_queue(kv: KVCacheManager) -> str:
    ids = []
    for b in kv.block_pool.policy:
        ids.append(f"{b.block_id}{'*' if b.block_hash is not None else ''}")
    return " ".join(ids)


def _run(kv: KVCacheManager, req: Request, say: Callable[[str], None], decode: int) -> None:
    blocks, hit = kv.get_computed_blocks(req)
    say(
        f"  lookup: {hit} of {req.num_tokens} prompt tokens cached "
        f"(hit blocks {blocks.get_block_ids()})"
    )
    new = kv.allocate_slots(req, req.num_tokens - hit, hit, blocks)
    assert new is not None, "the demo pool is large enough"
    req.num_computed_tokens = req.num_tokens
    say(f"  prefill {req.num_tokens - hit} tokens -> new blocks {new.get_block_ids()}")
    for step in range(decode):
        req.append_output_token_ids(900 + step)
        got = kv.allocate_slots(req, 1)
        assert got is not None
        req.num_computed_tokens += 1
    if decode:
        say(f"  decode {decode} tokens ({req.num_tokens} in all)")
    say(f"  tables: {_tables(kv, req.request_id)}")
    kv.check_integrity()


def main(say: Callable[[str], None] = print) -> None:
    """Print the worked example."""
    kv = KVCacheManager(
        _config(num_blocks=16), max_model_len=64, log_stats=True, enable_kv_cache_events=True
    )
    say("hybridkv walkthrough: prefix caching on a hybrid layout")
    say(
        f"  groups: full attention + sliding window W={WINDOW}; block_size={BLOCK}; "
        f"15 usable blocks (block 0 is the null block)"
    )
    say("  In a table, 0 is the null block: the sliding group frees blocks that fall")
    say("  wholly out of the window. In the free queue, * marks a cached block.")
    system = list(range(100, 112))  # a 12-token shared system prompt
    say("\n1. Request A: system prompt (12 tokens) + question (3 tokens), 6 decode steps")
    a = Request("A", [*system, 1, 2, 3])
    _run(kv, a, say, decode=6)
    say(f"  free queue: {_free_queue(kv)}")
    say("\n2. A finishes. Its blocks go back tail first: the partial last block (no")
    say("   hash) to the head, cached blocks to the tail, so A's tail is evicted")
    say("   before its prefix.")
    kv.free(a)
    say(f"  free queue: {_free_queue(kv)}")
    say("\n3. Request B: same system prompt, another question. The full group hits")
    say("   blocks A cached; the sliding group needs only the W-1 tokens before the")
    say("   hit, so its earlier blocks come back as null.")
    b = Request("B", [*system, 7, 8, 9, 10])
    _run(kv, b, say, decode=2)
    say("\n4. Request C has another tenant's cache_salt: same tokens, no hit.")
    c = Request("C", [*system, 7, 8, 9, 10], cache_salt="tenant-2")
    _run(kv, c, say, decode=0)
    kv.take_events()  # count only D's evictions below
    d = Request("D", list(range(500, 512)))
    blocks, hit = kv.get_computed_blocks(d)
    say(
        f"\n5. Memory pressure: D ({d.num_tokens} new tokens) needs "
        f"{d.num_tokens // BLOCK} blocks per group but {kv.block_pool.num_free_blocks} are free."
    )
    got = kv.allocate_slots(d, d.num_tokens - hit, hit, blocks)
    say(f"  allocate_slots -> {got} (nothing changed: a scheduler would preempt or wait)")
    kv.free(c)
    say(f"  after freeing C, free queue: {_free_queue(kv)}")
    got = kv.allocate_slots(d, d.num_tokens - hit, hit, blocks)
    assert got is not None
    evicted = sum(1 for e in kv.take_events() if type(e).__name__ == "BlockRemoved")
    say(
        f"  allocate_slots -> new blocks {got.get_block_ids()}; {evicted} cached blocks "
        "evicted (least recently used first)"
    )
    kv.free(b)
    kv.free(d)
    kv.check_integrity()
    stats = kv.make_prefix_cache_stats()
    assert stats is not None
    say(
        f"\nPrefix cache: {stats.requests} lookups, {stats.hits}/{stats.queries} tokens hit "
        f"({stats.hit_rate:.0%}). All blocks free again: "
        f"{kv.block_pool.num_free_blocks} of {kv.block_pool.num_blocks - 1}."
    )
