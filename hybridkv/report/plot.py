"""``hybridkv plan --plot``: the memory layout and the capacity, as one PNG.

Left panel, after vLLM's hybrid-allocator design figures: rows are the
shared buffers, columns the groups. Each group owns its own block ids, so a
column is one example block id (block ``k + 1`` given to group ``k``) and a
cell is what that block holds in that buffer: the group's layers living in
the slot, side by side, each as wide as its share of the slot, coloured by
kind; hatched grey is padding (a slot no layer of the group uses, or the part
of a slot a padded Mamba state or packed attention layers leave empty).
Right panel: max concurrency at ``max_model_len`` for the naive allocation,
vLLM's grouping, this plan, and the other unification strategy.

Drawn with matplotlib's object API on the Agg canvas (no pyplot, no global
backend switch). The figure goes to exactly the path given (``plot_format``).
A missing matplotlib, a directory or an unwritable path raises ``PlotError``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hybridkv.common.extras import install_command
from hybridkv.common.units import format_bytes
from hybridkv.planning import KVCachePlan
from hybridkv.report.plan_report import PlanReport
from hybridkv.report.units import layer_index, plural
from hybridkv.specs import KVCacheSpec, MambaSpec

MAX_BUFFERS = 16
MAX_GROUPS = 16
KIND_COLORS = {
    "full": "#4C72B0",
    "sliding_window": "#55A868",
    "chunked_local": "#DD8452",
    "mamba": "#8172B3",
}
PAD_COLOR = "#E6E6E6"


class PlotError(ValueError):
    """The figure cannot be drawn or written (matplotlib missing, bad path)."""


def _real_bytes(spec: KVCacheSpec) -> int:
    return spec.state_size_bytes if isinstance(spec, MambaSpec) else spec.page_size_bytes


def _label(name: str) -> str:
    i = layer_index(name)
    return name if i is None else str(i)


def _pad(ax: Any, x: float, y: float, w: float, h: float, patches: Any) -> None:
    if w > 1e-3:
        ax.add_patch(
            patches.Rectangle(
                (x, y), w, h, facecolor=PAD_COLOR, edgecolor="#999999", hatch="///", lw=0.5
            )
        )


def _shown_groups(plan: KVCachePlan) -> list[int]:
    """Indices of the groups to draw: all, or ``MAX_GROUPS`` shared fairly by kind."""
    n = plan.grouping.num_groups
    if n <= MAX_GROUPS:
        return list(range(n))
    by_kind: dict[str, list[int]] = {}
    for k, grp in enumerate(plan.grouping.groups):
        by_kind.setdefault(grp.spec.kind, []).append(k)
    queues = list(by_kind.values())
    shown: list[int] = []
    while len(shown) < MAX_GROUPS:
        for q in queues:
            if q and len(shown) < MAX_GROUPS:
                shown.append(q.pop(0))
    return sorted(shown)


def _draw_layout(ax: Any, fig: Any, plan: KVCachePlan, name: str, mpl: Any) -> None:
    patches = mpl.patches
    shown = _shown_groups(plan)
    rows = min(plan.grouping.group_size, MAX_BUFFERS)
    font = 8 if len(shown) <= 8 else 6.5
    for col, k in enumerate(shown):
        grp = plan.grouping.groups[k]
        share = _real_bytes(grp.spec) / plan.slot_bytes
        color = KIND_COLORS.get(grp.spec.kind, "#C44E52")
        for i in range(rows):
            x, y, h, width = col + 0.06, i + 0.1, 0.8, 0.88
            layers = grp.slot_layers(i)
            w = width * share
            vertical = len(layers) > 1 or len(shown) > 10
            for j, layer in enumerate(layers):
                rect = patches.Rectangle((x + j * w, y), w, h, facecolor=color, ec="white", lw=0.8)
                ax.add_patch(rect)
                ax.text(
                    x + (j + 0.5) * w,
                    y + h / 2,
                    _label(layer),
                    ha="center",
                    va="center",
                    fontsize=font,
                    color="white",
                    rotation=90 if vertical else 0,
                )
            used = w * len(layers)
            _pad(ax, x + used, y, width - used, h, patches)
            if not layers:
                ax.text(x + width / 2, y + h / 2, "pad", ha="center", va="center", fontsize=font)
    ax.set_xlim(0, len(shown))
    ax.set_ylim(rows, 0)
    ax.set_xticks([c + 0.5 for c in range(len(shown))])
    ax.set_xticklabels([f"G{k}\n#{k + 1}" for k in shown], fontsize=7)
    ax.set_yticks([i + 0.5 for i in range(rows)])
    ax.set_yticklabels([f"buffer {i}" for i in range(rows)], fontsize=7)
    ax.tick_params(length=0)
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    g, n = plan.grouping.group_size, plan.grouping.num_groups
    title = (
        f"{name}: {plural(g, 'buffer')} x {plan.num_blocks:,} slots of "
        f"{format_bytes(plan.slot_bytes)}, {plural(n, 'group')}"
    )
    cut = [f"first {MAX_BUFFERS} of {g} buffers"] if g > MAX_BUFFERS else []
    cut += [f"{MAX_GROUPS} of {n} groups"] if n > MAX_GROUPS else []
    if cut:
        title += f" ({' and '.join(cut)} drawn)"
    title += "\ncolumn: group G and one block id # it owns; cell: that block in each buffer"
    ax.set_title(title, fontsize=9.5)
    kinds = list(dict.fromkeys(grp.spec.kind for grp in plan.grouping.groups))
    handles = [
        patches.Patch(color=KIND_COLORS.get(kd, "#C44E52"), label=f"{kd} (layer index)")
        for kd in kinds
    ]
    handles.append(
        patches.Patch(facecolor=PAD_COLOR, edgecolor="#999999", hatch="///", label="padding")
    )
    below = mpl.transforms.offset_copy(ax.transAxes, fig=fig, y=-26, units="points")
    ax.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, 0),
        bbox_transform=below,
        ncol=len(handles),
        fontsize=8,
        frameon=False,
    )


def _bars(report: PlanReport) -> list[tuple[str, float]]:
    plan, opts, base = report.plan, report.options, report.baselines
    unif = plan.unified.strategy
    bars = [
        ("naive\n(full KV)", base.naive.max_concurrency),
        (f"vllm\ngrouping\n({unif})", base.vllm_hybrid.max_concurrency),
        (f"this plan\n({opts.grouping},\n{unif})", plan.hybrid.max_concurrency),
    ]
    other = report.other
    if other is not None and (other.slot_bytes != plan.slot_bytes or other.hybrid != plan.hybrid):
        bars.append(
            (
                f"{other.unified.strategy}\nunif.\n({opts.grouping})",
                other.hybrid.max_concurrency,
            )
        )
    return bars


def _draw_capacity(ax: Any, report: PlanReport) -> None:
    bars = _bars(report)
    colors = ["#BBBBBB", "#8DA0CB", "#E78AC3", "#A6D854"][: len(bars)]
    xs = range(len(bars))
    ax.bar(xs, [v for _, v in bars], color=colors, width=0.65)
    top = max(v for _, v in bars)
    for x, (_, v) in zip(xs, bars, strict=True):
        ax.text(x, v + top * 0.01, f"{v:,.2f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([name for name, _ in bars], fontsize=7.5)
    ax.set_ylim(0, top * 1.12)
    ax.set_ylabel(f"max concurrency at max_model_len {report.plan.max_model_len:,}", fontsize=8)
    ax.set_title(f"capacity in {format_bytes(report.plan.available_memory_bytes)}", fontsize=10)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


#: File formats by suffix; a path without one gets a PNG (still at exactly that path).
PLOT_FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf", "": "png"}


def plot_format(path: Path) -> str:
    """The format written at ``path``; ``PlotError`` for a directory or an unknown suffix.

    Checked before planning, so a bad ``--plot`` fails at once.
    """
    if path.is_dir():
        raise PlotError(f"--plot {path}: is a directory; give a file path such as {path}/plan.png")
    fmt = PLOT_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise PlotError(
            f"--plot {path}: unknown file type {path.suffix!r}; use .png, .svg or .pdf "
            "(no suffix writes a PNG)"
        )
    return fmt


def save_plan_figure(report: PlanReport, path: str | Path) -> None:
    """Draw the two panels for ``report`` and write them at exactly ``path``.

    PNG unless the suffix is ``.svg`` or ``.pdf`` (``plot_format``). Any
    failure is a one-line ``PlotError``, and leaves no partial file behind
    (unless ``path`` existed before).
    """
    try:
        import matplotlib.patches
        import matplotlib.transforms
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise PlotError(
            f"--plot needs matplotlib, which cannot be imported ({e}): {install_command('plot')}"
        ) from None
    plan = report.plan
    cols = min(plan.grouping.num_groups, MAX_GROUPS)
    rows = min(plan.grouping.group_size, MAX_BUFFERS)
    left = max(4.0, 0.75 * cols + 1.2)
    fig = Figure(figsize=(left + 4.6, max(3.2, 0.38 * rows + 2.2)))
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(1, 2, width_ratios=[left, 4.0], wspace=0.22)
    _draw_layout(fig.add_subplot(grid[0]), fig, plan, report.layout.name, matplotlib)
    _draw_capacity(fig.add_subplot(grid[1]), report)
    target = Path(path)
    fmt = plot_format(target)
    existed = target.exists()
    try:
        with target.open("wb") as f:  # exactly at ``path``: matplotlib would add a suffix
            fig.savefig(f, format=fmt, dpi=130, bbox_inches="tight")
    except OSError as e:
        if not existed and target.is_file():
            target.unlink()  # no half-written figure left behind
        raise PlotError(f"cannot write the figure to {path}: {e.strerror or e}") from None
