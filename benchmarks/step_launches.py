#!/usr/bin/env python3
"""How many kernels one decode step launches, counted on the CPU without running any.

A decode step of a small model on a GPU is bound by launches when each of its kernels
costs the host more than the GPU (issue 16). This counts them for a model's layer
structure with tiny widths (the count does not depend on widths): the engine runs
``--kernel-backend triton`` on CPU tensors with every Triton launch intercepted
(recorded, not run; ``kernel_resources.capture``'s trick) and every aten op recorded
by a ``TorchDispatchMode``. Aten ops that only make views or allocate are left out;
the rest approximate the eager kernels a CUDA run would launch (a cast to the same
dtype launches none, a few ops launch two).

    .venv/bin/python benchmarks/step_launches.py [--requests 8] [--write]
        # --write: benchmarks/results/step-launches.md
"""

from __future__ import annotations

import argparse
import collections
import datetime
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.pop("TRITON_INTERPRET", None)  # before triton: its kernels are intercepted

from torch.utils._python_dispatch import TorchDispatchMode
from triton.runtime.jit import JITFunction

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE)]
RESULTS = ROOT / "benchmarks" / "results" / "step-launches.md"

#: Aten ops that make views, allocate or read a scalar: no kernel of their own.
NO_KERNEL = {
    "view", "_unsafe_view", "reshape", "t", "empty", "empty_like", "empty_strided",
    "as_strided", "detach", "unsqueeze", "squeeze", "slice", "select", "expand",
    "transpose", "permute", "split", "split_with_sizes", "unbind", "alias", "lift_fresh",
    "_local_scalar_dense",
}  # fmt: skip
#: Tiny widths: the count depends on the layer structure, not on the sizes.
TINY = {"hidden_size": 64, "intermediate_size": 128, "vocab_size": 512, "head_dim": 64}


class _Aten(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def count(model: str, requests: int) -> tuple[collections.Counter, collections.Counter]:
    """(Triton launches, kernel-launching aten ops) of one decode step of ``requests``."""
    from random_checkpoint import write_random_checkpoint

    from hybridkv.engine import LLM, SamplingParams
    from hybridkv.engine.engine_request import EngineRequest
    from hybridkv.kernels import backend

    triton: collections.Counter = collections.Counter()

    def getitem(self: JITFunction, grid: Any) -> Any:
        return lambda *a, **k: triton.update([self.__name__])

    saved = JITFunction.__getitem__, backend._CHECKS
    JITFunction.__getitem__ = getitem  # type: ignore[method-assign]
    backend._CHECKS = {n: (lambda *a, **k: None) for n in saved[1]}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            ck = write_random_checkpoint(model, Path(tmp) / "ck", overrides=TINY)
            llm = LLM(str(ck), device="cpu", dtype="float32", kernel_backend="triton",
                      max_num_seqs=max(8, requests), max_model_len=2048,
                      kv_cache_memory_bytes=1 << 28)  # fmt: skip
            params = SamplingParams(max_tokens=10**6, ignore_eos=True)
            for i in range(requests):
                prompt = [(7 * i + j) % 500 + 3 for j in range(64)]
                llm.scheduler.add_request(
                    EngineRequest(f"p{i}", prompt, params, max_model_len=llm.max_model_len)
                )
            for _ in range(4):  # the prefill, then decodes
                llm.step()
            triton.clear()
            with _Aten() as aten:
                llm.step()
    finally:
        JITFunction.__getitem__, backend._CHECKS = saved  # type: ignore[method-assign]
    return triton, collections.Counter(o for o in aten.ops if o not in NO_KERNEL)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gemma-3-270m", help="a random_checkpoint.py shape")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--write", action="store_true", help=f"write {RESULTS.relative_to(ROOT)}")
    args = ap.parse_args(argv)
    triton, aten = count(args.model, args.requests)
    lines = [
        f"One decode step of {args.requests} requests, {args.model}'s layer structure "
        "(tiny widths), `--kernel-backend triton`:",
        "",
        "| launches | count | most frequent |",
        "| --- | ---: | --- |",
        f"| Triton kernels | {sum(triton.values())} | "
        + ", ".join(f"`{k}` {v}" for k, v in triton.most_common(6))
        + " |",
        f"| eager aten ops | {sum(aten.values())} | "
        + ", ".join(f"`{k}` {v}" for k, v in aten.most_common(8))
        + " |",
        f"| total | {sum(triton.values()) + sum(aten.values())} | |",
    ]
    print("\n".join(lines))
    if args.write:
        head = [
            "# Kernel launches per decode step, counted on the CPU",
            "",
            f"Generated by `benchmarks/step_launches.py` on {datetime.date.today()} "
            "(method in its docstring). Before the Gemma norm/RoPE/GeGLU kernels "
            "(`kernels/norms_triton.py`, 2026-11-26), the same step launched 36 Triton "
            "kernels and 1,353 eager aten ops (1,389 in all; `mul` 317, `add` 188, `to` "
            "137, `linear` 127, `pow`, `mean`, `rsqrt` and `type_as` 109 each).",
            "",
        ]
        RESULTS.write_text("\n".join(head + lines) + "\n")
        print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
