"""``LLM`` and ``SamplingParams`` arguments: clear ``ValueError``s, before any weight loads.

Each bad argument must fail at construction with a message naming it, and the
engine's own arguments must fail before the weights are read (``load_model``
is made to fail loudly for those). Prompts take numpy ints as token ids and
refuse bools, as ``hybridkv.Request`` does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from engine.tiny_checkpoints import llama4_config, save_checkpoint

from hybridkv.engine import LLM, SamplingParams
from hybridkv.layouts.context_length import rope_scaling_types


@pytest.fixture
def no_weight_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("weights were loaded before the arguments were checked")

    monkeypatch.setattr("hybridkv.engine.llm.load_model", refuse)


@pytest.fixture(scope="module")
def llm(tiny_ckpt: Path) -> LLM:
    return LLM(tiny_ckpt, block_size=4, max_model_len=64, kernel_backend="torch")


def clean(llm: LLM) -> None:
    llm.manager.check_integrity()
    assert not llm.scheduler.running and not llm.scheduler.waiting
    assert llm.manager.block_pool.num_free_blocks == llm.kv_cache_config.num_blocks - 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"seed": 2**70},
            "seed must be None or an int in [-2**63, 2**64 - n] (a torch generator seed; "
            f"sample i uses seed + i), got {2**70}",
        ),
        (
            {"stop_token_ids": None},
            "stop_token_ids must be a list of token ids (empty: none), not None",
        ),
        (
            {"stop_token_ids": [True]},
            "stop_token_ids must be ints in [0, 2**32), not bools: got [True]",
        ),
        ({"stop_token_ids": 7}, "stop_token_ids must be a list of token ids, got 7"),
    ],
)
def test_sampling_params_fail_at_construction(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError) as info:
        SamplingParams(**kwargs)  # type: ignore[arg-type]
    assert str(info.value) == message


def test_extreme_valid_seeds_generate(llm: LLM) -> None:
    for seed in (2**64 - 1, -(2**63)):
        params = SamplingParams(max_tokens=2, temperature=1.0, seed=seed)
        assert len(llm.generate({"prompt_token_ids": [5, 6]}, params, use_tqdm=False)) == 1
    clean(llm)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"device": "banana"}, "device 'banana' is not a device: pass 'auto', 'cpu' or 'cuda[:N]'"),
        ({"device": "meta"}, "device 'meta' is not supported: pass 'auto', 'cpu' or 'cuda[:N]'"),
        ({"kv_cache_memory_bytes": 0}, "kv_cache_memory_bytes must be an int >= 1, got 0"),
        (
            {"enable_prefix_caching": "yes"},
            "enable_prefix_caching must be True or False, got 'yes'",
        ),
        ({"hash_algo": "md5"}, "hash_algo must be one of ('sha256', 'xxhash'), got 'md5'"),
        (
            {"dtype": "int8"},
            "dtype 'int8' is not supported: 'auto' or one of ['bfloat16', 'float16', 'float32']",
        ),
    ],
)
def test_engine_arguments_fail_before_loading(
    tiny_ckpt: Path, no_weight_loading: None, kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError) as info:
        LLM(tiny_ckpt, **kwargs)  # type: ignore[arg-type]
    assert str(info.value) == message


def test_too_small_kv_memory_fails_before_loading(tiny_ckpt: Path, no_weight_loading: None) -> None:
    with pytest.raises(ValueError, match="1,000 bytes cannot hold one request of max_model_len"):
        LLM(tiny_ckpt, kv_cache_memory_bytes=1000)


def test_bad_chat_template_argument(llm: LLM) -> None:
    conv = [{"role": "user", "content": "w5"}]
    with pytest.raises(ValueError) as info:
        llm.chat(conv, chat_template="{% for m in messages %}", use_tqdm=False)
    assert str(info.value) == (
        "chat_template: not a valid Jinja template (line 1: Unexpected end "
        "of template. Jinja was looking for the following tags: 'endfor' "
        "or 'else'. The innermost block that needs to be closed is "
        "'for'.)"
    )
    with pytest.raises(ValueError, match="chat_template failed on this conversation: boom"):
        llm.chat(conv, chat_template="{{ raise_exception('boom') }}", use_tqdm=False)
    clean(llm)


def test_step_with_nothing_queued_does_nothing(llm: LLM) -> None:
    steps = llm.num_steps
    out = llm.step()
    assert out.scheduled == () and out.preempted == () and llm.num_steps == steps
    clean(llm)


def test_numpy_token_ids_are_ids_and_bools_are_not(llm: LLM) -> None:
    params = SamplingParams(max_tokens=3)
    plain = llm.generate({"prompt_token_ids": [5, 6, 7]}, params, use_tqdm=False)[0]
    numpy = llm.generate({"prompt_token_ids": np.array([5, 6, 7])}, params, use_tqdm=False)[0]
    assert numpy.prompt_token_ids == [5, 6, 7]
    assert numpy.outputs[0].token_ids == plain.outputs[0].token_ids
    with pytest.raises(ValueError, match=r"prompts\[0\]\['prompt_token_ids'\].*not bools"):
        llm.generate({"prompt_token_ids": [5, True]}, use_tqdm=False)
    clean(llm)


def test_long_context_override_only_with_rope_scaling(tmp_path: Path) -> None:
    assert rope_scaling_types(llama4_config()) == ["llama3"]
    model = save_checkpoint(llama4_config(), tmp_path / "llama4")
    with pytest.raises(ValueError) as info:
        LLM(model, max_model_len=2048, kernel_backend="torch")
    assert str(info.value) == (
        f"max_model_len=2048 exceeds {model}'s 1024 positions (max_position_embeddings): "
        "generation past them is silently wrong; the model scales RoPE (llama3): if it supports "
        "the longer context, pass allow_long_max_model_len=True (--allow-long-max-model-len)"
    )
    llm = LLM(
        model,
        max_model_len=2048,
        allow_long_max_model_len=True,
        kernel_backend="torch",
        block_size=4,
        max_num_batched_tokens=64,
        kv_cache_memory_bytes=8 << 20,
    )
    assert llm.max_model_len == 2048
