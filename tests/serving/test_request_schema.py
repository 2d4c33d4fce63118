"""The whole request schema of OpenAI's completion and chat endpoints, field by field.

Every field of the published schemas (OpenAI's API reference, as the official
``openai`` client 3.57 declares them), of vLLM's extensions we keep, and of the
SGLang fields sglang-router adds, is either honoured (a case below shows its
effect against the same request without it) or refused with a 400 whose
``param`` names it. A field the server declares but this walk does not cover,
or a field of the installed client that the lists below lack, fails the test.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from serve_http import post, sse_events

from hybridkv.serving.fields import sampling_params
from hybridkv.serving.protocol import ChatCompletionRequest, CompletionRequest

COMPLETION_FIELDS = {
    *("model", "prompt", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs"),
    *("max_tokens", "n", "presence_penalty", "seed", "stop", "stream", "stream_options"),
    *("suffix", "temperature", "top_p", "user"),
}
CHAT_FIELDS = {
    *("messages", "model", "audio", "frequency_penalty", "function_call", "functions"),
    *("logit_bias", "logprobs", "max_completion_tokens", "max_tokens", "metadata"),
    *("modalities", "moderation", "n", "parallel_tool_calls", "prediction"),
    *("presence_penalty", "prompt_cache_key", "prompt_cache_options", "prompt_cache_retention"),
    *("reasoning_effort", "response_format", "safety_identifier", "seed", "service_tier"),
    *("stop", "store", "stream", "stream_options", "temperature", "tool_choice", "tools"),
    *("top_logprobs", "top_p", "user", "verbosity", "web_search_options"),
}
VLLM_EXTENSIONS = {
    *("top_k", "min_tokens", "repetition_penalty", "stop_token_ids", "ignore_eos"),
    *("return_token_ids", "cache_salt"),
}
GATEWAY = {"no_stop_trim", "skip_special_tokens", "return_hidden_states"}
CHAT_GATEWAY = {"continue_final_message", "separate_reasoning", "stream_reasoning"}
ENDPOINTS = {
    "completions": (
        "/v1/completions",
        CompletionRequest,
        COMPLETION_FIELDS | VLLM_EXTENSIONS | GATEWAY,
        {"prompt": "w60 w61 w62 w63 w64"},
    ),
    "chat": (
        "/v1/chat/completions",
        ChatCompletionRequest,
        CHAT_FIELDS | VLLM_EXTENSIONS | GATEWAY | CHAT_GATEWAY,
        {"messages": [{"role": "user", "content": "w70 w71 w72"}]},
    ),
}


class Walk:
    """Calls one endpoint: the base request (greedy, 6 tokens) plus a case's fields."""

    def __init__(self, url: str, endpoint: str) -> None:
        self.url = url
        self.path, self.model, _, first = ENDPOINTS[endpoint]
        self.chat = endpoint == "chat"
        self.body = dict(first, model="tiny", max_tokens=6, temperature=0, return_token_ids=True)
        code, _, self.base = post(url, self.path, self.body)
        assert code == 200, self.base

    def post(self, **fields: Any) -> tuple[int, Any]:
        code, _, out = post(self.url, self.path, dict(self.body, **fields))
        return code, out

    def ok(self, **fields: Any) -> Any:
        code, out = self.post(**fields)
        assert code == 200, out
        return out

    def stream(self, **fields: Any) -> list[Any]:
        return sse_events(self.url, self.path, dict(self.body, **fields))

    def text(self, out: Any, i: int = 0) -> str:
        c = out["choices"][i]
        return str(c["message"]["content"] if self.chat else c["text"])

    def params(self, **fields: Any) -> Any:
        """The ``SamplingParams`` the body maps to (effects the tiny model cannot show)."""
        return sampling_params(self.model.model_validate(dict(self.body, **fields)), 6, 512)


def ids(out: Any, i: int = 0) -> list[int]:
    return list(out["choices"][i]["token_ids"])


Check = Callable[["Walk", str, Any], None]


@dataclass(frozen=True)
class Case:
    """A value of a field: honoured (``check`` shows the effect) or refused (``check``
    None: 400, or ``status``, with ``param``, default the field). ``extra``: fields
    the case needs beside it."""

    value: Any
    check: Check | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    status: int = 400
    param: str | None = None


# -- effects ------------------------------------------------------------------------
def same(w: Walk, name: str, v: Any) -> None:
    """The value asks for what the server does anyway: the base output."""
    assert ids(w.ok(**{name: v})) == ids(w.base)


def differs(w: Walk, name: str, v: Any) -> None:
    assert ids(w.ok(**{name: v})) != ids(w.base)


def greedy_when_sampled(w: Walk, name: str, v: Any) -> None:
    """At temperature 1 (seeded), the value leaves only the argmax: the greedy base."""
    assert ids(w.ok(**{name: v}, temperature=1.0, seed=2)) == ids(w.base)
    assert ids(w.ok(temperature=1.0, seed=2)) != ids(w.base)


def hot(w: Walk, name: str, v: Any) -> None:
    assert ids(w.ok(temperature=v, seed=1)) != ids(w.base)


def seeded(w: Walk, name: str, v: Any) -> None:
    a, b = w.ok(seed=v, temperature=1.0), w.ok(seed=v, temperature=1.0)
    assert ids(a) == ids(b) != ids(w.ok(seed=v + 1, temperature=1.0))


def n_choices(w: Walk, name: str, v: Any) -> None:
    out = w.ok(**{name: v, "n": v})
    assert [c["index"] for c in out["choices"]] == list(range(v))


def token_limit(w: Walk, name: str, v: Any) -> None:
    assert w.ok(**{name: v})["usage"]["completion_tokens"] == v


def all_biased(w: Walk, name: str, v: Any) -> None:
    assert ids(w.ok(logit_bias=v)) == [77] * 6


def stop_string(w: Walk, name: str, v: Any) -> None:
    text = w.text(w.base)
    stop = " " + text.split(" ")[3]
    out = w.ok(stop=[stop])
    assert w.text(out) == text[: text.index(stop)]
    assert out["choices"][0]["finish_reason"] == "stop"


def streamed(w: Walk, name: str, v: Any) -> None:
    events = w.stream()
    if w.chat:
        text = "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])
    else:
        text = "".join(c["text"] for e in events for c in e["choices"])
    assert text == w.text(w.base)


def usage_chunk(w: Walk, name: str, v: Any) -> None:
    events = w.stream(stream_options=v)
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 6


def completion_logprobs(w: Walk, name: str, v: Any) -> None:
    lp = w.ok(logprobs=v)["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == 6 and all(len(t) in (v, v + 1) for t in lp["top_logprobs"])
    assert w.base["choices"][0]["logprobs"] is None


def chat_logprobs(w: Walk, name: str, v: Any) -> None:
    assert len(w.ok(logprobs=v)["choices"][0]["logprobs"]["content"]) == 6
    assert w.base["choices"][0]["logprobs"] is None


def top_logprobs(w: Walk, name: str, v: Any) -> None:
    content = w.ok(logprobs=True, top_logprobs=v)["choices"][0]["logprobs"]["content"]
    assert all(len(x["top_logprobs"]) == v for x in content)


def echo(w: Walk, name: str, v: Any) -> None:
    assert w.text(w.ok(echo=v)) == w.body["prompt"] + w.text(w.base)


def prompts(w: Walk, name: str, v: Any) -> None:
    out = w.ok(prompt=v)
    assert len(out["choices"]) == 2 and out["usage"]["prompt_tokens"] == 3


def messages(w: Walk, name: str, v: Any) -> None:
    assert w.ok(messages=v)["usage"]["prompt_tokens"] > w.base["usage"]["prompt_tokens"]


def min_tokens(w: Walk, name: str, v: Any) -> None:
    fields = dict(logit_bias={"77": 100}, stop_token_ids=[77])
    assert ids(w.ok(**fields)) == [77]
    held = ids(w.ok(**fields, min_tokens=v))
    assert len(held) == v + 1 and held[-1] == 77 and 77 not in held[:-1]


def stop_ids(w: Walk, name: str, v: Any) -> None:
    base = ids(w.base)
    out = w.ok(stop_token_ids=[base[2]])
    assert ids(out) == base[: base.index(base[2]) + 1]
    assert out["choices"][0]["finish_reason"] == "stop"


def maps_to_ignore_eos(w: Walk, name: str, v: Any) -> None:
    # The tiny checkpoint has no end-of-sequence token: the mapping is the effect.
    assert w.params(ignore_eos=v).ignore_eos is True
    assert w.params().ignore_eos is False


def no_token_ids(w: Walk, name: str, v: Any) -> None:
    assert "token_ids" not in w.ok(return_token_ids=v)["choices"][0]


def salted(w: Walk, name: str, v: Any) -> None:
    assert w.ok()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # base is cached
    assert w.ok(cache_salt=v)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def ok_200(w: Walk, name: str, v: Any) -> None:
    w.ok(**{name: v})


# -- the cases ----------------------------------------------------------------------
COMMON: dict[str, list[Case]] = {
    "model": [Case("tiny", ok_200), Case("gpt-x", status=404)],
    "frequency_penalty": [Case(2.0, differs), Case(3.0)],
    "presence_penalty": [Case(2.0, differs), Case(-3.0)],
    "logit_bias": [Case({"77": 100}, all_biased), Case({"x": 1}), Case({"60": 101})],
    "n": [Case(2, n_choices), Case(0)],
    "seed": [Case(5, seeded)],
    "stop": [Case("(a word of the output)", stop_string)],
    "stream": [Case(True, streamed)],
    "stream_options": [
        Case({"include_usage": True}, usage_chunk),
        Case(
            {"include_obfuscation": True},
            extra={"stream": True},
            param="stream_options.include_obfuscation",
        ),
        Case({"include_usage": True}),  # without stream
    ],
    "temperature": [Case(0, same), Case(2.0, hot), Case(-1)],
    "top_p": [Case(1e-9, greedy_when_sampled), Case(0)],
    "max_tokens": [Case(3, token_limit), Case(0)],
    "user": [Case("someone")],
    "top_k": [Case(1, greedy_when_sampled), Case(-2)],
    "min_tokens": [Case(3, min_tokens), Case(7)],
    "repetition_penalty": [Case(2.0, differs), Case(0)],
    "stop_token_ids": [Case("(a token of the output)", stop_ids)],
    "ignore_eos": [Case(True, maps_to_ignore_eos)],
    "return_token_ids": [Case(False, no_token_ids)],
    "cache_salt": [Case("walk-tenant", salted), Case("")],
    "no_stop_trim": [Case(False, same), Case(True)],
    "skip_special_tokens": [Case(True, same), Case(False)],
    "return_hidden_states": [Case(False, same), Case(True)],
}
COMPLETION_ONLY: dict[str, list[Case]] = {
    "prompt": [Case(["w60 w61", "w62"], prompts), Case("")],
    "best_of": [Case(2, n_choices), Case(3)],
    "echo": [Case(True, echo), Case(True, extra={"logprobs": 1})],
    "logprobs": [Case(2, completion_logprobs), Case(21)],
    "suffix": [Case("w9")],
}
CHAT_ONLY: dict[str, list[Case]] = {
    "messages": [
        Case([{"role": "user", "content": "w70 w71 w72 w73 w74", "name": "x"}], messages),
        Case([{"role": "user", "content": "w6", "tool_calls": []}], param="messages.0.tool_calls"),
    ],
    "max_completion_tokens": [Case(3, token_limit), Case(0)],
    "logprobs": [Case(True, chat_logprobs)],
    "top_logprobs": [Case(2, top_logprobs), Case(2, extra={"logprobs": False})],
    "store": [Case(False, same), Case(True)],
    "metadata": [Case({}, same), Case({"k": "v"})],
    "service_tier": [Case("auto", same), Case("default", same), Case("flex")],
    "modalities": [Case(["text"], same), Case(["text", "audio"])],
    "response_format": [Case({"type": "text"}, same), Case({"type": "json_object"})],
    "tool_choice": [Case("none", same), Case("auto")],
    "function_call": [Case("none", same), Case("auto")],
    "tools": [Case([{"type": "function", "function": {"name": "f"}}])],
    "parallel_tool_calls": [Case(False)],
    "functions": [Case([{"name": "f"}])],
    "audio": [Case({"voice": "alloy", "format": "mp3"})],
    "prediction": [Case({"type": "content", "content": "w1"})],
    "reasoning_effort": [Case("low")],
    "verbosity": [Case("low")],
    "web_search_options": [Case({})],
    "moderation": [Case({})],
    "safety_identifier": [Case("someone")],
    "prompt_cache_key": [Case("k")],
    "prompt_cache_retention": [Case("24h")],
    "prompt_cache_options": [Case({"mode": "explicit"})],
    "continue_final_message": [Case(False, same), Case(True)],
    "separate_reasoning": [Case(True, same), Case(False)],
    "stream_reasoning": [Case(True, same), Case(False)],
}
CASES = {
    "completions": {**COMMON, **COMPLETION_ONLY},
    "chat": {**COMMON, **CHAT_ONLY},
}
WALK = [
    pytest.param(endpoint, name, case, id=f"{endpoint}-{name}-{k}")
    for endpoint, table in CASES.items()
    for name, cases in table.items()
    for k, case in enumerate(cases)
]


def test_the_walk_covers_every_declared_field() -> None:
    for endpoint, (_, model, fields, _) in ENDPOINTS.items():
        assert set(model.model_fields) == fields, endpoint
        assert set(CASES[endpoint]) == fields, endpoint


def test_the_lists_hold_every_field_of_the_installed_client() -> None:
    pytest.importorskip("openai")
    from openai.types import completion_create_params as completion
    from openai.types.chat import completion_create_params as chat

    for params, fields in ((completion, COMPLETION_FIELDS), (chat, CHAT_FIELDS)):
        declared = set(params.CompletionCreateParamsBase.__annotations__) | {"stream"}
        assert declared <= fields, f"new fields in the openai client: {declared - fields}"


@pytest.fixture(scope="module")
def walks(server: Any) -> dict[str, Walk]:
    live, _ = server
    return {endpoint: Walk(live.url, endpoint) for endpoint in ENDPOINTS}


@pytest.mark.parametrize(("endpoint", "name", "case"), WALK)
def test_each_field_is_honoured_or_refused(
    walks: dict[str, Walk], endpoint: str, name: str, case: Case
) -> None:
    w = walks[endpoint]
    if case.check is not None:
        case.check(w, name, case.value)
        return
    code, out = w.post(**case.extra, **{name: case.value})
    assert code == case.status, out
    assert out["error"]["param"] == (case.param or name), out
