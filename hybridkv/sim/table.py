"""The plain-text report of ``hybridkv simulate``: one row per replay.

Columns: layout, memory budget (decimal units, as typed in ``--memory 80GB``),
policy, token hit rate, full-attention match (``SimResult.full_match_rate``),
prefill tokens computed, preemptions (with tiers: how many were swapped to
the host, and the bytes), modeled TTFT
p50/p99 and output throughput, cached blocks at the end per kind, and the
wall time of the replay here.
"""

from __future__ import annotations

from collections.abc import Sequence

from hybridkv.report.table import format_table
from hybridkv.sim.result import SimResult

KIND_SHORT = {"full": "full", "sliding_window": "swa", "chunked_local": "chunk", "mamba": "mamba"}


DECIMAL_UNITS = (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3))


def memory_label(n: int) -> str:
    """``80_000_000_000`` -> ``"80 GB"``, ``42_496`` -> ``"42.5 KB"`` (decimal units)."""
    for unit, scale in DECIMAL_UNITS:
        if n >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{n} B"


def blocks_label(by_kind: dict[str, int]) -> str:
    """``{"full": 3, "sliding_window": 5}`` -> ``"full 3, swa 5"``."""
    return ", ".join(f"{KIND_SHORT.get(k, k)} {n:,}" for k, n in by_kind.items())


def _tier_cells(r: SimResult, with_disk: bool) -> list[str]:
    """The tier columns of one row (``-`` where the replay had no tiers)."""
    t = r.tiers
    if t is None:
        return ["-"] * (6 if with_disk else 4)
    cells = [memory_label(r.host_memory_bytes or 0), f"{100 * r.host_hit_rate:.2f}%"]
    if with_disk:
        disk = t.disk_memory_bytes
        cells += [memory_label(disk) if disk else "-", f"{100 * r.disk_hit_rate:.2f}%"]
    return [*cells, f"{100 * r.total_hit_rate:.2f}%", f"{100 * r.load_wait_share:.1f}%"]


def _swap_cell(r: SimResult) -> str:
    """Swapped preemptions and the bytes they stored (``-``: no tiers)."""
    t = r.tiers
    if t is None:
        return "-"
    return f"{t.swaps:,} ({memory_label(t.swapped_bytes)})" if t.swaps else "0"


def render_results(results: Sequence[SimResult], trace: str) -> str:
    """The report: a heading line, the table, and a note on the modeled figures."""
    if not results:
        raise ValueError("results must hold at least one replay")
    first = results[0]
    head = (
        f"Replay of {trace}: {first.num_requests:,} requests, {first.prompt_tokens:,} prompt "
        f"tokens, {first.output_tokens:,} output tokens; device {first.device}, arrivals "
        f"{first.arrivals}, max_num_seqs {first.max_num_seqs}, max_num_batched_tokens "
        f"{first.max_num_batched_tokens:,}, max_model_len {first.max_model_len:,}"
    )
    rows = [
        [
            r.layout,
            memory_label(r.memory_bytes),
            r.policy_label,
            f"{100 * r.token_hit_rate:.2f}%",
            f"{100 * r.full_match_rate:.2f}%",
            f"{r.prefill_tokens:,}",
            f"{r.preemptions:,}",
            f"{100 * r.in_use_p50:.0f}%",
            f"{r.ttft_p50_s:.2f}",
            f"{r.ttft_p99_s:.2f}",
            f"{r.output_tokens_per_s:,.0f}",
            blocks_label(r.cached_blocks),
            f"{r.replay_seconds:.1f}",
        ]
        for r in results
    ]
    headers = [
        "layout",
        "memory",
        "policy",
        "hit rate",
        "full match",
        "prefill tokens",
        "preempt",
        "in use",
        "TTFT p50 s",
        "TTFT p99 s",
        "out tok/s",
        "cached blocks",
        "replay s",
    ]
    tiered = [r for r in results if r.tiers is not None]
    if tiered:
        with_disk = any(r.tiers.disk_memory_bytes is not None for r in tiered)  # type: ignore[union-attr]
        at = headers.index("hit rate") + 1
        tier_headers = ["host", "+ host hits"]
        if with_disk:
            tier_headers += ["disk", "+ disk hits"]
        tier_headers += ["total hits", "load wait"]
        headers[at:at] = tier_headers
        for r, row in zip(results, rows, strict=True):
            row[at:at] = _tier_cells(r, with_disk)
        at = headers.index("preempt") + 1
        headers.insert(at, "swapped")
        for r, row in zip(results, rows, strict=True):
            row.insert(at, _swap_cell(r))
    lines = [head, *format_table(headers, rows, left=("cached blocks",))]
    lines += [
        "  (full match: what full attention alone matched; the hit falls short of it where",
        "   a window, chunk or Mamba state was missing. in use: blocks live requests hold at",
        "   the median step, pinned for any policy; TTFT and throughput are modeled on the",
        "   device; replay s is wall time here)",
    ]
    if tiered:
        lines += [
            "  (host, disk: modeled tiers under the device pool; + host / + disk hits: prompt",
            "   tokens they add to the device hit at first admission, loaded, not computed;",
            "   load wait: the share of the makespan the device waited for loads, included in",
            "   TTFT and throughput; swapped: preemptions swapped to the host, and the bytes",
            "   stored, the others recomputed)",
        ]
    return "\n".join(lines) + "\n"
