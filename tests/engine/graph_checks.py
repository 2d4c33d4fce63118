"""What the CUDA-graph tests check of a captured step, shared by the family tests."""

from __future__ import annotations

import torch
from host_reads import HOST_READS, RecordOps

from hybridkv.engine import LLM
from hybridkv.engine.graphs import StaticStep, StepShape


def captured_step_host_reads(llm: LLM) -> set[str]:
    """The host reads (``HOST_READS``) of a decode step and of a small mixed step of
    ``llm``'s model over static inputs, run once to plan the launches and then
    recorded; also checks that the recorded forward ran the model (a linear op)."""
    runner = llm.runner
    groups = list(runner.config.kv_cache_groups)
    reads: set[str] = set()
    for shape in (StepShape(4, 4, 64, decode=True), StepShape(16, 2, 64, decode=False)):
        static = StaticStep.make(shape, groups, runner.buffers, llm.max_model_len, runner.device)
        with torch.inference_mode():
            static.forward(runner.model, runner.ops)  # the first run plans the launches
            with RecordOps() as seen:
                static.forward(runner.model, runner.ops)
        assert "aten.linear.default" in seen.ops
        reads |= HOST_READS & set(seen.ops)
    return reads
