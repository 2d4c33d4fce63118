#!/usr/bin/env python3
"""Host work of one decode step, eager against graphed, every family, counted on the CPU.

A small step on a GPU is bound by the host (issue 47): each kernel launch and each
host-to-device copy costs microseconds. This counts, for a decode step of 8 requests
of each family's tiny test checkpoint (``tests/engine/tiny_checkpoints``; the counts
depend on the layer structure, not the widths), ``--kernel-backend triton`` on CPU
tensors with every Triton launch intercepted (``launch_count.intercepted``):

- **eager**: the Triton launches and the kernel-launching aten ops of the step (as
  ``step_launches.py`` counts them: views and allocations left out);
- **graphed**: what runs on the host besides the one graph replay, i.e. the aten ops
  of ``StaticStep.fill`` (host-side list and tensor work), of which ``copy_`` are the
  copies into the static device tensors (host-to-device on a GPU).

    .venv/bin/python benchmarks/graph_host_ops.py [--write]
        # --write: benchmarks/results/graph-host-ops.md
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.pop("TRITON_INTERPRET", None)  # before triton: its kernels are intercepted

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE), str(ROOT / "tests"), str(ROOT / "tests" / "engine")]
RESULTS = ROOT / "benchmarks" / "results" / "graph-host-ops.md"
REQUESTS = 8


def queue_decodes(llm: Any, requests: int, length: int) -> None:
    """Queue ``requests`` requests of ``length``-token prompts (ids below 503) that never
    stop: the engine's steps after their prefill are decode steps."""
    from hybridkv.engine import SamplingParams
    from hybridkv.engine.engine_request import EngineRequest

    params = SamplingParams(max_tokens=10**6, ignore_eos=True)
    for i in range(requests):
        prompt = [(7 * i + j) % 500 + 3 for j in range(length)]
        llm.scheduler.add_request(
            EngineRequest(f"p{i}", prompt, params, max_model_len=llm.max_model_len)
        )


def _engine(path: Path, graphed: bool) -> Any:
    """An engine with ``REQUESTS`` requests past their prefill (graphed: ``EagerReplay``)."""
    from hybridkv.engine import LLM
    from hybridkv.engine.graphs import EagerReplay, StepGraphs

    llm = LLM(path, device="cpu", dtype="float32", kernel_backend="triton",
              max_num_seqs=REQUESTS, kv_cache_memory_bytes=1 << 26)  # fmt: skip
    if graphed:
        llm.runner.graphs = StepGraphs(
            llm.runner, REQUESTS, llm.max_model_len, graph_factory=EagerReplay
        )
    queue_decodes(llm, REQUESTS, 40)
    for _ in range(4):  # the prefill, then decodes (their graph captured)
        llm.step()
    return llm


def count(family: str) -> tuple[int, int, int, int]:
    """(eager Triton launches, eager aten kernel ops, graphed fill ops, graphed copies)."""
    from launch_count import NO_KERNEL, AtenOps, intercepted
    from tiny_checkpoints import FAMILY_CONFIGS, save_checkpoint

    import hybridkv.engine.graphs.static_step as static_step

    with intercepted() as launches, tempfile.TemporaryDirectory() as tmp:
        path = save_checkpoint(FAMILY_CONFIGS[family](), Path(tmp) / family)
        llm = _engine(path, graphed=False)
        launches.clear()
        with AtenOps() as aten:
            llm.step()
        triton = len(launches)
        eager = sum(1 for o in aten.ops if o not in NO_KERNEL)
        llm = _engine(path, graphed=True)
        fill = static_step.StaticStep.fill
        seen: list[list[str]] = []

        def recorded(self: Any, *args: Any) -> int:
            with AtenOps() as a:
                out: int = fill(self, *args)
            seen.append(a.ops)
            return out

        static_step.StaticStep.fill = recorded  # type: ignore[method-assign]
        try:
            llm.step()
        finally:
            static_step.StaticStep.fill = fill  # type: ignore[method-assign]
        assert llm.runner.graphs.stats["decode replays"] >= 1 and len(seen) == 1
    return triton, eager, len(seen[0]), seen[0].count("copy_")


def main(argv: list[str] | None = None) -> int:
    from tiny_checkpoints import FAMILY_CONFIGS

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true", help=f"write {RESULTS.relative_to(ROOT)}")
    args = ap.parse_args(argv)
    lines = [
        f"One decode step of {REQUESTS} requests, each family's tiny test checkpoint, "
        "`--kernel-backend triton`:",
        "",
        "| family | eager: Triton launches | eager: aten kernel ops | eager: launches in all "
        "| graphed: host aten ops (fill) | graphed: copies into static tensors |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for family in FAMILY_CONFIGS:
        t, a, f, c = count(family)
        lines.append(f"| {family} | {t} | {a} | {t + a} | {f} | {c} + 1 replay |")
        print(lines[-1], flush=True)
    print("\n".join(lines))
    if args.write:
        head = [
            "# Host work of a decode step, eager and graphed, counted on the CPU",
            "",
            f"Generated by `benchmarks/graph_host_ops.py` on {datetime.date.today()} "
            "(method in its docstring). No timing: no GPU was lent. The MoE families' "
            "eager counts vary by a few percent between runs: the gathered routing skips "
            "experts no token picked. The graphed fill's aten ops other than the copies "
            "work on host tensors (no device launch). Before `graphs/packed.py` "
            "(2026-11-27) a graphed step's fill made 40 aten ops (24 for Ministral) and "
            "one copy per static tensor: 14 (Gemma 3, Llama 4, Command R7B), 8 "
            "(Ministral), 7 (Jamba, Bamba, Granite).",
            "",
        ]
        RESULTS.write_text("\n".join(head + lines) + "\n")
        print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
