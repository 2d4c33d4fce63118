"""``research/graph_kernels.py``: the kernels of one graphed Gemma 3 decode step, per layer.

Holds the count the fusions reached (issue 47): per layer one GEMM for q/k/v, one
kernel for q/k norm + RoPE and the cache write, attention, the o GEMM, a residual
norm, one GEMM for gate/up, GeGLU, the down GEMM, a residual norm: 9 (14 before).
Runs in a subprocess: it needs ``TRITON_INTERPRET`` unset, which the test session sets.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[2]


def test_a_graphed_gemma3_decode_step_runs_nine_kernels_per_layer():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = (
        "import sys; sys.path[:0] = ['research', 'benchmarks']\n"
        "import graph_kernels as g\n"
        "layers, rest = g.per_layer(g.record(4))\n"
        "print(sorted({len(v) for v in layers.values()}), len(layers))\n"
        "print([k for _, k in layers[0]])\n"
        "print(len(rest))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT,
        timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    counts, first, rest = run.stdout.strip().splitlines()[-3:]
    assert counts == "[9] 18"
    assert eval(first) == [  # a list literal printed above
        "_linear_pointwise", "_qk_norm_rope_cache_kernel", "unified_attention_kernel",
        "_linear_pointwise", "_add_rms_norm_kernel", "_linear_pointwise",
        "_gelu_tanh_mul_kernel", "_linear_pointwise", "_add_rms_norm_kernel",
    ]  # fmt: skip
    # The embedding, its scale, the first norm, the cos/sin of the two RoPE bases (one
    # gather each from its table: models/layers/rope_table.py; 7 kernels each before), the
    # LM head.
    assert int(rest) == 6
