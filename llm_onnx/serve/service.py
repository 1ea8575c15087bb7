"""What a server serves: one model behind one batching scheduler (or, for an embedding model,
behind an EmbeddingRunner), its metrics, the Responses API's store, and the compile step every
constrained request passes through before it runs."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Sequence

from fastapi import Request

from llm_onnx.runtime.generation.scheduler import Scheduler
from llm_onnx.runtime.model import Model
from llm_onnx.serve import embeddings, pipeline, structured
from llm_onnx.serve.errors import bad
from llm_onnx.serve.logprobs import TokenText
from llm_onnx.serve.media import MediaPolicy
from llm_onnx.serve.metrics import Metrics
from llm_onnx.serve.names import ModelNames
from llm_onnx.serve.plan import Plan
from llm_onnx.serve.policy import Fields, Reporter, attach
from llm_onnx.serve.response_store import ResponseStore

COMPILE_TIMEOUT_S = 10.0  # a constraint that takes longer to compile is refused (400)


class Service:
    """What the routes serve: one model behind one batching scheduler (an embedding model:
    behind an EmbeddingRunner, ``embedder``, with no scheduler).

    Args:
        model: the loaded Model.
        name: the model id clients send (default: the model folder's name); a sequence or a
            comma-separated list: the first is the primary name, the others aliases. The
            folder's and the checkpoint's names are accepted too, in any case (names.py).
        api_key: when set, every endpoint but /health needs ``Authorization: Bearer <key>``.
        max_batch, max_queue, prefill_chunk, max_length, max_cache_bytes: the Scheduler's.
        stored_responses, stored_bytes: the Responses API's store (``store: true``): at most
            this many responses and bytes of them, the oldest dropped first.
        served_by: what serves it, for the model card ("llm-onnx serve", "Ray Serve").
        strict_fields: every field the server would accept and ignore but its API's hints
            and metadata is a 400 naming it (policy.py; ``--strict-fields``).
        media: where images may come from (``--allowed-media-domains``; serve/media.py).
    """

    def __init__(self, model: Model, *, name: str | Sequence[str] | None = None,
                 api_key: str | None = None,
                 max_batch: int = 8, max_queue: int | None = 64, prefill_chunk: int = 256,
                 max_length: int | None = None, served_by: str = "llm-onnx serve",
                 max_cache_bytes: int | None = None, stored_responses: int = 1000,
                 stored_bytes: int = 64 << 20, strict_fields: bool = False,
                 media: MediaPolicy | None = None) -> None:
        self.model = model
        self.media = media or MediaPolicy()  # where images may come from (serve/media.py)
        self.strict_fields = strict_fields
        self.served_by = served_by
        manifest = getattr(model.engine, "manifest", None)
        self.names = ModelNames.of(name, manifest.folder.name if manifest is not None else None,
                                   manifest.name if manifest is not None else None)
        self.name = self.names.primary
        self.api_key = api_key or None
        self.metrics = Metrics()
        self.reporter = Reporter(self.metrics.ignored_fields)
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
        self.tokens = TokenText(model)
        self.created = int(time.time())
        self.draining = False
        self._closer: threading.Thread | None = None
        # Constraints compile here, off the event loop and off the scheduler's thread: one at a
        # time, each bounded by the engine's limits and by COMPILE_TIMEOUT_S.
        self.compiler = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="llm-onnx-compile")

    async def prepare(self, plan: Plan) -> None:
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
            raise bad(plan.constraint.where if plan.constraint is not None else "tools",
                        f"the constraint did not compile within {COMPILE_TIMEOUT_S:g} s; "
                        "simplify the schema or grammar.") from None
        kind = plan.constraint_kind
        if kind is not None:
            self.metrics.constrained.labels(kind).inc(len(plan.prompts) * plan.n)

    def fields(self, request: Request, api: str) -> Fields:
        """The field policy for ``request`` to one of the APIs (its ignored fields are
        reported when its answer starts)."""
        return attach(request, Fields(api, self.strict_fields))

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
        pipeline.count(self, request, status)

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


def _warm_constraints(model: Model) -> None:
    try:
        model.constraints.tokenizer
    except Exception:  # noqa: BLE001 - the first constrained request reports it properly
        pass
