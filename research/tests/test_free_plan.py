"""``research/free_plan.py``: would a release plan kept per request make ``free`` cheap?

Runs the script on a short replay of the shared harness's workload: it must time
``free`` with and without the plan, and report what moves before each free.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT.parent / "shared" / "bench" / "vllm_baseline" / "bench_vllm.py"


@pytest.mark.skipif(not HARNESS.exists(), reason="needs the shared replay harness")
def test_free_plan_times_free_without_its_plan_and_counts_what_moves():
    run = subprocess.run(
        [sys.executable, "research/free_plan.py", "--requests", "120", "--configs", "hybrid"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    free, rest, lru = map(float, re.search(
        r"free ([\d.]+) us per call, without the plan ([\d.]+) us .* lru's free ([\d.]+) us",
        run.stdout,
    ).groups())  # fmt: skip
    assert 0 < rest < free and lru > 0
    frees = int(re.search(r"of (\d+) frees", run.stdout).group(1))
    assert frees == 120  # every request is freed once, while it holds tables
    plan, kept = map(float, re.search(
        r"the plan ([\d.]+) us, of which needs no ref count ([\d.]+) us", run.stdout
    ).groups())  # fmt: skip
    assert 0 < kept < plan
    assert "E moves after admission: 0 times:" in run.stdout
