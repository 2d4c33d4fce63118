"""``research/step_launches.py``: the kernels one decode step launches, counted.

Gemma 3's norms, RoPE and GeGLU are one Triton kernel each under the ``triton``
backend, so a decode step of Gemma 3 270M's 18 layers launches about 360 kernels
(1,389 when they ran as eager torch ops). Runs in a subprocess: it needs
``TRITON_INTERPRET`` unset, which the test session sets.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[2]


def test_a_gemma3_decode_step_launches_one_kernel_per_fused_op():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = (
        "import sys; sys.path[:0] = ['research', 'benchmarks']\n"
        "import step_launches as s\n"
        "triton, aten = s.count('gemma-3-270m', 4)\n"
        "print(dict(triton)); print(sum(aten.values()), aten['linear'], aten['pow'])\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT,
        timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    triton_line, aten_line = run.stdout.strip().splitlines()[-2:]
    layers = 18
    # Per layer: q and k norm + RoPE with the cache write, two residual norms, GeGLU,
    # attention; plus the first layer's input norm.
    assert eval(triton_line) == {  # a dict literal printed above
        "_add_rms_norm_kernel": 2 * layers + 1,
        "_qk_norm_rope_cache_kernel": layers,
        "_gelu_tanh_mul_kernel": layers,
        "unified_attention_kernel": layers,
    }
    total, linear, pow_ = map(int, aten_line.split())
    assert linear == 4 * layers + 1  # qkv (merged), o, gate_up (merged), down; the LM head
    assert pow_ == 0  # no eager norm left
    assert total < 260
