"""What ``hybridkv plan`` compares a plan with, at the same memory and lengths.

- *naive*: every attention layer (sliding and chunked included) keeps full
  KV for all tokens in blocks of the requested block size, a Mamba layer one
  unpadded state per request (``capacity.naive_bytes_per_request``);
- *vLLM's grouping*: the same unified specs grouped by vLLM's heuristic
  (``grouping.vllm_grouping``), with the plan's reserved blocks.

The planner does not compute these (the engine needs none of them): the
report does, from the plan alone. Per-token attention bytes and Mamba state
sizes do not change under unification, so the plan's unified specs give the
naive figure of the raw specs.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridkv.planning import Capacity, Grouping, KVCachePlan, plan_capacity
from hybridkv.planning.capacity import capacity, naive_bytes_per_request
from hybridkv.planning.grouping import vllm_grouping


@dataclass(frozen=True)
class Baselines:
    """A plan's capacity next to the naive allocation's and vLLM's grouping's."""

    plan: Capacity
    naive: Capacity
    vllm_grouping: Grouping
    vllm_hybrid: Capacity

    @property
    def gain_over_naive(self) -> float:
        return self.plan.max_concurrency / self.naive.max_concurrency

    @property
    def gain_over_vllm_grouping(self) -> float:
        return self.plan.max_concurrency / self.vllm_hybrid.max_concurrency


def baselines(plan: KVCachePlan) -> Baselines:
    """The comparisons of ``plan`` (pure; same memory, lengths and unified specs)."""
    mml, mnbt = plan.max_model_len, plan.max_num_batched_tokens
    vllm = vllm_grouping(plan.unified, mml, mnbt)
    naive = naive_bytes_per_request(plan.unified.specs, mml, plan.block_size)
    return Baselines(
        plan=plan.hybrid,
        naive=capacity(plan.available_memory_bytes, naive, mml),
        vllm_grouping=vllm,
        vllm_hybrid=plan_capacity(plan.available_memory_bytes, plan.unified, vllm, mnbt, mml),
    )
