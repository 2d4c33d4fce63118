"""``research/tune_mamba_scan.py`` at tiny shapes on the CPU (Triton's interpreter),
so that the GPU-only sweep keeps running: every stage, the error check and its
refusals, the host-cost rows and the Mamba1 rows."""

from __future__ import annotations

import pytest
import torch
import tune_mamba_scan as tune

CPU = torch.device("cpu")

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU runs the real sweep")


def _cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip().strip("|").split("|")]


def test_smoke_report_has_every_section():
    lines = tune.report(CPU, smoke=True, budget=None)
    text = "\n".join(lines)
    for head in ("## Mamba2", "## At the rule's precision (tf32x3)", "## Host cost",
                 "## Where the time goes", "## Mamba1", "## Every Mamba2 candidate"):  # fmt: skip
        assert head in text
    # Stage 0's best gets its own rows where it is neither the defaults nor the best.
    profiled = [_cells(r)[2:] for r in lines if "no CUDA profiler" in r]
    assert profiled[:2] == [
        ["defaults", "-", "-", "no CUDA profiler on the CPU"],
        ["best", "-", "-", "no CUDA profiler on the CPU"],
    ]
    assert profiled[2:] in ([], [["best at tf32x3", "-", "-", "no CUDA profiler on the CPU"]])
    (rule,) = [r for r in lines if r.startswith("| tiny |") and r.count("|") == 8]
    assert _cells(rule)[3] in ("defaults", *(t.describe() for t in tune.SMOKE_PLAN.rule_stage))
    assert "chunk_size=32, block_m=16, block_k=16" in text and "pass_block=64" in text
    (summary,) = [r for r in lines if r.startswith("| tiny |") and r.count("|") == 13]
    cells = _cells(summary)
    # defaults, stage 0's 2, 2 precisions, 4 chunk x block_n, 4 block_p x stages (one
    # already seen), 8 warps, and shared_cb on stage 1's best, then flipped on the final
    # best: that last one is new unless stage 1's best with shared_cb won overall
    # (timing decides).
    assert cells[9] in ("14", "15") and cells[10:] == ["0", "0"], summary
    assert "shared_cb=True" in text
    assert cells[6].endswith("x") and cells[7].endswith("x")
    host = [r for r in lines if "| defaults: " in r or ("| best" in r and "%" in r)]
    assert len(host) in (2, 3) and all(_cells(r)[5].endswith("%") for r in host)
    m1 = [r for r in lines if r.startswith("| 1 x 24 |")]
    assert [_cells(r)[1] for r in m1] == ["2", "4"] and all(_cells(r)[4].endswith("x") for r in m1)


def test_choices_over_tolerance_are_refused_not_timed(monkeypatch):
    # bf16 rounds the matmul inputs (~1e-3 here); the fp32 choices stay within 1e-5.
    monkeypatch.setattr(tune, "TOL", {p: (1e-5, 1e-5) for p in tune.TOL})
    plan = tune.Plan(("ieee", "bf16"), (4,), (), (), (), (), (), (), reps=1, warmup=0)
    row, details, *_ = tune.sweep_shape(
        "tiny", (2, 16, 1, 32), 1, 40, CPU, plan, tune.Deadline(None)
    )
    status = {_cells(d)[2]: _cells(d)[5] for d in details}
    assert status["defaults"] == "ok"
    assert status["num_warps=4, precision=bf16"].startswith("over the tolerance")
    assert _cells(row)[10] == "1"  # refused


def test_past_the_budget_only_the_defaults_run():
    plan = tune.Plan(("ieee", "bf16"), (4,), (16,), (None,), (None,), (None,), (8,), (), 1, 0)
    row, details, *_ = tune.sweep_shape(
        "tiny", (2, 16, 1, 32), 1, 40, CPU, plan, tune.Deadline(-1.0)
    )
    assert _cells(details[0])[5] == "ok"
    assert all(_cells(d)[5].startswith("skipped") for d in details[1:])
    assert _cells(row)[4] == "defaults"
    assert int(_cells(row)[-1]) == len(details) - 1 > 0  # the row counts what it skipped


def test_main_refuses_to_write_a_smoke_run():
    with pytest.raises(SystemExit, match="nothing to write"):
        tune.main(["--smoke", "--write"])


class _Event:
    def __init__(self, key: str, us: float) -> None:
        self.key, self.self_device_time_total = key, us


def test_kernel_totals_sum_per_name_per_call_costliest_first():
    events = [
        _Event("_chunk_scan_kernel", 900.0),
        _Event("_state_passing_kernel", 300.0),
        _Event("_chunk_scan_kernel(int, int)", 300.0),  # the same kernel, another key
        _Event("Memset (Device)", 0.0),  # no device time: left out
    ]
    assert tune.kernel_totals(events, calls=3) == [
        ("_chunk_scan_kernel", pytest.approx(400e-6)),
        ("_state_passing_kernel", pytest.approx(100e-6)),
    ]


def test_kernel_totals_reads_the_old_profiler_field():
    class Old:
        key, self_cuda_time_total = "k", 50.0

    assert tune.kernel_totals([Old()], calls=1) == [("k", pytest.approx(50e-6))]


def test_a_failing_profiler_is_reported_in_its_row_and_the_sweep_goes_on(monkeypatch):
    def boom(*_a, **_k):
        raise RuntimeError("CUPTI unavailable")

    monkeypatch.setattr(tune, "kernel_seconds", boom)
    plan = tune.Plan(("ieee",), (4,), (), (), (), (), (), (), reps=1, warmup=0)
    row, _, host, kernels, _ = tune.sweep_shape(
        "tiny", (2, 16, 1, 32), 1, 40, CPU, plan, tune.Deadline(None)
    )
    assert len(host) == 2 and row.startswith("| tiny |")
    assert [_cells(k)[2:] for k in kernels] == [
        ["defaults", "-", "-", "profiler failed: RuntimeError: CUPTI unavailable"],
        ["best", "-", "-", "profiler failed: RuntimeError: CUPTI unavailable"],
    ]
