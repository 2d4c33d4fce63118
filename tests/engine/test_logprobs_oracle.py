"""``SamplingParams(logprobs=k)`` against transformers: ``log_softmax`` of its logits.

Our logprobs are vLLM's default ``raw_logprobs``: the model's distribution, before
penalties, bias and temperature. So even a sampled, penalised request's logprobs
equal ``log_softmax`` of transformers' logits at the positions of the tokens we
generated (teacher-forced), within 1e-4 in fp32; the top-k ids and ranks agree.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import torch
from oracle import random_prompt
from tiny_checkpoints import (
    bamba_config,
    gemma3_config,
    jamba_config,
    save_checkpoint,
    skip_unless_hf_is_a_reference,
)

from hybridkv.engine import LLM, SamplingParams

CONFIGS = {"gemma3": gemma3_config, "jamba": jamba_config, "bamba": bamba_config}
K = 5


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def ckpt(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_checkpoint(CONFIGS[request.param](), tmp_path_factory.mktemp(request.param))


@functools.cache
def _hf(path: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float64, experts_implementation="eager"
    ).eval()


def hf_logprobs(path: Path, prompt: list[int], out: list[int]) -> torch.Tensor:
    """``log_softmax`` of transformers' logits (run in float64) predicting each of
    ``out`` after ``prompt``, ``[len(out), V]`` in fp32 (skips where this transformers is
    no reference for the checkpoint: ``tiny_checkpoints.hf_reference_problem``)."""
    skip_unless_hf_is_a_reference(path)
    with torch.no_grad():
        logits = _hf(path)(torch.tensor([prompt + out])).logits[0]
    steps = logits[len(prompt) - 1 : len(prompt) - 1 + len(out)]
    return torch.log_softmax(steps, -1).float()


def check(path: Path, prompt: list[int], out: Any) -> None:
    ref = hf_logprobs(path, prompt, out.token_ids)
    assert out.logprobs is not None and len(out.logprobs) == len(out.token_ids)
    total = 0.0
    for j, (token, entry) in enumerate(zip(out.token_ids, out.logprobs, strict=True)):
        row = ref[j]
        assert next(iter(entry)) == token  # the sampled token comes first
        mine = entry[token]
        torch.testing.assert_close(mine.logprob, float(row[token]), rtol=0, atol=1e-4)
        assert mine.rank == int((row > row[token]).sum()) + 1
        top = row.topk(K)
        ranked = sorted((lp.rank, t) for t, lp in entry.items() if lp.rank <= K)
        assert [t for _, t in ranked] == top.indices.tolist(), f"step {j}"
        got = torch.tensor([entry[t].logprob for _, t in ranked])
        torch.testing.assert_close(got, top.values, rtol=0, atol=1e-4)
        assert len(entry) in (K, K + 1)
        total += mine.logprob
    assert out.cumulative_logprob == pytest.approx(total)


def test_greedy_logprobs_match_transformers(ckpt: Path) -> None:
    llm = LLM(ckpt, block_size=4, dtype="float32")
    prompt = random_prompt(13, seed=1)
    got = llm.generate(
        {"prompt_token_ids": prompt}, SamplingParams(max_tokens=8, logprobs=K), use_tqdm=False
    )[0]
    check(ckpt, prompt, got.outputs[0])
    assert all(next(iter(e.values())).rank == 1 for e in got.outputs[0].logprobs or [])


def test_logprobs_are_raw_whatever_the_sampling(ckpt: Path) -> None:
    llm = LLM(ckpt, block_size=4, dtype="float32")
    prompt = random_prompt(9, seed=2)
    params = SamplingParams(
        n=2,
        max_tokens=6,
        temperature=1.7,
        seed=5,
        logprobs=K,
        frequency_penalty=1.0,
        logit_bias={11: 2.0},
    )
    got = llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)[0]
    for sample in got.outputs:
        check(ckpt, prompt, sample)
    # Sampling at temperature 1.7 picks tokens that are not the argmax: ranks above 1.
    ranks = [
        e[t].rank for s in got.outputs for t, e in zip(s.token_ids, s.logprobs or [], strict=True)
    ]
    assert max(ranks) > 1


def test_logprobs_zero_gives_the_sampled_token_only(ckpt: Path) -> None:
    llm = LLM(ckpt, block_size=4, dtype="float32")
    prompt = {"prompt_token_ids": [5, 6, 7]}
    out = llm.generate(prompt, SamplingParams(max_tokens=3, logprobs=0), use_tqdm=False)
    assert [list(e) for e in out[0].outputs[0].logprobs or []] == [
        [t] for t in out[0].outputs[0].token_ids
    ]
    plain = llm.generate(prompt, SamplingParams(max_tokens=3), use_tqdm=False)[0].outputs[0]
    assert plain.logprobs is None and plain.cumulative_logprob is None
    assert plain.token_ids == out[0].outputs[0].token_ids
