#!/usr/bin/env python3
"""The kernels of one graphed decode step, per layer and named, counted on the CPU.

A graphed decode step of Gemma 3 270M on an H100 ran 289 kernels in 1.45 ms of GPU time,
5.6x the roofline of its bytes: each small kernel costs a few microseconds whatever it
reads (issue 47). This lists what a replay runs: the engine (``--kernel-backend triton``,
fp32, CPU tensors) decodes ``--requests`` requests with its steps "replayed" by
``EagerReplay`` (the CPU tests' stand-in for a CUDA graph), and one replay's
``StaticStep.forward`` is recorded: every Triton launch (intercepted, not run:
``launch_count.intercepted``) and every aten op that launches a kernel (views and
allocations left out), each under the module that ran it (forward hooks) or the step's
RoPE tables (``RopeFrequencies.for_step``). What runs on the GPU is close to this list:
an aten ``linear`` is one cuBLAS kernel (or two, with a split-K reduction), a Triton
launch one kernel.

Widths are shrunk (hidden 64, MLP 128, vocabulary 512): the list depends on the layer
structure and the head geometry (kept: 4 query / 1 KV heads of 256, which the attention
launch plan reads), not on the widths.

    .venv/bin/python research/graph_kernels.py [--requests 64] [--write]
        # --write: benchmarks/results/kernels-per-decode-step.md (the "now" section)
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.pop("TRITON_INTERPRET", None)  # before triton: its kernels are intercepted

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks"), str(HERE)]
RESULTS = ROOT / "benchmarks" / "results" / "kernels-per-decode-step.md"

#: Tiny widths; the head geometry stays Gemma 3 270M's (the attention plan reads it).
TINY = {"hidden_size": 64, "intermediate_size": 128, "vocab_size": 512}

#: What each recorded kernel does, by (innermost module's last name, kernel).
ROLES = {
    ("embed_tokens", "embedding"): "embedding lookup",
    ("model", "mul"): "embedding scale",
    ("model", "_add_rms_norm_kernel"): "first input RMSNorm",
    ("q_proj", "linear"): "q projection (GEMM)",
    ("k_proj", "linear"): "k projection (GEMM)",
    ("v_proj", "linear"): "v projection (GEMM)",
    ("qkv_proj", "linear"): "q, k, v projections (one GEMM)",
    ("o_proj", "linear"): "o projection (GEMM)",
    ("gate_proj", "linear"): "gate projection (GEMM)",
    ("up_proj", "linear"): "up projection (GEMM)",
    ("gate_up_proj", "linear"): "gate, up projections (one GEMM)",
    ("down_proj", "linear"): "down projection (GEMM)",
    ("lm_head", "linear"): "logits (LM head GEMM)",
    ("self_attn", "_norm_rope_kernel"): "q or k RMSNorm + RoPE",
    ("self_attn", "_qk_norm_rope_cache_kernel"): "q, k RMSNorm + RoPE, k/v cache write",
    ("attn", "_reshape_and_cache_kernel"): "reshape_and_cache (k, v)",
    ("attn", "unified_attention_kernel"): "attention",
    ("attn", "reduce_segments_kernel"): "attention split-KV merge",
    ("self_attn", "unified_attention_kernel"): "attention",
    ("self_attn", "reduce_segments_kernel"): "attention split-KV merge",
    ("layer", "_add_rms_norm_kernel"): "residual add + RMSNorm (post-norm, next pre-norm)",
    ("mlp", "_gelu_tanh_mul_kernel"): "GELU(gate) * up",
    ("step", "index"): "pick the sampled rows",
}


#: Aten names of a GEMM (``_linear_pointwise``: ``PackedLinear``'s oneDNN call, CPU bf16).
GEMMS = {"linear", "_linear_pointwise", "mm", "addmm"}


def _role(scope: str, kernel: str) -> str:
    kernel = "linear" if kernel in GEMMS else kernel
    last = scope.rsplit(".", 1)[-1]
    if re.fullmatch(r"layers\.\d+", scope.removeprefix("model.")):
        last = "layer"
    if scope.startswith("rope"):
        return "RoPE cos/sin of the step (a gather from the table of every position)"
    return ROLES.get((last, kernel), "?")


@contextlib.contextmanager
def _scopes(model: Any, rope_cls: Any) -> Iterator[list[str]]:
    """Inside, ``stack[-1]`` names the module (or RoPE table) running."""
    stack = ["step"]
    handles = []
    for name, module in model.named_modules():
        label = name or "step"

        def pre(_m: Any, _a: Any, label: str = label) -> None:
            stack.append(label)

        def post(_m: Any, _a: Any, _o: Any) -> None:
            stack.pop()

        handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
    for_step = rope_cls.for_step

    def scoped(self: Any, batch: Any, *args: Any) -> Any:
        stack.append(f"rope tables ({self.params['rope_theta']:g})")
        try:
            return for_step(self, batch, *args)
        finally:
            stack.pop()

    rope_cls.for_step = scoped
    try:
        yield stack
    finally:
        rope_cls.for_step = for_step
        for h in handles:
            h.remove()


def _launches(args: tuple, out: Any) -> bool:
    """False for an op that returns its input (``to`` the same dtype) or works on
    0-dim host scalars only (``torch.tensor(scale).to(dtype)``): no device kernel."""
    import torch

    outs = out if isinstance(out, tuple | list) else (out,)
    tensors = [o for o in outs if isinstance(o, torch.Tensor)]
    inputs = [a for a in args if isinstance(a, torch.Tensor)]
    if any(o is a for o in tensors for a in inputs):
        return False
    return not tensors or any(t.dim() > 0 for t in tensors)


def record(requests: int, model_name: str = "gemma-3-270m") -> list[tuple[str, str]]:
    """``(scope, kernel)`` of every kernel one replayed decode step runs, in order."""
    from graph_host_ops import queue_decodes
    from launch_count import NO_KERNEL, intercepted
    from random_checkpoint import write_random_checkpoint
    from torch.utils._python_dispatch import TorchDispatchMode
    from triton.runtime.jit import JITFunction

    from hybridkv.engine import LLM
    from hybridkv.engine.graphs import EagerReplay, StepGraphs
    from hybridkv.models.layers.rotary import RopeFrequencies

    got: list[tuple[str, str]] = []

    class Recorded(EagerReplay):
        """Records the replay's kernels (the forward only: not EagerReplay's copy)."""

        armed = False

        def replay(self) -> None:
            if not Recorded.armed:
                return super().replay()
            assert self.fn is not None
            with _scopes(llm.runner.model, RopeFrequencies) as stack:

                class Scoped(TorchDispatchMode):
                    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                        out = func(*args, **(kwargs or {}))
                        name = func.overloadpacket.__name__
                        if name not in NO_KERNEL and _launches(args, out):
                            got.append((stack[-1], name))
                        return out

                intercept = JITFunction.__getitem__

                def getitem(fn: JITFunction, grid: Any) -> Any:
                    got.append((stack[-1], fn.__name__))
                    return intercept(fn, grid)

                JITFunction.__getitem__ = getitem  # type: ignore[method-assign]
                try:
                    with Scoped():
                        self.fn()
                finally:
                    JITFunction.__getitem__ = intercept  # type: ignore[method-assign]
            return None

    with intercepted(), tempfile.TemporaryDirectory() as tmp:
        ck = write_random_checkpoint(model_name, Path(tmp) / "ck", overrides=TINY)
        llm = LLM(str(ck), device="cpu", dtype="bfloat16", kernel_backend="triton",
                  max_num_seqs=requests, max_model_len=1024,
                  kv_cache_memory_bytes=1 << 28)  # fmt: skip
        llm.runner.graphs = StepGraphs(
            llm.runner, requests, llm.max_model_len, graph_factory=Recorded
        )
        queue_decodes(llm, requests, 40)
        for _ in range(3):  # the prefill, then decodes (their graph captured)
            llm.step()
        Recorded.armed = True
        llm.step()
        assert llm.runner.graphs.stats["decode replays"] >= 1
    return got


def per_layer(got: list[tuple[str, str]]) -> tuple[dict[int, list[tuple[str, str]]], list]:
    """``got`` split into each layer's kernels and the rest (in order)."""
    layers: dict[int, list[tuple[str, str]]] = collections.defaultdict(list)
    rest = []
    for scope, kernel in got:
        m = re.match(r"model\.layers\.(\d+)", scope)
        if m:
            layers[int(m.group(1))].append((scope, kernel))
        else:
            rest.append((scope, kernel))
    return dict(layers), rest


def table(got: list[tuple[str, str]]) -> list[str]:
    """Markdown: one sliding and one full layer's kernels, the rest, the totals."""
    layers, rest = per_layer(got)
    counts = collections.Counter(len(v) for v in layers.values())
    lines = ["| where | kernel | what |", "| --- | --- | --- |"]
    shown = {0: "layer 0 (sliding)", 5: "layer 5 (full)"}
    for i, title in shown.items():
        for scope, kernel in layers.get(i, []):
            where = scope.removeprefix(f"model.layers.{i}").lstrip(".") or "(the layer)"
            lines.append(f"| {title}: {where} | `{kernel}` | {_role(scope, kernel)} |")
    for scope, kernel in rest:
        lines.append(f"| {scope} | `{kernel}` | {_role(scope, kernel)} |")
    in_layers = sum(len(v) for v in layers.values())
    per = ", ".join(f"{n} kernels in {c} layers" for n, c in sorted(counts.items()))
    lines += [
        "",
        f"Per layer: {per}. In the layers: {in_layers}; outside them: {len(rest)}; "
        f"**{len(got)} kernels per decode step** "
        f"({sum(1 for _, k in got if k.endswith('_kernel'))} Triton, "
        f"{sum(1 for _, k in got if k in GEMMS)} GEMMs).",
    ]
    return lines


#: The step before the fusions of 2026-11-28 (hybridkv at 5c63c20, this script's count).
BEFORE = (
    "Before (hybridkv at 5c63c20, the code the fifth lease ran): **14 kernels per layer**, "
    "in order: the q, k and v projections (3 GEMMs), `_norm_rope_kernel` for q and for k, "
    "`_reshape_and_cache_kernel`, `unified_attention_kernel`, the o projection, "
    "`_add_rms_norm_kernel`, the gate and up projections (2 GEMMs), "
    "`_gelu_tanh_mul_kernel`, the down projection, `_add_rms_norm_kernel`; 252 in the 18 "
    "layers and 19 outside them (the embedding, its scale, the first norm, 14 for the two "
    "RoPE tables, the gather of the sampled rows, the LM head): **271 per decode step** "
    "(127 Triton, 127 GEMMs). The H100 ran 289 kernels per replayed step (profiler): 18 "
    "more than counted here, which that profile did not name (one extra kernel per layer, "
    "such as a cuBLAS split-K reduction after one GEMM shape, would account for them: a "
    "guess; `step_profile.py` now lists the GPU's kernels by name for the next lease)."
)


def main(argv: list[str] | None = None) -> int:
    import datetime

    from machine_info import cpu_features, machine

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--write", action="store_true", help=f"write {RESULTS.relative_to(ROOT)}")
    args = ap.parse_args(argv)
    lines = table(record(args.requests))
    print("\n".join(lines))
    if args.write:
        head = [
            "# Kernels per decode step (graphed), counted on the CPU",
            "",
            f"Generated by `research/graph_kernels.py --requests {args.requests}` on "
            f"{datetime.date.today()} ({machine()}; {cpu_features()}; no GPU: launches are "
            "counted, not run; method in the script's docstring). Gemma 3 270M's layer "
            f"structure and heads, bf16, {args.requests} requests decoding, "
            "`--kernel-backend triton`, the step replayed from its graph (`EagerReplay`).",
            "",
            BEFORE,
            "",
            "Now (q/k/v and gate/up as one GEMM each: `models/layers/merged_linear.py`; q/k "
            "norm + RoPE and the k/v cache write as one kernel: "
            "`kernels/qk_norm_rope_cache_triton.py`; no gather of the rows of a decode "
            "graph; a step's RoPE cos/sin gathered, one `index_select` per base, from a "
            "table of every position: `models/layers/rope_table.py`), one sliding and one "
            "full layer, then what runs outside the layers:",
            "",
        ]
        RESULTS.write_text("\n".join(head + lines) + "\n")
        print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
