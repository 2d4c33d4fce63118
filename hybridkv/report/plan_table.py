"""The text report of ``hybridkv plan``: one ``PlanReport`` -> plain text.

Sections, in order: the model and the inputs; the unification notes; the
groups (kind, layers, padding layers, block size, blocks one ``max_model_len``
request holds); memory (slot, page, buffers, ``num_blocks``, padding waste);
capacity next to the naive allocation and to vLLM's grouping; the two
unification strategies side by side; with ``verbose``, every grouping choice.
The text is stable (no timestamps, sorted input) so tests and diffs can read it.
"""

from __future__ import annotations

from hybridkv.common.units import format_bytes, format_bytes_exact
from hybridkv.planning import KVCachePlan
from hybridkv.planning.grouping import mamba_reserve_blocks
from hybridkv.report.compare import render_choices, render_unifications
from hybridkv.report.plan_report import PlanReport
from hybridkv.report.table import format_table
from hybridkv.report.units import compact_layers, plural
from hybridkv.specs import MambaSpec


def render_plan(report: PlanReport, verbose: bool = False) -> str:
    """The whole report as text (ends with a newline)."""
    sections = [
        _header(report),
        _notes(report.plan),
        _groups(report.plan),
        _memory(report.plan),
        _capacity(report),
        render_unifications(report),
    ]
    if verbose:
        sections.append(render_choices(report))
    return "\n\n".join("\n".join(s) for s in sections) + "\n"


def _header(report: PlanReport) -> list[str]:
    plan, opts, layout = report.plan, report.options, report.layout
    lines = [f"Model {layout.summary()}"]
    if layout.source:
        lines.append(f"  source: {layout.source}")
    lines += [
        f"  memory {format_bytes_exact(plan.available_memory_bytes)}, cache dtype "
        f"{layout.cache_dtype}, requested block size {opts.block_size}",
        f"  max_model_len {plan.max_model_len:,}, max_num_batched_tokens "
        f"{plan.max_num_batched_tokens:,}",
        f"  unification {plan.unified.strategy}, grouping {plan.grouping_mode} "
        f"(auto may use up to {report.group_cap} groups)",
    ]
    return lines


def _notes(plan: KVCachePlan) -> list[str]:
    head = f"Unification ({plan.unified.strategy})"
    if not plan.unified.notes:
        return [head, "  every layer already fills one slot size: no block size or padding change"]
    return [head, *(f"  - {note}" for note in plan.unified.notes)]


def _groups(plan: KVCachePlan) -> list[str]:
    g = plan.grouping.group_size
    packed = any(grp.pack > 1 for grp in plan.grouping.groups)
    headers = ["group", "kind", "block", "layers", "layer indices"]
    headers += ["per slot"] if packed else []
    headers += ["padding", "blocks/request"]
    rows: list[list[object]] = []
    for k, (grp, blocks) in enumerate(
        zip(plan.grouping.groups, plan.group_blocks_per_request(), strict=True)
    ):
        row: list[object] = [
            k,
            grp.spec.kind,
            grp.spec.block_size,
            len(grp.layers),
            compact_layers(grp.layers),
        ]
        row += [grp.pack] if packed else []
        row += [g * grp.pack - len(grp.layers), f"{blocks:,}"]
        rows.append(row)
    lines = [
        f"Groups: {plural(plan.grouping.num_groups, 'group')} over {plural(g, 'shared buffer')} "
        f"(group size g = {g}; padding = layer places of a group no layer uses)",
        *format_table(headers, rows, left=["layer indices"]),
    ]
    if any(isinstance(grp.spec, MambaSpec) for grp in plan.grouping.groups):
        lines.append(
            "  (a Mamba group holds 2 blocks per request: its running state and latest checkpoint)"
        )
    return lines


def _memory(plan: KVCachePlan) -> list[str]:
    g = plan.grouping.group_size
    n = plan.num_blocks
    tensors = plan.kv_cache_config.kv_cache_tensors
    reserve = mamba_reserve_blocks(plan.grouping.groups, plan.max_num_batched_tokens)
    blocks_note = "block 0 is the null block"
    if reserve:
        blocks_note += f"; {reserve:,} reserved for the Mamba checkpoints of one step"
    used = n * plan.page_bytes
    rows = [
        ("slot (one block id in one buffer)", format_bytes_exact(plan.slot_bytes)),
        (f"page (one block id, {plural(g, 'buffer')} x slot)", format_bytes_exact(plan.page_bytes)),
        (
            "buffers",
            f"{len(tensors)}, each {n:,} slots = {format_bytes(n * plan.slot_bytes)}"
            + ("" if len(tensors) == g else f" ({g - len(tensors)} of the g slots hold no layer)"),
        ),
        ("num_blocks", f"{n:,} ({blocks_note})"),
        (
            "memory used",
            f"{format_bytes_exact(used)}, {format_bytes(plan.available_memory_bytes - used)} "
            "left over (less than one page)",
        ),
        (
            "padding waste",
            f"{100 * plan.grouping.waste_fraction:.2f}% of a max-len request "
            f"({format_bytes(plan.grouping.waste_bytes_per_request)} of "
            f"{format_bytes(plan.grouping.bytes_per_request)}; "
            f"{plural(plan.grouping.padding_layers, 'padding layer')})",
        ),
    ]
    width = max(len(k) for k, _ in rows)
    return ["Memory", *(f"  {k.ljust(width)}  {v}" for k, v in rows)]


def _capacity(report: PlanReport) -> list[str]:
    plan, base = report.plan, report.baselines
    vg = base.vllm_grouping
    rows = [
        (
            f"this plan ({plan.grouping_mode} grouping, g={plan.grouping.group_size})",
            plan.hybrid,
        ),
        (f"vllm grouping (g={vg.group_size})", base.vllm_hybrid),
        ("naive (every layer full KV)", base.naive),
    ]
    table = format_table(
        ["allocation", "bytes/request", "max concurrency", "KV tokens"],
        [
            [
                name,
                format_bytes(c.bytes_per_request),
                f"{c.max_concurrency:,.2f}",
                f"{c.kv_tokens:,}",
            ]
            for name, c in rows
        ],
    )
    return [
        f"Capacity (requests of max_model_len = {plan.max_model_len:,} tokens)",
        *table,
        f"  gain over naive: {base.gain_over_naive:.2f}x",
        f"  gain over vllm grouping: {base.gain_over_vllm_grouping:.3f}x (vllm grouping: "
        f"{plural(vg.num_groups, 'group')}, {plural(vg.padding_layers, 'padding layer')}, "
        f"{100 * vg.waste_fraction:.2f}% waste)",
    ]
