"""``bench_engine.py --async-scheduling``: the batch's throughput without and with async
scheduling, on the same engine in the same process.

The engine ``bench_engine.py`` loaded (its weights, its captured CUDA graphs) runs the
batch of case 1 alternately with ``async_steps`` off and on (``AsyncSteps``: what
``LLM(async_scheduling=True)`` installs), ``rounds`` times each; each run's wall time
and the median decode step's wall time (``LLM.step``, after a device sync on CUDA only at
the run's end) are kept, and the outputs checked identical. On a GPU this is the overlap
of the host with the GPU (issue 47: a graphed step of 2.72 ms wall with the GPU busy
1.14 ms); on the CPU the forward is synchronous and the two should tie (the CPU's
overlap is modelled by ``bench_host_step.py --overlap``).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from hybridkv.engine import LLM, SamplingParams
from hybridkv.engine.async_step import AsyncSteps


def _run(llm: LLM, prompts: list[list[int]], new: int) -> tuple[float, float, list[Any]]:
    """(seconds, median decode step seconds, token ids) of one ``generate``."""
    walls: list[float] = []
    step = llm.step

    def timed() -> Any:
        t = time.perf_counter()
        out = step()
        if out.scheduled and all(s.num_tokens == 1 for s in out.scheduled):
            walls.append(time.perf_counter() - t)
        return out

    llm.step = timed  # type: ignore[method-assign]
    params = SamplingParams(max_tokens=new, ignore_eos=True)
    try:
        t = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        if llm.device.type == "cuda":
            torch.cuda.synchronize(llm.device)
        seconds = time.perf_counter() - t
    finally:
        del llm.step
    return seconds, statistics.median(walls), [o.outputs[0].token_ids for o in outs]


def async_rows(llm: LLM, prompts: list[list[int]], new: int, rounds: int = 2) -> list[str]:
    """Table rows: the batch without and with async scheduling (module docstring)."""
    runs: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    tokens: dict[bool, Any] = {}
    stats: Any = None
    for _ in range(rounds):
        for on in (False, True):
            llm.async_steps = AsyncSteps(llm.device) if on else None
            llm.manager.reset_prefix_cache()
            seconds, step, tokens[on] = _run(llm, prompts, new)
            runs[on].append((seconds, step))
            stats = llm.async_steps.stats if on else stats  # type: ignore[union-attr]
    llm.async_steps = None
    total = len(prompts) * new
    rows = []
    for on in (False, True):
        seconds = statistics.median(r[0] for r in runs[on])
        step = statistics.median(r[1] for r in runs[on])
        rows.append(f"| {'on' if on else 'off'} | {total / seconds:.1f} | {step * 1e3:.2f} |")
    same = sum(a == b for a, b in zip(tokens[False], tokens[True], strict=True))
    print(f"async scheduling: {rows[0]} -> {rows[1]}; identical outputs {same}/{len(prompts)}; "
          f"{dict(stats)}", flush=True)  # fmt: skip
    return [*rows, "", f"Identical outputs {same}/{len(prompts)}; counters {dict(stats)}."]
