"""``min_tokens``, ``logit_bias`` and the penalties against numbers worked by hand, and
the engine's greedy choices against a plain-Python reference of vLLM's rules."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from oracle import random_prompt, record_logits
from tiny_checkpoints import gemma3_config, save_checkpoint

from hybridkv.engine import LLM, SamplingParams
from hybridkv.engine.engine_request import EngineRequest
from hybridkv.engine.penalties import process_logits
from hybridkv.engine.sampler import sample

INF = math.inf


def test_every_rule_on_a_six_token_vocabulary() -> None:
    # Worked by hand (module docstring of hybridkv.engine.penalties, in order):
    #   logits                    [ 2.0, -1.0,  0.5,  3.0, -2.0,  0.0]
    #   min_tokens (3 < 5): 4     [ 2.0, -1.0,  0.5,  3.0, -inf,  0.0]
    #   logit_bias {0:-1.5, 5:2}  [ 0.5, -1.0,  0.5,  3.0, -inf,  2.0]
    #   repetition 2 on {1,2,3,5} [ 0.5, -2.0, 0.25,  1.5, -inf,  1.0]
    #   frequency 0.5 (3:2, 2:1)  [ 0.5, -2.0,-0.25,  0.5, -inf,  1.0]
    #   presence 0.25 on {2, 3}   [ 0.5, -2.0, -0.5, 0.25, -inf,  1.0]
    logits = torch.tensor([2.0, -1.0, 0.5, 3.0, -2.0, 0.0])
    params = SamplingParams(
        max_tokens=8,
        min_tokens=5,
        logit_bias={0: -1.5, 5: 2},
        repetition_penalty=2.0,
        frequency_penalty=0.5,
        presence_penalty=0.25,
    )
    got = process_logits(logits, params, [1, 5], [3, 3, 2], frozenset({4}))
    assert got.tolist() == [0.5, -2.0, -0.5, 0.25, -INF, 1.0]
    assert logits.tolist() == [2.0, -1.0, 0.5, 3.0, -2.0, 0.0]  # the input is not touched
    # Once min_tokens are out, the stop token is free again (only the bias etc. apply).
    got = process_logits(logits, params, [1, 5], [3, 3, 2, 0, 0], frozenset({4}))
    assert got[4] == -2.0
    # bf16 logits are processed in fp32.
    bf16 = process_logits(logits.bfloat16(), params, [1, 5], [3], frozenset())
    assert bf16.dtype == torch.float32


def test_greedy_and_sampled_rows_use_the_processed_logits() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, -2.0, 0.0]])
    plain = EngineRequest("a", [1, 5], SamplingParams())
    biased = EngineRequest("b", [1, 5], SamplingParams(logit_bias={5: 4}))
    assert sample(logits, [plain]).tokens == [3]
    assert sample(logits, [biased]).tokens == [5]
    # A bias of -100 on all but one token leaves only that one to sample.
    others = {t: -100 for t in range(6) if t != 1}
    hot = EngineRequest("c", [1], SamplingParams(temperature=1.0, seed=3, logit_bias=others))
    assert [sample(logits, [hot]).tokens[0] for _ in range(20)] == [1] * 20


def test_min_tokens_masks_the_end_of_sequence_unless_ignore_eos() -> None:
    logits = torch.tensor([[0.0, 5.0, 1.0]])  # token 1 (the eos) is the argmax
    held = EngineRequest("a", [2], SamplingParams(min_tokens=2), eos_token_ids=frozenset({1}))
    assert sample(logits, [held]).tokens == [2]
    held.core.append_output_token_ids([2, 2])
    assert sample(logits, [held]).tokens == [1]
    stop = EngineRequest("b", [2], SamplingParams(min_tokens=2, stop_token_ids=[2]))
    assert sample(torch.tensor([[0.0, 1.0, 5.0]]), [stop]).tokens == [1]


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("presence_penalty", 2.5, "presence_penalty must be a number in [-2, 2]"),
        ("frequency_penalty", float("nan"), "frequency_penalty must be a number in [-2, 2]"),
        ("repetition_penalty", 0, "repetition_penalty must be a number > 0"),
        ("logit_bias", {5: 101}, "logit_bias[5] must be a number in [-100, 100]"),
        ("logit_bias", {-1: 1}, "logit_bias keys must be an int"),
        ("min_tokens", 17, "min_tokens must be an int in [0, max_tokens=16]"),
        ("logprobs", 21, "logprobs must be None or an int in [0, 20]"),
        ("n", 0, "n must be an int >= 1"),
        ("seed", 2**64, "seed must be None or an int in [-2**63, 2**64 - n]"),
    ],
)
def test_bad_values_name_the_field(field: str, value: object, says: str) -> None:
    with pytest.raises(ValueError) as e:
        SamplingParams(**{field: value})  # type: ignore[arg-type]
    assert says in str(e.value)


def test_the_samples_seeds_must_fit_a_generator() -> None:
    assert SamplingParams(seed=2**64 - 1).for_sample(0).seed == 2**64 - 1
    with pytest.raises(ValueError, match="sample i uses seed"):
        SamplingParams(n=2, seed=2**64 - 1)
    params = SamplingParams(n=3, seed=10, temperature=1.0)
    assert [params.for_sample(i).seed for i in range(3)] == [10, 11, 12]
    assert {params.for_sample(i).n for i in range(3)} == {1}


# -- the engine against a plain-Python reference ------------------------------------------


def reference(logits: list[float], p: SamplingParams, prompt: list[int], out: list[int]) -> int:
    """vLLM's rules one token at a time; returns the greedy choice."""
    row = list(logits)
    for t, bias in (p.logit_bias or {}).items():
        row[t] += bias
    for t in range(len(row)):
        count = out.count(t)
        if t in prompt or count:
            r = p.repetition_penalty
            row[t] = row[t] / r if row[t] > 0 else row[t] * r
        row[t] -= p.frequency_penalty * count
        row[t] -= p.presence_penalty * (count > 0)
    return max(range(len(row)), key=lambda t: (row[t], -t))


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_checkpoint(gemma3_config(), tmp_path_factory.mktemp("penalties"))


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_tokens=10, repetition_penalty=1.8),
        SamplingParams(max_tokens=10, frequency_penalty=1.5, presence_penalty=-0.5),
        SamplingParams(max_tokens=10, presence_penalty=2.0, logit_bias={7: 3.0, 9: -2.5}),
    ],
)
def test_engine_greedy_follows_the_reference(ckpt: Path, params: SamplingParams) -> None:
    llm = LLM(ckpt, block_size=4, dtype="float32")
    prompt = random_prompt(11, seed=3)
    one = {"prompt_token_ids": prompt}
    plain = llm.generate(one, SamplingParams(max_tokens=10), use_tqdm=False)
    seen = record_logits(llm)
    got = llm.generate(one, params, use_tqdm=False)[0]
    tokens = got.outputs[0].token_ids
    rows = seen[got.request_id]
    for j, row in enumerate(rows):
        assert tokens[j] == reference(row.tolist(), params, prompt, tokens[:j]), f"token {j}"
    assert tokens != plain[0].outputs[0].token_ids  # the fields had an effect
