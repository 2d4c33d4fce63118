"""``sample`` on logits in the model's dtype: greedy rows exact, sampled rows in fp32."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from hybridkv.engine.sampler import sample
from hybridkv.engine.sampling_params import SamplingParams
from hybridkv.kernels import get_backend
from hybridkv.kernels.cpu import native_status


def _req(params: SamplingParams, seed: int = 0) -> SimpleNamespace:
    return SimpleNamespace(params=params, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("native", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_greedy_rows_take_the_first_maximum(native: bool, dtype: torch.dtype) -> None:
    if native and native_status() is not None:
        pytest.skip(f"native CPU kernels unavailable: {native_status()}")
    logits = (torch.randn(6, 5000, generator=torch.Generator().manual_seed(1)) * 3).to(dtype)
    logits[2, [10, 4000]] = 50.0  # a tie: the lower id wins
    reqs = [_req(SamplingParams(max_tokens=1)) for _ in range(6)]
    greedy = get_backend("native" if native else "torch", logits.device).greedy
    got = sample(logits, reqs, greedy).tokens
    assert got == logits.float().max(-1).indices.tolist()
    assert got[2] == 10


def test_sampled_rows_are_the_same_from_bf16_or_its_fp32_copy() -> None:
    logits = (torch.randn(3, 300, generator=torch.Generator().manual_seed(2))).to(torch.bfloat16)
    params = SamplingParams(max_tokens=1, temperature=0.8, top_k=50, top_p=0.9, seed=7)
    a = sample(logits, [_req(params, seed=i) for i in range(3)]).tokens
    b = sample(logits.float(), [_req(params, seed=i) for i in range(3)]).tokens
    assert a == b


def test_draws_follow_the_filtered_distribution() -> None:
    # softmax([2, 1, 0, -1, -9]) at temperature 1, top_k 4: the last token never.
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -9.0]])
    params = SamplingParams(max_tokens=1, temperature=1.0, top_k=4)
    req = _req(params, seed=11)
    n = 20_000
    counts = torch.bincount(
        torch.tensor([sample(logits, [req]).tokens[0] for _ in range(n)]), minlength=5
    )
    want = torch.softmax(logits[0, :4], -1)
    sigma = (want * (1 - want) / n).sqrt()
    assert counts[4] == 0
    assert ((counts[:4] / n - want).abs() < 5 * sigma).all(), (counts / n, want)
