"""OpenAI's embeddings API: POST /v1/embeddings, over an embedding model's folder
(``llm-onnx export --task embed``).

    {"model": "q3e", "input": "a text" | ["texts", ...] | [token ids] | [[token ids], ...],
     "dimensions": 256, "encoding_format": "float" | "base64", "user": "..."}
    -> {"object": "list", "data": [{"object": "embedding", "index": i, "embedding": [...]}],
        "model": "q3e", "usage": {"prompt_tokens": n, "total_tokens": n}}

"base64" is each vector's little-endian float32 bytes (how OpenAI's client asks by default and
decodes). Inputs are tokenized with the tokenizer's special tokens and never truncated: one past
the context is a 400 naming it. A request's inputs run together in length-sorted batches
(runtime/core/embedder.py), one request at a time on a worker thread of their own; at most
``max_queue`` wait, beyond that the answer is 429.

A server over a generation folder answers this endpoint with a 400 saying how to export an
embedding model, and one over an embedding folder answers the generation endpoints with a 400
the other way round (``EmbeddingRunner.refuse_generation``).
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import numbers
import threading
from typing import Any

import numpy as np
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse

from llm_onnx.errors import GenerationError
from llm_onnx.serve import pipeline
from llm_onnx.serve.errors import ApiError, bad
from llm_onnx.serve.fields import body_object, integer, served_model, whole

PATHS = ("/v1/embeddings",)
API = "embeddings"  # in the field policy's reports (policy.py)
FIELDS = {"input", "model", "dimensions", "encoding_format"}
IGNORED_FIELDS = {"user"}
MAX_INPUTS = 2048  # OpenAI's limit on a request's inputs


class EmbeddingRunner:
    """Where a server's embedding requests run: one worker thread (each request's inputs are
    already batched; two at once would only share the cores), and a bound on those waiting."""

    def __init__(self, model: Any, max_queue: int | None) -> None:
        self.model = model
        self.max_queue = max_queue
        self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="llm-onnx-embed")
        self._lock = threading.Lock()
        self.pending = 0

    async def run(self, inputs: list[str] | list[list[int]],
                  dimensions: int | None) -> tuple[np.ndarray, int]:
        """The embeddings of ``inputs`` and how many tokens they were, tokenized and run on
        the worker thread; an input the model refuses (past the context, outside the
        vocabulary) is a 400 naming it."""
        with self._lock:
            if self.max_queue is not None and self.pending > self.max_queue:  # one runs
                raise ApiError(429, f"{self.pending - 1} embedding requests are waiting (the "
                                      f"limit is {self.max_queue}); retry shortly.",
                                 type="rate_limit_error", code="rate_limit_exceeded")
            self.pending += 1
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self.pool, self._embed, inputs, dimensions)
        except GenerationError as e:
            raise bad("input", str(e)) from None
        finally:
            with self._lock:
                self.pending -= 1

    def _embed(self, inputs: list[str] | list[list[int]],
               dimensions: int | None) -> tuple[np.ndarray, int]:
        rows, _ = self.model.embedding_ids(inputs)
        return self.model.engine.embed(rows, dimensions), sum(len(r) for r in rows)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    @staticmethod
    def refuse_generation(name: str) -> ApiError:
        return bad("model", f"`{name}` is an embedding model (exported with --task embed): "
                              "this server answers POST /v1/embeddings. Serve a folder exported "
                              "with --task generate (the default) for completions, chat and "
                              "responses.")


def not_embedding(name: str) -> ApiError:
    return bad("model", f"`{name}` is a generation model: it does not compute embeddings. "
                          "Export an embedding model with `llm-onnx export --task embed "
                          "--checkpoint ...` and serve that folder for POST /v1/embeddings.")


def read_inputs(body: dict) -> list[str] | list[list[int]]:
    """``input`` as a list of strings or a list of token-id lists; 400s name the field."""
    value = body.get("input")
    if value is None:
        raise bad("input", "you must provide 'input': a string, a list of strings, a list of "
                             "token ids or a list of lists of token ids.")
    if isinstance(value, str):
        value = [value]
    elif isinstance(value, list) and value and all(_token(v) for v in value):
        value = [value]
    if not isinstance(value, list) or not value:
        raise bad("input", "'input' must be a non-empty string or a non-empty list (of "
                             "strings, token ids or lists of token ids).")
    if len(value) > MAX_INPUTS:
        raise bad("input", f"'input' has {len(value)} items; the most a request takes is "
                             f"{MAX_INPUTS}.")
    strings = isinstance(value[0], str)
    for i, v in enumerate(value):
        if strings and not isinstance(v, str):
            raise bad("input", f"'input[{i}]' must be a string like 'input[0]', got "
                                 f"{_short(v)}.")
        if strings and not v:
            raise bad("input", f"'input[{i}]' is an empty string; give text to embed.")
        if not strings and not (isinstance(v, list) and v and all(_token(t) for t in v)):
            raise bad("input", f"'input[{i}]' must be a non-empty list of token ids "
                                 f"(integers), got {_short(v)}.")
    return value if strings else [[int(whole(t)) for t in v] for v in value]


def _token(value: Any) -> bool:
    value = whole(value)
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def encoding(body: dict) -> str:
    value = body.get("encoding_format")
    if value is None:
        return "float"
    if value not in ("float", "base64"):
        raise bad("encoding_format", f"'encoding_format' must be \"float\" or \"base64\", got "
                                       f"{_short(value)}.")
    return value


def dimensions(body: dict, model: Any) -> int | None:
    return integer(body, "dimensions", 1, model.engine.dimensions)


def encode(vector: np.ndarray, fmt: str) -> list[float] | str:
    if fmt == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()


def add_routes(app: FastAPI, service: Any, authorized: Any) -> None:
    """POST /v1/embeddings over ``service`` (its ``embedder``: None for a generation model)."""
    @app.post("/v1/embeddings", dependencies=[Depends(authorized)])
    async def embeddings(request: Request) -> JSONResponse:
        body = body_object(await pipeline.read_body(request))
        service.fields(request, API).check(body, FIELDS, IGNORED_FIELDS)
        name = served_model(body, service.names)
        embedder: EmbeddingRunner | None = getattr(service, "embedder", None)
        if embedder is None:
            raise not_embedding(name)
        if service.draining:
            raise ApiError(503, "the server is shutting down.", type="server_error",
                             code="service_unavailable")
        user = body.get("user")
        if user is not None and not isinstance(user, str):
            raise bad("user", f"'user' must be a string, got {_short(user)}.")
        inputs, fmt = read_inputs(body), encoding(body)
        vectors, tokens = await embedder.run(inputs, dimensions(body, service.model))
        service.metrics.prompt_tokens.inc(tokens)
        pipeline.count(service, request, 200)
        return JSONResponse({
            "object": "list", "model": name,
            "data": [{"object": "embedding", "index": i, "embedding": encode(v, fmt)}
                     for i, v in enumerate(vectors)],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})
