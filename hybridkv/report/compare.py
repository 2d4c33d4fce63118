"""Side-by-side sections: the two unification strategies, the grouping choices.

- ``render_unifications``: for ``vllm`` and ``packed`` unification (same
  memory, lengths and grouping mode): attention block size, slot, groups,
  buffers, Mamba padding, grouping waste and max concurrency; a strategy
  the planner rejects shows its error message instead.
- ``render_choices`` (``--verbose``): every group size ``g`` the planner
  weighed, marking the chosen one, vLLM's, and those over the group cap.
"""

from __future__ import annotations

from hybridkv.common.units import format_bytes
from hybridkv.planning import KVCachePlan
from hybridkv.report.plan_report import PlanReport
from hybridkv.report.table import format_table
from hybridkv.specs import MambaSpec


def mamba_padding(plan: KVCachePlan) -> float | None:
    """Largest Mamba page padding over its state, as a fraction (None: no Mamba)."""
    pads = [
        (s.page_size_bytes - s.state_size_bytes) / s.state_size_bytes
        for s in plan.unified.specs.values()
        if isinstance(s, MambaSpec)
    ]
    return max(pads) if pads else None


def render_unifications(report: PlanReport) -> list[str]:
    """Lines comparing the two strategies under the report's other options."""
    rows: list[list[object]] = []
    errors: list[str] = []
    for strategy, result in report.by_strategy():
        label = strategy + (" (this plan)" if strategy == report.options.unification else "")
        if isinstance(result, str):
            errors.append(f"  {label}: not possible: {result}")
            continue
        pad = mamba_padding(result)
        rows.append(
            [
                label,
                result.unified.attention_block_size or "-",
                format_bytes(result.slot_bytes),
                result.grouping.num_groups,
                result.grouping.group_size,
                "-" if pad is None else f"+{100 * pad:.1f}%",
                f"{100 * result.grouping.waste_fraction:.2f}%",
                f"{result.hybrid.max_concurrency:,.2f}",
            ]
        )
    headers = [
        "unification",
        "attn block",
        "slot",
        "groups",
        "buffers",
        "Mamba padding",
        "waste",
        "max concurrency",
    ]
    return [
        f"Unification strategies ({report.options.grouping} grouping, same memory)",
        *format_table(headers, rows),
        *errors,
    ]


def render_choices(report: PlanReport) -> list[str]:
    """Lines listing every grouping choice of the plan (``--verbose``)."""
    plan, cap = report.plan, report.group_cap
    rows: list[list[object]] = []
    for c in plan.choices:
        marks = []
        if c.group_size == plan.grouping.group_size:
            marks.append("chosen")
        if c.group_size == report.baselines.vllm_grouping.group_size:
            marks.append("vllm")
        if c.num_groups > cap:
            marks.append("over cap")
        rows.append(
            [
                c.group_size,
                c.num_groups,
                c.padding_layers,
                format_bytes(c.waste_bytes_per_request),
                f"{100 * c.waste_fraction:.2f}%",
                ", ".join(marks),
            ]
        )
    return [
        f"Grouping choices (g = buffers; cap {cap} groups = max(vllm's "
        f"{report.baselines.vllm_grouping.num_groups}, --max-groups {report.options.max_groups}))",
        *format_table(["g", "groups", "padding", "waste/request", "waste", "note"], rows),
    ]
