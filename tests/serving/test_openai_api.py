"""``hybridkv serve`` through the real OpenAI client: outputs equal ``LLM``'s.

Greedy completions and chats, streamed or not, give exactly the token ids
(vLLM's ``return_token_ids`` extension) and text of ``LLM.generate`` /
``LLM.chat`` on the same checkpoint; usage counts cached prompt tokens.
"""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

import pytest

from hybridkv.engine import LLM, SamplingParams

openai = pytest.importorskip("openai")

PROMPTS = ["w5 w6 w7 w8 w9 w10 w11 w12 w13", "w40 w41 w42", "w5 w6 w7 w8 w9 w10 w11 w12 w99"]


@pytest.fixture(scope="module")
def ref(tok_ckpt: Path) -> LLM:
    return LLM(tok_ckpt, block_size=4, max_model_len=64)


@pytest.fixture(scope="module")
def client(server: Any) -> Any:
    live, _ = server
    return openai.OpenAI(base_url=live.url + "/v1", api_key="none", max_retries=0, timeout=60)


def _ids(obj: Any, key: str) -> list[int]:
    return list((obj.model_extra or {})[key])


def test_completions_equal_llm_generate(client: Any, ref: LLM) -> None:
    want = ref.generate(PROMPTS, SamplingParams(max_tokens=6), use_tqdm=False)
    for prompt, out in zip(PROMPTS, want, strict=True):
        got = client.completions.create(
            model="tiny",
            prompt=prompt,
            max_tokens=6,
            temperature=0,
            extra_body={"return_token_ids": True},
        )
        choice = got.choices[0]
        assert _ids(choice, "token_ids") == out.outputs[0].token_ids
        assert _ids(choice, "prompt_token_ids") == out.prompt_token_ids
        assert choice.text == out.outputs[0].text
        assert choice.finish_reason == "length"
        assert got.usage.prompt_tokens == len(out.prompt_token_ids)
        assert got.usage.completion_tokens == 6
        assert got.usage.total_tokens == len(out.prompt_token_ids) + 6


def test_token_id_prompt_and_cached_tokens(client: Any, ref: LLM) -> None:
    ids = list(range(100, 121))  # 21 tokens: 5 full blocks of 4
    want = ref.generate({"prompt_token_ids": ids}, SamplingParams(max_tokens=3), use_tqdm=False)
    first = client.completions.create(model="tiny", prompt=ids, max_tokens=3, temperature=0)
    again = client.completions.create(model="tiny", prompt=ids, max_tokens=3, temperature=0)
    assert first.choices[0].text == again.choices[0].text == want[0].outputs[0].text
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens_details.cached_tokens == 20


def test_streamed_completion_joins_to_the_whole(client: Any, ref: LLM) -> None:
    want = ref.generate(PROMPTS[0], SamplingParams(max_tokens=8), use_tqdm=False)[0]
    chunks = list(
        client.completions.create(
            model="tiny",
            prompt=PROMPTS[0],
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"return_token_ids": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    ids = [t for c in chunks if c.choices for t in _ids(c.choices[0], "token_ids")]
    assert text == want.outputs[0].text
    assert ids == want.outputs[0].token_ids
    assert len([c for c in chunks if c.choices and c.choices[0].text]) >= 2  # really streamed
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] == "length" and set(reasons[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8


def test_chat_equals_llm_chat_streamed_or_not(client: Any, ref: LLM) -> None:
    conv = [{"role": "user", "content": "w20 w21 w22 w23"}]
    want = ref.chat(conv, SamplingParams(max_tokens=5), use_tqdm=False)[0]
    got = client.chat.completions.create(model="tiny", messages=conv, max_tokens=5, temperature=0)
    assert got.object == "chat.completion"
    assert got.choices[0].message.role == "assistant"
    assert got.choices[0].message.content == want.outputs[0].text
    assert got.usage.prompt_tokens == len(want.prompt_token_ids)
    stream = client.chat.completions.create(
        model="tiny", messages=conv, max_tokens=5, temperature=0, stream=True
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want.outputs[0].text
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.object == "chat.completion.chunk" for c in chunks)


def test_several_prompts_in_one_call(client: Any, ref: LLM) -> None:
    want = ref.generate(PROMPTS[:2], SamplingParams(max_tokens=4), use_tqdm=False)
    got = client.completions.create(model="tiny", prompt=PROMPTS[:2], max_tokens=4, temperature=0)
    assert [c.index for c in got.choices] == [0, 1]
    assert [c.text for c in got.choices] == [o.outputs[0].text for o in want]


def test_stop_string_cuts_the_text(client: Any, ref: LLM) -> None:
    out = ref.generate(PROMPTS[1], SamplingParams(max_tokens=8), use_tqdm=False)[0]
    words = out.outputs[0].text.split(" ")
    stop = " " + words[3]  # the text ends just before the fourth word
    first = out.outputs[0].text.index(stop)
    got = client.completions.create(
        model="tiny", prompt=PROMPTS[1], max_tokens=8, temperature=0, stop=[stop]
    )
    assert got.choices[0].text == out.outputs[0].text[:first]
    assert got.choices[0].finish_reason == "stop"
    streamed = client.completions.create(
        model="tiny", prompt=PROMPTS[1], max_tokens=8, temperature=0, stop=stop, stream=True
    )
    chunks = list(streamed)
    assert "".join(c.choices[0].text for c in chunks) == out.outputs[0].text[:first]
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_seeded_sampling_is_reproducible(client: Any, ref: LLM) -> None:
    params = SamplingParams(max_tokens=6, temperature=1.0, seed=7)
    want = ref.generate(PROMPTS[0], params, use_tqdm=False)[0].outputs[0].text
    got = client.completions.create(
        model="tiny", prompt=PROMPTS[0], max_tokens=6, temperature=1.0, seed=7
    )
    assert got.choices[0].text == want


def test_models_and_health(server: Any, client: Any) -> None:
    live, _ = server
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert models.data[0].model_extra["max_model_len"] == 64
    with urllib.request.urlopen(live.url + "/health", timeout=30) as r:
        assert r.status == 200
