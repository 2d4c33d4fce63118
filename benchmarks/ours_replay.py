"""Our side of the vLLM comparison: ``hybridkv simulate``'s own replay, closed, one at a time.

``run_ours`` calls ``hybridkv.sim.replay_trace`` with the options of
``hybridkv simulate LAYOUT --max-num-seqs 1 --arrivals closed`` (the requests
come already loaded, e.g. with ``--output-tokens 1``), so its figures are the
CLI's. The only addition is a measurement: the replay's ``KVCacheManager`` is
swapped for a subclass whose ``free`` also counts the prefix cache's blocks by
kind every ``sample_every`` requests (the peak and the mean under pressure the
vLLM side reports too). It reads the pool and changes no decision.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from unittest import mock

from pressure_mean import PressureMean

import hybridkv.sim.replay as sim_replay
from hybridkv.kv_cache_manager import KVCacheManager
from hybridkv.layouts import ModelLayout
from hybridkv.sim import CostModel, SimOptions, SimResult, device_profile, replay_trace
from hybridkv.sim.census import cached_blocks_by_kind
from hybridkv.sim.trace import TraceRequest


def closed_options(
    memory_bytes: int, policy: str, max_num_batched_tokens: int, max_model_len: int | None = None
) -> SimOptions:
    """``--max-num-seqs 1 --arrivals closed`` at ``memory_bytes`` with ``policy``
    (``max_model_len``: None plans for the layout's own)."""
    return SimOptions(
        memory_bytes=memory_bytes,
        policy=policy,
        max_num_seqs=1,
        max_num_batched_tokens=max_num_batched_tokens,
        arrivals="closed",
        max_model_len=max_model_len,
    )


@dataclass(frozen=True)
class OursResult:
    """A ``SimResult``, the largest cached-block counts seen and their mean
    under pressure (``pressure_mean``), per kind."""

    sim: SimResult
    peak_cached_blocks: dict[str, int]
    pressured_mean_blocks: dict[str, float]


def _sampling_manager(
    every: int, peak: dict[str, int], pressured: list[PressureMean]
) -> type[KVCacheManager]:
    class SamplingManager(KVCacheManager):
        _frees = 0

        def free(self, request: Any) -> bool:
            out = super().free(request)
            self._frees += 1
            if self._frees % every == 0:
                now = cached_blocks_by_kind(self)
                for kind, n in now.items():
                    peak[kind] = max(peak.get(kind, 0), n)
                if not pressured:
                    pressured.append(PressureMean(self.block_pool.num_blocks - 1))
                pressured[0].add(now)
            return out

    return SamplingManager


def run_ours(
    layout: ModelLayout,
    requests: Sequence[TraceRequest],
    options: SimOptions,
    *,
    active_params: float,
    sample_every: int = 10,
    progress: bool = False,
    desc: str = "hybridkv",
) -> OursResult:
    """``replay_trace`` on ``requests`` (module docstring)."""
    cost = CostModel.from_layout(layout, device_profile("h100"), active_params)
    peak: dict[str, int] = {}
    pressured: list[PressureMean] = []
    manager = _sampling_manager(sample_every, peak, pressured)
    with mock.patch.object(sim_replay, "KVCacheManager", manager):
        sim = replay_trace(layout, requests, options, cost, progress=progress, desc=desc)
    for kind, n in sim.cached_blocks.items():
        peak[kind] = max(peak.get(kind, 0), n)
    return OursResult(
        sim,
        {k: peak.get(k, 0) for k in sim.cached_blocks},
        pressured[0].mean() if pressured else {},
    )
