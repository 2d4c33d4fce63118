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
- ``host_hit_tokens`` (with ``--host-memory``): the tokens a modeled host tier
  adds to each request's device hit at its first admission, summed
  (``host_hit_rate``); a shadow count, not replayed (``hybridkv.sim.host_tier``);
- ``output_tokens``: tokens sampled (the last one of a request is sampled,
  never computed, so without preemption ``decode = output - requests``).

``in_use_mean`` / ``in_use_p50``: the share of the usable blocks that live
requests hold (their tables, and under ``hybrid`` the blocks they retain for
kept points) after each step's allocation, averaged over the steps / at the
median step. Those blocks are pinned: what running requests computed still
serves hits, but no cache policy decides whether to keep them, so where the
share is near 1 the policies have little room to differ.

Block counts are per layer kind (``hybridkv.sim.census``); bytes are blocks
times ``page_bytes`` (one block id across all the shared buffers). Times are
modeled seconds of the simulated device (``hybridkv.sim.cost_model``), except
``replay_seconds``: the wall time the replay took here.

``return_bonus`` / ``return_grade`` / ``value_weight`` / ``floor_tokens``: the
``hybrid`` knobs the replay set (``SimOptions``; None: the manager's defaults);
``policy_label`` names them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hybridkv.sim.options import label_of


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
    host_hit_tokens: int = 0
    #: Bytes the modeled host tier held at the end, and the units demoted into it.
    host_used_bytes: int = 0
    host_demoted_units: int = 0

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
    def host_hit_rate(self) -> float:
        """Prompt tokens a modeled host tier adds to the device hit, per prompt token."""
        return self.host_hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

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
            "host_used_bytes": self.host_used_bytes,
            "host_demoted_units": self.host_demoted_units,
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
            "ttft_p50_s": self.ttft_p50_s,
            "ttft_p99_s": self.ttft_p99_s,
            "makespan_s": self.makespan_s,
            "output_tokens_per_s": self.output_tokens_per_s,
            "requests_per_s": self.requests_per_s,
            "replay_seconds": self.replay_seconds,
        }
        if self.tuning is not None:
            out["tuning"] = self.tuning
        return out
