"""The HTTP routes of ``hybridkv serve`` (FastAPI), over one ``EngineLoop``.

Imports FastAPI at the top (it resolves the routes' annotations from this
module): import this module only once the ``serve`` extra is known present.

- ``POST /v1/completions`` and ``POST /v1/chat/completions``, streamed
  (Server-Sent Events, ending with ``data: [DONE]``) or not;
- ``GET /v1/models``, ``GET /health`` (503 once the engine thread is gone),
  ``GET /metrics`` (``ServerMetrics``);
- SGLang's ``GET /get_model_info`` and ``/get_server_info`` (also without
  ``get_``), which sglang-router reads when it registers a worker.

Errors are OpenAI's error object (``errors``): 400 for a bad body or
parameter (a prompt longer than ``max_model_len``, a ``max_tokens`` the
context has no room for: ``token_budget``), 404 for another model's name or
path, 503 with ``Retry-After`` when ``max_waiting`` requests wait, 500 when the
engine step that computed the request failed (a stream that has begun gets an
error chunk, then ``[DONE]``). A chat's template is checked after its other
fields. A client that disconnects aborts its requests.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from hybridkv.engine.chat_template import ChatTemplate, missing_template_message
from hybridkv.engine.engine_request import EngineRequest
from hybridkv.engine.sampling_params import SamplingParams
from hybridkv.engine.tokenizer import encode_chat
from hybridkv.serving.auth import AccessPolicy, BearerAuth
from hybridkv.serving.engine_loop import EngineLoop, EngineStopped, QueueFull
from hybridkv.serving.errors import HTTPError, error_response, install_error_handlers
from hybridkv.serving.fields import error_param, refusal, sampling_params
from hybridkv.serving.generation import EngineError, Generation
from hybridkv.serving.logprob_format import LogprobFormat
from hybridkv.serving.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from hybridkv.serving.responses import Reply, error_body, sse
from hybridkv.serving.token_budget import Limit, NoRoom

NO_TEMPLATE_FIX = "start the server with hybridkv serve MODEL --chat-template FILE"


def build_app(
    engine: EngineLoop,
    model_name: str,
    *,
    chat_template: ChatTemplate | None = None,
    access: AccessPolicy | None = None,
) -> Any:
    """The FastAPI app; starts the engine thread on startup, stops it on shutdown.

    ``chat_template`` renders chats (None: chat requests get a 400 naming
    ``--chat-template``, after their other fields are checked); ``access``:
    the API key and what usage reveals (``auth``; default: open, all shown)."""
    access = access or AccessPolicy()
    llm = engine.llm

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        if not engine.alive:
            engine.start()
        yield
        engine.stop()

    app = FastAPI(title="hybridkv", lifespan=lifespan)
    install_error_handlers(app)
    if access.api_key is not None:
        app.add_middleware(BearerAuth, key=access.api_key, open_paths=access.open_paths)
    error = error_response

    def params(body: SamplingFields, max_tokens: int) -> SamplingParams:
        problem = refusal(body)
        if problem:
            raise HTTPError(400, problem[1], problem[0])
        if body.model is not None and body.model != model_name:
            raise HTTPError(404, f"The model `{body.model}` does not exist.", "model")
        try:
            return sampling_params(body, max_tokens, llm.text_config.vocab_size)
        except ValueError as e:
            raise HTTPError(400, str(e), error_param(body, str(e))) from None

    def make(prompt: Any, p: SamplingParams, limit: Limit, salt: str | None) -> list[EngineRequest]:
        """The prompt's ``n`` engine requests, ``max_tokens`` fitted to the context
        (``token_budget``), under the body's ``cache_salt``."""
        if salt is not None:
            prompt = {"prompt": prompt} if isinstance(prompt, str) else dict(prompt)
            prompt["cache_salt"] = salt
        try:
            reqs = llm.make_requests(prompt, p)
            budget = limit.budget(reqs[0].core.num_prompt_tokens, llm.max_model_len)
            if budget != p.max_tokens:
                p = dataclasses.replace(p, max_tokens=budget)
                reqs = llm.make_requests(prompt, p)
        except NoRoom as e:
            raise HTTPError(400, str(e), e.field) from None
        except ValueError as e:
            raise HTTPError(400, str(e), limit.prompt_field) from None
        return reqs

    async def run(
        request: Request,
        body: SamplingFields,
        reqs: list[EngineRequest],
        chat: bool,
        stops: tuple[str, ...] = (),
    ) -> Any:
        echo = isinstance(body, CompletionRequest) and body.echo
        stop_strings = [*body.stop_strings(), *stops]
        gen = Generation(engine, reqs, stop_strings, llm.tokenizer, n=body.n, echo=echo)
        k = body.num_logprobs()
        fmt = None if k is None else LogprobFormat(llm.tokenizer, k, chat)
        cached = access.cached_tokens_in_usage
        reply = Reply(chat, model_name, body.return_token_ids, cached, logprobs=fmt, echo=echo)
        try:
            gen.submit()
        except QueueFull as e:
            raise HTTPError(503, f"server busy: {e}; retry later") from None
        except EngineStopped as e:
            raise HTTPError(503, str(e)) from None
        if body.stream:
            usage = body.stream_options is not None and body.stream_options.include_usage
            return StreamingResponse(_stream(gen, reply, usage), media_type="text/event-stream")
        try:
            done = await _until_disconnect(request, _drain(gen))
        except EngineError as e:
            return error(500, f"the engine failed on this request: {e}")
        finally:
            gen.close()
        if not done:
            return Response(status_code=499)  # nobody is listening
        return JSONResponse(reply.response(gen.choices))

    @app.post("/v1/completions")
    async def completions(request: Request, body: CompletionRequest) -> Any:
        given = body.max_tokens if "max_tokens" in body.model_fields_set else None
        limit = Limit(given, 16, "max_tokens", "prompt")
        p = params(body, given or 16)
        prompts = body.prompts()
        if not prompts:
            raise HTTPError(400, "prompt must not be empty", "prompt")
        reqs = [
            r
            for x in prompts
            for r in make(
                x if isinstance(x, str) else {"prompt_token_ids": x}, p, limit, body.cache_salt
            )
        ]
        return await run(request, body, reqs, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request, body: ChatCompletionRequest) -> Any:
        field = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
        limit = Limit(body.max_completion_tokens or body.max_tokens, None, field, "messages")
        p = params(body, limit.requested or llm.max_model_len)  # each field's own error first
        if chat_template is None and llm.tokenizer is not None:
            raise HTTPError(400, missing_template_message(NO_TEMPLATE_FIX), "messages")
        try:
            messages = [m.for_template() for m in body.messages]
            text = chat_template.text if chat_template is not None else None
            ids = encode_chat(llm.tokenizer, messages, text)
        except ValueError as e:
            raise HTTPError(400, str(e), "messages") from None
        stops = chat_template.stop if chat_template is not None else ()
        reqs = make({"prompt_token_ids": ids}, p, limit, body.cache_salt)
        return await run(request, body, reqs, chat=True, stops=stops)

    @app.get("/v1/models")
    async def models() -> Any:
        card = {
            "id": model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "hybridkv",
            "root": model_name,
            "max_model_len": llm.max_model_len,
        }
        return {"object": "list", "data": [card]}

    # SGLang's worker-info endpoints: a gateway (sglang-router) reads the
    # model's name from them when it registers this server as a worker.
    model_info = {
        "model_path": str(llm.model_dir),
        "served_model_name": model_name,
        "tokenizer_path": str(llm.model_dir),
        "is_generation": True,
        "preferred_sampling_params": None,
    }

    @app.get("/get_model_info")
    @app.get("/model_info")
    async def get_model_info() -> Any:
        return model_info

    @app.get("/get_server_info")
    @app.get("/server_info")
    async def get_server_info() -> Any:
        return {
            **model_info,
            "context_length": llm.max_model_len,
            "page_size": llm.kv_cache_config.kv_cache_groups[0].kv_cache_spec.block_size,
            "max_running_requests": llm.scheduler.max_num_seqs,
            "engine": "hybridkv",
        }

    @app.get("/health")
    async def health() -> Any:
        if not engine.alive:
            return error(503, "the engine thread has stopped")
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Any:
        await asyncio.wrap_future(engine.call(engine.metrics.refresh))
        return Response(engine.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return app


async def _drain(gen: Generation) -> None:
    async for _ in gen.events():
        pass


async def _until_disconnect(request: Any, work: Awaitable[None]) -> bool:
    """Run ``work``; False (and ``work`` cancelled) if the client disconnects first."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request.receive))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not task.done():
        task.cancel()
        return False
    task.result()  # raises what ``work`` raised
    return True


async def _disconnected(receive: Callable[[], Awaitable[dict[str, Any]]]) -> None:
    """Returns once the client has gone (the body was read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _stream(gen: Generation, reply: Reply, usage: bool) -> AsyncIterator[str]:
    """SSE frames; a client that goes away cancels this generator (``close``)."""
    try:
        try:
            async for ev in gen.events():
                first = ev.first  # the choice's first chunk carries the role / prompt ids
                if first and reply.chat:
                    yield sse(reply.chunk(ev.choice, "", [], first=True))
                    first = False
                if ev.text or ev.token_ids:
                    chunk = reply.chunk(
                        ev.choice, ev.text, ev.token_ids, first=first, logprobs=ev.logprobs
                    )
                    yield sse(chunk)
                    first = False
                if ev.finish is not None:
                    yield sse(reply.chunk(ev.choice, "", [], first=first, finish=ev.finish))
        except EngineError as e:
            yield sse(error_body(500, f"the engine failed on this request: {e}"))
        else:
            if usage:
                yield sse(reply.usage_chunk(gen.choices))
        yield sse("[DONE]")
    finally:
        gen.close()
