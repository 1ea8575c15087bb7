"""Continuous batching: concurrent requests decoding together in the rows of one Generator.

    scheduler = Scheduler(model, max_batch=8)
    with scheduler:                                   # starts the stepping thread
        request = scheduler.submit(model.encode("Once upon a time"), model.options())
        for event in request:                         # TokenEvents as they are picked
            print(event.text, end="", flush=True)

One thread owns the generator and loops over steps:

    1. drop cancelled requests (a queued one never starts; a running one frees its row now)
    2. admit queued requests, oldest first, into the lowest free rows (running rows stay together
       at the bottom of the cache, so a decode run has few or no idle rows in its range); a prompt
       that starts like one a free row's cache holds takes that prefix (copied), runs the rest
    3. prefill: prompt chunks of newcomers, oldest first, at most ``prefill_chunk`` tokens in all
       while other rows are decoding (a long prompt delays them by one chunk per step), a whole
       prompt when nobody waits; first tokens are delivered at once
    4. decode: one batched run of every decoding row; tokens delivered, finished rows released

Each request keeps its own options (sampling, seed, stop strings, limits) in its own
SequenceState, so its tokens are those it would get alone. Events reach the caller through a
listener (called on the scheduler's thread with the request and the item; it must not block) or
by iterating the request. No web framework and no torch here: the server (llm_onnx.serve) and
Ray deployments are clients of this class.
"""

from __future__ import annotations

import itertools
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import Protocol

from llm_onnx.errors import GenerationError, LlmOnnxError
from llm_onnx.runtime.generation.generator import Generator
from llm_onnx.runtime.generation.images import RowImages
from llm_onnx.runtime.generation.model_like import ModelLike
from llm_onnx.runtime.generation.options import GenerationOptions
from llm_onnx.runtime.generation.results import Result, TokenEvent


class QueueFull(LlmOnnxError):
    """The scheduler's queue holds ``max_queue`` requests already (HTTP 429)."""


class SchedulerClosed(LlmOnnxError):
    """The scheduler is shutting down and takes no new requests (HTTP 503)."""


class Observer(Protocol):
    """What the scheduler reports as it works (the server's Prometheus metrics implement it;
    gauges such as the queue depth read ``queued`` / ``running`` when scraped). Called on the
    scheduler's thread; implementations must be quick."""

    def request_started(self, request: Request) -> None: ...

    def token(self, request: Request, event: TokenEvent, now: float) -> None: ...

    def request_finished(self, request: Request, result: Result | None,
                         error: BaseException | None) -> None: ...


Item = TokenEvent | Result | BaseException  # what a request's listener receives
Listener = Callable[["Request", Item], None]


@dataclass(eq=False)
class Request:
    """A request in the scheduler. Iterate it for its TokenEvents (blocking), or call
    ``result()``; ``cancel()`` from any thread."""

    id: int
    prompt: list[int]
    options: GenerationOptions
    logprobs: int | None = None
    listener: Listener | None = None
    submitted_at: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    last_token_at: float | None = None
    row: int | None = None
    outcome: Result | BaseException | None = None
    reuse_points: tuple[int, ...] = ()  # where later prompts may part from this one
    prompt_logprobs: int | None = None  # score the prompt (see Generator.append_tokens)
    images: RowImages | None = None  # the prompt's images (``prompt`` is ``images.ids``)
    _cancelled: bool = False
    _done: threading.Event = field(default_factory=threading.Event)
    _items: queue.SimpleQueue | None = None

    def __post_init__(self) -> None:
        if self.listener is None:
            self._items = queue.SimpleQueue()

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @property
    def finished(self) -> bool:
        return self._done.is_set()

    def cancel(self) -> None:
        """Stop this request: it frees its row at the next step (finish_reason "cancelled")."""
        self._cancelled = True

    def result(self, timeout: float | None = None) -> Result:
        """Wait for the end; the Result, or the error the request failed with."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.id} did not finish within {timeout} s.")
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        assert self.outcome is not None
        return self.outcome

    def __iter__(self) -> Iterator[TokenEvent]:
        if self._items is None:
            raise GenerationError("this request delivers its events to its listener.")
        while True:
            item = self._items.get()
            if isinstance(item, TokenEvent):
                yield item
            elif isinstance(item, BaseException):
                raise item
            else:
                return

    def _emit(self, item: Item) -> None:
        if isinstance(item, (Result, BaseException)):
            self.outcome = item
        if self.listener is not None:
            self.listener(self, item)
        else:
            assert self._items is not None
            self._items.put(item)
        if isinstance(item, (Result, BaseException)):
            self._done.set()


class Scheduler:
    """Continuous batching of requests over one model (see the module docstring).

    Args:
        model: the loaded Model.
        max_batch: rows decoding together (the KV cache has this many rows).
        max_length: positions per row, prompt and answer (default: the model's context).
        prefill_chunk: most prompt tokens run in one step while other rows are decoding.
        max_queue: most requests waiting for a row; more raise QueueFull (None: no limit).
        observer: told of requests as they start and end, and of every token (metrics).
        max_cache_bytes: most bytes the running requests' rows may hold at their longest
            (prompt plus max_new_tokens positions of keys and values, and a recurrent state
            with its checkpoints; ``engine.row_bytes``): a request that would pass it waits
            for others to finish; one that alone needs more is refused (None: rows only).
    """

    def __init__(self, model: ModelLike, *, max_batch: int = 8, max_length: int | None = None,
                 prefill_chunk: int = 256, max_queue: int | None = None,
                 observer: Observer | None = None, max_cache_bytes: int | None = None) -> None:
        if max_queue is not None and max_queue < 0:
            raise GenerationError(f"max_queue must be >= 0, got {max_queue}.")
        if max_cache_bytes is not None and max_cache_bytes < 1:
            raise GenerationError(f"max_cache_bytes must be positive, got {max_cache_bytes}.")
        self.max_cache_bytes = max_cache_bytes
        self.model = model
        self.generator = Generator(model, batch=max_batch, max_length=max_length or
                                   model.context_length, prefill_chunk=prefill_chunk)
        self.max_batch = max_batch
        self.max_length = self.generator.max_length
        self.prefill_chunk = prefill_chunk
        self.max_queue = max_queue
        self.observer = observer
        self._ids = itertools.count(1)
        self._queue: deque[Request] = deque()
        self._running: dict[int, Request] = {}
        self.step_seconds = 0.0  # inside steps that ran something (model runs and host work)
        self._cond = threading.Condition()
        self._closed = False
        self._stopping = False
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ callers' side

    def submit(self, prompt: Seq[int], options: GenerationOptions, *, logprobs: int | None = None,
               listener: Listener | None = None, images: RowImages | None = None) -> Request:
        """Queue one request; see ``submit_many``."""
        return self.submit_many([(prompt, options)], logprobs=logprobs, listener=listener,
                                images=images)[0]

    def submit_many(self, items: Seq[tuple[Seq[int], GenerationOptions]], *,
                    logprobs: int | None = None, listener: Listener | None = None,
                    reuse_points: Seq[int] = (), prompt_logprobs: int | None = None,
                    images: RowImages | None = None) -> list[Request]:
        """Queue several requests at once, all or none (the choices of one API call).
        ``reuse_points``: lengths at which later prompts may part from these;
        ``prompt_logprobs``: score each prompt (see Generator.append_tokens); ``images``: the
        images of every prompt (each then ``images.ids``: Model.image_row); rows with images
        and rows without decode together.

        ``listener(request, item)`` receives each TokenEvent, then the Result (or the exception
        the request failed with), on the scheduler's thread. Without one, iterate the requests.

        Raises:
            GenerationError: a prompt that is empty, outside the vocabulary, or leaves no room.
            QueueFull: the queue cannot take them all. SchedulerClosed: shutting down.
        """
        vocab = self.model.engine.vocab_size
        requests = []
        for prompt, options in items:
            ids = [int(i) for i in prompt]
            if not ids:
                raise GenerationError("the prompt has no tokens.")
            bad = [i for i in ids if not 0 <= i < vocab]
            if bad:
                raise GenerationError(f"token id {bad[0]} is outside the vocabulary "
                                      f"(0..{vocab - 1}).")
            if len(ids) >= self.max_length:
                raise GenerationError(f"the prompt has {len(ids)} tokens but the context is "
                                      f"{self.max_length} tokens (prompt and answer together).")
            need = self._row_bytes(ids, options)
            if self.max_cache_bytes is not None and need > self.max_cache_bytes:
                raise GenerationError(
                    f"the request needs {need / 2**20:.1f} MiB of cache (its prompt and "
                    f"max_tokens), more than the server's {self.max_cache_bytes / 2**20:.1f} "
                    "MiB for all requests (--max-cache-memory); ask for fewer tokens.")
            requests.append(Request(0, ids, options.validated(), logprobs, listener,
                                    reuse_points=tuple(reuse_points),
                                    prompt_logprobs=prompt_logprobs, images=images))
        with self._cond:
            if self._closed:
                raise SchedulerClosed("the server is shutting down; no new requests are taken.")
            if self.max_queue is not None and len(self._queue) + len(requests) > self.max_queue:
                raise QueueFull(f"the queue is full ({len(self._queue)} of {self.max_queue} "
                                "requests waiting); retry later.")
            for r in requests:
                r.id = next(self._ids)
                self._queue.append(r)
            self._cond.notify_all()
        return requests

    def generate(self, prompt: Seq[int], options: GenerationOptions,
                 timeout: float | None = None, images: RowImages | None = None) -> Result:
        """Submit and wait (needs the stepping thread: ``start()`` or ``with scheduler``)."""
        return self.submit(prompt, options, images=images).result(timeout)

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def running(self) -> int:
        return len(self._running)

    # ------------------------------------------------------------------ the thread

    def start(self) -> Scheduler:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="llm-onnx-scheduler",
                                            daemon=True)
            self._thread.start()
        return self

    def close(self, timeout: float | None = 0.0) -> None:
        """Take no new requests; let queued and running ones go on for up to ``timeout`` seconds
        (None: until they finish), cancel what is left, stop the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._thread is not None and (self._queue or self._running):
            if deadline is not None and time.monotonic() >= deadline:
                break
            time.sleep(0.02)
        with self._cond:
            for r in list(self._queue) + list(self._running.values()):
                r.cancel()
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        else:  # never started: settle what is queued here
            self.step()

    def __enter__(self) -> Scheduler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close(timeout=None if exc[0] is None else 0.0)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self._queue or self._running or self._stopping):
                    self._cond.wait()
                if self._stopping and not (self._queue or self._running):
                    return
            if not self.step() and self._stopping:
                return

    # ------------------------------------------------------------------ one step

    def step(self) -> bool:
        """One iteration (see the module docstring); False when there was nothing to do.
        Called by the stepping thread, or directly (tests, a caller's own loop)."""
        began = time.perf_counter()
        self._settle_cancelled()
        self._admit()
        if not self._running:
            return False
        gen = self.generator
        try:
            budget = self.prefill_chunk if gen.decoding_rows else math.inf
            self._deliver(gen.prefill_step(budget))
            self._deliver(gen.decode_step())
        except Exception as e:  # a failed run leaves the cache unknown: fail every running request
            error = e if isinstance(e, LlmOnnxError) else \
                GenerationError(f"the model failed to run: {type(e).__name__}: {e}")
            for row, request in list(self._running.items()):
                gen.release(row)
                self._end(row, request, error)
            gen.clear()
        self.step_seconds += time.perf_counter() - began
        return True

    def _settle_cancelled(self) -> None:
        with self._cond:
            dropped = [r for r in self._queue if r.cancelled]
            for r in dropped:
                self._queue.remove(r)
        for r in dropped:
            r._emit(Result("", [], "cancelled", len(r.prompt)))
            if self.observer is not None:
                self.observer.request_finished(r, None, None)
        for row, request in list(self._running.items()):
            if request.cancelled:
                self._end(row, request, self._released(self.generator.cancel(row)))

    def _row_bytes(self, prompt: Seq[int], options: GenerationOptions) -> int:
        """The most a request's row holds (see max_cache_bytes)."""
        row_bytes = getattr(self.model.engine, "row_bytes", None)
        if row_bytes is None:  # an engine that does not say (the tests' fakes)
            return 0
        return int(row_bytes(min(len(prompt) + options.max_new_tokens, self.max_length)))

    @property
    def committed_bytes(self) -> int:
        """What the running requests' rows hold at most (see max_cache_bytes)."""
        return sum(self._row_bytes(r.prompt, r.options) for r in list(self._running.values()))

    def _admit(self) -> None:
        gen = self.generator
        while True:
            with self._cond:
                free = gen.free_rows
                if not free or not self._queue:
                    return
                if self.max_cache_bytes is not None and self._running and \
                        self.committed_bytes + self._row_bytes(self._queue[0].prompt,
                                                               self._queue[0].options) \
                        > self.max_cache_bytes:
                    return  # the oldest request waits until enough of the cache is free
                request = self._queue.popleft()
            row = free[0]  # the lowest: running rows stay together (see Generator.decode_step)
            try:
                gen.append_tokens(request.prompt, row=row, options=request.options,
                                  logprobs=request.logprobs, reuse_points=request.reuse_points,
                                  prompt_logprobs=request.prompt_logprobs,
                                  images=request.images)
            except GenerationError as e:
                request._emit(e)
                if self.observer is not None:
                    self.observer.request_finished(request, None, e)
                continue
            request.row = row
            self._running[row] = request
            if self.observer is not None:
                self.observer.request_started(request)

    def _deliver(self, events: list[TokenEvent]) -> None:
        now = time.perf_counter()
        for event in events:
            request = self._running[event.row]
            if self.observer is not None:  # sees the previous token's time (inter-token latency)
                self.observer.token(request, event, now)
            if request.first_token_at is None:
                request.first_token_at = now
            request.last_token_at = now
            request._emit(event)
            if event.finish_reason is not None:
                self._end(event.row, request, self._released(self.generator.release(event.row)))

    def _end(self, row: int, request: Request, outcome: Result | BaseException) -> None:
        self._running.pop(row, None)
        request._emit(outcome)
        if self.observer is not None:
            self.observer.request_finished(
                request, outcome if isinstance(outcome, Result) else None,
                outcome if isinstance(outcome, BaseException) else None)

    @staticmethod
    def _released(result: Result | None) -> Result:
        assert result is not None  # a running request's row always holds its sequence
        return result
