"""``research/step_profile.py``: what its profile counts per step, and its CPU code path.

``launch_counts`` must tell the kernels the GPU ran (a graph's replayed kernels among
them) from the launches the host made: the 2026-11-27 H100 lease's graphed profile
counted 289 "launches" per replayed step, which were the graph's kernels.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from step_profile import kernels_by_name, launch_counts
from torch.autograd import DeviceType

ROOT = Path(__file__).resolve().parents[2]


def _event(name: str, device: DeviceType, us: float = 0.0) -> SimpleNamespace:
    return SimpleNamespace(name=name, device_type=device, device_time=us)


def test_graph_kernels_count_as_gpu_kernels_not_host_launches():
    events = [
        _event("cudaGraphLaunch", DeviceType.CPU),
        *(_event(f"kernel_{i}", DeviceType.CUDA, 2.0) for i in range(5)),
        _event("cuLaunchKernelEx", DeviceType.CPU),
        _event("cudaLaunchKernel", DeviceType.CPU),
        _event("triton_poi_fused", DeviceType.CUDA, 4.0),
        _event("aten::copy_", DeviceType.CPU),
        _event("cudaMemcpyAsync", DeviceType.CPU),
    ]
    busy, kernels, launches, graphs = launch_counts(events)
    assert (kernels, launches, graphs) == (6, 2, 1)
    assert abs(busy - 14e-6) < 1e-12


def test_kernels_by_name_counts_and_times_each_kernel_per_step():
    events = [
        _event("cudaGraphLaunch", DeviceType.CPU),
        *(_event("gemm", DeviceType.CUDA, 3.0) for _ in range(4)),
        *(_event("splitKreduce_kernel", DeviceType.CUDA, 1.0) for _ in range(2)),
        _event("x" * 70, DeviceType.CUDA, 0.5),
    ]
    rows = kernels_by_name(events, steps=2)
    assert rows[2:] == [
        "| `gemm` | 2.0 | 6.0 |",
        "| `splitKreduce_kernel` | 1.0 | 1.0 |",
        f"| `{'x' * 57}...` | 0.5 | 0.2 |",
    ]


def test_graphed_profile_runs_on_the_cpu_stand_in(tmp_path: Path):
    # The --cuda-graphs code path on a tiny Gemma 3 under EagerReplay: decode steps are
    # replayed, and a replay's batch time is the fill's. Vocabulary 20,000: the ids
    # bench_engine.corpus draws without a tokenizer.
    code = (
        "import sys; sys.path[:0] = ['tests', 'tests/engine']\n"
        "from pathlib import Path\n"
        "from tiny_checkpoints import gemma3_config, save_checkpoint\n"
        f"save_checkpoint(gemma3_config(vocab_size=20_000), Path({str(tmp_path)!r}))\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True)
    run = subprocess.run(
        [sys.executable, "research/step_profile.py", "--model", str(tmp_path), "--dtype",
         "float32", "--batch", "3", "--length", "12", "--steps", "2", "--kernel-backend",
         "triton", "--cuda-graphs", "--graph-min-span", "16", "--programs-per-sm", "0"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert "Replayed from graphs: 2 of the 2 timed steps." in run.stdout
    assert "(smallest span class 16)" in run.stdout
    assert "(split-KV fill rule: 0 programs per SM)" in run.stdout
    row = next(
        line
        for line in run.stdout.splitlines()
        if line.startswith("| ") and "---" not in line and "step wall" not in line
    )
    batch = float(row.split("|")[3])
    assert batch > 0  # StaticStep.fill was timed as the batch's part
