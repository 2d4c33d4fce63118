"""``PlanOptions`` -> ``PlanReport``: the plan and what it is compared with.

A report holds the plan the user asked for and the same plan under the other
page-size unification strategy (``vllm`` <-> ``packed``), or the
``ValueError`` message that strategy raised (it can need more memory, or not
apply to the model), and the plan's ``Baselines`` (naive KV, vLLM's grouping).
Building it is pure: it only calls ``plan_kv_cache`` and ``baselines``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hybridkv.planning import STRATEGIES, KVCachePlan, plan_kv_cache
from hybridkv.report.baselines import Baselines, baselines

if TYPE_CHECKING:
    from hybridkv.layouts import ModelLayout


@dataclass(frozen=True)
class PlanOptions:
    """The ``hybridkv plan`` arguments that reach the planner."""

    memory_bytes: int
    max_model_len: int | None = None
    block_size: int = 16
    grouping: str = "auto"
    unification: str = "vllm"
    max_num_batched_tokens: int | None = None
    max_groups: int = 8

    @property
    def other_unification(self) -> str:
        """The strategy the report compares with."""
        others = [s for s in STRATEGIES if s != self.unification]
        if len(others) != 1:
            raise ValueError(f"unification must be one of {STRATEGIES}, got {self.unification!r}")
        return others[0]

    def plan(self, layout: ModelLayout, unification: str | None = None) -> KVCachePlan:
        """``plan_kv_cache`` with these options (``unification`` overrides)."""
        return plan_kv_cache(
            layout,
            self.memory_bytes,
            block_size=self.block_size,
            max_model_len=self.max_model_len,
            max_num_batched_tokens=self.max_num_batched_tokens,
            grouping=self.grouping,
            unification=unification or self.unification,
            max_groups=self.max_groups,
        )


@dataclass(frozen=True)
class PlanReport:
    """A plan, its layout and options, its baselines, and the other strategy's plan or error."""

    layout: ModelLayout
    options: PlanOptions
    plan: KVCachePlan
    baselines: Baselines
    other: KVCachePlan | None
    other_error: str | None

    @property
    def group_cap(self) -> int:
        """Most groups ``auto`` grouping may use: ``max(vllm's, --max-groups)``."""
        return max(self.baselines.vllm_grouping.num_groups, self.options.max_groups)

    def by_strategy(self) -> list[tuple[str, KVCachePlan | str]]:
        """``(strategy, plan or error message)`` for both strategies, in order."""
        out: dict[str, KVCachePlan | str] = {self.options.unification: self.plan}
        out[self.options.other_unification] = (
            self.other if self.other is not None else str(self.other_error)
        )
        return [(s, out[s]) for s in STRATEGIES]


def build_plan_report(layout: ModelLayout, options: PlanOptions) -> PlanReport:
    """Plan ``layout`` with ``options`` and with the other unification.

    Raises the planner's ``ValueError`` when the requested plan fails (too
    little memory, bad lengths); a failure of the other strategy is recorded.
    """
    plan = options.plan(layout)
    try:
        other: KVCachePlan | None = options.plan(layout, options.other_unification)
        error = None
    except ValueError as e:
        other, error = None, str(e)
    return PlanReport(layout, options, plan, baselines(plan), other, error)
