"""The HTTP routes of ``hybridkv serve`` (FastAPI), over one ``EngineLoop``.

Imports FastAPI at the top (it resolves the routes' annotations from this
module): import this module only once the ``serve`` extra is known present.

- ``POST /v1/completions`` and ``POST /v1/chat/completions``, streamed
  (Server-Sent Events, ending with ``data: [DONE]``) or not;
- ``GET /v1/models``, ``GET /health`` (503 once the engine thread is gone),
  ``GET /metrics`` (``ServerMetrics``);
- SGLang's ``GET /get_model_info`` and ``/get_server_info`` (also without
  ``get_``), which sglang-router reads when it registers a worker.

Errors are OpenAI's JSON: 400 for a bad body or parameter (including a
prompt longer than ``max_model_len``), 404 for another model's name, 503 with
``Retry-After`` when ``max_waiting`` requests wait, 500 when the engine step
that computed the request failed (a stream that has begun gets an error
chunk, then ``[DONE]``). A client that disconnects aborts its requests.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from hybridkv.engine.engine_request import EngineRequest
from hybridkv.engine.sampling_params import SamplingParams
from hybridkv.engine.tokenizer import encode_chat
from hybridkv.serving.engine_loop import EngineLoop, EngineStopped, QueueFull
from hybridkv.serving.fields import error_param, refusal, sampling_params
from hybridkv.serving.generation import EngineError, Generation
from hybridkv.serving.logprob_format import LogprobFormat
from hybridkv.serving.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from hybridkv.serving.responses import Reply, error_body, sse


class HTTPError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


def build_app(engine: EngineLoop, model_name: str, *, chat_template: str | None = None) -> Any:
    """The FastAPI app; starts the engine thread on startup, stops it on shutdown."""
    llm = engine.llm

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        if not engine.alive:
            engine.start()
        yield
        engine.stop()

    app = FastAPI(title="hybridkv", lifespan=lifespan)

    def error(status: int, message: str, param: str | None = None) -> Any:
        headers = {"Retry-After": "1"} if status == 503 else None
        return JSONResponse(error_body(status, message, param), status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def bad_body(_: Any, exc: RequestValidationError) -> Any:
        first = exc.errors()[0] if exc.errors() else {}
        loc = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return error(400, f"{loc or 'body'}: {first.get('msg', 'invalid request')}", loc or None)

    @app.exception_handler(HTTPError)
    async def http_error(_: Any, exc: HTTPError) -> Any:
        return error(exc.status, exc.message, exc.param)

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

    def make(prompt: Any, p: SamplingParams, salt: str | None) -> list[EngineRequest]:
        if salt is not None:
            prompt = {"prompt": prompt} if isinstance(prompt, str) else dict(prompt)
            prompt["cache_salt"] = salt
        try:
            return llm.make_requests(prompt, p)
        except ValueError as e:
            raise HTTPError(400, str(e), "prompt") from None

    async def run(
        request: Request, body: SamplingFields, reqs: list[EngineRequest], chat: bool
    ) -> Any:
        echo = isinstance(body, CompletionRequest) and body.echo
        gen = Generation(engine, reqs, body.stop_strings(), llm.tokenizer, n=body.n, echo=echo)
        k = body.num_logprobs()
        fmt = None if k is None else LogprobFormat(llm.tokenizer, k, chat)
        reply = Reply(chat, model_name, body.return_token_ids, logprobs=fmt, echo=echo)
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
        p = params(body, body.max_tokens or 16)
        prompts = body.prompts()
        if not prompts:
            raise HTTPError(400, "prompt must not be empty", "prompt")
        reqs = [
            r
            for x in prompts
            for r in make(x if isinstance(x, str) else {"prompt_token_ids": x}, p, body.cache_salt)
        ]
        return await run(request, body, reqs, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request, body: ChatCompletionRequest) -> Any:
        try:
            messages = [m.for_template() for m in body.messages]
            ids = encode_chat(llm.tokenizer, messages, chat_template)
        except ValueError as e:
            raise HTTPError(400, str(e), "messages") from None
        room = max(1, llm.max_model_len - len(ids))
        p = params(body, body.token_limit(room))
        reqs = make({"prompt_token_ids": ids}, p, body.cache_salt)
        return await run(request, body, reqs, chat=True)

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
