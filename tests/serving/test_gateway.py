"""sglang-router accepts a ``hybridkv serve`` replica as a worker and routes to it.

The gateway probes ``/health``, reads SGLang's ``/server_info`` and
``/model_info`` (the model's name, the tokenizer's local path, so it never
reaches for the network), then forwards OpenAI requests. With ``--api-key``
on both, the gateway sends the key to the worker (its info reads and the
requests it forwards) and asks it of its own clients.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from live_server import start_server

openai = pytest.importorskip("openai")
ROUTER = shutil.which("sglang-router", path=str(Path(sys.executable).parent))


KEY = "sk-gateway-test"


@pytest.fixture(params=[None, KEY], ids=["open", "api-key"])
def worker(request: Any, server: Any, tok_ckpt: Path) -> Iterator[tuple[Any, str | None]]:
    """The worker: the module's open server, or one that needs ``KEY``."""
    if request.param is None:
        yield server[0], None
        return
    live, _ = start_server(tok_ckpt, api_key=request.param)
    yield live, request.param
    live.stop()


@pytest.mark.skipif(ROUTER is None, reason="sglang-router is not installed (the cluster extra)")
def test_the_gateway_routes_to_hybridkv(worker: Any, tmp_path: Path) -> None:
    live, key = worker
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    log = (tmp_path / "router.log").open("wb")
    proc = subprocess.Popen(
        [
            str(ROUTER),
            "launch",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--policy",
            "cache_aware",
            "--worker-urls",
            live.url,
            "--log-level",
            "info",
            *(["--api-key", key] if key else []),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    router = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        workers: list[Any] = []
        # Until the gateway has registered the worker and its first health
        # check has passed (on a loaded box registration can come first).
        while not workers or not all(w["is_healthy"] for w in workers):
            assert proc.poll() is None, "the gateway exited"
            assert time.monotonic() < deadline, (
                f"the gateway never registered the worker as healthy: {workers}"
            )
            time.sleep(0.2)
            try:
                auth = {"Authorization": f"Bearer {key}"} if key else {}
                ask = urllib.request.Request(router + "/workers", headers=auth)
                with urllib.request.urlopen(ask, timeout=5) as r:
                    workers = json.loads(r.read())["workers"]
            except OSError:
                pass
        # Registered under the served name (from /model_info), healthy, over HTTP.
        assert [(w["url"], w["model_id"], w["is_healthy"]) for w in workers] == [
            (live.url, "tiny", True)
        ]
        api_key = key or "none"
        client = openai.OpenAI(base_url=router + "/v1", api_key=api_key, max_retries=0, timeout=30)
        direct = openai.OpenAI(base_url=live.url + "/v1", api_key=api_key, max_retries=0)
        args: dict[str, Any] = dict(model="tiny", prompt="w5 w6 w7", max_tokens=4, temperature=0)
        want = direct.completions.create(**args)
        got = client.completions.create(**args)
        assert got.choices[0].text == want.choices[0].text
        # The gateway adds SGLang's fields at their defaults: the server takes them.
        chat: dict[str, Any] = dict(
            model="tiny", messages=[{"role": "user", "content": "w9 w10"}], max_tokens=3
        )
        want_chat = direct.chat.completions.create(**chat, temperature=0)
        got_chat = client.chat.completions.create(**chat, temperature=0)
        assert got_chat.choices[0].message.content == want_chat.choices[0].message.content
        streamed = client.completions.create(**args, stream=True)
        assert "".join(c.choices[0].text for c in streamed if c.choices) == want.choices[0].text
        assert [m.id for m in client.models.list().data] == ["tiny"]
        if key:
            keyless = openai.OpenAI(base_url=router + "/v1", api_key="wrong", max_retries=0)
            with pytest.raises(openai.AuthenticationError):
                keyless.completions.create(**args)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()
