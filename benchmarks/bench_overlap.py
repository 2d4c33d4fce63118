"""``bench_host_step.py --overlap MS,MS``: a decode step's wall time with a **modelled**
device (``model_device.py``), without and with async scheduling.

For each modelled device time, fresh processes of ``bench_host_step.py --device-ms MS``
run without and with ``--async``, alternating, ``--rounds`` times each (the same
``--graphs``, ``--batch``... as given). Per run: the median over its decode steps of the
step's wall time (``LLM.step``, ``time.perf_counter``) and of its host CPU time (the
phases' ``host``: thread CPU time, so the host's sleep while it waits for the modelled
device is not in it), and the 10th percentile of the wall (contention on a shared machine
only adds to a synchronous step's wall: its low percentile is the step undisturbed; an
async step's can fall below the device time, when the step before it ran long and the
device got ahead, so the ratio is of medians); then the median over rounds. The table
sets the walls beside ``host + device`` (what a synchronous step costs when nothing overlaps) and
``max(host, device)`` (what a perfect overlap gives). The device is a model, not a GPU:
what this shows is that the engine's host work runs while the device works, and how
much of it does not (scheduling the next step needs the previous step's tokens only at
its end).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any


def _run(script: Path, rest: list[str], ms: float, on: bool) -> dict[str, Any]:
    cmd = [sys.executable, str(script), *rest, "--device-ms", str(ms), "--json"]
    if on:
        cmd.append("--async")
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _rest(argv: list[str]) -> list[str]:
    """``argv`` less ``--overlap`` / ``--rounds`` and their values, and ``--async``."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("--overlap", "--rounds", "--device-ms"):
            skip = True
        elif a != "--async":
            out.append(a)
    return out


def overlap(args: argparse.Namespace, argv: list[str], here: Path) -> int:
    """Run the comparison (module docstring) and print its table."""
    sys.path.insert(0, str(here))
    from machine_info import cpu_features, machine

    script = here / "bench_host_step.py"
    rest = _rest(argv)
    times = [float(x) for x in args.overlap.split(",")]
    rows = []
    for ms in times:
        runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
        for r in range(args.rounds):
            for on in (False, True):
                runs[on].append(_run(script, rest, ms, on))
                last = runs[on][-1]
                print(f"device {ms} ms, round {r + 1}, async {on}: wall {last['wall']:.3f} "
                      f"(p10 {last['wall_p10']:.3f}) "
                      f"host {last['host']:.3f} ms", file=sys.stderr)  # fmt: skip
        if runs[False][0]["tokens"] != runs[True][0]["tokens"]:
            raise SystemExit("async scheduling generated other tokens")
        med = {on: {k: statistics.median(x[k] for x in rs) for k in ("wall", "wall_p10", "host")}
               for on, rs in runs.items()}  # fmt: skip
        settled = runs[True][0]["async"]
        rows.append((ms, med[False], med[True], settled))
    load = os.getloadavg()
    print(f"{machine()}; {cpu_features()}; load average {load[0]:.1f} {load[1]:.1f}; "
          f"{'graphed' if args.graphs else 'eager'} decode, {args.batch} x {args.length} -> "
          f"{args.tokens}; MODELLED device (model_device.py); medians of {args.rounds} "
          "alternating runs")  # fmt: skip
    print()
    print("| device (modelled) | host off / on | wall off: median / p10 | host + device | "
          "wall on: median / p10 | max(host, device) | off / on |")  # fmt: skip
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for ms, off, on, _ in rows:
        print(f"| {ms:.2f} | {off['host']:.3f} / {on['host']:.3f} | {off['wall']:.3f} / "
              f"{off['wall_p10']:.3f} | {off['host'] + ms:.3f} | {on['wall']:.3f} / "
              f"{on['wall_p10']:.3f} | {max(on['host'], ms):.3f} | "
              f"{off['wall'] / on['wall']:.2f}x |")  # fmt: skip
    print()
    print(f"async counters of the last setting's first run: {rows[-1][3]}")
    stores = runs[True][0].get("tier_stores")
    if stores is not None:
        print(f"host tier: {stores} blocks written through in that run")
    return 0
