"""The OpenAI-compatible HTTP app (FastAPI): the routes over one Service (a model, its batching
scheduler, metrics, the served name and API key).

    GET  /health                  200 {"status": "ok"}; 503 while shutting down (no key needed)
    GET  /v1/models               the one model served, OpenAI's list shape
    POST /v1/completions          prompt(s) -> text; stream: true for server-sent events
    POST /v1/chat/completions     messages -> the assistant's answer, with the model's template
    POST /v1/embeddings           texts -> vectors (an embedding model's folder: embeddings.py)
    GET  /metrics                 Prometheus text format
    GET  /                        the chat page (llm_onnx/serve/web; off with web_ui=False)
    POST /v1/messages             Anthropic's Messages API (messages.py; /count_tokens too)
    POST /tokenize, /detokenize   vLLM's and llama.cpp's token endpoints (tokens_api.py)

``create_app(service)`` is the one app definition: ``llm-onnx serve`` runs it under uvicorn, the
Ray Serve deployment mounts the same object.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from llm_onnx.runtime.chat.dialects.base import ReplyReader
from llm_onnx.runtime.model import Model
from llm_onnx.runtime.chat.dialects.base import ChatPiece
from llm_onnx.runtime.generation.scheduler import Scheduler
from llm_onnx.runtime.generation.sequence import Result, TokenEvent
from llm_onnx.runtime.chat.dialects.base import ToolCallDelta
from llm_onnx.serve import (embeddings, messages, openai_responses, protocol as p,
                            requests as rq, responses as rs, runner, structured, tokens_api, web)
from llm_onnx.serve.metrics import CONTENT_TYPE, Metrics
from llm_onnx.serve.response_input import ResponseStore

log = logging.getLogger("llm_onnx.serve")

COMPILE_TIMEOUT_S = 10.0  # a constraint that takes longer to compile is refused (400)


class Service:
    """What the routes serve: one model behind one batching scheduler (an embedding model:
    behind an EmbeddingRunner, ``embedder``, with no scheduler).

    Args:
        model: the loaded Model.
        name: the model id clients send (default: the model folder's name).
        api_key: when set, every endpoint but /health needs ``Authorization: Bearer <key>``.
        max_batch, max_queue, prefill_chunk, max_length, max_cache_bytes: the Scheduler's.
        stored_responses, stored_bytes: the Responses API's store (``store: true``): at most
            this many responses and bytes of them, the oldest dropped first.
        served_by: what serves it, for the model card ("llm-onnx serve", "Ray Serve").
    """

    def __init__(self, model: Model, *, name: str | None = None, api_key: str | None = None,
                 max_batch: int = 8, max_queue: int | None = 64, prefill_chunk: int = 256,
                 max_length: int | None = None, served_by: str = "llm-onnx serve",
                 max_cache_bytes: int | None = None, stored_responses: int = 1000,
                 stored_bytes: int = 64 << 20) -> None:
        self.model = model
        self.served_by = served_by
        manifest = getattr(model.engine, "manifest", None)
        self.name = name or (manifest.folder.name if manifest is not None else "model")
        self.api_key = api_key or None
        self.metrics = Metrics()
        self.scheduler: Scheduler | None = None
        self.embedder: embeddings.EmbeddingRunner | None = None
        if getattr(model, "task", "generate") == "embed":  # no cache, no chat template
            self.embedder = embeddings.EmbeddingRunner(model, max_queue)
        else:
            self.scheduler = Scheduler(model, max_batch=max_batch, max_length=max_length,
                                       prefill_chunk=prefill_chunk, max_queue=max_queue,
                                       observer=self.metrics, max_cache_bytes=max_cache_bytes)
            self.metrics.attach(self.scheduler)
        self.responses = ResponseStore(stored_responses, stored_bytes)
        self.tokens = rs.TokenText(model)
        self.created = int(time.time())
        self.draining = False
        self._closer: threading.Thread | None = None
        # Constraints compile here, off the event loop and off the scheduler's thread: one at a
        # time, each bounded by the engine's limits and by COMPILE_TIMEOUT_S.
        self.compiler = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="llm-onnx-compile")

    async def prepare(self, plan: p.Plan) -> None:
        """Compose and compile the plan's constraint (a 400 if it is invalid or too slow)."""
        if plan.constraint is None and (plan.chat is None or not plan.chat.calls_tools):
            return
        loop = asyncio.get_running_loop()
        # model.constraints converts the tokenizer on first use (about a second at a 150,000-
        # token vocabulary): in the compile thread, not on the event loop every stream runs on
        work = loop.run_in_executor(self.compiler,
                                    lambda: structured.prepare(plan, self.model.constraints))
        try:
            await asyncio.wait_for(asyncio.shield(work), COMPILE_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise p.bad(plan.constraint.where if plan.constraint is not None else "tools",
                        f"the constraint did not compile within {COMPILE_TIMEOUT_S:g} s; "
                        "simplify the schema or grammar.") from None
        kind = plan.constraint_kind
        if kind is not None:
            self.metrics.constrained.labels(kind).inc(len(plan.prompts) * plan.n)

    @property
    def max_length(self) -> int:
        """Positions a request may use (an embedding model: its context)."""
        return self.scheduler.max_length if self.scheduler is not None else \
            self.model.context_length

    def generating(self) -> Scheduler:
        """The scheduler of a generation model; a 400 saying so for an embedding model."""
        if self.scheduler is None:
            raise embeddings.EmbeddingRunner.refuse_generation(self.name)
        return self.scheduler

    def start(self) -> None:
        if self.scheduler is not None:
            self.scheduler.start()
            if self.model.tokenizer is not None:
                # the constraint engine's tokenizer, converted now in the compile thread: the
                # first schema request then waits only for its own grammar
                self.compiler.submit(_warm_constraints, self.model)

    def count(self, request: Request, status: int | str) -> None:
        """One answer to ``request`` in the metrics (by endpoint and status)."""
        _count(self, request, status)

    def begin_shutdown(self, grace_s: float) -> None:
        """Stop taking requests now; running and queued ones get ``grace_s`` seconds to finish,
        then end with finish_reason "abort". Returns at once (the wait runs on a thread)."""
        if self.draining:
            return
        self.draining = True
        if self.scheduler is None:
            return
        self._closer = threading.Thread(target=self.scheduler.close, args=(grace_s,),
                                        name="llm-onnx-drain", daemon=True)
        self._closer.start()

    def stop(self) -> None:
        self.begin_shutdown(0.0)
        if self._closer is not None:
            self._closer.join()
        self.compiler.shutdown(wait=False, cancel_futures=True)
        if self.embedder is not None:
            self.embedder.close()


def create_app(service: Service, *, cors_origins: Sequence[str] = (),
               web_ui: bool = True) -> FastAPI:
    """The FastAPI app over ``service`` (its scheduler starts and stops with the app), with the
    chat page at ``/`` unless ``web_ui`` is False."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service.start()
        yield
        await asyncio.get_running_loop().run_in_executor(None, service.stop)

    app = FastAPI(title="llm-onnx", summary="OpenAI-compatible API over an llm-onnx model folder",
                  lifespan=lifespan)
    app.state.service = service
    app.add_middleware(_ReplicaHeader)
    if cors_origins:
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["*"],
                           allow_headers=["*"])

    @app.exception_handler(p.ApiError)
    async def api_error(request: Request, e: p.ApiError) -> JSONResponse:
        _count(service, request, e.status)
        return JSONResponse(_error_body(request, e), status_code=e.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        _count(service, request, e.status_code)
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        message = f"{request.method} {request.url.path}: {e.detail}"
        return JSONResponse(_error_body(request, p.ApiError(e.status_code, message, type=kind)),
                            status_code=e.status_code, headers=getattr(e, "headers", None))

    @app.exception_handler(Exception)
    async def server_error(request: Request, e: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        _count(service, request, 500)
        error = p.ApiError(500, f"internal error: {type(e).__name__}: {e}", type="server_error")
        return JSONResponse(_error_body(request, error), status_code=500)

    async def authorized(request: Request) -> None:
        error = p.api_key_error(request.headers.get("authorization", ""), service.api_key,
                                request.headers.get("x-api-key", ""))
        if error is not None:
            raise error

    @app.get("/health")
    async def health() -> JSONResponse:
        if service.draining:
            return JSONResponse({"status": "shutting down"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics", dependencies=[Depends(authorized)])
    async def metrics() -> Response:
        return Response(service.metrics.exposition(), media_type=CONTENT_TYPE)

    def model_card() -> dict[str, Any]:
        # OpenAI's four fields, vLLM's max_model_len, and what the chat page shows: precision,
        # where the graphs run, what serves them, whether replies think or call tools.
        engine, manifest = service.model.engine, getattr(service.model.engine, "manifest", None)
        where = engine.where() if hasattr(engine, "where") else None
        return {"id": service.name, "object": "model", "created": service.created,
                "owned_by": "llm-onnx", "max_model_len": service.max_length,
                "task": service.model.task if hasattr(service.model, "task") else "generate",
                "precision": manifest.precision.precision if manifest is not None else None,
                "runs_on": where, "served_by": service.served_by,
                "reasoning": service.model.splits_reasoning or
                service.model.tool_format == "harmony",
                "tool_call_format": service.model.tool_format}

    @app.get("/v1/models", dependencies=[Depends(authorized)])
    async def models(request: Request) -> JSONResponse:
        _count(service, request, 200)
        return JSONResponse({"object": "list", "data": [model_card()]})

    @app.get("/v1/models/{name:path}", dependencies=[Depends(authorized)])
    async def model(name: str, request: Request) -> JSONResponse:
        if name != service.name:
            raise p.ApiError(404, f"The model `{name}` does not exist.", param="model",
                             code="model_not_found")
        _count(service, request, 200)
        return JSONResponse(model_card())

    @app.post("/v1/chat/completions", dependencies=[Depends(authorized)])
    async def chat_completions(request: Request) -> Response:
        plan = rq.chat_plan(await runner.read_body(request), service.model, service.name,
                            service.generating().max_length)
        await service.prepare(plan)
        return await _answer(service, request, plan)

    @app.post("/v1/completions", dependencies=[Depends(authorized)])
    async def completions(request: Request) -> Response:
        plan = rq.completion_plan(await runner.read_body(request), service.model, service.name,
                                  service.generating().max_length)
        await service.prepare(plan)
        return await _answer(service, request, plan)

    for api in APIS:  # the other APIs' routes, each module's own
        api.add_routes(app, service, authorized)
    if web_ui and service.scheduler is not None:  # (the chat page talks to a generation model)
        web.add_routes(app)
    return app


# Modules that add an API's routes: ``add_routes(app, service, authorized)``.
APIS: list[Any] = [openai_responses, embeddings, messages, tokens_api]


def _error_body(request: Request, e: p.ApiError) -> dict[str, Any]:
    """An error in the shape of the API the path belongs to: Anthropic's for the Messages API,
    OpenAI's everywhere else."""
    if request.url.path.startswith(ANTHROPIC_PATHS):
        return e.anthropic_body()
    return e.body()


ANTHROPIC_PATHS = ("/v1/messages",)


class _ReplicaHeader:
    """Every response says which process answered (``X-LLM-ONNX-Replica: host:pid``): behind a
    load balancer or Ray Serve's proxy, which replica served a request."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.value = f"{socket.gethostname()}:{os.getpid()}".encode()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def tagged(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []),
                                                  (b"x-llm-onnx-replica", self.value)]}
            await send(message)

        await self.app(scope, receive, tagged)


_count = runner.count
runner.ENDPOINTS.update(messages.PATHS, tokens_api.PATHS)


async def _answer(service: Service, request: Request, plan: p.Plan) -> Response:
    run = runner.submit(service, plan, plan.stream)
    if plan.stream:
        return StreamingResponse(_events(service, request, plan, run),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    results = await run.results(request)
    if results is None:  # the client went away; its jobs are cancelled
        _count(service, request, 499)
        return Response(status_code=499)
    _count(service, request, 200)
    body = rs.response(plan, results, service.tokens)
    _count_tool_calls(service, body)
    return JSONResponse(body)


def _count_tool_calls(service: Service, body: dict[str, Any]) -> None:
    calls = sum(len(c["message"].get("tool_calls") or []) for c in body["choices"]
                if "message" in c)
    if calls:
        service.metrics.tool_calls.inc(calls)


async def _events(service: Service, request: Request, plan: p.Plan,
                  run: runner.Run) -> AsyncIterator[str]:
    """Server-sent events: a chunk per token (or per first chunk of a choice), a last chunk per
    choice with its finish_reason, the usage chunk if asked for, then ``data: [DONE]``. A client
    that disconnects makes the surrounding response cancel this generator: its jobs are
    cancelled and their rows freed at the scheduler's next step."""
    finished = [False] * len(run.jobs)
    offsets = [0] * len(run.jobs)
    generated = 0
    status = "499"
    chat = plan.kind == p.CHAT
    # Each choice's text split into reasoning_content, content and tool-call deltas.
    replies = [plan.chat.stream() if chat and plan.chat is not None else None
               for _ in run.jobs]
    try:
        first = []
        for i in range(len(run.jobs)):
            if chat:
                first.append({"index": i, "delta": {"role": "assistant", "content": ""},
                              "logprobs": None, "finish_reason": None})
            elif plan.echo and plan.prompt_logprobs is None:  # else with its logprobs, below
                text = plan.prompt_texts[i // plan.n]
                offsets[i] = len(text)
                first.append({"index": i, "text": text, "logprobs": None, "finish_reason": None})
        if first:
            yield _sse(rs.chunk(plan, first))
        async for i, item in run.items():
            if isinstance(item, TokenEvent):
                if item.prompt_logprobs is not None and plan.echo:
                    yield _sse(rs.chunk(plan, [_echo(plan, service, i, item, offsets)]))
                generated += item.token_id >= 0
                last = item.finish_reason is not None
                pieces = replies[i].push(item.text, last) if replies[i] is not None else \
                    ([ChatPiece(item.text)] if item.text else [])
                if not pieces and plan.logprobs is None and not last:
                    continue
                choice = _choice(plan, service, i, item, pieces, offsets, replies[i])
                yield _sse(rs.chunk(plan, [choice]))
                if last and replies[i] is not None and replies[i].tool_calls:
                    service.metrics.tool_calls.inc(replies[i].tool_calls)
            elif isinstance(item, Result):
                if item.finish_reason == "cancelled" and not finished[i]:
                    pieces = replies[i].push("", True) if replies[i] is not None else []
                    end = {"index": i, "delta": _delta(pieces)} if chat else \
                        {"index": i, "text": ""}
                    end.update(logprobs=None, finish_reason=rs.finish_reason(item.finish_reason))
                    yield _sse(rs.chunk(plan, [end]))
                finished[i] = True
            else:  # the model failed: tell the client in OpenAI's streamed-error shape
                yield _sse(p.ApiError(500, f"generation failed: {item}", type="server_error")
                           .body())
                finished[i] = True
        if plan.include_usage:
            yield _sse(rs.chunk(plan, [], rs.usage(sum(len(x) for x in plan.prompts), generated)))
        yield "data: [DONE]\n\n"
        status = "200"
    finally:
        run.cancel()
        _count(service, request, status)


def _delta(pieces: list[ChatPiece | ToolCallDelta]) -> dict[str, Any]:
    """A chat chunk's delta: thinking as ``reasoning_content`` (vLLM's and DeepSeek's field),
    the answer as ``content``, tool calls as ``tool_calls`` (OpenAI's streamed shape)."""
    delta: dict[str, Any] = {}
    for piece in pieces:
        if isinstance(piece, ToolCallDelta):
            delta.setdefault("tool_calls", []).append(rs.tool_call_delta(piece))
            continue
        key = "reasoning_content" if piece.reasoning else "content"
        delta[key] = delta.get(key, "") + piece
    return delta


def _choice(plan: p.Plan, service: Service, i: int, event: TokenEvent,
            pieces: list[ChatPiece | ToolCallDelta], offsets: list[int],
            reply: ReplyReader | None) -> dict[str, Any]:
    reason = None if event.finish_reason is None else \
        rs.finish_reason(event.finish_reason, reply is not None and reply.tool_calls > 0)
    logprobs = None
    if plan.kind == p.CHAT:
        if plan.logprobs is not None and event.logprob is not None:
            logprobs = rs.chat_logprobs([event.logprob], service.tokens)
        return {"index": i, "delta": _delta(pieces), "logprobs": logprobs, "finish_reason": reason}
    if plan.logprobs is not None and event.logprob is not None:
        logprobs = rs.completion_logprobs([event.logprob], service.tokens, offsets[i])
    offsets[i] += len(event.text)
    return {"index": i, "text": event.text, "logprobs": logprobs, "finish_reason": reason}


def _echo(plan: p.Plan, service: Service, i: int, event: TokenEvent,
          offsets: list[int]) -> dict[str, Any]:
    """A streamed completion's echoed prompt with its logprobs (sent once they are known)."""
    assert event.prompt_logprobs is not None
    logprobs = rs.echo_logprobs(plan.prompts[i // plan.n], event.prompt_logprobs, [],
                                service.tokens)
    offsets[i] = sum(len(t) for t in logprobs["tokens"])
    return {"index": i, "text": plan.prompt_texts[i // plan.n], "logprobs": logprobs,
            "finish_reason": None}


def _sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def _warm_constraints(model) -> None:
    try:
        model.constraints.tokenizer
    except Exception:  # noqa: BLE001 - the first constrained request reports it properly
        pass
