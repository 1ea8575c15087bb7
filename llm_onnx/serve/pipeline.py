"""The pipeline every generation API's route runs: read the body, (the API parses it into a
Plan and the service compiles its constraint,) submit the Plan's jobs to the scheduler, then
either wait for every Result or iterate the items as the scheduler's thread hands them over.
The wire format (OpenAI's chunks, Anthropic's events, the Responses API's events) is the API's
own render step; this module knows only jobs, TokenEvents, Results and failures.

    run = submit(service, plan, stream=True)        # or stream=False: no per-token items
    async for i, item in run.items(request):        # i: the choice index
        ...                                         # TokenEvent, then the Result (or an error)
    results = await run.results(request)            # every choice's Result (None: client gone)

A client that disconnects cancels its jobs (their rows are freed at the scheduler's next step).
"""

from __future__ import annotations

import asyncio
import json
import threading
import weakref
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request

from llm_onnx.errors import GenerationError
from llm_onnx.runtime.generation.results import Result, TokenEvent
from llm_onnx.runtime.generation.scheduler import QueueFull, SchedulerClosed
from llm_onnx.runtime.generation.scheduler import Request as Job
from llm_onnx.serve.errors import ApiError, bad
from llm_onnx.serve.plan import COMPLETION, Plan

DISCONNECT_POLL_S = 0.1
MAX_BODY_BYTES = 8 << 20


class _Mailbox:
    """Hands items from the scheduler's thread to an event loop: one wake-up of the loop for all
    the items of a step (a token for each running request), not one per token."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._items: list[tuple[asyncio.Queue, Any]] = []
        self._scheduled = False

    def post(self, queue: asyncio.Queue, item: Any) -> None:  # any thread
        with self._lock:
            self._items.append((queue, item))
            if self._scheduled:
                return
            self._scheduled = True
        self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:  # the loop's thread
        with self._lock:
            items, self._items, self._scheduled = self._items, [], False
        for queue, item in items:
            queue.put_nowait(item)


_MAILBOXES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Mailbox] = \
    weakref.WeakKeyDictionary()


class Run:
    """A plan's jobs on the scheduler and the queue their items arrive on."""

    def __init__(self, jobs: list[Job], queue: asyncio.Queue[tuple[Job, Any]]) -> None:
        self.jobs = jobs
        self.queue = queue
        self.index = {job.id: i for i, job in enumerate(jobs)}

    def cancel(self) -> None:
        for job in self.jobs:
            job.cancel()  # no-op for finished jobs; frees the rows of a departed client's

    async def results(self, request: Request) -> list[Result] | None:
        """Every job's Result in order, or None if the client disconnected first; a failed
        generation is a 500."""
        results: list[Result | None] = [None] * len(self.jobs)
        watcher = asyncio.ensure_future(disconnected(request))
        try:
            for _ in self.jobs:
                getter = asyncio.ensure_future(self.queue.get())
                done, _pending = await asyncio.wait({getter, watcher},
                                                    return_when=asyncio.FIRST_COMPLETED)
                if getter not in done:
                    getter.cancel()
                    return None
                job, item = getter.result()
                if isinstance(item, BaseException):
                    raise ApiError(500, f"generation failed: {item}", type="server_error")
                results[self.index[job.id]] = item
            return results  # type: ignore[return-value]
        finally:
            watcher.cancel()
            self.cancel()

    async def items(self) -> AsyncIterator[tuple[int, TokenEvent | Result | BaseException]]:
        """(choice index, item) until every job has ended: its TokenEvents, then its Result (or
        the exception it failed with). Cancels the jobs when the caller stops early."""
        finished = 0
        try:
            while finished < len(self.jobs):
                job, item = await self.queue.get()
                if not isinstance(item, TokenEvent):
                    finished += 1
                yield self.index[job.id], item
        finally:
            self.cancel()


def submit(service: Any, plan: Plan, stream: bool) -> Run:
    """Queue ``plan``'s jobs (``stream``: every TokenEvent is delivered, else only the ends);
    the scheduler's refusals as HTTP errors: 429 (queue full), 503 (shutting down), 400."""
    loop = asyncio.get_running_loop()
    mailbox = _MAILBOXES.get(loop) or _MAILBOXES.setdefault(loop, _Mailbox(loop))
    queue: asyncio.Queue[tuple[Job, Any]] = asyncio.Queue()

    def listener(job: Job, item: Any) -> None:  # on the scheduler's thread
        if stream or not isinstance(item, TokenEvent):
            try:
                mailbox.post(queue, (job, item))
            except RuntimeError:  # the event loop has closed: nobody is listening any more
                job.cancel()

    try:
        jobs = service.scheduler.submit_many(plan.jobs(), logprobs=plan.logprobs,
                                             listener=listener, reuse_points=plan.reuse_points,
                                             prompt_logprobs=plan.prompt_logprobs,
                                             images=plan.images)
    except QueueFull as e:
        raise ApiError(429, str(e), type="rate_limit_error", code="rate_limit_exceeded") from None
    except SchedulerClosed as e:
        raise ApiError(503, str(e), type="server_error", code="service_unavailable") from None
    except GenerationError as e:
        raise bad("prompt" if plan.kind == COMPLETION else "messages", str(e)) from None
    return Run(jobs, queue)


# Paths counted by name in /metrics' requests counter (the app adds each API's PATHS;
# ENDPOINT_PREFIXES: paths with an id, counted under one label)
ENDPOINTS = {"/health", "/metrics", "/v1/models"}
ENDPOINT_PREFIXES = {"/v1/models/": "/v1/models/{name}"}


def count(service: Any, request: Request, status: int | str) -> None:
    """One request answered with ``status``, in /metrics, by endpoint."""
    path = request.url.path
    endpoint = path if path in ENDPOINTS else next(
        (label for prefix, label in ENDPOINT_PREFIXES.items() if path.startswith(prefix)),
        "other")
    service.metrics.requests.labels(endpoint, str(status)).inc()


async def disconnected(request: Request) -> None:
    while not await request.is_disconnected():
        await asyncio.sleep(DISCONNECT_POLL_S)


async def read_body(request: Request) -> Any:
    """A request's JSON body (413 past MAX_BODY_BYTES, 400 if it is not JSON)."""
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > MAX_BODY_BYTES:
        raise ApiError(413, f"the request body has {size} bytes; the limit is "
                              f"{MAX_BODY_BYTES}.")
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise ApiError(413, f"the request body is over {MAX_BODY_BYTES} bytes.")
    raw = _decoded(raw, request.headers.get("content-encoding", "identity").strip().lower())
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise bad(None, f"We could not parse the JSON body of your request ({e}). Send a JSON "
                          "object with Content-Type: application/json.") from None


def _decoded(raw: bytes, encoding: str) -> bytes:
    """A body sent compressed (Claude Code gzips its bodies when told to): gzip and deflate,
    at most MAX_BODY_BYTES once inflated; another encoding is a 415."""
    if encoding in ("", "identity"):
        return raw
    if encoding not in ("gzip", "deflate"):
        raise ApiError(415, f"Content-Encoding {encoding!r} is not supported: send the body "
                            "as it is, or gzip it.", type="invalid_request_error")
    import zlib

    inflater = zlib.decompressobj(wbits=47)  # gzip or zlib, told apart by the header
    try:
        out = inflater.decompress(raw, MAX_BODY_BYTES + 1)
    except zlib.error as e:
        raise bad(None, f"the request body is not valid {encoding} data ({e}).") from None
    if len(out) > MAX_BODY_BYTES or inflater.unconsumed_tail:
        raise ApiError(413, f"the request body is over {MAX_BODY_BYTES} bytes once inflated.")
    return out
