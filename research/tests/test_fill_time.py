"""``research/fill_time.py``: a graphed decode step's ``fill`` against an earlier revision's.

Runs the script on a small batch against this checkout's own ``HEAD``: it must find a
replayed decode step, time both fills and check that they wrote the same values.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_fill_time_compares_two_revisions_on_a_decode_step():
    run = subprocess.run(
        [sys.executable, "research/fill_time.py", "--baseline", "HEAD", "--batch", "3",
         "--length", "12", "--repeats", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert "a decode step of 3 requests, 6 attention groups" in run.stdout
    assert "same values written" in run.stdout
