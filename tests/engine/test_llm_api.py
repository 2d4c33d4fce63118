"""The offline API around the model: prompts, chat, sampling, stops, errors.

Every bad call must raise a clear error and leave the manager clean: no
request holds blocks and ``check_integrity()`` passes.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from tiny_checkpoints import gemma3_config, save_checkpoint, save_word_tokenizer

from hybridkv.engine import LLM, SamplingParams
from hybridkv.models.loader import CheckpointError
from hybridkv.models.registry import UnsupportedModelError


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = save_checkpoint(gemma3_config(), tmp_path_factory.mktemp("gemma3_tok"))
    return save_word_tokenizer(path)


@pytest.fixture(scope="module")
def no_tok(tmp_path_factory):
    return save_checkpoint(gemma3_config(), tmp_path_factory.mktemp("gemma3_plain"))


@pytest.fixture
def llm(ckpt):
    return LLM(ckpt, block_size=4, max_model_len=64)


def _clean(llm: LLM) -> None:
    llm.manager.check_integrity()
    assert not llm.scheduler.running and not llm.scheduler.waiting
    assert llm.manager.block_pool.num_free_blocks == llm.kv_cache_config.num_blocks - 1


def test_text_prompts_decode_to_text(llm):
    outs = llm.generate(["w5 w6 w7 w8 w9", "w10 w11"], SamplingParams(max_tokens=4), use_tqdm=False)
    for o in outs:
        assert len(o.outputs[0].token_ids) == 4
        assert o.outputs[0].text == " ".join(
            llm.tokenizer.convert_ids_to_tokens(o.outputs[0].token_ids)
        )
        assert o.outputs[0].finish_reason == "length"
        m = o.metrics
        assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finished_time
    assert outs[0].prompt_token_ids == [5, 6, 7, 8, 9]
    _clean(llm)


def test_text_prompt_without_tokenizer_is_a_clear_error(no_tok):
    llm = LLM(no_tok, block_size=4, max_model_len=64)
    with pytest.raises(ValueError, match="no tokenizer"):
        llm.generate("hello", use_tqdm=False)
    with pytest.raises(ValueError, match="tokenizer"):
        llm.chat([{"role": "user", "content": "w5"}], use_tqdm=False)
    out = llm.generate({"prompt_token_ids": [5, 6]}, SamplingParams(max_tokens=2), use_tqdm=False)
    assert out[0].outputs[0].text == ""
    _clean(llm)


def test_multi_turn_chat_hits_the_prefix_cache(llm):
    params = SamplingParams(max_tokens=5)
    conv = [{"role": "user", "content": " ".join(f"w{i}" for i in range(20, 40))}]
    first = llm.chat(conv, params, use_tqdm=False)[0]
    assert first.num_cached_tokens == 0
    reply = " ".join(llm.tokenizer.convert_ids_to_tokens(first.outputs[0].token_ids))
    conv += [{"role": "assistant", "content": reply}, {"role": "user", "content": "w50 w51"}]
    second = llm.chat(conv, params, use_tqdm=False)[0]
    # The second prompt starts with the whole first prompt (template renders turns alike).
    assert second.prompt_token_ids[: len(first.prompt_token_ids)] == first.prompt_token_ids
    assert second.num_cached_tokens >= len(first.prompt_token_ids) // 4 * 4
    # The same conversations as a batch give the same replies.
    batch = llm.chat([conv[:1], conv], params, use_tqdm=False)
    assert [b.outputs[0].token_ids for b in batch] == [
        first.outputs[0].token_ids,
        second.outputs[0].token_ids,
    ]
    _clean(llm)


def test_stop_tokens_and_max_model_len(llm):
    ref = llm.generate(
        {"prompt_token_ids": [5, 6, 7]}, SamplingParams(max_tokens=6), use_tqdm=False
    )
    toks = ref[0].outputs[0].token_ids
    stop = toks[2]
    out = llm.generate(
        {"prompt_token_ids": [5, 6, 7]},
        SamplingParams(max_tokens=6, stop_token_ids=[stop]),
        use_tqdm=False,
    )[0]
    assert out.outputs[0].token_ids == toks[: toks.index(stop) + 1]
    assert out.outputs[0].finish_reason == "stop" and out.outputs[0].stop_reason == stop
    long = llm.generate(
        {"prompt_token_ids": list(range(5, 65))}, SamplingParams(max_tokens=50), use_tqdm=False
    )[0]
    assert len(long.outputs[0].token_ids) == 4  # 60 prompt tokens + 4 = max_model_len 64
    _clean(llm)


def test_seeded_sampling_is_reproducible_across_batches(llm):
    p = SamplingParams(max_tokens=8, temperature=1.0, top_k=50, top_p=0.9, seed=1234)
    alone = llm.generate({"prompt_token_ids": [5, 6, 7]}, p, use_tqdm=False)[0]
    with_others = llm.generate(
        [{"prompt_token_ids": [9, 9, 9, 9]}, {"prompt_token_ids": [5, 6, 7]}],
        [SamplingParams(max_tokens=3, temperature=1.0), p],
        use_tqdm=False,
    )[1]
    assert alone.outputs[0].token_ids == with_others.outputs[0].token_ids
    other_seed = llm.generate(
        {"prompt_token_ids": [5, 6, 7]},
        SamplingParams(max_tokens=8, temperature=1.0, seed=99),
        use_tqdm=False,
    )[0]
    assert other_seed.outputs[0].token_ids != alone.outputs[0].token_ids
    _clean(llm)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"max_tokens": 0}, "max_tokens"), ({"temperature": -1.0}, "temperature"),
     ({"top_p": 0.0}, "top_p"), ({"top_k": -2}, "top_k"), ({"seed": "x"}, "seed"),
     ({"stop_token_ids": [-1]}, "stop_token_ids")],
)  # fmt: skip
def test_invalid_sampling_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(
    ("prompts", "match"),
    [({"prompt_token_ids": []}, "empty"), ([], "non-empty"), ("", "empty"),
     ({"prompt_token_ids": list(range(5, 70))}, "max_model_len"),
     ({"prompt_token_ids": [5, 100_000]}, "token ids"), ([{"text": "w5"}], "prompt_token_ids"),
     ([{"prompt_token_ids": [5]}, {"prompt_token_ids": []}], "prompts\\[1\\] is empty")],
)  # fmt: skip
def test_bad_prompts_leave_no_state(llm, prompts, match):
    with pytest.raises(ValueError, match=match):
        llm.generate(prompts, use_tqdm=False)
    _clean(llm)


def test_wrong_number_of_sampling_params(llm):
    with pytest.raises(ValueError, match="2 sampling_params for 1 prompts"):
        llm.generate("w5", [SamplingParams(), SamplingParams()], use_tqdm=False)
    _clean(llm)


def test_failing_step_aborts_the_call(llm, monkeypatch):
    def boom(work):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(llm.runner, "execute", boom)
    with pytest.raises(RuntimeError, match="exploded"):
        llm.generate(["w5 w6", "w7"], use_tqdm=False)
    _clean(llm)


def test_abort_frees_blocks(llm):
    from hybridkv.engine.engine_request import EngineRequest

    req = EngineRequest("x", [5, 6, 7, 8, 9], SamplingParams(max_tokens=3))
    llm.scheduler.add_request(req)
    llm.step()
    assert llm.manager.get_block_ids("x")[0]
    assert llm.scheduler.abort("x") and not llm.scheduler.abort("x")
    assert req.status.finished
    _clean(llm)


def test_missing_path_and_unsupported_architecture(tmp_path, no_tok):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        LLM(tmp_path / "nope")
    with pytest.raises(ValueError, match=r"config\.json"):
        LLM(tmp_path)
    (tmp_path / "model.gguf.txt").write_text("not a model")
    with pytest.raises(ValueError, match="not a GGUF"):
        LLM(tmp_path / "model.gguf.txt")
    bad = tmp_path / "bad"
    shutil.copytree(no_tok, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["architectures"] = ["Qwen2ForCausalLM"]
    cfg["model_type"] = "qwen2"
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match=r"Gemma3ForCausalLM.*JambaForCausalLM"):
        LLM(bad)


@pytest.mark.parametrize("change", ["drop", "extra", "shape"])
def test_strict_loader(tmp_path, no_tok, change):
    from safetensors.torch import load_file, save_file

    bad = tmp_path / "ckpt"
    shutil.copytree(no_tok, bad)
    weights = load_file(bad / "model.safetensors")
    name = "model.layers.1.mlp.up_proj.weight"
    if change == "drop":
        del weights[name]
        match = "1 parameters missing.*up_proj"
    elif change == "extra":
        weights["model.layers.1.mlp.extra.weight"] = torch.zeros(2)
        match = "match no parameter.*extra"
    else:
        weights[name] = weights[name][:-1].contiguous()
        match = "shapes differ.*up_proj"
    save_file(weights, bad / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=match):
        LLM(bad)


def test_bad_engine_arguments(no_tok):
    cases = [
        ({"block_size": 0}, "block_size"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"dtype": "int8"}, "dtype"),
        ({"kv_cache_memory_bytes": 1000}, "cannot hold"),
        ({"hash_algo": "md5"}, "md5"),
    ]
    for kwargs, match in cases:
        with pytest.raises(ValueError, match=match):
            LLM(no_tok, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"hybrid_return_bonus": 4.0}, r"hybrid_return_bonus tunes cache_policy='hybrid'.*'lru'"),
        ({"hybrid_value_weight": 1.0}, r"hybrid_value_weight tunes cache_policy='hybrid'"),
        (
            {"cache_policy": "hybrid", "hybrid_return_bonus": -1.0},
            r"hybrid_return_bonus must be a finite number >= 0, got -1.0",
        ),
        (
            {"cache_policy": "hybrid", "hybrid_value_weight": float("inf")},
            r"hybrid_value_weight must be a finite number >= 0, got inf",
        ),
        ({"hybrid_floor_tokens": 8960}, r"hybrid_floor_tokens tunes cache_policy='hybrid'"),
        ({"hybrid_return_grade": "turn"}, r"hybrid_return_grade tunes cache_policy='hybrid'"),
        (
            {"cache_policy": "hybrid", "hybrid_return_grade": "steep"},
            r"hybrid_return_grade must be one of flat, turn, log-turn, got 'steep'",
        ),
        (
            {"cache_policy": "hybrid", "hybrid_floor_tokens": 1.5},
            r"hybrid_floor_tokens must be None \(by cost\) or an int >= 0, got 1.5",
        ),
        (
            {"cache_policy": "hybrid", "hybrid_floor_tokens": -16},
            r"hybrid_floor_tokens must be None \(by cost\) or an int >= 0, got -16",
        ),
    ],
)
def test_bad_hybrid_knobs_fail_before_the_checkpoint_is_read(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        LLM(tmp_path / "no-such-model", **kwargs)


def test_hybrid_knobs_reach_the_manager(no_tok):
    """Gemma 3's sliding layers: the cost-aware free set takes the weight, and
    returning prompts the bonus (``2 ** (bonus / weight)``)."""
    default = LLM(no_tok, block_size=4, max_model_len=64, cache_policy="hybrid")
    assert default.manager.block_pool.policy.weight == 1.0
    assert default.manager.policy.return_factor == 2.0**4
    tuned = LLM(
        no_tok,
        block_size=4,
        max_model_len=64,
        cache_policy="hybrid",
        hybrid_return_bonus=2.0,
        hybrid_value_weight=0.5,
    )
    assert tuned.manager.block_pool.policy.weight == 0.5
    assert tuned.manager.policy.return_factor == 2.0 ** (2.0 / 0.5)
    off = LLM(no_tok, block_size=4, max_model_len=64, cache_policy="hybrid", hybrid_return_bonus=0)
    assert off.manager.policy.seen is None
    floor = LLM(
        no_tok, block_size=4, max_model_len=64, cache_policy="hybrid", hybrid_floor_tokens=10
    )
    assert floor.manager.policy.floor_tokens == 12  # rounded up to the 4-token hit step
    assert default.manager.policy.seen.turns is False  # flat: no turns kept
    graded = LLM(
        no_tok, block_size=4, max_model_len=64, cache_policy="hybrid", hybrid_return_grade="turn"
    )
    assert graded.manager.policy.seen.turns is True
    assert graded.manager.policy.return_value(3) == 2.0 ** (4 * 3)
