"""The OpenAI-compatible server on Ray Serve: replicas of one model, on one machine or a cluster.

    llm-onnx export --checkpoint default --precision int8 --out models/smollm2-int8
    llm-onnx serve --ray --model models/smollm2-int8 --replicas 2
    serve run llm_onnx.serve.ray_app:app model=$PWD/models/smollm2-int8 replicas=2   # Ray's CLI

Two deployments (needs the extra: ``pip install '.[ray]'`` in the checkout, plain
``ray[serve]``):

    Ray's HTTP proxy ──▶ Frontend (no model, no CPU reserved) ──handle──▶ ModelReplica x N
                         relays each request, retries one          each: Model + batching
                         that a dying replica had not started      Scheduler + the very app of
                         answering, else a 503; merges the         `llm-onnx serve`
                         replicas' /metrics and /health            (create_app), run in process

A ModelReplica runs every request through the same ASGI app as ``llm-onnx serve`` and streams
back its ASGI messages; the Frontend turns them into the HTTP response. So the routes, the error
bodies and the server-sent events are one definition, and a killed replica costs its requests
either nothing (a plain answer starts only when complete, so it is retried on another replica),
an OpenAI-shaped 503 (when no replica can take it), or, for a stream already under way, a last
``data: {"error": ...}`` event and ``data: [DONE]``. Ray replaces the dead replica.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ray import serve
from ray.exceptions import RayActorError, TaskCancelledError
from ray.serve.exceptions import BackPressureError, RayServeException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from llm_onnx.errors import LlmOnnxError
from llm_onnx.serve.errors import ApiError, api_key_error

log = logging.getLogger("llm_onnx.serve")

APP_NAME = "llm-onnx"
RETRIES = 3  # replicas tried for a request that no replica has started answering


class RayConfigError(LlmOnnxError):
    """A bad `serve run` argument or --ray option."""


@dataclass(frozen=True)
class ReplicaConfig:
    """What every replica loads and how it serves (the options of `llm-onnx serve`)."""

    model: str
    name: str | None = None  # --model-name: the primary name, then aliases, comma-separated
    api_key: str | None = None
    max_batch: int = 8
    max_queue: int = 64
    prefill_chunk: int = 256
    max_seq_len: int | None = None
    max_cache_bytes: int | None = None  # per replica (--max-cache-memory)
    threads: int = 1
    provider: str = "auto"
    chat_template: str | None = None  # a template's text (or a file the replicas can read)
    tool_call_format: str | None = None
    speculative: str | None = None  # None: the model's default
    draft_model: str | None = None  # a folder the replicas can read
    num_speculative_tokens: int | None = None
    web_ui: bool = True  # the chat page at /
    # the Responses API's stored responses, kept by each replica in its own memory
    stored_responses: int = 1000
    stored_bytes: int = 64 << 20
    strict_fields: bool = False  # --strict-fields (policy.py)


@dataclass(frozen=True)
class Scaling:
    """How many replicas: a fixed number, or autoscaling between ``min`` and ``max`` on the
    requests each replica has under way (``target`` per replica, default its max_batch)."""

    replicas: int = 1
    autoscale: tuple[int, int] | None = None
    target: int | None = None
    extra_actor_options: dict = field(default_factory=dict)


# ----------------------------------------------------------------------------- replicas

@serve.deployment(name="ModelReplica", health_check_period_s=5, graceful_shutdown_timeout_s=10)
class ModelReplica:
    """One model folder behind the batching scheduler and the `llm-onnx serve` app."""

    def __init__(self, config: dict) -> None:
        from llm_onnx.runtime import Model
        from llm_onnx.serve.app import create_app
        from llm_onnx.serve.service import Service

        cfg = ReplicaConfig(**config)
        model = Model.load(cfg.model, provider=cfg.provider, threads=cfg.threads,
                           chat_template=cfg.chat_template,
                           tool_call_format=cfg.tool_call_format, speculative=cfg.speculative,
                           draft_model=cfg.draft_model,
                           num_speculative_tokens=cfg.num_speculative_tokens)
        self.service = Service(model, name=cfg.name, api_key=cfg.api_key,
                               max_batch=cfg.max_batch, max_queue=cfg.max_queue,
                               prefill_chunk=cfg.prefill_chunk, max_length=cfg.max_seq_len,
                               served_by="Ray Serve", max_cache_bytes=cfg.max_cache_bytes,
                               stored_responses=cfg.stored_responses,
                               stored_bytes=cfg.stored_bytes, strict_fields=cfg.strict_fields)
        self.app = create_app(self.service, web_ui=cfg.web_ui)
        self.service.start()
        self.id = f"{socket.gethostname()}:{os.getpid()}"

    async def handle(self, request: dict[str, Any]):  # -> AsyncIterator[list[dict]]
        """Run one HTTP request through the app; yield its ASGI messages, a batch at a time
        (the response start, then body parts). Cancelling this generator (the client left)
        disconnects the request, which cancels its generation."""
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": request["method"], "scheme": "http", "path": request["path"],
                 "raw_path": request["path"].encode(), "root_path": "",
                 "query_string": request["query_string"].encode(),
                 "headers": [(k.encode("latin-1"), v.encode("latin-1"))
                             for k, v in request["headers"]],
                 "client": None, "server": None}
        body_sent = False
        gone = asyncio.Event()
        outbox: asyncio.Queue[dict | None] = asyncio.Queue()

        async def receive() -> dict:
            nonlocal body_sent
            if not body_sent:
                body_sent = True
                return {"type": "http.request", "body": request["body"], "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            await outbox.put(message)

        async def run() -> None:
            try:
                await self.app(scope, receive, send)
            finally:
                await outbox.put(None)

        task = asyncio.ensure_future(run())
        try:
            while True:
                batch = [await outbox.get()]
                while not outbox.empty():
                    batch.append(outbox.get_nowait())
                done = batch[-1] is None
                batch = [_plain(m) for m in batch if m is not None]
                if batch:
                    yield batch
                if done:
                    return
        finally:
            gone.set()  # the app sees the client leave and cancels the generation
            if not task.done():
                try:
                    await asyncio.wait_for(asyncio.shield(task), 5)
                except (asyncio.TimeoutError, asyncio.CancelledError):
                    task.cancel()

    def metrics(self) -> tuple[str, str]:
        return self.id, self.service.metrics.exposition().decode()

    def status(self) -> dict[str, Any]:
        s = self.service.scheduler
        return {"replica": self.id, "running": s.running, "queued": s.queued,
                "draining": self.service.draining}

    def check_health(self) -> None:
        """Ray's health check: a replica whose scheduler thread died is replaced."""
        thread = self.service.scheduler._thread
        if thread is None or not thread.is_alive():
            raise RuntimeError("the scheduler thread is not running")

    def __del__(self) -> None:
        service = getattr(self, "service", None)
        if service is not None:
            service.stop()


def _plain(message: dict) -> dict:
    """An ASGI message as plain, picklable data (header pairs as strings)."""
    if message["type"] == "http.response.start":
        return {"type": message["type"], "status": message["status"],
                "headers": [(k.decode("latin-1"), v.decode("latin-1"))
                            for k, v in message.get("headers", [])]}
    return {"type": message["type"], "body": bytes(message.get("body", b"")),
            "more_body": message.get("more_body", False)}


# ----------------------------------------------------------------------------- the frontend

_REPLICA_GONE = (RayActorError, RayServeException)


@serve.deployment(name="Frontend", ray_actor_options={"num_cpus": 0},
                  max_ongoing_requests=10_000)
class Frontend:
    """Relays HTTP requests to the replicas (see the module docstring)."""

    def __init__(self, replicas: Any, api_key: str | None = None) -> None:
        self.replicas = replicas
        self.streams = replicas.options(stream=True, method_name="handle")
        self.api_key = api_key or None

    async def __call__(self, request: Request) -> Response:
        if request.method == "GET" and request.url.path == "/metrics":
            return await self._metrics(request)
        if request.method == "GET" and request.url.path == "/health":
            return await self._health()
        message = {"method": request.method, "path": request.url.path,
                   "query_string": request.url.query, "headers": list(request.headers.items()),
                   "body": await request.body()}
        error: BaseException | None = None
        for _ in range(RETRIES):
            stream = self.streams.remote(message)
            try:
                first = await stream.__anext__()
            except BackPressureError:
                return _error(429, "every replica's queue is full; retry later.",
                              "rate_limit_error", "rate_limit_exceeded")
            except _REPLICA_GONE as e:  # nothing was answered yet: another replica takes it
                error = e
                continue
            except StopAsyncIteration:
                error = RuntimeError("the replica sent no response")
                continue
            start, rest = first[0], first[1:]
            headers = {k: v for k, v in start["headers"] if k.lower() != "content-length"}
            return StreamingResponse(_relay(stream, rest, _is_sse(headers)),
                                     status_code=start["status"], headers=headers)
        log.warning("no replica could answer %s: %s", request.url.path, error)
        return _error(503, f"no replica could answer the request ({type(error).__name__}); "
                           "retry later.", "server_error", "service_unavailable")

    async def _metrics(self, request: Request) -> Response:
        """Every replica's metrics in one exposition, each sample labelled with its replica."""
        from llm_onnx.serve.metrics import CONTENT_TYPE, merge_replicas

        denied = api_key_error(request.headers.get("authorization", ""), self.api_key)
        if denied is not None:
            return JSONResponse(denied.body(), status_code=denied.status)
        parts = await self.replicas.broadcast("metrics").results_async(timeout_s=10,
                                                                       return_exceptions=True)
        return Response(merge_replicas([x for x in parts if isinstance(x, tuple)]),
                        media_type=CONTENT_TYPE)

    async def _health(self) -> Response:
        answers = await self.replicas.broadcast("status").results_async(timeout_s=10,
                                                                        return_exceptions=True)
        statuses = [a for a in answers if isinstance(a, dict)]
        live = [s for s in statuses if not s["draining"]]
        return JSONResponse({"status": "ok" if live else "unavailable", "replicas": statuses},
                            status_code=200 if live else 503)


async def _relay(stream: Any, first: list[dict], sse: bool):
    """The body parts of a replica's response; if the replica dies mid-stream, an OpenAI-style
    error event and [DONE] end a server-sent event stream cleanly."""
    try:
        for message in first:
            yield message.get("body", b"")
        async for batch in stream:
            for message in batch:
                yield message.get("body", b"")
    except _REPLICA_GONE as e:
        log.warning("a replica died while answering: %s", e)
        if sse:
            body = ApiError(503, "the replica serving this stream stopped; the answer is "
                                 "incomplete.", type="server_error",
                            code="service_unavailable").body()
            yield f"data: {json.dumps(body)}\n\ndata: [DONE]\n\n".encode()
    except (asyncio.CancelledError, TaskCancelledError):
        stream.cancel()  # the client left: the replica cancels the generation
        raise


def _is_sse(headers: dict[str, str]) -> bool:
    return any(k.lower() == "content-type" and v.startswith("text/event-stream")
               for k, v in headers.items())


def _error(status: int, message: str, type_: str, code: str) -> JSONResponse:
    return JSONResponse(ApiError(status, message, type=type_, code=code).body(),
                        status_code=status)


# ----------------------------------------------------------------------------- building

def build(config: ReplicaConfig, scaling: Scaling = Scaling()) -> serve.Application:
    """The Ray Serve application: a Frontend over ``scaling`` replicas of ``config``."""
    actor: dict[str, Any] = {"num_cpus": config.threads, **scaling.extra_actor_options}
    if config.provider == "cuda":
        actor.setdefault("num_gpus", 1)
    options: dict[str, Any] = {"ray_actor_options": actor,
                               "max_ongoing_requests": config.max_batch + config.max_queue}
    if scaling.autoscale is not None:
        low, high = scaling.autoscale
        options["autoscaling_config"] = {
            "min_replicas": low, "max_replicas": high,
            "target_ongoing_requests": scaling.target or config.max_batch}
        options["max_queued_requests"] = config.max_queue * high
    else:
        options["num_replicas"] = scaling.replicas
        options["max_queued_requests"] = config.max_queue * scaling.replicas
    replicas = ModelReplica.options(**options).bind(asdict(config))
    return Frontend.bind(replicas, config.api_key)


def app(args: dict[str, str]) -> serve.Application:
    """Ray's application builder: ``serve run llm_onnx.serve.ray_app:app model=DIR
    [replicas=N | autoscale=MIN:MAX] [threads=T] [max_batch=B] [api_key=K] ...`` (or the same
    keys under ``args:`` in a Serve config file)."""
    args = dict(args)
    names = {f.name: f for f in fields(ReplicaConfig)}
    if "model" not in args:
        raise RayConfigError("llm_onnx.serve.ray_app:app needs model=DIR (a model folder from "
                             "`llm-onnx export`).")
    replicas, autoscale = args.pop("replicas", None), args.pop("autoscale", None)
    unknown = sorted(set(args) - set(names))
    if unknown:
        raise RayConfigError(f"unknown argument {unknown[0]!r} for llm_onnx.serve.ray_app:app; "
                             f"known: {', '.join(sorted(names))}, replicas, autoscale.")
    values: dict[str, Any] = {}
    for key, raw in args.items():
        values[key] = _convert(key, raw, names[key].type)
    if replicas is not None and autoscale is not None:
        raise RayConfigError("give replicas=N or autoscale=MIN:MAX, not both.")
    scaling = Scaling(replicas=_count("replicas", replicas or "1"),
                      autoscale=parse_autoscale(autoscale) if autoscale else None)
    return build(ReplicaConfig(**values), scaling)


def _convert(key: str, raw: Any, kind: Any) -> Any:
    if isinstance(raw, str) and str(kind) == "bool":
        if raw.lower() not in ("true", "false", "1", "0"):
            raise RayConfigError(f"{key}={raw!r}: expected true or false.")
        return raw.lower() in ("true", "1")
    if not isinstance(raw, str) or "int" not in str(kind):
        return raw
    return _count(key, raw)


def _count(key: str, raw: Any) -> int:
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise RayConfigError(f"{key}={raw!r}: expected a whole number.") from None
    if value < 1:
        raise RayConfigError(f"{key}={raw!r}: expected a number >= 1.")
    return value


def parse_autoscale(text: str) -> tuple[int, int]:
    """'MIN:MAX' -> (MIN, MAX), 0 <= MIN <= MAX, MAX >= 1."""
    low, sep, high = str(text).partition(":")
    try:
        pair = (int(low), int(high))
    except ValueError:
        pair = (-1, -1)
    if not sep or pair[0] < 0 or pair[1] < max(1, pair[0]):
        raise RayConfigError(f"autoscale {text!r}: expected MIN:MAX with 0 <= MIN <= MAX and "
                             "MAX >= 1, e.g. 1:4.")
    return pair


# ----------------------------------------------------------------------------- running

def run(config: ReplicaConfig, scaling: Scaling, *, host: str = "127.0.0.1", port: int = 8000,
        address: str | None = None, on_ready: Any = None) -> None:
    """`llm-onnx serve --ray`: start a local Ray instance (``address`` None) or join one
    (``"auto"``: the cluster this machine belongs to; ``"ray://head:10001"``: Ray Client), deploy,
    serve until SIGTERM / Ctrl-C, then remove the application (and stop the local instance)."""
    import signal
    import threading

    import ray

    stop = threading.Event()
    own = address is None
    previous: dict = {}
    try:
        try:
            ray.init(address=address, include_dashboard=False if own else None,
                     log_to_driver=False, configure_logging=False)
        except (ConnectionError, RuntimeError) as e:
            first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            raise RayConfigError(f"cannot {'start Ray' if own else f'join the Ray cluster at {address}'}"
                                 f": {first}") from None
        # after ray.init, which installs handlers of its own that end the process at once
        previous = {sig: signal.signal(sig, lambda *_: stop.set())
                    for sig in (signal.SIGINT, signal.SIGTERM)}
        serve.start(http_options={"host": host, "port": port})
        serve.run(build(config, scaling), name=APP_NAME, route_prefix="/")
        if on_ready is not None:
            on_ready()
        while not stop.wait(0.5):
            pass
    finally:
        try:
            if ray.is_initialized():
                if own:
                    serve.shutdown()
                else:
                    serve.delete(APP_NAME)
        finally:
            if ray.is_initialized():
                ray.shutdown()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
