"""The HTTP app (FastAPI): the routes of every API over one Service (a model, its batching
scheduler, metrics, the served name and API key). Each API is a module with a parse step (the
request read into a Plan) and a render step (the answer in the API's shape) over the shared
pipeline; this module only wires them:

    GET  /health                  200 {"status": "ok"}; 503 while shutting down (no key needed)
    HEAD /                        200, no body, no key needed (Claude Code's first request)
    GET  /v1/models               the one model served, OpenAI's list shape
    GET  /metrics                 Prometheus text format
    POST /v1/chat/completions     openai_chat.py
    POST /v1/completions          openai_completions.py
    POST /v1/responses (+ GET, DELETE /v1/responses/{id})    openai_responses.py
    POST /v1/embeddings           embeddings.py (an embedding model's folder)
    POST /v1/messages (+ /count_tokens)                      anthropic_messages.py
    POST /tokenize, /detokenize   tokens.py (vLLM's and llama.cpp's token endpoints)
    GET  /                        the chat page (web/; off with web_ui=False)

An API module gives ``add_routes(app, service, authorized)`` and ``PATHS`` (counted by name in
the metrics; ``PATH_PREFIXES``: paths with an id, counted under one label), and, if its errors
are not OpenAI's shape, ``error_body(error)``; the fields its requests may carry are declared at
its top (``FIELDS``, ``IGNORED_FIELDS``, ``TOLERATED_FIELDS``, ``UNSUPPORTED_FIELDS``: the field
policy, policy.py). Adding an API is one such module and one line in ``APIS``.

``create_app(service)`` is the one app definition: ``llm-onnx serve`` runs it under uvicorn, the
Ray Serve deployment mounts the same object.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from llm_onnx.serve import (
    anthropic_messages,
    embeddings,
    openai_chat,
    openai_completions,
    openai_responses,
    pipeline,
    tokens,
    web,
)
from llm_onnx.serve.errors import ApiError, api_key_error
from llm_onnx.serve.fields import model_not_found
from llm_onnx.serve.metrics import CONTENT_TYPE
from llm_onnx.serve.policy import ReportIgnored
from llm_onnx.serve.service import Service

log = logging.getLogger("llm_onnx.serve")

# The APIs served, each a module (see the module docstring), in the order their routes are added.
APIS: list[Any] = [openai_chat, openai_completions, openai_responses, embeddings,
                   anthropic_messages, tokens]


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
    app.add_middleware(ReportIgnored, reporter=lambda: service.reporter)
    if cors_origins:
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["*"],
                           allow_headers=["*"])

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError) -> JSONResponse:
        pipeline.count(service, request, e.status)
        return JSONResponse(_error_body(request, e), status_code=e.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        pipeline.count(service, request, e.status_code)
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        message = f"{request.method} {request.url.path}: {e.detail}"
        return JSONResponse(_error_body(request, ApiError(e.status_code, message, type=kind)),
                            status_code=e.status_code, headers=getattr(e, "headers", None))

    @app.exception_handler(Exception)
    async def server_error(request: Request, e: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        pipeline.count(service, request, 500)
        error = ApiError(500, f"internal error: {type(e).__name__}: {e}", type="server_error")
        return JSONResponse(_error_body(request, error), status_code=500)

    async def authorized(request: Request) -> None:
        error = api_key_error(request.headers.get("authorization", ""), service.api_key,
                              request.headers.get("x-api-key", ""))
        if error is not None:
            raise error

    @app.get("/health")
    async def health() -> JSONResponse:
        if service.draining:
            return JSONResponse({"status": "shutting down"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.head("/", include_in_schema=False)
    async def head() -> Response:  # a client's check that the server is there
        return Response(status_code=503 if service.draining else 200)

    @app.get("/metrics", dependencies=[Depends(authorized)])
    async def metrics() -> Response:
        return Response(service.metrics.exposition(), media_type=CONTENT_TYPE)

    def model_card() -> dict[str, Any]:
        # OpenAI's four fields, vLLM's max_model_len, and what the chat page shows: precision,
        # where the graphs run, what serves them, whether replies think or call tools, whether
        # it takes images.
        engine, manifest = service.model.engine, getattr(service.model.engine, "manifest", None)
        where = engine.where() if hasattr(engine, "where") else None
        return {"id": service.name, "aliases": list(service.names.aliases),
                "object": "model", "created": service.created,
                "owned_by": "llm-onnx", "max_model_len": service.max_length,
                "task": service.model.task if hasattr(service.model, "task") else "generate",
                "precision": manifest.precision.precision if manifest is not None else None,
                "runs_on": where, "served_by": service.served_by,
                "reasoning": service.model.splits_reasoning,
                "tool_call_format": service.model.tool_format,
                "modalities": list(manifest.modalities) if manifest is not None else ["text"]}

    @app.get("/v1/models", dependencies=[Depends(authorized)])
    async def models(request: Request) -> JSONResponse:
        pipeline.count(service, request, 200)
        return JSONResponse({"object": "list", "data": [model_card()]})

    @app.get("/v1/models/{name:path}", dependencies=[Depends(authorized)])
    async def model(name: str, request: Request) -> JSONResponse:
        if not service.names.accepts(name):
            raise model_not_found(name, service.names)
        pipeline.count(service, request, 200)
        return JSONResponse(model_card())

    for api in APIS:
        pipeline.ENDPOINTS.update(api.PATHS)
        pipeline.ENDPOINT_PREFIXES.update(getattr(api, "PATH_PREFIXES", {}))
        api.add_routes(app, service, authorized)
    if web_ui and service.scheduler is not None:  # (the chat page talks to a generation model)
        web.add_routes(app)
    else:
        @app.get("/", include_in_schema=False)
        async def no_page() -> Response:  # a 404, as for any path (HEAD / answers, above)
            raise StarletteHTTPException(404, "Not Found")
    return app


def _error_body(request: Request, e: ApiError) -> dict[str, Any]:
    """An error in the shape of the API the path belongs to (Anthropic's for the Messages
    API's), OpenAI's everywhere else."""
    path = request.url.path
    for api in APIS:
        if hasattr(api, "error_body") and path.startswith(tuple(api.PATHS)):
            return api.error_body(e)
    return e.body()


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
