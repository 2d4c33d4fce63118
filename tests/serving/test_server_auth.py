"""``--api-key``: every path but ``/health`` needs the key; ``--metrics-public``;
``--no-cached-tokens-in-usage``. The walk over the app's route table fails for a
route that answers without the key, including routes added later."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from live_server import LiveServer, start_server
from serve_http import post
from starlette.routing import Route

from hybridkv.cli import main
from hybridkv.serving import auth

KEY = "sk-test-0123456789"
JSON = {"Content-Type": "application/json"}
#: A valid body for each POST route (a new POST route needs one here).
BODIES = {
    "/v1/completions": {"prompt": "w5 w6", "max_tokens": 2},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "w5"}], "max_tokens": 2},
}


def call(url: str, method: str, path: str, key: str | None = None, **headers: str) -> Any:
    """``(status, headers, body bytes)`` of one request, with ``Bearer key`` when given."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    body = json.dumps(BODIES[path]) if method == "POST" and path in BODIES else None
    if body is not None:
        headers["Content-Type"] = "application/json"
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    try:
        conn.request(method, path, body, headers)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


@pytest.fixture(scope="module")
def keyed(tok_ckpt: Path) -> Iterator[LiveServer]:
    live, _ = start_server(tok_ckpt, api_key=KEY)
    yield live
    live.stop()


def routes(live: LiveServer) -> list[tuple[str, str]]:
    """``(method, path)`` of every route of the live app (HEAD aside)."""
    app = live.server.config.app
    out = [
        (m, r.path)
        for r in app.routes
        if isinstance(r, Route)
        for m in sorted(r.methods or ())
        if m != "HEAD"
    ]
    assert ("POST", "/v1/completions") in out and ("GET", "/health") in out
    return out


def assert_401(status: int, headers: dict[str, str], body: bytes, says: str) -> None:
    assert status == 401 and headers["www-authenticate"] == "Bearer"
    assert json.loads(body) == {
        "error": {"message": says, "type": "AuthenticationError", "param": None, "code": 401}
    }


def test_every_route_needs_the_key_but_health(keyed: LiveServer) -> None:
    walked = routes(keyed)
    for method, path in walked:
        if path == "/health":
            assert call(keyed.url, method, path)[0] == 200
            continue
        status, headers, body = call(keyed.url, method, path)
        assert_401(
            status, headers, body, "missing API key: send the header 'Authorization: Bearer KEY'"
        )
        status, headers, body = call(keyed.url, method, path, key=KEY + "x")
        assert_401(status, headers, body, "invalid API key")
        status, _, body = call(keyed.url, method, path, key=KEY)
        assert status == 200, (method, path, status, body[:200])
    assert {p for _, p in walked} >= {"/v1/models", "/v1/chat/completions", "/metrics"}
    assert call(keyed.url, "GET", "/health", key="wrong")[0] == 200


def test_other_schemes_and_unknown_paths(keyed: LiveServer) -> None:
    status, headers, body = call(keyed.url, "GET", "/v1/models", Authorization=f"Basic {KEY}")
    assert_401(status, headers, body, "invalid API key")
    # Without the key an unknown path says nothing about what exists; with it, a 404.
    assert call(keyed.url, "GET", "/v1/secret")[0] == 401
    assert call(keyed.url, "GET", "/v1/secret", key=KEY)[0] == 404


def test_the_openai_client_sends_the_key(keyed: LiveServer) -> None:
    openai = pytest.importorskip("openai")
    good = openai.OpenAI(base_url=keyed.url + "/v1", api_key=KEY, max_retries=0)
    assert good.completions.create(model="tiny", prompt="w5", max_tokens=2).choices
    bad = openai.OpenAI(base_url=keyed.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError, match="invalid API key"):
        bad.models.list()


def test_the_key_from_the_environment_and_public_metrics(
    tok_ckpt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HYBRIDKV_API_KEY", KEY)
    live, _ = start_server(tok_ckpt, metrics_public=True)
    try:
        assert call(live.url, "GET", "/metrics")[0] == 200
        assert call(live.url, "GET", "/v1/models")[0] == 401
        assert call(live.url, "GET", "/v1/models", key=KEY)[0] == 200
    finally:
        live.stop()


def test_the_key_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[bytes, bytes]] = []

    def spy(a: bytes, b: bytes) -> bool:
        seen.append((a, b))
        return a == b

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    assert auth.key_matches("Bearer k1", "k1") and auth.key_matches("bearer  k1 ", "k1")
    assert not auth.key_matches("Bearer k2", "k1") and not auth.key_matches(None, "k1")
    assert seen == [(b"k1", b"k1"), (b"k1", b"k1"), (b"k2", b"k1")]


def test_cached_tokens_can_be_left_out_of_usage(tok_ckpt: Path) -> None:
    live, _ = start_server(tok_ckpt, no_cached_tokens_in_usage=True)
    body = {"prompt": " ".join(f"w{i}" for i in range(5, 30)), "max_tokens": 2}
    try:
        for _ in range(2):  # the second is a prefix-cache hit: still not told
            code, _, out = post(live.url, "/v1/completions", body)
            assert code == 200
            usage = out["usage"]
            assert set(usage) == {"prompt_tokens", "completion_tokens", "total_tokens"}
        conn = http.client.HTTPConnection("127.0.0.1", live.port, timeout=60)
        streamed = dict(body, stream=True, stream_options={"include_usage": True})
        conn.request("POST", "/v1/completions", json.dumps(streamed), JSON)
        frames = conn.getresponse().read().decode().split("\n\n")
        last = json.loads(frames[-3].removeprefix("data: "))
        assert set(last["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}
    finally:
        live.stop()


def test_cli_access_options(tok_ckpt: Path, capsys: Any, monkeypatch: Any) -> None:
    monkeypatch.delenv("HYBRIDKV_API_KEY", raising=False)
    assert main(["serve", "--port=0", str(tok_ckpt), "--metrics-public"]) == 2
    assert capsys.readouterr().err == (
        "hybridkv serve: error: --metrics-public needs --api-key (or $HYBRIDKV_API_KEY)\n"
    )
    assert main(["serve", "--port=0", str(tok_ckpt), "--api-key", " "]) == 2
    assert capsys.readouterr().err == (
        "hybridkv serve: error: --api-key must not be empty (leave it out for an open server)\n"
    )
