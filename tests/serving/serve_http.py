"""Plain HTTP helpers for the server tests (no client library in between)."""

from __future__ import annotations

import http.client
import json
import time
from typing import Any
from urllib.parse import urlsplit


def post(url: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
    """POST JSON; ``(status, headers, decoded JSON body)``."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        data = r.read()
        return r.status, dict(r.getheaders()), json.loads(data) if data else None
    finally:
        conn.close()


def open_stream(url: str, body: dict[str, Any]) -> tuple[http.client.HTTPConnection, Any]:
    """Start a streamed completion; the caller reads lines and closes."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    conn.request(
        "POST",
        "/v1/completions",
        json.dumps(dict(body, stream=True)),
        {"Content-Type": "application/json"},
    )
    return conn, conn.getresponse()


def metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``/metrics`` as ``{(sample name, sorted labels without model_name): value}``."""
    from prometheus_client.parser import text_string_to_metric_families

    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))
            out[(s.name, labels)] = s.value
    return out


def wait_until(check: Any, timeout: float = 30.0) -> None:
    """Poll ``check()`` until true, at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)


def sse_events(url: str, path: str, body: dict[str, Any]) -> list[Any]:
    """POST ``body`` with ``stream: true``; the decoded ``data:`` chunks before ``[DONE]``
    (which must end the stream)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        conn.request(
            "POST", path, json.dumps(dict(body, stream=True)), {"Content-Type": "application/json"}
        )
        r = conn.getresponse()
        assert r.status == 200, r.read()
        frames = [line[6:] for line in r.read().decode().splitlines() if line.startswith("data: ")]
    finally:
        conn.close()
    assert frames and frames[-1] == "[DONE]", frames[-3:]
    return [json.loads(f) for f in frames[:-1]]
