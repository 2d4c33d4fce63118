"""``n`` samples per prompt through the prefix cache, and ``cache_salt`` in ``generate``.

The samples of one prompt are ``n`` engine requests queued together: the first
computes the prompt, the other ``n - 1`` hit its blocks (the prefix cache counts
``n - 1`` of the ``n`` lookups as hits). Sample ``i`` draws with ``seed + i``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from oracle import random_prompt
from tiny_checkpoints import gemma3_config, save_checkpoint

from hybridkv.engine import LLM, SamplingParams

L = 203  # prompt tokens: 50 full blocks of 4 and 3 more


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_checkpoint(gemma3_config(), tmp_path_factory.mktemp("samples"))


def _llm(ckpt: Path, **kw: object) -> LLM:
    return LLM(ckpt, block_size=4, dtype="float32", **kw)  # type: ignore[arg-type]


def test_four_samples_compute_the_prompt_once(ckpt: Path) -> None:
    llm = _llm(ckpt)
    prompt = {"prompt_token_ids": random_prompt(L, seed=1)}
    params = SamplingParams(n=4, max_tokens=6, temperature=1.0, seed=7)
    llm.manager.make_prefix_cache_stats()  # reset
    out = llm.generate(prompt, params, use_tqdm=False)
    stats = llm.manager.make_prefix_cache_stats()
    assert stats is not None
    assert (stats.requests, stats.queries) == (4, 4 * L)
    assert stats.hits == 3 * ((L - 1) // 4 * 4)  # 3 of 4 lookups hit all 50 full blocks
    assert len(out) == 1 and [s.index for s in out[0].outputs] == [0, 1, 2, 3]
    assert out[0].num_cached_tokens == 0  # the prompt's own hit: none, it was computed
    samples = [tuple(s.token_ids) for s in out[0].outputs]
    assert len(set(samples)) == 4  # seeds 7, 8, 9, 10 differ
    assert all(len(s) == 6 for s in samples)
    llm.manager.check_integrity()
    # Reproducible: the same call on a fresh engine gives the same four samples.
    again = _llm(ckpt).generate(prompt, params, use_tqdm=False)
    assert [tuple(s.token_ids) for s in again[0].outputs] == samples


def test_without_prefix_caching_each_sample_computes_the_prompt(ckpt: Path) -> None:
    llm = _llm(ckpt, enable_prefix_caching=False)
    prompt = {"prompt_token_ids": random_prompt(40, seed=2)}
    out = llm.generate(prompt, SamplingParams(n=3, max_tokens=4), use_tqdm=False)
    greedy = [s.token_ids for s in out[0].outputs]
    assert greedy[0] == greedy[1] == greedy[2]  # greedy samples agree
    assert llm.manager.make_prefix_cache_stats().hits == 0  # type: ignore[union-attr]


def test_n_per_prompt_in_a_batch(ckpt: Path) -> None:
    llm = _llm(ckpt)
    prompts = [{"prompt_token_ids": random_prompt(9, seed=s)} for s in (3, 4)]
    params = [SamplingParams(n=2, max_tokens=3), SamplingParams(n=3, max_tokens=2)]
    out = llm.generate(prompts, params, use_tqdm=False)
    assert [len(o.outputs) for o in out] == [2, 3]
    assert [len(s.token_ids) for s in out[1].outputs] == [2, 2, 2]
    assert out[0].prompt_token_ids == prompts[0]["prompt_token_ids"]


def test_cache_salt_separates_tenants(ckpt: Path) -> None:
    llm = _llm(ckpt)
    ids = random_prompt(41, seed=5)
    one = SamplingParams(max_tokens=2)

    def cached(salt: str | None) -> int:
        prompt: dict[str, object] = {"prompt_token_ids": ids}
        if salt is not None:
            prompt["cache_salt"] = salt
        return llm.generate(prompt, one, use_tqdm=False)[0].num_cached_tokens

    assert cached("tenant-a") == 0
    assert cached("tenant-b") == 0  # another tenant: no hit
    assert cached(None) == 0  # nor for unsalted requests
    assert cached("tenant-a") == 40  # the same tenant: its 10 full blocks
    assert cached(None) == 40


@pytest.mark.parametrize(
    ("prompt", "says"),
    [
        ({"prompt_token_ids": [5], "cache_salt": ""}, "cache_salt'] must be a non-empty str"),
        ({"prompt_token_ids": [5], "cache_salt": 3}, "cache_salt'] must be a non-empty str"),
        ({"prompt_token_ids": [5], "salt": "a"}, "unknown keys ['salt']"),
        ({"prompt_token_ids": [5]}, None),
    ],
)
def test_bad_prompt_dicts_name_the_key(ckpt: Path, prompt: dict, says: str | None) -> None:
    llm = _llm(ckpt)
    if says is None:
        llm.generate(prompt, SamplingParams(max_tokens=1), use_tqdm=False)
        return
    with pytest.raises(ValueError) as e:
        llm.generate(prompt, SamplingParams(max_tokens=1), use_tqdm=False)
    assert says in str(e.value)
    assert not llm.scheduler.has_unfinished()


def test_logit_bias_ids_are_checked_against_the_vocabulary(ckpt: Path) -> None:
    llm = _llm(ckpt)
    with pytest.raises(ValueError, match=r"logit_bias: token ids must be in \[0, 512\)"):
        llm.generate(
            {"prompt_token_ids": [5]}, SamplingParams(logit_bias={512: 1.0}), use_tqdm=False
        )
