"""Anthropic's Messages API over the served model (the ``anthropic`` client and tools built on
it work against ``base_url=http://host:port``). Parse: ``anthropic_messages_request``. Render:
the reply as Anthropic's message, or its server-sent events.

    POST /v1/messages                 a reply: {"id": "msg_...", "type": "message",
                                      "role": "assistant", "model", "content": [block],
                                      "stop_reason", "stop_sequence",
                                      "usage": {"input_tokens", "output_tokens"}}
    POST /v1/messages/count_tokens    {"input_tokens": N}

Content blocks, in order: ``thinking`` (a reasoning model's think block), ``text``, then one
``tool_use`` {"id": "toolu_...", "name", "input"} per call. stop_reason: end_turn, max_tokens,
stop_sequence (``stop_sequence`` names it) or tool_use. With ``stream``, server-sent events
as Anthropic sends them:

    message_start, ping,
    per block: content_block_start, content_block_delta (text_delta, thinking_delta,
               input_json_delta), content_block_stop
    message_delta (stop_reason, stop_sequence, usage), message_stop

Errors are Anthropic's {"type": "error", "error": {"type", "message"}} (``error_body``, which
the app's handlers use for these paths), as is an ``error`` event that ends a stream when the
reply cannot finish.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from llm_onnx.runtime.chat.dialects.base import ChatPiece, ToolCallDelta
from llm_onnx.runtime.generation.results import Result, TokenEvent
from llm_onnx.serve import anthropic_messages_request as mr
from llm_onnx.serve import pipeline
from llm_onnx.serve.errors import ApiError
from llm_onnx.serve.plan import Plan

PATHS = ("/v1/messages", "/v1/messages/count_tokens")
_STOP_REASONS = {"stop": "end_turn", "stop_string": "stop_sequence", "length": "max_tokens"}


def add_routes(app: FastAPI, service: Any, authorized: Any) -> None:
    @app.post("/v1/messages", dependencies=[Depends(authorized)])
    async def create(request: Request) -> Response:
        body = await pipeline.read_body(request)
        # (in a thread: images are decoded, and fetched where allowed, while parsing)
        plan, conv = await asyncio.to_thread(mr.messages_plan, body, service.model,
                                             service.names, service.generating().max_length,
                                             service.fields(request, mr.API), service.media)
        try:
            await service.prepare(plan)
        except ApiError as e:
            raise mr.translated(e) from None
        run = pipeline.submit(service, plan, plan.stream)
        if plan.stream:
            return StreamingResponse(_events(service, request, plan, conv, run),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache",
                                              "X-Accel-Buffering": "no"})
        results = await run.results(request)
        if results is None:  # the client went away; its job is cancelled
            service.count(request, 499)
            return Response(status_code=499)
        body = message(plan, conv, results[0])
        calls = sum(block["type"] == "tool_use" for block in body["content"])
        if calls:
            service.metrics.tool_calls.inc(calls)
        service.count(request, 200)
        return JSONResponse(body)

    @app.post("/v1/messages/count_tokens", dependencies=[Depends(authorized)])
    async def count_tokens(request: Request) -> JSONResponse:
        body = await pipeline.read_body(request)
        count = await asyncio.to_thread(mr.count_tokens, body, service.model, service.names,
                                        service.fields(request, mr.API), service.media)
        service.count(request, 200)
        return JSONResponse({"input_tokens": count})


def error_body(error: ApiError) -> dict[str, Any]:
    """An error in Anthropic's shape."""
    return error.anthropic_body()


def message(plan: Plan, conv: mr.Conversation, result: Result) -> dict[str, Any]:
    """The whole (non-streamed) reply."""
    _check_ended(result)
    assert plan.chat is not None
    read = plan.chat.read(result)
    content: list[dict[str, Any]] = []
    if read.reasoning:
        content.append({"type": "thinking", "signature": "",
                        "thinking": "" if conv.omit_thinking else read.reasoning})
    if read.text:
        content.append({"type": "text", "text": read.text})
    for call in read.tool_calls or []:
        content.append({"type": "tool_use", "id": tool_use_id(call.id), "name": call.name,
                        "input": json.loads(call.arguments)})
    reason = _stop_reason(result, bool(read.tool_calls))
    return {**_head(plan), "content": content, "stop_reason": reason,
            "stop_sequence": result.stop_string if reason == "stop_sequence" else None,
            "usage": _usage(plan, len(result.token_ids))}


def tool_use_id(call_id: str) -> str:
    """A call's id as Anthropic writes them (``toolu_...``); sent back in tool_use and
    tool_result blocks, it reaches the template as given."""
    return "toolu_" + call_id[len("call_"):] if call_id.startswith("call_") else call_id


def _head(plan: Plan) -> dict[str, Any]:
    return {"id": plan.id, "type": "message", "role": "assistant", "model": plan.model}


def _usage(plan: Plan, output_tokens: int) -> dict[str, int]:
    return {"input_tokens": len(plan.prompts[0]), "output_tokens": output_tokens}


def _stop_reason(result: Result, tool_calls: bool) -> str:
    if tool_calls and result.finish_reason == "stop":
        return "tool_use"
    return _STOP_REASONS[result.finish_reason]


def _check_ended(result: Result) -> None:
    """A reply that did not end on its own, its stop sequence or max_tokens is an error."""
    if result.finish_reason == "cancelled":
        raise ApiError(503, "the server is shutting down: the reply was cut short.",
                         type="server_error")
    if result.finish_reason == "error":
        raise ApiError(500, f"generation failed: {result.error}", type="server_error")


class _Blocks:
    """A reply's pieces (ChatPieces, ToolCallDeltas) as content block events."""

    def __init__(self, omit_thinking: bool) -> None:
        self.omit_thinking = omit_thinking
        self.index = -1
        self.kind: str | None = None
        self.calls: dict[int, int] = {}  # a call's index -> its block's

    def push(self, pieces: list[ChatPiece | ToolCallDelta]) -> list[str]:
        out = []
        for piece in pieces:
            if isinstance(piece, ToolCallDelta):
                if piece.id is not None:
                    out += self._open("tool_use", {"type": "tool_use",
                                                   "id": tool_use_id(piece.id),
                                                   "name": piece.name, "input": {}})
                    self.calls[piece.index] = self.index
                if piece.arguments:
                    out.append(_delta(self.calls[piece.index], {
                        "type": "input_json_delta", "partial_json": piece.arguments}))
            elif piece.reasoning:
                if self.kind != "thinking":
                    out += self._open("thinking", {"type": "thinking", "thinking": "",
                                                   "signature": ""})
                if not self.omit_thinking:
                    out.append(_delta(self.index, {"type": "thinking_delta",
                                                   "thinking": str(piece)}))
            elif piece:
                if self.kind != "text":
                    out += self._open("text", {"type": "text", "text": ""})
                out.append(_delta(self.index, {"type": "text_delta", "text": str(piece)}))
        return out

    def close(self) -> list[str]:
        if self.kind is None:
            return []
        self.kind = None
        return [_event("content_block_stop", {"type": "content_block_stop",
                                              "index": self.index})]

    def _open(self, kind: str, block: dict[str, Any]) -> list[str]:
        out = self.close()
        self.index += 1
        self.kind = kind
        return out + [_event("content_block_start", {"type": "content_block_start",
                                                     "index": self.index,
                                                     "content_block": block})]


async def _events(service: Any, request: Request, plan: Plan, conv: mr.Conversation,
                  run: pipeline.Run) -> AsyncIterator[str]:
    """The reply as Anthropic's server-sent events (see the module docstring). A client that
    disconnects makes the response cancel this generator, and with it the job."""
    assert plan.chat is not None
    reply, blocks = plan.chat.stream(), _Blocks(conv.omit_thinking)
    generated, status = 0, "499"
    try:
        yield _event("message_start", {"type": "message_start", "message": {
            **_head(plan), "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": _usage(plan, 0)}})
        yield _event("ping", {"type": "ping"})
        async for _i, item in run.items():
            if isinstance(item, TokenEvent):
                generated += item.token_id >= 0
                for event in blocks.push(reply.push(item.text, item.finish_reason is not None)):
                    yield event
                continue
            try:
                if not isinstance(item, Result):
                    raise ApiError(500, f"generation failed: {item}", type="server_error")
                _check_ended(item)
            except ApiError as e:
                yield _event("error", e.anthropic_body())
                status = str(e.status)
                return
            for event in blocks.close():
                yield event
            if reply.tool_calls:
                service.metrics.tool_calls.inc(reply.tool_calls)
            reason = _stop_reason(item, reply.tool_calls > 0)
            yield _event("message_delta", {"type": "message_delta", "delta": {
                "stop_reason": reason,
                "stop_sequence": item.stop_string if reason == "stop_sequence" else None},
                "usage": _usage(plan, generated)})
            yield _event("message_stop", {"type": "message_stop"})
            status = "200"
    finally:
        run.cancel()
        service.count(request, status)


def _delta(index: int, delta: dict[str, Any]) -> str:
    return _event("content_block_delta", {"type": "content_block_delta", "index": index,
                                          "delta": delta})


def _event(name: str, data: dict[str, Any]) -> str:
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"
