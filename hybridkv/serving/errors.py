"""Every error ``hybridkv serve`` answers is OpenAI's error object.

``{"error": {"message", "type", "param", "code"}}`` (``responses.error_body``)
for each 4xx and 5xx, whoever raises it:

- ``HTTPError`` from a route (a bad parameter, another model's name, a full queue);
- a body that is not JSON: the message says what the parser found wrong and
  where (line and column), ``param`` is null;
- a body that does not fit the request schema: the first problem, with its
  field's path as ``param`` (``messages.0.role``);
- an unknown path (404, naming the routes there are) or method (405, with
  ``Allow``), which the framework would answer as ``{"detail": ...}``;
- anything else a route raises: 500 with the exception's type and message.

503s carry ``Retry-After: 1``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Route

from hybridkv.serving.responses import error_body


class HTTPError(Exception):
    """An error answer of a route: status, message, and the request field it is about."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


def error_response(
    status: int, message: str, param: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    """OpenAI's error object as a response (``Retry-After`` on a 503)."""
    if status == 503:
        headers = {**(headers or {}), "Retry-After": "1"}
    return JSONResponse(error_body(status, message, param), status, headers=headers)


def json_problem(body: bytes) -> str | None:
    """What is wrong with ``body`` as JSON, in words with the line and column; None if fine."""
    if not body.strip():
        return "the request body is empty: send a JSON object"
    try:
        json.loads(body)
    except UnicodeDecodeError:
        return "the request body is not UTF-8 text: send a JSON object"
    except json.JSONDecodeError as e:
        return (
            f"the request body is not valid JSON: {e.msg[0].lower()}{e.msg[1:]} "
            f"at line {e.lineno}, column {e.colno}"
        )
    return None


def _field(loc: Sequence[Any]) -> str | None:
    return ".".join(str(p) for p in loc if p != "body") or None


_SCALAR_TAGS = frozenset({"str", "int", "float", "bool", "bytes", "list", "dict", "none"})


def _is_type_tag(part: Any) -> bool:
    """Whether a path part names one type of a union (``str``, ``list[int]``), not a field."""
    return isinstance(part, str) and (
        part in _SCALAR_TAGS or "[" in part or "-" in part or part[:1].isupper()
    )


def schema_problem(errors: Sequence[Any]) -> tuple[str | None, str]:
    """``(field path, message)`` of the first of pydantic's ``errors``.

    A value that fits none of a field's accepted types gives one error per
    type, each with the type's name in its path (``prompt.str``,
    ``prompt.list[int]``): they are told as one, at the field they share.
    """
    if not errors:
        return None, "the request body does not fit the request schema"
    first = errors[0]
    loc = list(first.get("loc", ()))
    if not loc or not _is_type_tag(loc[-1]):
        field = _field(loc)
        return field, f"{field or 'body'}: {first.get('msg', 'invalid')}"
    at = loc[:-1]
    same = [e for e in errors if list(e.get("loc", ()))[: len(at)] == at]
    field = _field(at)
    wants = dict.fromkeys(str(e.get("msg", "")).removeprefix("Input should be ") for e in same)
    return field, f"{field or 'body'}: got {first.get('input')!r}, which should be " + (
        " or ".join(wants)
    )


def _routes(app: FastAPI) -> str:
    """``POST /v1/completions, GET /health, ...``: what the app answers."""
    out = []
    for r in app.routes:
        if isinstance(r, Route) and r.include_in_schema:
            out += [f"{m} {r.path}" for m in sorted(r.methods or ()) if m != "HEAD"]
    return ", ".join(out)


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error of ``app`` with OpenAI's error object (module docstring)."""

    @app.exception_handler(HTTPError)
    async def http_error(_: Request, exc: HTTPError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.param)

    @app.exception_handler(RequestValidationError)
    async def bad_body(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {}
        if first.get("type") == "json_invalid" or tuple(first.get("loc", ())) == ("body",):
            problem = json_problem(await request.body())
            if problem is not None:
                return error_response(400, problem)
        field, message = schema_problem(errors)
        return error_response(400, message, field)

    @app.exception_handler(StarletteHTTPException)
    async def framework_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        where = f"{request.method} {request.url.path}"
        if exc.status_code == 404:
            message = f"no route {where}; this server answers {_routes(app)}"
        elif exc.status_code == 405:
            allowed = (exc.headers or {}).get("Allow", "")
            message = f"{where} is not allowed; {request.url.path} takes {allowed}"
        else:
            message = f"{where}: {exc.detail}"
        return error_response(exc.status_code, message, headers=dict(exc.headers or {}))

    @app.exception_handler(Exception)
    async def crash(_: Request, exc: Exception) -> JSONResponse:
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}")
