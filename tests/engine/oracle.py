"""The engine-vs-transformers oracle shared by the per-family tests.

``run_engine`` generates greedily with our ``LLM`` while recording, per
request, the logits of every step that sampled (wrapping the runner).
``check_against_hf`` compares tokens exactly and logits at rtol/atol 1e-4
with transformers' greedy ``generate`` on the same checkpoint. ``random_prompt``
and ``shared_block_size`` are the per-family tests' helpers.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from tiny_checkpoints import hf_greedy

from hybridkv.engine import LLM, SamplingParams

_HF_CACHE: dict[tuple[str, tuple[int, ...], int], tuple[list[int], torch.Tensor]] = {}


def cached_hf_greedy(path: Path, prompt: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    key = (str(path), tuple(prompt), n)
    if key not in _HF_CACHE:
        _HF_CACHE[key] = hf_greedy(path, prompt, n)
    return _HF_CACHE[key]


def random_prompt(n: int, seed: int = 0) -> list[int]:
    """``n`` token ids in [3, 500), reproducible from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 500, (n,), generator=g).tolist()


def shared_block_size(llm: LLM) -> int:
    """The one block size every KV cache group of ``llm`` has (with Mamba layers, a
    page's worth of attention: prefix hits come in whole blocks of it)."""
    sizes = {g.kv_cache_spec.block_size for g in llm.kv_cache_config.kv_cache_groups}
    assert len(sizes) == 1, sizes
    return sizes.pop()


def device_for(backend: str) -> str:
    """The device a test of kernel ``backend`` runs on: ``native`` is the CPU backend
    (``LLM``'s ``device="auto"`` would take CUDA where there is one and refuse it)."""
    return "cpu" if backend == "native" else "auto"


def record_logits(llm: LLM) -> dict[str, list[torch.Tensor]]:
    """Wrap ``llm.runner.execute``; returns request id -> logits rows, step by step."""
    seen: dict[str, list[torch.Tensor]] = defaultdict(list)
    execute = llm.runner.execute

    def wrapped(work: Any, *pending: Any) -> torch.Tensor:  # (async: the step in flight's ids)
        logits = execute(work, *pending)
        for row, s in zip(logits, [s for s in work if s.samples], strict=True):
            seen[s.request.request_id].append(row.cpu())  # a copy, on the CPU like the refs
        return logits

    llm.runner.execute = wrapped  # type: ignore[method-assign]
    return seen


def run_engine(llm: LLM, prompts: list[list[int]], n: int) -> tuple[list[Any], list[torch.Tensor]]:
    """Greedy outputs of ``prompts`` in one ``generate`` call, and their logits ``[n, V]``."""
    seen = record_logits(llm)
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts], SamplingParams(max_tokens=n), use_tqdm=False
    )
    return outs, [torch.stack(seen[o.request_id]) for o in outs]


def bf16_and_fp32_logits(
    ckpt: Path, prompt: list[int], n: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy logits ``[n, V]`` of ``prompt`` from a bf16 and an fp32 engine on ``ckpt``;
    the bf16 ones must come in bf16 (``compute_logits`` keeps the model's dtype)."""
    _, ours = run_engine(LLM(ckpt, block_size=4, dtype="bfloat16"), [prompt], n)
    _, want = run_engine(LLM(ckpt, block_size=4, dtype="float32"), [prompt], n)
    assert ours[0].dtype == torch.bfloat16
    return ours[0].float(), want[0]


def check_against_hf(path: Path, llm: LLM, prompts: list[list[int]], n: int) -> list[Any]:
    """Token-identical and logits within 1e-4 of transformers for every prompt."""
    outs, logits = run_engine(llm, prompts, n)
    for prompt, out, ours in zip(prompts, outs, logits, strict=True):
        tokens, ref = cached_hf_greedy(path, prompt, n)
        assert out.outputs[0].token_ids == tokens, (len(prompt), out.outputs[0].token_ids, tokens)
        torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)
    llm.manager.check_integrity()
    if llm.tiers is not None:
        llm.tiers.check_integrity()
    return outs
