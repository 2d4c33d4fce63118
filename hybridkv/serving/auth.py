"""Who may call ``hybridkv serve``, and what its answers tell a caller.

``AccessPolicy`` holds the server's choices:

- ``api_key``: every path but ``/health`` (and ``/metrics`` when
  ``metrics_public``) needs ``Authorization: Bearer KEY``; a missing or
  wrong key gets OpenAI's 401 error object. ``BearerAuth`` checks it as ASGI
  middleware, before routing, so a route added later cannot skip it and an
  unknown path tells a caller without the key nothing (401, not 404). The
  comparison is ``hmac.compare_digest`` (its time does not depend on where
  the keys differ).
- ``cached_tokens_in_usage``: whether ``usage.prompt_tokens_details.cached_tokens``
  is sent. A cache hit tells the caller that someone sent the same prefix
  before (README "Serving", docs/cluster.md: the side channel and its three
  defenses, ``cache_salt``, the key and hiding this count).
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from hybridkv.serving.responses import error_body

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

#: Paths every caller may read: a load balancer's health probe.
ALWAYS_OPEN = frozenset({"/health"})


@dataclass(frozen=True, slots=True)
class AccessPolicy:
    """The server's access choices (module docstring)."""

    api_key: str | None = None
    metrics_public: bool = False
    cached_tokens_in_usage: bool = True

    def __post_init__(self) -> None:
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("--api-key must not be empty (leave it out for an open server)")

    @property
    def open_paths(self) -> frozenset[str]:
        """Paths served without the key."""
        return ALWAYS_OPEN | {"/metrics"} if self.metrics_public else ALWAYS_OPEN


def key_matches(header: str | None, key: str) -> bool:
    """Whether an ``Authorization`` header carries ``Bearer KEY`` (constant-time)."""
    scheme, _, token = (header or "").strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(token.strip().encode("utf-8"), key.encode("utf-8"))


class BearerAuth:
    """ASGI middleware: 401 (OpenAI's error object) for a call without the key."""

    def __init__(self, app: Any, *, key: str, open_paths: frozenset[str]) -> None:
        self.app, self.key, self.open_paths = app, key, open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        header = headers.get(b"authorization")
        if header is not None and key_matches(header.decode("latin-1"), self.key):
            await self.app(scope, receive, send)
            return
        message = (
            "missing API key: send the header 'Authorization: Bearer KEY'"
            if header is None
            else "invalid API key"
        )
        body = json.dumps(error_body(401, message)).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b"Bearer"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
