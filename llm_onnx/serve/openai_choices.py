"""What OpenAI's two choice APIs share (Chat Completions: ``openai_chat``; Completions:
``openai_completions``): the fields both take, finish reasons and usage in OpenAI's words, and
the answer itself, whole or as server-sent events:

    data: {"object": "chat.completion.chunk" | "text_completion", "choices": [...]}   per token
    data: {... "choices": [], "usage": {...}}        with stream_options.include_usage
    data: [DONE]

A ``Choices`` object is an API's render step: how one of its choices reads, whole and streamed.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from typing import Any, ClassVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from llm_onnx.runtime.chat.dialects.base import ChatPiece, ToolCallDelta
from llm_onnx.runtime.generation.results import Result, TokenEvent
from llm_onnx.serve import pipeline
from llm_onnx.serve.errors import ApiError
from llm_onnx.serve.logprobs import TokenText
from llm_onnx.serve.plan import Plan

# Fields both APIs honour (FIELDS) and accept as hints or metadata that change nothing here
# (IGNORED_FIELDS): the field policy (policy.py).
IGNORED_FIELDS = {"user", "metadata", "store", "service_tier", "modalities", "prediction",
                  "reasoning_effort", "safety_identifier", "prompt_cache_key"}
COMMON_FIELDS = {
    "model", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options", "stop",
    "seed", "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "response_format",
    # llm-onnx's own options, sent by the openai client as extra_body
    "top_k", "min_p", "repetition_penalty", "ignore_eos",
    # vLLM's structured outputs (and the guided_* fields of its older releases)
    "structured_outputs", "guided_json", "guided_regex", "guided_choice",
    "guided_grammar"}
MAX_N = 128

Piece = ChatPiece | ToolCallDelta


def finish_reason(reason: str, tool_calls: bool = False) -> str:
    """Our finish reasons in OpenAI's words: "tool_calls" when a reply with tool calls ended
    where its grammar allowed (the calls are whole; "length" if they were cut short); "abort"
    for a request the server ended while shutting down ("cancelled") or whose constraint's
    matcher failed ("error")."""
    if tool_calls and reason == "stop":
        return "tool_calls"
    return {"stop": "stop", "stop_string": "stop", "length": "length"}.get(reason, "abort")


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class Choices(ABC):
    """How an API's choices read: whole (``choice``) and streamed (the other methods, called by
    ``respond`` for each choice ``i`` in turn). One per answer: it keeps the streams' state."""

    chunk_object: ClassVar[str]  # a streamed chunk's "object"

    def __init__(self, plan: Plan, tokens: TokenText) -> None:
        self.plan = plan
        self.tokens = tokens

    def response(self, results: Sequence[Result]) -> dict[str, Any]:
        """The whole (non-streamed) answer: one choice per result, prompt-major."""
        plan = self.plan
        return {"id": plan.id, "object": plan.kind, "created": plan.created, "model": plan.model,
                "choices": [self.choice(index, r) for index, r in enumerate(results)],
                "usage": usage(sum(len(p) for p in plan.prompts),
                               sum(len(r.token_ids) for r in results))}

    def chunk(self, choices: list[dict[str, Any]], usage_: dict[str, int] | None = None,
              ) -> dict[str, Any]:
        """One server-sent event's object."""
        plan = self.plan
        out = {"id": plan.id, "object": self.chunk_object, "created": plan.created,
               "model": plan.model, "choices": choices}
        if plan.include_usage:
            out["usage"] = usage_
        return out

    @abstractmethod
    def choice(self, index: int, result: Result) -> dict[str, Any]:
        """A finished choice, whole."""

    def first(self, i: int) -> dict[str, Any] | None:
        """Choice ``i``'s part of the first chunk, sent before any token (None: nothing)."""
        return None

    def before(self, i: int, event: TokenEvent) -> dict[str, Any] | None:
        """A chunk's choice to send before ``event``'s own (None: none)."""
        return None

    @abstractmethod
    def pieces(self, i: int, event: TokenEvent) -> list[Piece]:
        """What ``event`` adds to choice ``i`` (its last event: the rest of it)."""

    @abstractmethod
    def delta(self, i: int, event: TokenEvent, pieces: list[Piece]) -> dict[str, Any]:
        """Choice ``i``'s chunk for ``event``."""

    @abstractmethod
    def cut_short(self, i: int) -> dict[str, Any]:
        """The last chunk's choice of one the server cut short (without its finish reason)."""

    def tool_calls(self, i: int) -> int:
        """The tool calls choice ``i`` made (counted in the metrics when it ends)."""
        return 0


async def respond(service: Any, request: Request, plan: Plan, choices: Choices) -> Response:
    """Run ``plan`` and answer with ``choices``: whole, or streamed if the request asks."""
    run = pipeline.submit(service, plan, plan.stream)
    if plan.stream:
        return StreamingResponse(_events(service, request, choices, run),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    results = await run.results(request)
    if results is None:  # the client went away; its jobs are cancelled
        pipeline.count(service, request, 499)
        return Response(status_code=499)
    pipeline.count(service, request, 200)
    body = choices.response(results)
    calls = sum(len(c["message"].get("tool_calls") or []) for c in body["choices"]
                if "message" in c)
    if calls:
        service.metrics.tool_calls.inc(calls)
    return JSONResponse(body)


async def _events(service: Any, request: Request, choices: Choices,
                  run: pipeline.Run) -> AsyncIterator[str]:
    """Server-sent events: a chunk per token (or per first chunk of a choice), a last chunk per
    choice with its finish_reason, the usage chunk if asked for, then ``data: [DONE]``. A client
    that disconnects makes the surrounding response cancel this generator: its jobs are
    cancelled and their rows freed at the scheduler's next step."""
    plan = choices.plan
    finished = [False] * len(run.jobs)
    generated = 0
    status = "499"
    try:
        first = [c for c in map(choices.first, range(len(run.jobs))) if c is not None]
        if first:
            yield _sse(choices.chunk(first))
        async for i, item in run.items():
            if isinstance(item, TokenEvent):
                before = choices.before(i, item)
                if before is not None:
                    yield _sse(choices.chunk([before]))
                generated += item.token_id >= 0
                last = item.finish_reason is not None
                pieces = choices.pieces(i, item)
                if not pieces and plan.logprobs is None and not last:
                    continue
                yield _sse(choices.chunk([choices.delta(i, item, pieces)]))
                if last and choices.tool_calls(i):
                    service.metrics.tool_calls.inc(choices.tool_calls(i))
            elif isinstance(item, Result):
                if item.finish_reason == "cancelled" and not finished[i]:
                    end = choices.cut_short(i)
                    end.update(logprobs=None, finish_reason=finish_reason(item.finish_reason))
                    yield _sse(choices.chunk([end]))
                finished[i] = True
            else:  # the model failed: tell the client in OpenAI's streamed-error shape
                yield _sse(ApiError(500, f"generation failed: {item}", type="server_error")
                           .body())
                finished[i] = True
        if plan.include_usage:
            yield _sse(choices.chunk([], usage(sum(len(x) for x in plan.prompts), generated)))
        yield "data: [DONE]\n\n"
        status = "200"
    finally:
        run.cancel()
        pipeline.count(service, request, status)


def _sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"
