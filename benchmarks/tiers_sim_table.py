#!/usr/bin/env python3
"""Issue 45's hit-rate targets from ``hybridkv simulate --json`` files, as markdown.

Give it the JSON outputs of one layout and workload: runs with tiers
(``--memory D --host-memory H1,H2,.. --policy hybrid`` and ``lru``) and runs
without (``--memory D,D+H1,D+H2,..,4TB --policy hybrid``, and ``lru`` at 4TB).
It prints one row per (policy, host) run with tiers: device hit, host and
disk hits, total, the same total bytes all on the device (``hybrid``), tier
efficiency (their ratio), the share of the unlimited hit, ``hybrid`` over
``lru`` where both ran, the load wait share and the modeled TTFT p50/p99.

    python benchmarks/tiers_sim_table.py out/mc-jamba-*.json [--plot hit.png]

``--plot`` draws the runs with tiers as ``hybridkv simulate --plot`` does (hit
rate against host memory, one curve per policy), from the JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from hybridkv.sim.result import SimResult, TierFigures  # noqa: E402

#: A device budget this large holds the whole trace: its hit rate is "unlimited".
UNLIMITED_BYTES = 10**12


def load(paths: list[Path]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in paths:
        data = json.loads(path.read_text())
        rows += data if isinstance(data, list) else [data]
    return rows


def pct(x: float) -> str:
    return f"{100 * x:.2f} %"


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table of the module docstring."""
    plain = {(r["policy"], r["memory_bytes"]): r for r in rows if r.get("tiers") is None}
    tiered = [r for r in rows if r.get("tiers") is not None]
    # "Unlimited": the runs of at least UNLIMITED_BYTES; the best policy's hit there.
    best_unlimited = max(
        (r["token_hit_rate"] for (p, m), r in plain.items() if m >= UNLIMITED_BYTES), default=0.0
    )
    lru_total = {
        (r["memory_bytes"], r["host_memory_bytes"]): r["total_hit_rate"]
        for r in tiered
        if r["policy"] == "lru"
    }
    out = [
        "| policy | device | host | device hit | + host | + disk | total | same bytes on "
        "device | tier efficiency | of unlimited | hybrid / lru | load wait | TTFT p50 / p99 s |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in sorted(tiered, key=lambda r: (r["policy"], r["host_memory_bytes"])):
        device, host = r["memory_bytes"], r["host_memory_bytes"]
        same = plain.get((r["policy"], device + host))
        eff = f"{100 * r['total_hit_rate'] / same['token_hit_rate']:.1f} %" if same else ""
        of_unlimited = (
            f"{100 * r['total_hit_rate'] / best_unlimited:.1f} %" if best_unlimited else ""
        )
        lru = lru_total.get((device, host))
        vs = f"{r['total_hit_rate'] / lru:.2f}x" if r["policy"] == "hybrid" and lru else ""
        out.append(
            f"| {r['policy']} | {device / 1e9:g} GB | {host / 1e9:g} GB | "
            f"{pct(r['token_hit_rate'])} | {pct(r['host_hit_rate'])} | "
            f"{pct(r['disk_hit_rate'])} | {pct(r['total_hit_rate'])} | "
            f"{pct(same['token_hit_rate']) if same else ''} | {eff} | {of_unlimited} | {vs} | "
            f"{100 * r['load_wait_share']:.3f} % | {r['ttft_p50_s']:.2f} / {r['ttft_p99_s']:.2f} |"
        )
    device_only = ", ".join(
        f"{p} {m / 1e9:g} GB {pct(r['token_hit_rate'])}" for (p, m), r in sorted(plain.items())
    )
    return "\n".join(out) + f"\n\nWithout tiers: {device_only}.\n"


def as_result(row: dict[str, Any]) -> SimResult:
    """A ``SimResult`` back from its JSON (the derived figures dropped)."""
    names = {f.name for f in dataclasses.fields(SimResult)}
    fields = {k: v for k, v in row.items() if k in names}
    if row.get("tiers") is not None:
        fields["tiers"] = TierFigures(**row["tiers"])
    return SimResult(**fields)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", nargs="+", type=Path)
    ap.add_argument("--plot", type=Path, help="hit rate against host memory, as a PNG")
    ap.add_argument("--title", default="", help="the figure's title")
    args = ap.parse_args()
    rows = load(args.json)
    print(table(rows), end="")
    if args.plot:
        from hybridkv.sim.plot import save_hit_rate_figure

        tiered = [as_result(r) for r in rows if r.get("tiers") is not None]
        save_hit_rate_figure(tiered, args.plot, args.title)


if __name__ == "__main__":
    main()
