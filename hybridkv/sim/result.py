"""``SimResult``: what one replay measured, and its JSON form.

Token counts:

- ``prompt_tokens``: the replayed prompts' tokens;
- ``hit_tokens``: the prefix-cache hit of each request at its first
  admission, summed (``token_hit_rate = hit_tokens / prompt_tokens``);
- ``full_match_tokens``: how far the full-attention groups alone matched at
  the same admissions, summed (``full_match_rate``; >= ``hit_tokens``). The
  difference is what missing sliding-window blocks, chunks or Mamba states
  cost: a hit needs every group. Without full attention, the hit itself;
- ``prefill_tokens``: tokens computed in prefill chunks, including the
  recomputation of preempted requests; ``decode_tokens``: one-token steps past
  the prompt. Every computed token is one or the other;
- ``tiers`` (with ``--host-memory``, ``TierFigures``): the tokens the host and
  disk tiers add to each request's device hit at its first admission, loaded
  rather than computed (``host_hit_rate``, ``disk_hit_rate``;
  ``hybridkv.sim.tier_replay``); ``prefill_tokens`` then excludes them;
- ``output_tokens``: tokens sampled (the last one of a request is sampled,
  never computed, so without preemption ``decode = output - requests``).

``in_use_mean`` / ``in_use_p50``: the share of the usable blocks that live
requests hold (their tables, and under ``hybrid`` the blocks they retain for
kept points) after each step's allocation, averaged over the steps / at the
median step. Those blocks are pinned: what running requests computed still
serves hits, but no cache policy decides whether to keep them, so where the
share is near 1 the policies have little room to differ. ``retained_mean``: the
part of that share (mean over the steps) that ``hybrid``'s running requests
retain for kept points their windows have passed (0 under ``lru``): room the
running batch does not get. ``running_mean``: running requests after each
step's scheduling, averaged over the steps; where admissions wait for room,
fewer running requests mean smaller decode batches, more steps, and a longer
queue (TTFT).

Block counts are per layer kind (``hybridkv.sim.census``); bytes are blocks
times ``page_bytes`` (one block id across all the shared buffers). Times are
modeled seconds of the simulated device (``hybridkv.sim.cost_model``), except
``replay_seconds``: the wall time the replay took here.

``return_bonus`` / ``return_grade`` / ``value_weight`` / ``floor_tokens``: the
``hybrid`` knobs the replay set (``SimOptions``; None: the manager's defaults);
``policy_label`` names them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from hybridkv.sim.options import label_of

if TYPE_CHECKING:
    from hybridkv.sim.tier_replay import TierReplay
    from hybridkv.sim.tier_swap import SimSwap


@dataclass(frozen=True)
class TierFigures:
    """What the tiers under the device pool did in one replay.

    ``*_hit_tokens``: tokens past the device hit served by a tier (disk: past
    the device-and-host hit); ``*_load_bytes``: bytes loaded from each tier;
    ``loaded_tokens``: tokens passed by loads (hits, and reloads of resumed
    requests: ``reloaded_tokens``); ``load_s`` / ``load_wait_s``: modeled seconds of
    loads, and of the device waiting for them; ``*_used_bytes`` /
    ``host_bytes_by_kind``: what the tiers held at the end; ``*_stores`` /
    ``*_evictions``: units stored in and evicted from each tier;
    ``demoted_units``: device evictions demoted to the host (``hybrid``);
    ``host_spare_stores`` / ``host_spare_skips``: units offered for spare room
    only (``hybrid``'s ``evict_first`` blocks) stored, and skipped for want of it;
    ``preemption_mode`` and the swap figures (``sim/tier_swap.py``): ``swaps``
    (the other preemptions recomputed), ``swaps_declined`` (the cost model chose
    recompute), ``swaps_unneeded`` (the pool's reuse would lose none of its
    units: nothing copied), ``swapped_units`` / ``swapped_bytes`` (stored in the host by
    swaps), ``swapped_tokens`` (swap points summed), ``swap_saved_s`` (the cost
    model's estimate at each decision, summed: not the replay's own saving)."""

    disk_memory_bytes: int | None
    tier_hits: int
    host_hit_tokens: int
    disk_hit_tokens: int
    host_load_bytes: int
    disk_load_bytes: int
    loaded_tokens: int
    reloaded_tokens: int
    load_s: float
    load_wait_s: float
    host_used_bytes: int
    disk_used_bytes: int
    host_bytes_by_kind: dict[str, int]
    host_stores: int
    host_evictions: int
    disk_stores: int
    disk_evictions: int
    demoted_units: int
    host_spare_stores: int
    host_spare_skips: int
    preemption_mode: str | None = None
    swaps: int = 0
    swaps_declined: int = 0
    swaps_unneeded: int = 0
    swapped_units: int = 0
    swapped_bytes: int = 0
    swapped_tokens: int = 0
    swap_saved_s: float = 0.0

    @classmethod
    def of(
        cls, tiers: TierReplay, swap: SimSwap | None = None, mode: str | None = None
    ) -> TierFigures:
        """The figures of a finished replay's tiers (and its swaps, ``mode``: the
        replay's ``preemption_mode``)."""
        cache = tiers.cache
        disk = cache.disk
        return cls(
            disk_memory_bytes=disk.budget_bytes if disk is not None else None,
            tier_hits=tiers.tier_hits,
            host_hit_tokens=tiers.host_hit_tokens,
            disk_hit_tokens=tiers.disk_hit_tokens,
            host_load_bytes=tiers.host_load_bytes,
            disk_load_bytes=tiers.disk_load_bytes,
            loaded_tokens=tiers.loaded_tokens,
            reloaded_tokens=tiers.reloaded_tokens,
            load_s=tiers.load_s,
            load_wait_s=tiers.load_wait_s,
            host_used_bytes=cache.host.used_bytes,
            disk_used_bytes=disk.used_bytes if disk is not None else 0,
            host_bytes_by_kind=cache.host.bytes_by(cache.kind_of),
            host_stores=cache.host.stores,
            host_evictions=cache.host.evictions,
            disk_stores=disk.stores if disk is not None else 0,
            disk_evictions=disk.evictions if disk is not None else 0,
            demoted_units=cache.demoted,
            host_spare_stores=cache.host.spare_stores,
            host_spare_skips=cache.host.spare_skips,
            preemption_mode=mode,
            **({} if swap is None else swap.figures()),
        )


@dataclass(frozen=True)
class SimResult:
    """The measurements of one replay (see the module docstring)."""

    layout: str
    policy: str
    memory_bytes: int
    device: str
    arrivals: str
    num_requests: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    num_blocks: int
    page_bytes: int
    prompt_tokens: int
    output_tokens: int
    hit_tokens: int
    prefill_tokens: int
    decode_tokens: int
    preemptions: int
    steps: int
    cached_blocks: dict[str, int]
    peak_blocks_in_use: int
    peak_blocks_by_kind: dict[str, int]
    in_use_mean: float
    in_use_p50: float
    ttft_p50_s: float
    ttft_p99_s: float
    makespan_s: float
    replay_seconds: float
    return_bonus: float | None = None
    value_weight: float | None = None
    full_match_tokens: int = 0
    floor_tokens: int | None = None
    return_grade: str | None = None
    tuning: str | None = None
    host_memory_bytes: int | None = None
    tiers: TierFigures | None = None
    running_mean: float = 0.0
    retained_mean: float = 0.0

    @property
    def policy_label(self) -> str:
        """The policy, with the knobs set away from their defaults:
        ``hybrid (bonus 8, weight 1)`` (``options.policy_label``)."""
        return label_of(self)

    @property
    def token_hit_rate(self) -> float:
        """Prefix-hit tokens at first admission over prompt tokens."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def host_hit_tokens(self) -> int:
        return self.tiers.host_hit_tokens if self.tiers is not None else 0

    @property
    def disk_hit_tokens(self) -> int:
        return self.tiers.disk_hit_tokens if self.tiers is not None else 0

    @property
    def host_hit_rate(self) -> float:
        """Prompt tokens the host tier adds to the device hit, per prompt token."""
        return self.host_hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def disk_hit_rate(self) -> float:
        """Prompt tokens the disk tier adds past device and host, per prompt token."""
        return self.disk_hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def total_hit_rate(self) -> float:
        """Device, host and disk hits together, per prompt token."""
        return self.token_hit_rate + self.host_hit_rate + self.disk_hit_rate

    @property
    def load_wait_share(self) -> float:
        """The share of the makespan the device spent waiting for loads."""
        if self.tiers is None or self.makespan_s <= 0:
            return 0.0
        return self.tiers.load_wait_s / self.makespan_s

    @property
    def full_match_rate(self) -> float:
        """Full-attention match at first admission over prompt tokens."""
        return self.full_match_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def cached_bytes(self) -> dict[str, int]:
        """Bytes of the cached blocks, per kind."""
        return {k: n * self.page_bytes for k, n in self.cached_blocks.items()}

    @property
    def output_tokens_per_s(self) -> float:
        """Modeled output throughput: sampled tokens over the makespan."""
        return self.output_tokens / self.makespan_s if self.makespan_s > 0 else 0.0

    @property
    def requests_per_s(self) -> float:
        """Modeled request throughput over the makespan."""
        return self.num_requests / self.makespan_s if self.makespan_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict of every field and derived figure (``token_hit_rate``...)."""
        out: dict[str, Any] = {
            "layout": self.layout,
            "policy": self.policy,
            "return_bonus": self.return_bonus,
            "return_grade": self.return_grade,
            "value_weight": self.value_weight,
            "floor_tokens": self.floor_tokens,
            "memory_bytes": self.memory_bytes,
            "device": self.device,
            "arrivals": self.arrivals,
            "num_requests": self.num_requests,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_model_len": self.max_model_len,
            "num_blocks": self.num_blocks,
            "page_bytes": self.page_bytes,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "hit_tokens": self.hit_tokens,
            "token_hit_rate": self.token_hit_rate,
            "host_memory_bytes": self.host_memory_bytes,
            "host_hit_tokens": self.host_hit_tokens,
            "host_hit_rate": self.host_hit_rate,
            "host_used_bytes": self.tiers.host_used_bytes if self.tiers is not None else 0,
            "host_demoted_units": self.tiers.demoted_units if self.tiers is not None else 0,
            "full_match_tokens": self.full_match_tokens,
            "full_match_rate": self.full_match_rate,
            "prefill_tokens": self.prefill_tokens,
            "decode_tokens": self.decode_tokens,
            "preemptions": self.preemptions,
            "steps": self.steps,
            "cached_blocks": dict(self.cached_blocks),
            "cached_bytes": self.cached_bytes,
            "peak_blocks_in_use": self.peak_blocks_in_use,
            "peak_blocks_by_kind": dict(self.peak_blocks_by_kind),
            "in_use_mean": self.in_use_mean,
            "in_use_p50": self.in_use_p50,
            "retained_mean": self.retained_mean,
            "running_mean": self.running_mean,
            "ttft_p50_s": self.ttft_p50_s,
            "ttft_p99_s": self.ttft_p99_s,
            "makespan_s": self.makespan_s,
            "output_tokens_per_s": self.output_tokens_per_s,
            "requests_per_s": self.requests_per_s,
            "replay_seconds": self.replay_seconds,
        }
        if self.tuning is not None:
            out["tuning"] = self.tuning
        if self.tiers is not None:
            out["tiers"] = asdict(self.tiers)
            out["disk_hit_rate"] = self.disk_hit_rate
            out["total_hit_rate"] = self.total_hit_rate
            out["load_wait_share"] = self.load_wait_share
        return out
