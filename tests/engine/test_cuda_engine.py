"""The engine on CUDA with the Triton backend (issue 16), against transformers.

On a GPU: the tiny checkpoint of every family (``tiny_checkpoints.FAMILY_CONFIGS``)
in float32, under both cache policies: greedy tokens identical to transformers'
(run in float64 on the CPU: a reference with no rounding of its own), logits within
1e-4; then a prefix hit on the GPU gives the same tokens as the cold run. Without
CUDA the same test body runs for Gemma 3 on the CPU (Triton's interpreter), so that
the GPU cases' code keeps working.

Bamba and Granite 4.0 H also run with one Mamba2 group (``*-one-group``, as their real
checkpoints): transformers before 5.23.0 (the GPU machines' 5.17) normalizes the
mixer's gated RMSNorm over all groups at once, so there the 2-group checkpoints' greedy
comparison skips (``tiny_checkpoints.hf_reference_problem`` says why) and the 1-group
ones still compare.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from oracle import check_against_hf
from tiny_checkpoints import FAMILY_CONFIGS, bamba_config, granite_config, save_checkpoint

from hybridkv.engine import LLM, SamplingParams

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
CONFIGS = {
    **FAMILY_CONFIGS,
    "bamba-one-group": functools.partial(bamba_config, mamba_n_groups=1),
    "granite-one-group": functools.partial(granite_config, mamba_n_groups=1),
}
#: Tokens generated per prompt: 8 on a GPU; on the CPU, where the body is a stand-in that
#: keeps the GPU cases' code running (Gemma 3's Triton path is checked against
#: transformers in test_gemma3_oracle.py too), 3 in Triton's interpreter.
N = 8 if CUDA else 3


def _prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 500, (n,), generator=g).tolist()


@pytest.fixture(scope="module", params=list(CONFIGS) if CUDA else ["gemma3"])
def ckpt(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    name = request.param
    return save_checkpoint(CONFIGS[name](), tmp_path_factory.mktemp(f"{name}-cuda"))


@pytest.mark.parametrize("policy", ["lru", "hybrid"] if CUDA else ["hybrid"])
def test_greedy_matches_transformers_on_the_device(ckpt: Path, policy: str) -> None:
    llm = LLM(
        ckpt,
        device=DEVICE,
        kernel_backend="triton",
        block_size=4,
        cache_policy=policy,
        dtype="float32",
    )
    assert llm.runner.device.type == DEVICE
    prompts = [_prompt(n, seed) for seed, n in enumerate((5, 23, 41))]
    check_against_hf(ckpt, llm, prompts, N)


def test_a_prefix_hit_on_the_device_gives_the_cold_tokens(ckpt: Path) -> None:
    llm = LLM(ckpt, device=DEVICE, kernel_backend="triton", block_size=4, dtype="float32")
    shared = _prompt(64, 7)
    params = SamplingParams(max_tokens=N)
    cold = llm.generate({"prompt_token_ids": [*shared, 11, 12]}, params, use_tqdm=False)[0]
    warm = llm.generate({"prompt_token_ids": [*shared, 11, 12]}, params, use_tqdm=False)[0]
    assert warm.num_cached_tokens > 0
    assert warm.outputs[0].token_ids == cold.outputs[0].token_ids
    llm.manager.check_integrity()
