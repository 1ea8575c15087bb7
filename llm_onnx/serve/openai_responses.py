"""OpenAI's Responses API: POST /v1/responses, GET and DELETE /v1/responses/{id},
GET /v1/responses/{id}/input_items.

Parse: the request is read into a chat plan (openai_responses_request.py) and runs as one.
Render: the reply comes back as output items, each with its own id: a ``reasoning`` item (a
reasoning model's thinking; with ``include: ["reasoning.encrypted_content"]`` also its
``encrypted_content``), a ``message`` with one ``output_text`` part, and a ``function_call``
per tool call (with its ``namespace`` for a namespace's tool) or a ``custom_tool_call`` for a
custom tool. Streamed, as OpenAI's event sequence, each event with its ``sequence_number``:

    response.created, response.in_progress
    per item: response.output_item.added
              reasoning: response.reasoning_text.delta ... response.reasoning_text.done
              message:   response.content_part.added, response.output_text.delta ...,
                         response.output_text.done, response.content_part.done
              call:      response.function_call_arguments.delta ...,
                         response.function_call_arguments.done
              custom:    response.custom_tool_call_input.delta (the whole text, once the
                         call is written), response.custom_tool_call_input.done
              response.output_item.done
    response.completed (or response.incomplete: max_output_tokens reached)

Logprobs (``include: ["message.output_text.logprobs"]`` or ``top_logprobs``) belong to the
tokens that wrote the message's text: a thinking or tool-call token has none. A request for them
runs through the streamed events even when not streamed, so both carry the same ones.

``store`` (default true) keeps the response for ``previous_response_id`` and GET, within the
server's bound (response_store.py).
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
from llm_onnx.serve import pipeline
from llm_onnx.serve.errors import ApiError
from llm_onnx.serve.logprobs import TokenText, chat_logprobs
from llm_onnx.serve.openai_responses_request import API, ResponsePlan, responses_names, sealed
from llm_onnx.serve.openai_responses_tools import custom_input, new_id


def _status(result: Result) -> str:
    return "incomplete" if result.finish_reason == "length" else "completed"


def _reasoning_item(item_id: str, text: str, status: str, seal: bool) -> dict[str, Any]:
    item = {"id": item_id, "type": "reasoning", "summary": [],
            "content": [{"type": "reasoning_text", "text": text}], "status": status}
    if seal:
        item["encrypted_content"] = sealed(text)
    return item


def _message_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [{"type": "output_text", "text": text, "annotations": [],
                                        "logprobs": []}]
    return {"id": item_id, "type": "message", "role": "assistant", "status": status,
            "content": content}


def output_items(plan: ResponsePlan, result: Result) -> list[dict[str, Any]]:
    """A finished reply as output items (reasoning, message, function and custom calls)."""
    chat = plan.plan.chat
    read = chat.read(result) if chat is not None else result
    status = "incomplete" if result.finish_reason == "length" else "completed"
    items: list[dict[str, Any]] = []
    if read.reasoning:
        items.append(_reasoning_item(new_id("rs"), read.reasoning, status, plan.sealed))
    calls = read.tool_calls or []
    if read.text or not calls:
        items.append(_message_item(new_id("msg"), read.text, status))
    items += [plan.tools.output_item(c.id, c.name, c.arguments) for c in calls]
    return items


def _conversation_after(plan: ResponsePlan, items: list[dict[str, Any]]) -> list[dict]:
    """The conversation a continuation starts from: this one and the reply's assistant turn."""
    reply: dict[str, Any] = {"role": "assistant", "content": None}
    for item in items:
        if item["type"] == "message":
            reply["content"] = "".join(part["text"] for part in item["content"])
        elif item["type"] == "reasoning":
            reply["reasoning_content"] = item["content"][0]["text"]
        else:
            arguments = item["arguments"] if item["type"] == "function_call" else \
                json.dumps({"input": item["input"]}, ensure_ascii=False)
            reply.setdefault("tool_calls", []).append(
                {"id": item["call_id"], "type": "function",
                 "function": {"name": item["name"], "arguments": arguments}})
    return plan.conversation + [reply]


def _keep(service: Any, plan: ResponsePlan, response: dict[str, Any]) -> None:
    if plan.store:
        calls = plan.calls | {i["call_id"] for i in response["output"]
                              if i["type"] in ("function_call", "custom_tool_call")}
        service.responses.put(response, _conversation_after(plan, response["output"]), calls)


class _Events:
    """The streamed events of one reply, built from its text pieces and tool-call deltas."""

    def __init__(self, plan: ResponsePlan, tokens: TokenText) -> None:
        self.plan = plan
        self.tokens = tokens
        self.pending: list[dict[str, Any]] = []  # logprobs of tokens whose text is still held
        self.sequence = 0
        self.items: list[dict[str, Any]] = []  # every item added so far, in output order
        self.open: dict[str, Any] | None = None  # the reasoning or message item being written
        self.calls: dict[int, dict[str, Any]] = {}  # tool-call delta index -> its item
        self.arguments: dict[int, str] = {}  # ... -> the arguments' text so far

    def event(self, kind: str, **fields: Any) -> str:
        data = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    def _add(self, item: dict[str, Any]) -> list[str]:
        self.items.append(item)
        return [self.event("response.output_item.added", output_index=len(self.items) - 1,
                           item=json.loads(json.dumps(item)))]

    def _index(self, item: dict[str, Any]) -> int:
        return next(i for i, x in enumerate(self.items) if x is item)

    def close_open(self, status: str = "completed") -> list[str]:
        item, self.open = self.open, None
        if item is None:
            return []
        i = self._index(item)
        item["status"] = status
        if item["type"] == "reasoning":
            text = item["content"][0]["text"]
            if self.plan.sealed:
                item["encrypted_content"] = sealed(text)
            return [self.event("response.reasoning_text.done", item_id=item["id"],
                               output_index=i, content_index=0, text=text),
                    self.event("response.output_item.done", output_index=i, item=item)]
        part = item["content"][0]
        return [self.event("response.output_text.done", item_id=item["id"], output_index=i,
                           content_index=0, text=part["text"], logprobs=part["logprobs"]),
                self.event("response.content_part.done", item_id=item["id"], output_index=i,
                           content_index=0, part=part),
                self.event("response.output_item.done", output_index=i, item=item)]

    def token(self, event: TokenEvent, pieces: list[Any]) -> list[str]:
        """A token's events: its pieces, its logprob (if asked for) on the first piece of message
        text it completed, with those of earlier tokens whose text it released."""
        if self.plan.plan.logprobs is not None and event.logprob is not None:
            self.pending += chat_logprobs([event.logprob], self.tokens)["content"]
        out: list[str] = []
        for piece in pieces:
            if isinstance(piece, ToolCallDelta):
                self.pending = []
                out += self.call(piece)
                continue
            if piece.reasoning:
                self.pending = []
            out += self.text(piece, self.pending if not piece.reasoning else [])
            self.pending = [] if not piece.reasoning else self.pending
        return out

    def text(self, piece: ChatPiece, logprobs: list[dict[str, Any]] = ()) -> list[str]:
        kind = "reasoning" if piece.reasoning else "message"
        out: list[str] = []
        if self.open is not None and self.open["type"] != kind:
            out += self.close_open()
        if self.open is None:
            if kind == "reasoning":
                self.open = _reasoning_item(new_id("rs"), "", "in_progress", False)
                out += self._add(self.open)
            else:
                self.open = _message_item(new_id("msg"), None, "in_progress")
                out += self._add(self.open)
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                self.open["content"].append(part)
                out.append(self.event("response.content_part.added", item_id=self.open["id"],
                                      output_index=len(self.items) - 1, content_index=0,
                                      part=dict(part)))
        i = len(self.items) - 1
        self.open["content"][0]["text"] += piece
        name = "response.reasoning_text.delta" if kind == "reasoning" else \
            "response.output_text.delta"
        extra = {} if kind == "reasoning" else {"logprobs": list(logprobs)}
        if kind == "message":
            self.open["content"][0]["logprobs"] += logprobs
        out.append(self.event(name, item_id=self.open["id"], output_index=i, content_index=0,
                              delta=str(piece), **extra))
        return out

    def call(self, delta: ToolCallDelta) -> list[str]:
        """A call's events: a function call's arguments as they come; a custom tool's text
        once the call is whole (``finish``: the arguments are JSON around it until then)."""
        out: list[str] = []
        item = self.calls.get(delta.index)
        if item is None:
            out += self.close_open()
            item = self.calls[delta.index] = self.plan.tools.output_item(
                delta.id or new_id("call"), delta.name or "", "", "in_progress")
            self.arguments[delta.index] = ""
            out += self._add(item)
        if delta.arguments:
            self.arguments[delta.index] += delta.arguments
            if item["type"] == "function_call":
                item["arguments"] += delta.arguments
                out.append(self.event("response.function_call_arguments.delta",
                                      item_id=item["id"], output_index=self._index(item),
                                      delta=delta.arguments))
        return out

    def finish(self, result: Result) -> list[str]:
        status = _status(result)
        out = self.close_open(status)
        for index, item in self.calls.items():
            i = self._index(item)
            item["status"] = "completed"
            if item["type"] == "custom_tool_call":
                item["input"] = custom_input(self.arguments[index])
                out += [self.event("response.custom_tool_call_input.delta", item_id=item["id"],
                                   output_index=i, delta=item["input"]),
                        self.event("response.custom_tool_call_input.done", item_id=item["id"],
                                   output_index=i, input=item["input"])]
            else:
                out.append(self.event("response.function_call_arguments.done",
                                      item_id=item["id"], output_index=i,
                                      arguments=item["arguments"]))
            out.append(self.event("response.output_item.done", output_index=i, item=item))
        return out


async def _events(service: Any, plan: ResponsePlan, run: pipeline.Run,
                  ) -> AsyncIterator[tuple[str, dict[str, Any] | None]]:
    """The reply's events, each with the final Response on the last one (else None)."""
    events = _Events(plan, service.tokens)
    reply = plan.plan.chat.stream() if plan.plan.chat is not None else None
    start = plan.response("in_progress", [], None)
    yield events.event("response.created", response=start), None
    yield events.event("response.in_progress", response=start), None
    async for _, item in run.items():
        if isinstance(item, TokenEvent):
            last = item.finish_reason is not None
            pieces = reply.push(item.text, last) if reply is not None else \
                ([ChatPiece(item.text)] if item.text else [])
            for line in events.token(item, pieces):
                yield line, None
        elif isinstance(item, Result):
            for line in events.finish(item):
                yield line, None
            final = plan.response(_status(item), events.items, item)
            _keep(service, plan, final)
            kind = "response.completed" if final["status"] == "completed" else \
                "response.incomplete"
            yield events.event(kind, response=final), final
        else:  # the model failed
            failed = plan.response("failed", events.items, None)
            failed["error"] = {"code": "server_error", "message": f"generation failed: {item}"}
            yield events.event("response.failed", response=failed), failed


async def _stream(service: Any, request: Request, plan: ResponsePlan,
                  run: pipeline.Run) -> AsyncIterator[str]:
    status = "499"
    try:
        async for line, final in _events(service, plan, run):
            if final is not None:
                status = "200" if final["status"] != "failed" else "500"
            yield line
    finally:
        run.cancel()
        pipeline.count(service, request, status)


PATHS = ("/v1/responses",)
PATH_PREFIXES = {"/v1/responses/": "/v1/responses/{id}"}  # counted under one label


def add_routes(app: FastAPI, service: Any, authorized: Any) -> None:
    """The Responses API's routes over ``service`` (its ``responses`` store)."""

    @app.post("/v1/responses", dependencies=[Depends(authorized)])
    async def create(request: Request) -> Response:
        body = await pipeline.read_body(request)
        # (in a thread: images are decoded, and fetched where allowed, while parsing)
        plan = await asyncio.to_thread(ResponsePlan, body, service, service.fields(request, API))
        with responses_names():
            await service.prepare(plan.plan)
        by_events = plan.plan.stream or plan.plan.logprobs is not None
        run = pipeline.submit(service, plan.plan, by_events)
        if not plan.plan.stream and by_events:  # logprobs: the same events, kept to the end
            final = None
            try:
                async for _, final in _events(service, plan, run):
                    pass
            finally:
                run.cancel()
            code = 500 if final is None or final["status"] == "failed" else 200
            pipeline.count(service, request, code)
            if code == 500:
                raise ApiError(500, "generation failed", type="server_error",
                                 code="server_error")
            return JSONResponse(final)
        if plan.plan.stream:
            return StreamingResponse(_stream(service, request, plan, run),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache",
                                              "X-Accel-Buffering": "no"})
        results = await run.results(request)
        if results is None:
            pipeline.count(service, request, 499)
            return Response(status_code=499)
        result = results[0]
        response = plan.response(_status(result), output_items(plan, result), result)
        _keep(service, plan, response)
        pipeline.count(service, request, 200)
        return JSONResponse(response)

    @app.get("/v1/responses/{response_id}", dependencies=[Depends(authorized)])
    async def retrieve(response_id: str, request: Request) -> JSONResponse:
        response, _, _ = service.responses.get(response_id, "response_id")
        pipeline.count(service, request, 200)
        return JSONResponse(response)

    @app.get("/v1/responses/{response_id}/input_items", dependencies=[Depends(authorized)])
    async def input_items(response_id: str, request: Request) -> JSONResponse:
        _, conversation, _ = service.responses.get(response_id, "response_id")
        items = [{"id": f"msg_{i}", "type": "message", "role": m["role"], "status": "completed",
                  "content": [{"type": "input_text", "text": m.get("content") or ""}]}
                 for i, m in enumerate(conversation[:-1]) if m["role"] != "tool"]
        pipeline.count(service, request, 200)
        return JSONResponse({"object": "list", "data": items, "has_more": False,
                             "first_id": items[0]["id"] if items else None,
                             "last_id": items[-1]["id"] if items else None})

    @app.delete("/v1/responses/{response_id}", dependencies=[Depends(authorized)])
    async def delete(response_id: str, request: Request) -> JSONResponse:
        service.responses.delete(response_id)
        pipeline.count(service, request, 200)
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})
