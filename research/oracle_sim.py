"""Replay a trace through the real simulator with the oracle free set (``oracle_free_set``).

Everything is ``hybridkv simulate``'s (scheduler, manager, cost model, trace arrivals,
64 running, the H100 profile) under ``lru``'s caching (every boundary's Mamba state
snapshotted), except the free set: it evicts by the plan's next need. The plan is
each request's reach by default: the longest hit any cache could give it (the
leading full blocks some earlier prompt holds, one token short of the prompt).

``replay_trace`` builds its manager with ``manager_factory``, so ``hooked_replay``
passes a subclass of ``KVCacheManager`` there (no patching of module names). The
subclass records each request's hit (any policy: the per-request comparison of
``offline_ceiling.py``) and, for the oracle, passes the oracle free set and moves the
clock at each hit look-up: requests are admitted in trace order, so a look-up of
request ``r`` means every earlier one was admitted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from oracle_free_set import Clock, Needs, OracleFreeSet, plan_needs

from hybridkv.cache_manager.kv_cache_manager import KVCacheManager
from hybridkv.core.block import KVCacheBlock
from hybridkv.core.hashing import BlockHasher
from hybridkv.core.request import Request
from hybridkv.layouts import ModelLayout
from hybridkv.sim.cost_model import CostModel
from hybridkv.sim.devices import device_profile
from hybridkv.sim.model_params import active_params_for
from hybridkv.sim.options import SimOptions
from hybridkv.sim.replay import replay_trace
from hybridkv.sim.result import SimResult
from hybridkv.sim.trace import TraceRequest
from hybridkv.specs import FullAttentionSpec


def sim_hashes(requests: Sequence[TraceRequest], block_size: int) -> list[list[bytes]]:
    """Each prompt's full-block hashes as the simulator's manager computes them."""
    hasher = BlockHasher(block_size, SimOptions(memory_bytes=1).hash_algo, 0)
    return [hasher.hash_tokens(r.prompt_token_ids()) for r in requests]


def reach(
    requests: Sequence[TraceRequest], hashes: Sequence[Sequence[bytes]], block_size: int
) -> list[int]:
    """Per request, its leading blocks some earlier prompt holds, one token short."""
    seen: set[bytes] = set()
    out = []
    for req, hs in zip(requests, hashes, strict=True):
        cap = min(len(hs), (req.input_length - 1) // block_size)
        k = 0
        while k < len(hs) and hs[k] in seen:
            k += 1
        out.append(min(k, cap))
        seen.update(hs)
    return out


def hooked_manager(
    hits: dict[int, int], clock: Clock | None = None, needs: Needs | None = None
) -> type[KVCacheManager]:
    """A ``KVCacheManager`` that records each request's hit at its first admission
    (``hits[trace index]``, tokens: what the replay's hit rate counts) and, given
    ``needs`` and ``clock``, uses the oracle free set and moves the clock at each
    look-up."""

    class HookedManager(KVCacheManager):
        def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
            if needs is not None:
                assert clock is not None
                (kv_group,) = [
                    i
                    for i, g in enumerate(config.kv_cache_groups)
                    if type(g.kv_cache_spec) is FullAttentionSpec
                ]

                def factory(blocks: list[KVCacheBlock]) -> OracleFreeSet:
                    return OracleFreeSet(blocks, needs, clock, kv_group)

                kwargs["eviction_policy"] = factory
            super().__init__(config, *args, **kwargs)

        def get_computed_blocks(
            self, request: Request, record_stats: bool = True
        ) -> tuple[Any, int]:
            if clock is not None:
                clock.now = max(clock.now, int(request.request_id))
            return super().get_computed_blocks(request, record_stats)

        def allocate_slots(
            self,
            request: Request,
            num_new_tokens: int,
            num_new_computed_tokens: int = 0,
            *args: Any,
            **kwargs: Any,
        ) -> Any:
            out = super().allocate_slots(
                request, num_new_tokens, num_new_computed_tokens, *args, **kwargs
            )
            r = int(request.request_id)
            if out is not None and r not in hits:  # its first admission: the hit counted
                hits[r] = num_new_computed_tokens
            return out

    return HookedManager


def hooked_replay(
    layout: ModelLayout,
    requests: Sequence[TraceRequest],
    options: SimOptions,
    manager: type[KVCacheManager],
) -> SimResult:
    """``replay_trace`` (H100 profile) with ``manager`` building the manager."""
    cost = CostModel.from_layout(layout, device_profile("h100"), active_params_for(layout.name))
    return replay_trace(layout, requests, options, cost, manager_factory=manager)


def oracle_replay(
    layout: ModelLayout,
    requests: Sequence[TraceRequest],
    memory_bytes: int,
    needs: Needs,
    hits: dict[int, int] | None = None,
) -> SimResult:
    """``hybridkv simulate LAYOUT --memory M --policy lru`` with the oracle free set;
    ``hits``: filled with each request's hit (``hooked_manager``)."""
    manager = hooked_manager({} if hits is None else hits, Clock(), needs)
    return hooked_replay(layout, requests, SimOptions(memory_bytes=memory_bytes), manager)


__all__ = ["hooked_manager", "hooked_replay", "oracle_replay", "plan_needs", "reach", "sim_hashes"]
