"""Our side of the vLLM comparison: ``hybridkv simulate``'s own replay, closed, one at a time.

``run_ours`` calls ``hybridkv.sim.replay_trace`` with the options of
``hybridkv simulate LAYOUT --max-num-seqs 1 --arrivals closed`` (the requests
come already loaded, e.g. with ``--output-tokens 1``), so its figures are the
CLI's. The only addition is a measurement: ``replay_trace``'s ``on_finished`` hook
counts the prefix cache's blocks by kind every ``sample_every`` finished requests
(the peak and the mean under pressure the vLLM side reports too). It reads the pool
and changes no decision.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pressure_mean import PressureMean

from hybridkv.cache_manager.kv_cache_manager import KVCacheManager
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


def _sampler(
    every: int, peak: dict[str, int], pressured: list[PressureMean]
) -> Callable[[KVCacheManager, int], None]:
    """``replay_trace``'s ``on_finished``: the cached blocks by kind after every
    ``every``-th finished request."""
    done = [0]

    def sample(manager: KVCacheManager, n: int) -> None:
        before, done[0] = done[0], done[0] + n
        if done[0] // every == before // every:
            return
        now = cached_blocks_by_kind(manager)
        for kind, blocks in now.items():
            peak[kind] = max(peak.get(kind, 0), blocks)
        if not pressured:
            pressured.append(PressureMean(manager.block_pool.num_blocks - 1))
        pressured[0].add(now)

    return sample


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
    sample = _sampler(sample_every, peak, pressured)
    sim = replay_trace(
        layout, requests, options, cost, progress=progress, desc=desc, on_finished=sample
    )
    for kind, n in sim.cached_blocks.items():
        peak[kind] = max(peak.get(kind, 0), n)
    return OursResult(
        sim,
        {k: peak.get(k, 0) for k in sim.cached_blocks},
        pressured[0].mean() if pressured else {},
    )
