"""Start-up cost of the light core: ``import hybridkv``, ``hybridkv --help``, ``hybridkv plan``.

Every sample is a fresh interpreter (nothing cached in the process; the OS
file cache and the ``.pyc`` files are warm: one unmeasured run per case goes
first, and ``PYTHONDONTWRITEBYTECODE`` is removed from the children's
environment, since an installed package has its bytecode compiled). For each
case it reports the median of ``--repeats`` runs and whether torch (or another
extra) got imported:

- ``import hybridkv``: the import alone, timed inside the child with
  ``perf_counter`` (interpreter start-up excluded), and the child's peak RSS;
- ``hybridkv --help`` and ``hybridkv plan LAYOUT --memory M``: wall time of
  the whole process, as a user waits for it (interpreter start-up included),
  run as ``python -m hybridkv``;
- ``python -c pass``: the interpreter's own start-up, for reference.

Targets (issue 17, on the 2-core CI box): ``import hybridkv`` <= 0.2 s and
``hybridkv --help`` <= 0.3 s. ``--src DIR`` measures another checkout's
``DIR/hybridkv`` package instead (with ``kernels/`` and ``configs/`` placed
inside it as the install does), e.g. a ``git archive`` of an older commit;
the children then drop this venv's editable-install finder, which would
otherwise still import the installed copy.

    python benchmarks/bench_import.py [--repeats 9] [--src DIR] [--out results/import.md]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine_info import machine

EXTRAS = ("torch", "numpy", "transformers", "triton", "matplotlib", "jinja2")
TARGETS = {"import hybridkv": 0.2, "hybridkv --help": 0.3}

# The child times the import itself and reports what it loaded and its peak RSS.
IMPORT_PROBE = """
import json, resource, sys, time
t = time.perf_counter()
import hybridkv
dt = time.perf_counter() - t
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps([dt, rss, [m for m in {extras!r} if m in sys.modules]]))
"""

# Runs the CLI in-process (output discarded) and reports what it loaded.
CLI_PROBE = """
import contextlib, io, json, sys
from hybridkv.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    try:
        main({argv!r})
    except SystemExit:
        pass
print(json.dumps([m for m in {extras!r} if m in sys.modules]))
"""


# With --src: the editable install's finder sits on sys.meta_path ahead of PYTHONPATH.
SRC_PRELUDE = (
    "import sys\n"
    "sys.meta_path[:] = [f for f in sys.meta_path "
    "if '__editable__' not in getattr(f, '__module__', '')]\n"
)


def _env(src: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    if src is not None:
        env["PYTHONPATH"] = str(src)
    return env


@dataclass(frozen=True)
class Child:
    """How children run: their environment and folder (``src``'s, where ``-c`` finds it)."""

    env: dict[str, str]
    cwd: Path

    def wall(self, cmd: list[str]) -> float:
        t = time.perf_counter()
        subprocess.run(
            cmd,
            env=self.env,
            cwd=self.cwd,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        return time.perf_counter() - t

    def walls(self, cmd: list[str], repeats: int) -> list[float]:
        """Wall times of ``repeats`` runs of ``cmd``, after one unmeasured warm-up run."""
        self.wall(cmd)
        return [self.wall(cmd) for _ in range(repeats)]

    def json(self, code: str) -> Any:
        done = subprocess.run(
            [sys.executable, "-c", code],
            env=self.env,
            cwd=self.cwd,
            check=True,
            capture_output=True,
            text=True,
        )
        return json.loads(done.stdout.splitlines()[-1])


def _cli(src: Path | None, argv: list[str]) -> list[str]:
    """``python -m hybridkv ARGV``, through the prelude when measuring ``src``."""
    if src is None:
        return [sys.executable, "-m", "hybridkv", *argv]
    run = "import runpy; runpy.run_module('hybridkv', run_name='__main__', alter_sys=True)"
    return [sys.executable, "-c", SRC_PRELUDE + run, *argv]


def measure(repeats: int, src: Path | None, layout: str, memory: str) -> list[dict[str, Any]]:
    """One row per case: median seconds, min, max, extras loaded (and RSS for the import)."""
    child = Child(_env(src), src if src is not None else Path(__file__).resolve().parents[1])
    rows: list[dict[str, Any]] = []
    py = sys.executable
    rows.append(_row("python -c pass", child.walls([py, "-c", "pass"], repeats)))
    prelude = SRC_PRELUDE if src is not None else ""
    probe = prelude + IMPORT_PROBE.format(extras=EXTRAS)
    samples = [child.json(probe) for _ in range(repeats + 1)][1:]
    times = [float(s[0]) for s in samples]
    row = _row("import hybridkv", times, loaded=samples[0][2])
    row["rss_mb"] = statistics.median(float(s[1]) for s in samples)
    rows.append(row)
    for name, argv in (
        ("hybridkv --help", ["--help"]),
        (f"hybridkv plan {layout} --memory {memory}", ["plan", layout, "--memory", memory]),
    ):
        walls = child.walls(_cli(src, argv), repeats)
        loaded = child.json(prelude + CLI_PROBE.format(argv=argv, extras=EXTRAS))
        rows.append(_row(name, walls, loaded=loaded))
    return rows


def _row(name: str, times: list[float], loaded: Any = ()) -> dict[str, Any]:
    return {
        "case": name,
        "median_s": statistics.median(times),
        "min_s": min(times),
        "max_s": max(times),
        "loaded": list(loaded),
    }


def render(rows: list[dict[str, Any]], repeats: int, load: float) -> str:
    lines = [
        f"{repeats} fresh processes per case, median (min-max). Machine: {machine()}; "
        f"load average before the run {load:.1f} (a shared box: compare rows of one run).",
        "",
        "| case | median | min - max | target | extras imported | peak RSS |",
        "| --- | ---: | ---: | ---: | --- | ---: |",
    ]
    for r in rows:
        target = TARGETS.get(str(r["case"]))
        verdict = (
            ""
            if target is None
            else f"<= {target} s: " + ("met" if float(r["median_s"]) <= target else "**missed**")
        )
        rss = f"{r['rss_mb']:.0f} MB" if "rss_mb" in r else ""
        loaded = ", ".join(r["loaded"]) or "none"
        lines.append(
            f"| `{r['case']}` | {r['median_s']:.3f} s | {r['min_s']:.3f} - {r['max_s']:.3f} s | "
            f"{verdict} | {loaded} | {rss} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--src", type=Path, help="a checkout whose hybridkv to measure instead")
    ap.add_argument("--layout", default="gemma-3-27b")
    ap.add_argument("--memory", default="80GB")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON")
    args = ap.parse_args()
    load = os.getloadavg()[0]
    rows = measure(args.repeats, args.src, args.layout, args.memory)
    sys.stdout.write(render(rows, args.repeats, load))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
