"""Replay trace requests through vLLM 0.33's real ``KVCacheManager``, one at a time.

The set-up of ``hybridkv simulate LAYOUT --max-num-seqs 1 --arrivals closed``:
each request is admitted once the one before it has finished; its prompt is
computed in chunks of at most ``max_num_batched_tokens``; it samples its output
tokens one step at a time; then it is freed. What runs is vLLM's own manager
(``vllm/v1/core/kv_cache_manager.py``: ``KVCacheManager``, its
``HybridKVCacheCoordinator`` / ``UnitaryKVCacheCoordinator``, the single-type
managers incl. ``MambaManager`` in align mode, ``BlockPool``) and vLLM's own
``Request`` with its block hasher. The loop around it is ours and makes, in the
same order and with the same arguments, the manager calls vLLM's synchronous
``Scheduler`` (``vllm/v1/core/sched/scheduler.py``) makes for one running
request and no KV connector, speculative decoding, encoder or LoRA:

- ``Scheduler.schedule``: ``kv_cache_manager.new_step_starts()`` first, every step;
- waiting request (``num_computed_tokens == 0``): ``get_computed_blocks(request)``,
  whose third result the scheduler stores as ``request.shared_prefix_boundary``;
  ``num_new_tokens = num_tokens - hit``, capped by the token budget, then (Mamba
  align only) ``_mamba_block_aligned_split`` (``vllm_ref.chunking``); then
  ``allocate_slots(request, num_new_tokens, num_new_computed_tokens=hit,
  new_computed_blocks=..., num_lookahead_tokens=0,
  full_sequence_must_fit=scheduler_reserve_full_isl (True by default),
  has_scheduled_reqs=False)``; then ``status = RUNNING``,
  ``num_computed_tokens = hit``;
- running request: ``num_new_tokens = num_tokens - num_computed_tokens``, capped,
  split as above, ``allocate_slots(request, num_new_tokens, num_lookahead_tokens=0)``;
- ``_update_after_schedule``: ``num_computed_tokens += num_new_tokens``;
- ``update_from_output``: a step reaching ``num_tokens`` samples one token
  (``request.append_output_token_ids``, which hashes newly full blocks); at
  ``max_tokens`` the request finishes and ``_free_request`` ->
  ``kv_cache_manager.free(request)``.

Not reproduced: vLLM enables async scheduling by default, which schedules a
request's next chunk while the previous one is in flight. That changes no hit or
caching decision here (one request at a time; blocks are cached at allocation),
only when ``remove_skipped_blocks`` returns a request's superseded Mamba state
blocks (one step later, on the processed-token basis), i.e. a few transient
blocks per request. Runs here are synchronous (``max_concurrent_batches = 1``).

The figures: hit tokens at admission (the scheduler's
``num_new_local_computed_tokens``), blocks in vLLM's prefix cache by kind at the
end (a block is cached while it carries a block hash; its group is in the hash
key), and the largest count of cached blocks per kind seen after a request is
freed, sampled every ``sample_every`` requests.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from pressure_mean import PressureMean
from vllm_ref.chunking import mamba_chunk_tokens

from hybridkv.sim.census import KIND_ORDER
from hybridkv.sim.trace import OUTPUT_TOKEN_BASE, TraceRequest

KIND_OF_SPEC = {
    "FullAttentionSpec": "full",
    "SlidingWindowSpec": "sliding_window",
    "ChunkedLocalAttentionSpec": "chunked_local",
    "MambaSpec": "mamba",
}


@dataclass
class VllmReplayResult:
    """What one replay through vLLM's manager measured."""

    retention: int | None
    num_requests: int
    prompt_tokens: int
    hit_tokens: int
    cached_blocks: dict[str, int]
    peak_cached_blocks: dict[str, int]
    steps: int
    pressured_mean_blocks: dict[str, float]
    seconds: float
    junction_chunks: int = 0
    chunk_rule_checks: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def token_hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def group_kinds(config: Any) -> list[str]:
    """The kind (``full``, ``sliding_window``, ``mamba``...) of each vLLM group."""
    return [KIND_OF_SPEC[type(g.kv_cache_spec).__name__] for g in config.kv_cache_groups]


def cached_blocks_by_kind(kv: Any, kinds: list[str], get_group_id: Callable) -> dict[str, int]:
    """Blocks of vLLM's pool that carry a block hash, per kind of their group."""
    counts = {k: 0 for k in KIND_ORDER if k in kinds}
    for block in kv.block_pool.blocks:
        key = block.block_hash
        if key is not None:
            counts[kinds[get_group_id(key)]] += 1
    return counts


class VllmCacheReplay:
    """Drives one vLLM ``KVCacheManager`` as its scheduler would (module docstring)."""

    def __init__(
        self,
        vl: SimpleNamespace,
        config: Any,
        *,
        max_model_len: int,
        scheduler_block_size: int,
        hash_block_size: int,
        max_num_batched_tokens: int = 8192,
        hash_algo: str = "sha256",
        chunk_rule_check: Callable[..., int] | None = None,
    ) -> None:
        self.vl = vl
        self.config = config
        self.kinds = group_kinds(config)
        self.budget = max_num_batched_tokens
        self.block_size = scheduler_block_size
        self.kv = vl.KVCacheManager(
            config,
            max_model_len=max_model_len,
            scheduler_block_size=scheduler_block_size,
            hash_block_size=hash_block_size,
            max_in_flight_tokens=max_num_batched_tokens,
            enable_caching=True,
            log_stats=False,
        )
        hash_fn = vl.hashing.get_hash_fn_by_name(hash_algo)
        vl.kv_cache_utils.init_none_hash(hash_fn)
        self.hasher = vl.kv_cache_utils.get_request_block_hasher(hash_block_size, hash_fn)
        ki = vl.kv_cache_interface
        self.mamba_align = any(
            isinstance(g.kv_cache_spec, ki.MambaSpec) for g in config.kv_cache_groups
        )
        self.chunk_rule_check = chunk_rule_check
        self.junction_chunks = 0
        self.chunk_rule_checks = 0
        self.steps = 0

    def _chunk(self, req: Any, start: int) -> int:
        """Tokens the scheduler gives ``req``'s next step from ``start``."""
        n = min(req.num_tokens - start, self.budget)
        if not self.mamba_align:
            return n
        kw = dict(
            num_prompt_tokens=req.num_prompt_tokens,
            num_tokens=req.num_tokens,
            block_size=self.block_size,
            junction=req.shared_prefix_boundary,
            max_prefill_tokens=self.budget,
        )
        out = mamba_chunk_tokens(start, n, **kw)
        if self.chunk_rule_check is not None:
            theirs = self.chunk_rule_check(start, n, **kw)
            if theirs != out:
                raise AssertionError(f"chunk rule differs from vLLM's: {out} vs {theirs} ({kw})")
            self.chunk_rule_checks += 1
        if out and start + out == req.shared_prefix_boundary:
            self.junction_chunks += 1
        return out

    def _serve(self, req: Any, out_base: int) -> int:
        """Admit, prefill, sample and free one request; its hit tokens at admission."""
        vl, kv = self.vl, self.kv
        kv.new_step_starts()
        blocks, hit, junction = kv.get_computed_blocks(req)
        req.shared_prefix_boundary = junction
        n = self._chunk(req, hit)
        new = kv.allocate_slots(
            req,
            n,
            num_new_computed_tokens=hit,
            new_computed_blocks=blocks,
            num_lookahead_tokens=0,
            full_sequence_must_fit=True,
            has_scheduled_reqs=False,
        )
        if new is None:
            raise RuntimeError(
                f"vLLM cannot admit request {req.request_id} ({req.num_tokens} tokens) "
                f"with {self.config.num_blocks} blocks"
            )
        req.status = vl.RequestStatus.RUNNING
        req.num_computed_tokens = hit
        while True:
            self.steps += 1
            req.num_computed_tokens += n
            if req.num_computed_tokens == req.num_tokens:
                req.append_output_token_ids(out_base + req.num_output_tokens)
                if req.num_output_tokens >= req.max_tokens:
                    req.status = vl.RequestStatus.FINISHED_LENGTH_CAPPED
                    kv.free(req)
                    return hit
            kv.new_step_starts()
            n = self._chunk(req, req.num_computed_tokens)
            if n == 0 or kv.allocate_slots(req, n, num_lookahead_tokens=0) is None:
                raise RuntimeError(
                    f"vLLM cannot schedule request {req.request_id} alone "
                    f"({n} tokens at {req.num_computed_tokens}) with "
                    f"{self.config.num_blocks} blocks"
                )

    def run(
        self,
        requests: Sequence[TraceRequest],
        *,
        sample_every: int = 10,
        progress: bool = False,
        desc: str = "vllm",
    ) -> VllmReplayResult:
        """Replay ``requests`` in order (module docstring)."""
        vl = self.vl
        get_group_id = vl.kv_cache_utils.get_group_id
        t0 = time.perf_counter()
        bar = _bar(len(requests), desc) if progress else None
        hit_tokens = 0
        next_out = OUTPUT_TOKEN_BASE
        peak = cached_blocks_by_kind(self.kv, self.kinds, get_group_id)
        pressured = PressureMean(self.config.num_blocks - 1)
        try:
            for k, tr in enumerate(requests):
                req = vl.Request(
                    request_id=str(k),
                    prompt_token_ids=tr.prompt_token_ids(),
                    sampling_params=vl.SamplingParams(max_tokens=tr.output_length),
                    pooling_params=None,
                    block_hasher=self.hasher,
                )
                hit_tokens += self._serve(req, next_out)
                next_out += tr.output_length
                if (k + 1) % sample_every == 0:
                    now = cached_blocks_by_kind(self.kv, self.kinds, get_group_id)
                    peak = {kind: max(peak[kind], now[kind]) for kind in peak}
                    pressured.add(now)
                if bar is not None:
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()
        end = cached_blocks_by_kind(self.kv, self.kinds, get_group_id)
        peak = {kind: max(peak[kind], end[kind]) for kind in peak}
        return VllmReplayResult(
            retention=self.config.prefix_cache_retention_interval,
            num_requests=len(requests),
            prompt_tokens=sum(r.input_length for r in requests),
            hit_tokens=hit_tokens,
            cached_blocks=end,
            peak_cached_blocks=peak,
            steps=self.steps,
            pressured_mean_blocks=pressured.mean(),
            seconds=time.perf_counter() - t0,
            junction_chunks=self.junction_chunks,
            chunk_rule_checks=self.chunk_rule_checks,
        )


def _bar(total: int, desc: str) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="req", file=sys.stderr, dynamic_ncols=True)
