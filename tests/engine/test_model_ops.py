"""Llama 4 and Jamba run their norms and RoPE on the step's kernel backend (``batch.ops``).

A backend that counts its calls replaces the engine's for one prefill step of
a tiny checkpoint: every norm and rotation of the model must reach it (a
module that called torch directly would be missing from the count).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import torch
from tiny_checkpoints import jamba_config, llama4_config, save_checkpoint

from hybridkv.engine import LLM, SamplingParams
from hybridkv.kernels.torch_backend import TorchBackend


class CountingBackend(TorchBackend):
    """The torch reference, counting its norm and RoPE calls."""

    name = "torch"  # the public ops (attention, cache write) run as under "torch"

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
        self.calls["rms_norm" if weight is not None else "rms_norm_weightless"] += 1
        return super().rms_norm(x, weight, eps)

    def rope_pairwise(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        self.calls["rope_pairwise"] += 1
        return super().rope_pairwise(x, cos, sin)


def _one_step_calls(config: Any, path: Path) -> Counter[str]:
    llm = LLM(save_checkpoint(config, path), block_size=4, kernel_backend="torch")
    counting = CountingBackend()
    llm.runner.ops = counting
    prompts = [{"prompt_token_ids": list(range(3, 12))}]
    out = llm.generate(prompts, SamplingParams(max_tokens=1), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 1  # one step: the prefill
    return counting.calls


def test_llama4_norms_and_rope_run_on_the_backend(tmp_path: Path) -> None:
    # 4 layers x 2 norms + the final norm; q and k of the 3 RoPE layers: RoPE, then L2 norm
    calls = _one_step_calls(llama4_config(), tmp_path)
    assert calls == {"rms_norm": 9, "rope_pairwise": 6, "rms_norm_weightless": 6}


def test_llama4_without_qk_norm_has_no_weightless_norm(tmp_path: Path) -> None:
    calls = _one_step_calls(llama4_config(use_qk_norm=False), tmp_path)
    assert calls == {"rms_norm": 9, "rope_pairwise": 6}


def test_jamba_norms_run_on_the_backend(tmp_path: Path) -> None:
    # 4 layers x 2 norms + the final norm; dt, B and C norms of the 2 Mamba mixers
    calls = _one_step_calls(jamba_config(), tmp_path)
    assert calls == {"rms_norm": 15}
