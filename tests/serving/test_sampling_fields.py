"""The sampling fields through the server equal ``LLM.generate`` with the same params:
``n`` (usage counts the prompt once), ``logprobs`` in OpenAI's shapes (streamed and
not), penalties, ``logit_bias``, ``min_tokens``, ``echo`` and ``cache_salt``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from serve_http import post, sse_events

from hybridkv.engine import LLM, SamplingParams


@pytest.fixture(scope="module")
def ref(tok_ckpt: Path) -> LLM:
    return LLM(tok_ckpt, block_size=4, max_model_len=64)


def _words(start: int, n: int) -> str:
    return " ".join(f"w{i}" for i in range(start, start + n))


def completion(server: Any, **body: Any) -> dict[str, Any]:
    live, _ = server
    code, _, out = post(live.url, "/v1/completions", dict({"model": "tiny"}, **body))
    assert code == 200, out
    return out  # type: ignore[no-any-return]


def test_n_samples_count_the_prompt_once(server: Any, ref: LLM) -> None:
    prompt = _words(300, 13)
    params = SamplingParams(n=3, max_tokens=5, temperature=1.0, seed=11)
    want = ref.generate(prompt, params, use_tqdm=False)[0]
    body = dict(prompt=prompt, n=3, max_tokens=5, temperature=1.0, seed=11)
    got = completion(server, **body, return_token_ids=True)
    assert [c["index"] for c in got["choices"]] == [0, 1, 2]
    assert [c["token_ids"] for c in got["choices"]] == [s.token_ids for s in want.outputs]
    assert len({tuple(c["token_ids"]) for c in got["choices"]}) == 3  # seeds 11, 12, 13
    usage = got["usage"]
    assert usage["prompt_tokens"] == 13 and usage["completion_tokens"] == 15
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0
    again = completion(server, **body)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 12  # 3 full blocks
    assert [c["text"] for c in again["choices"]] == [s.text for s in want.outputs]
    # Two prompts with n=2: choice 2 * prompt + sample, each prompt counted once.
    two = completion(server, prompt=[_words(320, 5), _words(330, 7)], n=2, max_tokens=2)
    assert [c["index"] for c in two["choices"]] == [0, 1, 2, 3]
    assert two["usage"]["prompt_tokens"] == 12 and two["usage"]["completion_tokens"] == 8


def test_chat_n_and_streamed_choices(server: Any) -> None:
    live, _ = server
    body = {
        "messages": [{"role": "user", "content": _words(340, 4)}],
        "n": 2,
        "max_tokens": 3,
        "temperature": 1.0,
        "seed": 3,
    }
    code, _, whole = post(live.url, "/v1/chat/completions", body)
    assert code == 200 and [c["index"] for c in whole["choices"]] == [0, 1]
    chunks = sse_events(live.url, "/v1/chat/completions", body)
    texts = ["", ""]
    for ch in chunks:
        for c in ch["choices"]:
            texts[c["index"]] += c["delta"].get("content") or ""
    assert texts == [c["message"]["content"] for c in whole["choices"]]


def test_completion_logprobs_match_the_engine(server: Any, ref: LLM) -> None:
    prompt = _words(360, 6)
    want = ref.generate(prompt, SamplingParams(max_tokens=5, logprobs=3), use_tqdm=False)
    out = want[0].outputs[0]
    got = completion(server, prompt=prompt, max_tokens=5, temperature=0, logprobs=3)
    lp = got["choices"][0]["logprobs"]
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    tok = ref.tokenizer
    texts = [tok.decode([t], skip_special_tokens=False) for t in out.token_ids]
    assert lp["tokens"] == texts
    assert lp["token_logprobs"] == pytest.approx(
        [e[t].logprob for t, e in zip(out.token_ids, out.logprobs, strict=True)], abs=1e-5
    )  # type: ignore[arg-type]
    for top, entry in zip(lp["top_logprobs"], out.logprobs or [], strict=True):
        best = sorted((x for x in entry.values() if x.rank <= 3), key=lambda x: x.rank)
        assert list(top.values())[:3] == pytest.approx([x.logprob for x in best], abs=1e-5)
        assert len(top) in (3, 4)
    assert lp["text_offset"] == [sum(len(t) for t in texts[:i]) for i in range(5)]
    # Streamed: the chunks' logprobs join to the same lists.
    live, _ = server
    chunks = sse_events(
        live.url,
        "/v1/completions",
        {"prompt": prompt, "max_tokens": 5, "temperature": 0, "logprobs": 3},
    )
    joined: dict[str, list[Any]] = {k: [] for k in lp}
    for ch in chunks:
        part = ch["choices"][0]["logprobs"]
        if part is not None:
            for k in joined:
                joined[k] += part[k]
    # (the second call hits the prompt's cached blocks: the last bits may differ)
    assert joined["tokens"] == lp["tokens"] and joined["text_offset"] == lp["text_offset"]
    assert joined["token_logprobs"] == pytest.approx(lp["token_logprobs"], abs=1e-5)
    assert [list(t) for t in joined["top_logprobs"]] == [list(t) for t in lp["top_logprobs"]]


def test_chat_logprobs_shapes(server: Any) -> None:
    live, _ = server
    body = {
        "messages": [{"role": "user", "content": _words(380, 3)}],
        "max_tokens": 4,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
    }
    code, _, whole = post(live.url, "/v1/chat/completions", body)
    assert code == 200
    content = whole["choices"][0]["logprobs"]["content"]
    assert len(content) == whole["usage"]["completion_tokens"] == 4
    for item in content:
        assert set(item) == {"token", "logprob", "bytes", "top_logprobs"}
        assert item["bytes"] == list(item["token"].encode())
        assert len(item["top_logprobs"]) == 2
        assert item["top_logprobs"][0]["logprob"] >= item["top_logprobs"][1]["logprob"]
        assert item["top_logprobs"][0]["logprob"] == item["logprob"]  # greedy: the argmax
    streamed = [
        x
        for ch in sse_events(live.url, "/v1/chat/completions", body)
        for c in ch["choices"]
        if c["logprobs"] is not None
        for x in c["logprobs"]["content"]
    ]
    # (the second call hits the prompt's cached blocks: the last bits may differ)
    assert [x["token"] for x in streamed] == [x["token"] for x in content]
    flat = [[x["logprob"]] + [t["logprob"] for t in x["top_logprobs"]] for x in streamed]
    want = [[x["logprob"]] + [t["logprob"] for t in x["top_logprobs"]] for x in content]
    assert flat == [pytest.approx(w, abs=1e-5) for w in want]
    code, _, plain = post(
        live.url, "/v1/chat/completions", dict(body, logprobs=False, top_logprobs=None)
    )
    assert plain["choices"][0]["logprobs"] is None


@pytest.mark.parametrize(
    "fields",
    [
        {"frequency_penalty": 2.0},
        {"presence_penalty": 1.5, "repetition_penalty": 1.3},
        {"logit_bias": {"77": 5.0, "80": -3.0}},
    ],
)
def test_penalties_and_bias_equal_the_engine(server: Any, ref: LLM, fields: dict[str, Any]) -> None:
    prompt = _words(400, 5)
    engine_fields = dict(fields)
    if "logit_bias" in fields:
        engine_fields["logit_bias"] = {int(k): v for k, v in fields["logit_bias"].items()}
    want = ref.generate(prompt, SamplingParams(max_tokens=10, **engine_fields), use_tqdm=False)
    plain = ref.generate(prompt, SamplingParams(max_tokens=10), use_tqdm=False)
    got = completion(
        server, prompt=prompt, max_tokens=10, temperature=0, return_token_ids=True, **fields
    )
    assert got["choices"][0]["token_ids"] == want[0].outputs[0].token_ids
    assert want[0].outputs[0].token_ids != plain[0].outputs[0].token_ids


def test_min_tokens_holds_back_the_stop(server: Any) -> None:
    body = dict(
        prompt=_words(420, 3),
        max_tokens=8,
        temperature=0,
        logit_bias={"77": 100},
        stop_token_ids=[77],
        return_token_ids=True,
    )
    assert completion(server, **body)["choices"][0]["token_ids"] == [77]
    held = completion(server, **body, min_tokens=3)["choices"][0]
    assert len(held["token_ids"]) == 4 and held["token_ids"][3] == 77
    assert 77 not in held["token_ids"][:3] and held["finish_reason"] == "stop"


def test_echo_puts_the_prompt_first(server: Any) -> None:
    live, _ = server
    prompt = _words(440, 4)
    plain = completion(server, prompt=prompt, max_tokens=3, temperature=0)
    echoed = completion(server, prompt=prompt, max_tokens=3, temperature=0, echo=True)
    assert echoed["choices"][0]["text"] == prompt + plain["choices"][0]["text"]
    ids = completion(server, prompt=[440, 441], max_tokens=1, temperature=0, echo=True)
    assert ids["choices"][0]["text"].startswith("w440 w441")
    chunks = sse_events(
        live.url,
        "/v1/completions",
        {"prompt": prompt, "max_tokens": 3, "temperature": 0, "echo": True},
    )
    assert "".join(c["choices"][0]["text"] for c in chunks) == echoed["choices"][0]["text"]


def test_cache_salt_separates_tenants(server: Any) -> None:
    live, _ = server
    ids = list(range(460, 481))  # 21 tokens: 5 full blocks

    def cached(**salt: str) -> int:
        out = completion(server, prompt=ids, max_tokens=1, **salt)
        return int(out["usage"]["prompt_tokens_details"]["cached_tokens"])

    assert cached(cache_salt="tenant-a") == 0
    assert cached(cache_salt="tenant-b") == 0
    assert cached() == 0
    assert cached(cache_salt="tenant-a") == 20
    chat = {"messages": [{"role": "user", "content": _words(490, 9)}], "max_tokens": 1}
    for salt, want in (("a", 0), ("b", 0), ("a", None)):
        code, _, out = post(live.url, "/v1/chat/completions", dict(chat, cache_salt=salt))
        got = out["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert code == 200 and (got == want if want is not None else got > 0)
    code, _, out = post(live.url, "/v1/completions", {"prompt": ids, "cache_salt": ""})
    assert code == 400 and out["error"]["param"] == "cache_salt"
