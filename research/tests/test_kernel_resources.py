"""``research/kernel_resources.py``: the Triton kernels compiled offline for sm_90.

The launchers' rules must compile without local memory (register spills) and, where
a kernel multiplies tiles, to tensor-core instructions: the chunked Mamba2 scan's
first rules did neither and ran 5-12x slower than the sequential kernel on an H200.
The compile runs in a subprocess: it needs ``TRITON_INTERPRET`` unset, which the
test session sets.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "research" / "kernel_resources.py"
NVIDIA_BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"

pytestmark = pytest.mark.skipif(
    not (NVIDIA_BIN / "cuobjdump").exists() or not (NVIDIA_BIN / "ptxas").exists(),
    reason="this triton has no bundled NVIDIA toolchain",
)


def _python(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT,
        timeout=600,
    )  # fmt: skip


def test_every_rule_compiles_without_local_memory_and_mamba2_on_tensor_cores():
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, cwd=ROOT,
        timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    rows = [r for r in run.stdout.splitlines() if r.startswith("| Mamba2 chunked scan")]
    kernels = {r.split("|")[2].strip(): r.split("|")[-2].strip() for r in rows}
    assert kernels == {  # chunk 64 and chunk 256 (C B^T shared by rule there)
        "`_chunk_cumsum_kernel`": "none",  # no matmul: dt and its cumulative sum
        "`_chunk_state_kernel`": "wgmma",
        "`_state_passing_kernel`": "none",  # no matmul: a recurrence over chunks
        "`_chunk_cb_kernel`": "wgmma",
        "`_chunk_scan_kernel`": "wgmma",
    }


def test_the_report_sees_spills_and_cuda_core_dots():
    # IEEE fp32 dots with all of d_state in one block: the first lease's rules.
    got = _python(
        "import sys; sys.path[:0] = ['research', 'benchmarks']\n"
        "import kernel_resources as kr\n"
        "from bench_kernels import MAMBA2_SHAPES, mamba2_prefill_inputs\n"
        "from hybridkv.kernels.mamba import ssd_chunk_scan_fn\n"
        "from hybridkv.kernels.mamba.scan_tiles import ScanTiles\n"
        "args, _ = mamba2_prefill_inputs(1, 128, MAMBA2_SHAPES['Bamba 9B'], None, 'cpu')\n"
        "tiles = ScanTiles(precision='ieee', block_n=128, num_warps=8)\n"
        "for launch in kr.capture(lambda: ssd_chunk_scan_fn(*args, backend='triton', "
        "tiles=tiles)):\n"
        "    r = kr.resources('ieee', launch)\n"
        "    print(r.kernel, r.stack, r.tensor_cores)\n"
    )
    assert got.returncode == 0, got.stderr
    seen = dict((k, (int(s), t)) for k, s, t in (line.split() for line in got.stdout.splitlines()))
    assert seen["_chunk_scan_kernel"][0] > 0 and seen["_chunk_scan_kernel"][1] == "none"
    # The chunk-state kernel's [64, 64] x [64, 128] product no longer spills here since it
    # reads dt from phase 0's buffer (2026-11-28); its dots still run on CUDA cores.
    assert seen["_chunk_state_kernel"][1] == "none"


def test_decode_steps_of_any_batch_and_length_reuse_a_few_binaries():
    # Batch 1-40, 100-32,868 tokens, split 1-16 ways as on CUDA: before the segment
    # count left the constexprs and num_seqs / the table stride left specialisation,
    # these steps compiled 51 attention binaries and 15 merges.
    got = _python(
        "import sys; sys.path[:0] = ['research', 'benchmarks']\n"
        "import kernel_resources as kr\n"
        "print(kr.decode_variants())\n"
    )
    assert got.returncode == 0, got.stderr
    counts = eval(got.stdout.strip().splitlines()[-1])  # a dict literal printed above
    # Short- and long-span tiles, each whole and split (the fill rule splits short spans
    # of small batches too since 2026-11-28); one merge per power of two of segments.
    assert counts == {"reduce_segments_kernel": 4, "unified_attention_kernel": 4}


def test_the_norm_kernels_compile_without_contracted_multiply_adds():
    # The H100 lease (2026-11-26): with Triton's default FMA contraction, norm_rope
    # compiled RoPE's two rounded products and their sum into one fma.rn.bf16, and
    # the norms differed from torch's by one or two ulps in about a fifth of the
    # values. Their launches turn contraction off; forced back on, the fma returns
    # (so this check sees it).
    got = _python(
        "import sys, re; sys.path[:0] = ['research', 'benchmarks']\n"
        "import kernel_resources as kr\n"
        "for op in ('add_rms_norm', 'norm_rope', 'rms_norm'):\n"
        "    (launch,) = kr.capture(kr._norms(op))\n"
        "    n = len(re.findall(r'\\bfma\\.', kr.compile_launch(launch).asm['ptx']))\n"
        "    on = kr.compile_launch(launch, enable_fp_fusion=True).asm['ptx']\n"
        "    full = 'div.full' in kr.compile_launch(launch).asm['ptx']\n"
        "    print(op, n, len(re.findall(r'\\bfma\\.', on)), full)\n"
    )
    assert got.returncode == 0, got.stderr
    rows = [ln.split() for ln in got.stdout.splitlines()]
    counts = {op: (int(a), int(b), full == "True") for op, a, b, full in rows}
    assert set(counts) == {"add_rms_norm", "norm_rope", "rms_norm"}
    for op, (launched, fused, approx_div) in counts.items():
        assert launched == 0, f"{op}: {launched} fma instructions as launched"
        assert fused > 0, f"{op}: no fma even with contraction on"
        # The mean of squares divides as IEEE does (div.rn), not approximately.
        assert not approx_div, f"{op}: div.full (approximate division) in its PTX"
