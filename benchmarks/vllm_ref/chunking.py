"""Where vLLM 0.33's scheduler ends a prefill chunk of a Mamba ("align") hybrid.

Reproduces ``Scheduler._mamba_block_aligned_split``
(``vllm/v1/core/sched/scheduler.py``), which ``Scheduler.schedule`` applies to
every chunk of a model with Mamba layers in ``mamba_cache_mode="align"`` (the
mode prefix caching selects), both for a running request and for a waiting one
at admission. In align mode a Mamba state is written only where a chunk ends,
so this rule decides where states *can* be cached. For the configurations
benchmarked here (no EAGLE block drop, no hash lookahead tokens, hash block size
equal to the block size so no sub-block "partial" hits, and Mamba1 layers, which
export no internal prefill checkpoints), with ``prefill_end =
max(num_prompt_tokens, num_tokens - 1)``:

1. a chunk starting at or past ``prefill_end`` is left alone (decode);
2. a chunk ending before ``prefill_end`` is floored to a block boundary (unless
   that would leave it empty *and* a block is larger than the token budget);
3. the chunk then ends at the earliest of these positions strictly inside it:
   - the next block boundary, when the chunk starts mid-block;
   - the last cacheable boundary, ``(num_tokens - 1) // block * block`` (the
     prompt's last aligned state, which a resend of the same prompt resumes at);
   - the shared-prefix junction, floored to a block from the chunk's start,
     when the junction lies strictly inside the chunk. The junction is
     ``Request.shared_prefix_boundary``, which the scheduler sets at admission
     from ``KVCacheManager.get_computed_blocks``'s third result: the longest
     single-group hit (the full-attention hit) when it runs past the
     reconciled hit, i.e. a prefix another request computed whose Mamba state
     is not cached; else 0.

``mamba_chunk_tokens`` returns the chunk's token count, as vLLM's does.
"""

from __future__ import annotations


def mamba_chunk_tokens(
    start: int,
    num_new_tokens: int,
    *,
    num_prompt_tokens: int,
    num_tokens: int,
    block_size: int,
    junction: int,
    max_prefill_tokens: int,
) -> int:
    """Tokens of a chunk from ``start`` clipped as vLLM's align-mode scheduler does."""
    prefill_end = max(num_prompt_tokens, num_tokens - 1)
    if start >= prefill_end:
        return num_new_tokens
    end = start + num_new_tokens
    if end < prefill_end:
        floored = end - end % block_size
        if floored > start or block_size <= max_prefill_tokens:
            end = floored
    candidates = [(num_tokens - 1) // block_size * block_size]
    if start % block_size:
        candidates.append(start - start % block_size + block_size)
    if start < junction < end:
        candidates.append(start + (junction - start) // block_size * block_size)
    inside = [s for s in candidates if start < s < end]
    if inside:
        end = min(inside)
    return max(end - start, 0)


def vllm_chunk_rule(vl: object, block_size: int, max_prefill_tokens: int) -> object:
    """vLLM's own ``Scheduler._mamba_block_aligned_split``, run from its source file.

    Returns a function with ``mamba_chunk_tokens``'s signature that calls vLLM's
    method on a stand-in scheduler holding this module's configuration (see the
    module docstring) and a stand-in request. Used to check the rule above.
    """
    from types import SimpleNamespace

    from vllm_ref.source import source_functions

    ki = vl.kv_cache_interface  # type: ignore[attr-defined]
    path = vl.src / "vllm" / "v1" / "core" / "sched" / "scheduler.py"  # type: ignore[attr-defined]
    ns = {
        "get_mamba_prefill_checkpoint_position": ki.get_mamba_prefill_checkpoint_position,
        "is_mamba_prefill_checkpoint_valid": ki.is_mamba_prefill_checkpoint_valid,
    }
    name = "Scheduler._mamba_block_aligned_split"
    split = source_functions(path, (name,), ns)[name]
    sched = SimpleNamespace(
        cache_config=SimpleNamespace(block_size=block_size),
        block_size=block_size,
        hash_block_size=block_size,
        mamba_partial_cache_hit=False,
        mamba_shared_prefix_checkpoint=False,
        use_eagle_block_drop=False,
        num_hash_lookahead_tokens=0,
        mamba_has_prefill_checkpoint_blocks=False,
        mamba_prefill_checkpoint_alignment=None,
        max_num_scheduled_tokens=max_prefill_tokens,
        scheduler_config=SimpleNamespace(long_prefill_token_threshold=0),
    )

    def rule(
        start: int,
        num_new_tokens: int,
        *,
        num_prompt_tokens: int,
        num_tokens: int,
        block_size: int,
        junction: int,
        max_prefill_tokens: int,
    ) -> int:
        assert block_size == sched.block_size
        assert max_prefill_tokens == sched.max_num_scheduled_tokens
        req = SimpleNamespace(
            num_computed_tokens=start,
            num_prompt_tokens=num_prompt_tokens,
            num_tokens=num_tokens,
            shared_prefix_boundary=junction,
        )
        return int(split(sched, req, num_new_tokens))

    return rule
