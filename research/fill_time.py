#!/usr/bin/env python3
"""How long ``StaticStep.fill`` (a graphed step's host work) takes on a decode step, against
the fill of an earlier revision in the same process.

On the fifth lease's H100 a graphed Gemma 3 270M decode step of 64 requests spent 1.05 ms
of its 3.44 ms in ``fill`` (issue 47). This builds the engine on a checkpoint
(``--model``, by default a tiny Gemma 3 of 270M's 18 layers and six attention groups:
``tiny_checkpoints.gemma3_config``, a 512-token window on 5 of every 6 layers; the torch
backend on the CPU: only the host work is timed), decodes
``--batch`` requests of ``--length`` tokens until a decode step is replayed, then times,
alternately, that step's ``fill`` with this checkout's ``StaticStep`` and with the one of
``--baseline REV`` (``hybridkv/engine/graphs/static_step.py`` read from git), each over
fresh static tensors of the same shape, and checks that both wrote the same values
(packed ints and block tables). Also the manager's ``get_block_ids`` for the step.

    .venv/bin/python research/fill_time.py [--model DIR] [--baseline f2703d4]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [
    str(ROOT),
    str(ROOT / "benchmarks"),
    str(ROOT / "tests"),
    str(ROOT / "tests" / "engine"),
]


def _ms(fn: Callable[[], Any], n: int = 200) -> float:
    for _ in range(20):
        fn()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e3


def _baseline_module(rev: str, tmp: Path) -> Any:
    src = subprocess.run(
        ["git", "show", f"{rev}:hybridkv/engine/graphs/static_step.py"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    path = tmp / "baseline_static_step.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("baseline_static_step", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["baseline_static_step"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _tiny_gemma3(out: Path) -> Path:
    from tiny_checkpoints import gemma3_config, save_checkpoint

    kinds = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(18)]
    config = gemma3_config(vocab_size=20_000, num_hidden_layers=18, sliding_window=512,
                           layer_types=kinds, max_position_embeddings=4096)  # fmt: skip
    return save_checkpoint(config, out)


def main(argv: list[str] | None = None) -> int:
    import torch
    from graph_host_ops import queue_decodes
    from machine_info import machine

    from hybridkv.engine import LLM
    from hybridkv.engine.graphs import EagerReplay, StaticStep, StepGraphs

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="a checkpoint (default: the tiny 18-layer Gemma 3)")
    ap.add_argument("--baseline", default="f2703d4", help="git revision of the baseline fill")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)
    model = args.model or str(_tiny_gemma3(Path(tempfile.mkdtemp(prefix="fill-time-"))))
    llm = LLM(model, device="cpu", dtype="float32", kernel_backend="torch",
              max_num_seqs=args.batch, max_model_len=args.length + 64)  # fmt: skip
    queue_decodes(llm, args.batch, args.length)
    seen: list[tuple[Any, list[Any], Any]] = []
    fill = StaticStep.fill

    def spy(static: Any, work: Any, ids: Any, *rest: Any) -> int:  # rest: pending ids, if any
        seen.append((static, list(work), ids))
        return fill(static, work, ids, *rest)

    llm.runner.graphs = StepGraphs(
        llm.runner, args.batch, llm.max_model_len, graph_factory=EagerReplay
    )
    StaticStep.fill = spy  # type: ignore[method-assign]
    try:
        while not seen or not seen[-1][0].shape.decode:
            llm.step()
    finally:
        StaticStep.fill = fill  # type: ignore[method-assign]
    shape, work, ids = seen[-1][0].shape, seen[-1][1], seen[-1][2]
    runner, manager = llm.runner, llm.runner.manager
    groups = list(runner.config.kv_cache_groups)
    with tempfile.TemporaryDirectory() as tmp, torch.inference_mode():
        base = _baseline_module(args.baseline, Path(tmp))
        steps = [
            cls.make(shape, groups, runner.buffers, llm.max_model_len, runner.device)
            for cls in (base.StaticStep, StaticStep)
        ]
        old_ms, new_ms = [], []
        for _ in range(args.repeats):
            old_ms.append(_ms(lambda: steps[0].fill(work, ids)))
            new_ms.append(_ms(lambda: steps[1].fill(work, ids)))
        for s in steps:
            s.fill(work, ids)
        a, b = steps
        assert a.ints64.mirror.tolist() == b.ints64.mirror.tolist()
        assert a.ints32.mirror.tolist() == b.ints32.mirror.tolist()
        for ma, mb in zip(a.metas, b.metas, strict=True):
            assert torch.equal(ma.block_table, mb.block_table)
        ids_ms = statistics.median(
            _ms(lambda: [manager.get_block_ids(s.request.request_id) for s in work])
            for _ in range(args.repeats)
        )
    old, new = statistics.median(old_ms), statistics.median(new_ms)
    blocks = [len(r) for r in ids[0]]
    print(
        f"{machine()}: a decode step of {len(work)} requests, {len(blocks)} attention groups "
        f"of {blocks[0]} blocks each: `fill` {old:.3f} ms at {args.baseline}, {new:.3f} ms now "
        f"({old / new:.2f}x; medians of {args.repeats}, same values written); the manager's "
        f"`get_block_ids` {ids_ms:.3f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
