"""What one full garbage collection costs with a large block pool, before and after the
engine freezes its start-up heap (``hybridkv/engine/heap_freeze.py``).

Two pools, each built the way the product builds it:

- ``sim``: the simulator's manager for jamba-v0.1 at 40 GB of device memory (the
  ``hybridkv simulate`` plan: block size 16, 8,192 batched tokens), ``hybrid``;
- ``llm``: an ``LLM`` over a random tiny Gemma 3 checkpoint (``tests/engine``'s)
  whose KV memory is sized to ``--llm-blocks`` blocks.

For each, in one process: the median time of ``gc.collect()`` (a full, generation-2
collection: the pause CPython's collector takes when allocation counts trigger one)
and of ``gc.collect(0)`` (a young one), over ``--repeats`` calls; then
``freeze_startup_heap`` (what ``LLM`` calls at the end of its start-up) and the
same again; ``release_heap`` after. The ratio is after / before.

    python benchmarks/bench_gc_freeze.py [--write]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from machine_info import cpu_features, machine

from hybridkv import KVCacheManager
from hybridkv.engine.heap_freeze import freeze_startup_heap, release_heap
from hybridkv.layouts import shipped_layout
from hybridkv.planning import plan_kv_cache

ROOT = Path(__file__).resolve().parents[1]
OUT = Path(__file__).resolve().parent / "results" / "gc-freeze.md"


def timed(fn: Callable[[], object], repeats: int) -> float:
    """Median milliseconds of ``fn()``."""
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append((time.perf_counter() - start) * 1e3)
    return statistics.median(out)


def measure(name: str, blocks: int, owner: object, repeats: int) -> list[str]:
    """The table rows of one pool (the heap as it is now, ``owner`` its engine)."""
    gc.collect()
    tracked = len(gc.get_objects())
    full_before = timed(gc.collect, repeats)
    young_before = timed(lambda: gc.collect(0), repeats)
    start = time.perf_counter()
    unfreeze = freeze_startup_heap(owner)
    freeze_ms = (time.perf_counter() - start) * 1e3
    if unfreeze is None:
        raise SystemExit("the heap was frozen already: nothing to measure")
    frozen = gc.get_freeze_count()
    full_after = timed(gc.collect, repeats)
    young_after = timed(lambda: gc.collect(0), repeats)
    release_heap(unfreeze)
    row = f"| {name} | {blocks:,} | {tracked:,} | {frozen:,} | {freeze_ms:.0f} |"
    return [
        f"{row} full `gc.collect()` | {full_before:.3f} | {full_after:.3f} | "
        f"{full_after / full_before:.4f}x |",
        f"{row} young `gc.collect(0)` | {young_before:.3f} | {young_after:.3f} | "
        f"{young_after / young_before:.2f}x |",
    ]


def sim_pool(repeats: int) -> list[str]:
    plan = plan_kv_cache(
        shipped_layout("jamba-v0.1"),
        40_000_000_000,
        block_size=16,
        max_model_len=32768,
        max_num_batched_tokens=8192,
    )
    manager = KVCacheManager(plan.kv_cache_config, 32768, cache_policy="hybrid")
    blocks = len(manager.block_pool.blocks)
    return measure("sim: jamba-v0.1, 40 GB", blocks, manager, repeats)


def llm_pool(blocks: int, repeats: int) -> list[str]:
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "engine")]
    from tiny_checkpoints import gemma3_config, save_checkpoint

    from hybridkv.engine import LLM

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = save_checkpoint(gemma3_config(), Path(tmp))
        probe = LLM(ckpt, block_size=4, max_model_len=64, device="cpu")
        per_block = probe.plan.available_memory_bytes // len(probe.manager.block_pool.blocks)
        probe.close()
        del probe
        gc.unfreeze()  # the probe's start-up froze the heap; measure from a thawed one
        llm = LLM(
            ckpt,
            block_size=4,
            max_model_len=64,
            device="cpu",
            kv_cache_memory_bytes=per_block * blocks,
        )
        release_heap(llm._unfreeze)  # measured below, from the thawed heap
        n = len(llm.manager.block_pool.blocks)
        rows = measure("`LLM`: tiny Gemma 3", n, llm, repeats)
        llm.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--llm-blocks", type=int, default=524_288)
    ap.add_argument("--write", action="store_true", help=f"write {OUT.name}")
    args = ap.parse_args()
    rows = sim_pool(args.repeats)
    gc.collect()
    rows += llm_pool(args.llm_blocks, args.repeats)
    header = [
        "| pool | blocks | objects tracked | objects frozen | freeze at start-up (ms) "
        "| collection | before (ms) | after freeze (ms) | after / before |",
        "| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    text = "\n".join(
        [
            "# One full garbage collection with a large pool, before and after the start-up "
            "freeze (`benchmarks/bench_gc_freeze.py`)",
            "",
            f"{machine()}; {cpu_features()}. Medians of {args.repeats} calls in one process.",
            "",
            *header,
            *rows,
            "",
        ]
    )
    print(text)
    if args.write:
        OUT.write_text(text)


if __name__ == "__main__":
    main()
