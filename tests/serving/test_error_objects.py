"""Every 4xx/5xx is OpenAI's error object, and ``max_tokens`` must fit in the context.

The module server runs with ``--max-model-len 64``.
"""

from __future__ import annotations

import http.client
import json
from typing import Any

import pytest
from serve_http import post

from hybridkv.serving.responses import error_type


def send(url: str, method: str, path: str, body: str | None = None) -> tuple[int, dict, Any]:
    """A raw request (any method, any body bytes); ``(status, headers, decoded JSON)``."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body, headers)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, json.loads(r.read())
    finally:
        conn.close()


def error_of(out: Any, status: int) -> dict[str, Any]:
    """The error object, checked for OpenAI's shape."""
    assert set(out) == {"error"}, out
    err = out["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"]
    assert err["type"] == error_type(status) and err["code"] == status
    assert err["param"] is None or isinstance(err["param"], str)
    return err


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ('{"prompt": "w5",}', "expecting property name enclosed in double quotes at line 1, "),
        ('{"prompt":\n "w5" "max_tokens": 2}', "expecting ',' delimiter at line 2, column 7"),
        ('{"prompt": "w5"', "at line 1, column 16"),
        ("", "the request body is empty"),
    ],
)
def test_malformed_json_says_what_and_where(server: Any, body: str, says: str) -> None:
    live, _ = server
    code, _, out = send(live.url, "POST", "/v1/completions", body)
    err = error_of(out, 400)
    assert code == 400 and says in err["message"] and err["param"] is None
    assert err["message"].startswith(("the request body is not valid JSON: ", "the request"))


def test_unknown_paths_and_methods(server: Any) -> None:
    live, _ = server
    code, _, out = send(live.url, "GET", "/v1/nothing")
    err = error_of(out, 404)
    assert code == 404 and err["message"].startswith("no route GET /v1/nothing; ")
    assert "POST /v1/completions" in err["message"] and "GET /health" in err["message"]
    code, headers, out = send(live.url, "GET", "/v1/completions")
    err = error_of(out, 405)
    assert code == 405 and headers["allow"] == "POST" and err["type"] == "MethodNotAllowedError"
    assert err["message"] == "GET /v1/completions is not allowed; /v1/completions takes POST"
    code, _, out = send(live.url, "DELETE", "/v1/models")
    assert code == 405 and error_of(out, 405)["param"] is None


def test_schema_errors_name_the_field(server: Any) -> None:
    live, _ = server
    code, _, out = post(live.url, "/v1/completions", {"prompt": 5})
    err = error_of(out, 400)
    assert err["param"] == "prompt"
    assert err["message"] == "prompt: got 5, which should be a valid string or a valid list"
    code, _, out = post(live.url, "/v1/completions", {"prompt": "w5", "max_tokens": "x"})
    assert error_of(out, 400)["param"] == "max_tokens"
    chat = {"messages": [{"role": "user", "content": "w5"}, {"role": "robot", "content": "x"}]}
    code, _, out = post(live.url, "/v1/chat/completions", chat)
    assert error_of(out, 400)["param"] == "messages.1.role"
    code, _, out = send(live.url, "POST", "/v1/completions", "[1, 2]")
    assert code == 400 and error_of(out, 400)["message"].startswith("body: ")


def test_an_unexpected_failure_is_a_500_object(server: Any, monkeypatch: Any) -> None:
    live, engine = server

    def broken(llm: Any) -> None:
        raise RuntimeError("gauge broke")

    monkeypatch.setattr(engine.metrics, "refresh", broken)
    code, _, out = send(live.url, "GET", "/metrics")
    err = error_of(out, 500)
    assert code == 500 and err["message"] == "internal error: RuntimeError: gauge broke"


LONG = " ".join(["w5"] * 60)  # 60 prompt tokens of the 64


def test_max_tokens_beyond_the_context_is_refused(server: Any) -> None:
    live, engine = server
    body = {"prompt": LONG, "max_tokens": 100, "ignore_eos": True}
    code, _, out = post(live.url, "/v1/completions", body)
    err = error_of(out, 400)
    assert code == 400 and err["param"] == "max_tokens"
    assert err["message"] == (
        "max_tokens=100 is too large: this model's maximum context length is 64 tokens and the "
        "prompt has 60, which leaves room for 4 (100 > 64 - 60); lower max_tokens"
    )
    # Exactly the room is fine, and without max_tokens the default (16) is cut to the room.
    for fields in ({"max_tokens": 4}, {}, {"max_tokens": None}):
        code, _, out = post(live.url, "/v1/completions", {"prompt": LONG, **fields})
        assert code == 200 and out["usage"]["completion_tokens"] == 4, out
        assert out["choices"][0]["finish_reason"] == "length"
    code, _, out = post(live.url, "/v1/completions", {"prompt": LONG + " w5 w5 w5 w5"})
    err = error_of(out, 400)
    assert err["param"] == "prompt" and "the whole context (max_model_len=64)" in err["message"]
    chat = {"messages": [{"role": "user", "content": LONG}], "max_completion_tokens": 50}
    code, _, out = post(live.url, "/v1/chat/completions", chat)
    err = error_of(out, 400)
    assert code == 400 and err["param"] == "max_completion_tokens"
    assert "max_completion_tokens=50 is too large" in err["message"] and " 64 " in err["message"]
    engine.call(lambda llm: llm.manager.check_integrity()).result(30)


def test_error_types_follow_the_openai_client() -> None:
    assert [error_type(s) for s in (400, 401, 404, 405, 415, 500, 503, 599)] == [
        "BadRequestError",
        "AuthenticationError",
        "NotFoundError",
        "MethodNotAllowedError",
        "UnsupportedMediaTypeError",
        "InternalServerError",
        "ServiceUnavailableError",
        "Error",
    ]
