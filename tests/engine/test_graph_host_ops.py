"""``benchmarks/graph_host_ops.py``: a graphed decode step's host work, counted so that
it cannot grow. Its int inputs go to the device in two copies (``PackedInts``, int64
and int32) plus one per attention group's block table, however many vectors the
groups need (Ministral: two attention groups; Jamba: one, and a Mamba group). Runs in
a subprocess: it needs ``TRITON_INTERPRET`` unset, which the test session sets.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[2]


def test_a_graphed_decode_step_makes_two_copies_plus_one_per_block_table():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = (
        "import sys; sys.path.insert(0, 'benchmarks')\n"
        "import graph_host_ops as g\n"
        "print([g.count(f) for f in ('ministral', 'jamba')])\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT,
        timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    (_, ministral_eager, ministral_fill, ministral_copies), jamba = eval(
        run.stdout.strip().splitlines()[-1]
    )  # a list literal printed above
    assert ministral_copies == 2 + 2
    assert jamba[3] == 2 + 1
    # The fill's other aten ops work on host tensors; far fewer than the eager launches.
    assert ministral_fill < ministral_eager / 4 and jamba[2] < jamba[1] / 4
