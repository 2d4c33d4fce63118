"""``hybridkv simulate --plot``: token hit rate against memory, per policy.

One curve per cache policy, one point per budget (decimal GB on the x axis,
hit rate in percent on the y axis). With tiers (``--host-memory``) the x axis
is the host tier's size and the y axis the hit rate of device and tiers
together; with several device budgets, each has its curves. Drawn with
matplotlib's object API on the Agg canvas, like ``hybridkv.report.plot``
(no pyplot, no global backend switch). A missing matplotlib or an unwritable
path raises ``PlotError``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hybridkv.common.extras import install_command
from hybridkv.report.plot import PlotError
from hybridkv.sim.result import SimResult
from hybridkv.sim.table import memory_label

POLICY_STYLE = {"lru": ("#4C72B0", "o"), "hybrid": ("#DD8452", "s")}
#: Styles of the other curves (``hybrid`` with its knobs set), in turn.
TUNED_STYLES = (("#2ca02c", "^"), ("#9467bd", "v"), ("#8c564b", "D"), ("#555555", "x"))


def check_plot_available() -> None:
    """Raise ``PlotError`` now if matplotlib cannot be imported (before long replays)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        raise PlotError(
            f"--plot needs matplotlib, which cannot be imported ({e}): {install_command('plot')}"
        ) from None


def curves(results: Sequence[SimResult]) -> dict[str, list[tuple[float, float]]]:
    """Per policy (``policy_label``: tuned runs of ``hybrid`` are curves of
    their own), ``(memory GB, hit rate %)`` points sorted by memory; with
    tiers, ``(host GB, total hit rate %)`` per policy and device budget."""
    out: dict[str, list[tuple[float, float]]] = {}
    tiered = any(r.tiers is not None for r in results)
    devices = {r.memory_bytes for r in results}
    for r in results:
        if not tiered:
            out.setdefault(r.policy_label, []).append(
                (r.memory_bytes / 1e9, 100 * r.token_hit_rate)
            )
            continue
        label = r.policy_label
        if len(devices) > 1:
            label += f", {memory_label(r.memory_bytes)} device"
        host = (r.host_memory_bytes or 0) / 1e9
        out.setdefault(label, []).append((host, 100 * r.total_hit_rate))
    return {p: sorted(points) for p, points in out.items()}


def save_hit_rate_figure(results: Sequence[SimResult], path: str | Path, title: str) -> None:
    """Draw the hit-rate curves of ``results`` and write them as a PNG at ``path``."""
    check_plot_available()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    top = 0.0
    tuned = iter(TUNED_STYLES * len(results))
    for policy, points in curves(results).items():
        color, marker = POLICY_STYLE.get(policy.split(",")[0]) or next(tuned)
        xs = [x for x, _ in points]
        ys = [y for _, y in points]
        top = max(top, *ys)
        ax.plot(xs, ys, marker=marker, color=color, label=policy)
    tiered = any(r.tiers is not None for r in results)
    ax.set_xlabel("host tier (GB)" if tiered else "KV cache memory (GB)")
    ax.set_ylabel("token hit rate, device + tiers (%)" if tiered else "token hit rate (%)")
    ax.set_ylim(0, max(1.0, top * 1.15))
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(title="policy", fontsize=8)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    try:
        fig.savefig(str(path), dpi=130, bbox_inches="tight")
    except OSError as e:
        raise PlotError(f"cannot write the figure to {path}: {e.strerror or e}") from None
