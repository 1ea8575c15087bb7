"""OpenAI's Chat Completions API: POST /v1/chat/completions.

Parse: the body, checked field by field (the structured-output fields in ``structured``), read
into a Plan whose ChatRequest renders the messages with the model's chat template and reads each
reply back. Render: a message per choice (content, ``reasoning_content`` for a reasoning model's
thinking, ``tool_calls``), or streamed chunks whose deltas carry the same three.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import Response

from llm_onnx.errors import GenerationError
from llm_onnx.runtime.chat.dialects.base import ChatPiece, ReplyReader, ToolCallDelta
from llm_onnx.runtime.chat.render import check_template_vars, template_variables
from llm_onnx.runtime.chat.request import ChatRequest
from llm_onnx.runtime.generation.results import Result, TokenEvent, ToolCall
from llm_onnx.runtime.model import Model
from llm_onnx.runtime.structured.constraint import ConstraintError
from llm_onnx.serve import pipeline
from llm_onnx.serve.errors import bad, text_only
from llm_onnx.serve.fields import (
    body_object,
    boolean,
    fit_length,
    integer,
    sampling,
    served_model,
    stream_fields,
)
from llm_onnx.serve.logprobs import TokenText, chat_logprobs
from llm_onnx.serve.media import (
    MediaPolicy,
    accepting,
    image_part,
    place_images,
    policy_for,
    split,
    takes_images,
)
from llm_onnx.serve.names import ModelNames
from llm_onnx.serve.openai_choices import (
    COMMON_FIELDS,
    IGNORED_FIELDS,
    MAX_N,
    Choices,
    Piece,
    finish_reason,
    respond,
)
from llm_onnx.serve.plan import CHAT, Plan
from llm_onnx.serve.policy import Fields
from llm_onnx.serve.structured import answer_constraint, tool_fields
from llm_onnx.serve.system_turns import rendered

PATHS = ("/v1/chat/completions",)
API = "chat.completions"  # in the field policy's reports (policy.py)
FIELDS = COMMON_FIELDS | {"messages", "max_completion_tokens", "top_logprobs", "tools",
                          "tool_choice", "parallel_tool_calls",
                          # vLLM's extra field: chat template variables ({"enable_thinking": false})
                          "chat_template_kwargs", "reasoning_effort"}
TOLERATED_FIELDS: set[str] = set()
# The legacy function calling (a value that asks for nothing passes), web search, audio output
UNSUPPORTED_FIELDS = {"functions": None, "function_call": "none", "web_search_options": None,
                      "audio": None}


def add_routes(app: FastAPI, service: Any, authorized: Any) -> None:
    @app.post("/v1/chat/completions", dependencies=[Depends(authorized)])
    async def chat_completions(request: Request) -> Response:
        body = await pipeline.read_body(request)
        # (in a thread: images are decoded, and fetched where allowed, while parsing)
        plan = await asyncio.to_thread(chat_plan, body, service.model, service.names,
                                       service.generating().max_length,
                                       service.fields(request, API), service.media)
        await service.prepare(plan)
        return await respond(service, request, plan, ChatChoices(plan, service.tokens))


# ---------------------------------------------------------------------------------------------
# Parse
# ---------------------------------------------------------------------------------------------

def chat_plan(body: Any, model: Model, served: str | ModelNames, context: int,
              fields: Fields | None = None, media: MediaPolicy | None = None) -> Plan:
    """POST /v1/chat/completions, checked (its constraint is composed by structured.prepare;
    ``fields``: the field policy, lenient by default; ``media``: where images may come from,
    serve/media.py)."""
    body = body_object(body)
    (fields or Fields(API)).check(body, FIELDS, IGNORED_FIELDS, TOLERATED_FIELDS,
                                  UNSUPPORTED_FIELDS)
    name = served_model(body, served)
    if not model.chat_template:
        raise bad("messages", "this model has no chat template; use /v1/completions.")
    answer = answer_constraint(body)
    tools, choice, parallel = tool_fields(body, model.chat_template)
    template_vars = _reasoning_vars(body, model.chat_template, template_kwargs(body))
    with accepting(policy_for(model, media)):
        messages = messages_of(body.get("messages"))
    messages, images = split(model, messages)
    # what the template shows of the tools (a custom tool's grammar is the constraint's)
    shown = [{k: v for k, v in t.items() if k != "input_grammar"} for t in tools or []] or tools
    try:
        messages, text = rendered(model, messages, tools=shown, template_vars=template_vars)
        prompt = model.encode(text, add_special_tokens=False)
        chat = ChatRequest(model, text, answer, tools, choice, parallel)
    except ConstraintError as e:
        raise bad(e.where, str(e)) from None
    except GenerationError as e:
        raise bad("messages", str(e)) from None
    n = integer(body, "n", 1, MAX_N) or 1
    stream, usage = stream_fields(body)
    logprobs = None
    if boolean(body, "logprobs"):
        logprobs = integer(body, "top_logprobs", 0, 20) or 0
    elif body.get("top_logprobs") is not None:
        raise bad("top_logprobs", "'top_logprobs' needs 'logprobs' set to true.")
    options = sampling(body, model.defaults, model.engine.vocab_size)
    row = place_images(model, prompt, images, text) if images else None
    prompt = row.ids if row is not None else prompt
    new = fit_length(body, ("max_completion_tokens", "max_tokens"), prompt, context, None,
                     "messages")
    return Plan(CHAT, name, [prompt], [replace(options, max_new_tokens=new)], n, stream, usage,
                logprobs, chat=chat, constraint=answer, images=row,
                reuse_points=[] if row is not None else model.reuse_points(
                    messages, prompt, tools=shown, template_vars=template_vars))


REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


def _reasoning_vars(body: dict, template: str, variables: dict[str, Any] | None,
                    ) -> dict[str, Any] | None:
    """``reasoning_effort`` (OpenAI's field, which vLLM and Ollama also take) as the chat
    template's own switch: gpt-oss's ``reasoning_effort`` (low, medium, high: none and minimal
    read as low, xhigh as high), or for a template with ``enable_thinking``, thinking off for
    none and on for any other effort (Qwen3 and SmolLM3 think by default, Gemma 4 does not).
    chat_template_kwargs, if it sets the same variable, wins."""
    effort = body.get("reasoning_effort")
    if effort is None:
        return variables
    if effort not in REASONING_EFFORTS:
        raise bad("reasoning_effort", f"'reasoning_effort' must be one of "
                                      f"{', '.join(REASONING_EFFORTS)}, got {effort!r}.")
    names = template_variables(template)
    extra: dict[str, Any] = {}
    if "reasoning_effort" in names:
        extra["reasoning_effort"] = {"none": "low", "minimal": "low", "xhigh": "high"}.get(
            effort, effort)
    elif "enable_thinking" in names:
        extra["enable_thinking"] = effort != "none"
    return {**extra, **(variables or {})} or variables


def template_kwargs(body: dict) -> dict[str, Any] | None:
    """vLLM's ``chat_template_kwargs``: variables for the chat template. Names the template does
    not read are ignored, as transformers and vLLM ignore them."""
    value = body.get("chat_template_kwargs")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad("chat_template_kwargs", "'chat_template_kwargs' must be an object of chat "
                                          "template variables, like {\"enable_thinking\": false}.")
    try:
        return check_template_vars(value)
    except GenerationError as e:
        raise bad("chat_template_kwargs", f"'chat_template_kwargs': {e}") from None


_ROLES = {"system", "developer", "user", "assistant", "tool"}


def messages_of(messages: Any) -> list[dict[str, Any]]:
    """A body's ``messages`` as the chat template takes them: text parts joined, ``developer``
    as ``system``, an assistant's tool calls with their arguments as objects."""
    if not isinstance(messages, list):
        raise bad("messages", "'messages' must be a list of {\"role\", \"content\"} objects.")
    if not messages:
        raise bad("messages", "'messages' must not be empty.")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(where, f"'{where}' must be an object with 'role' and 'content'.")
        role = m.get("role")
        if role not in _ROLES:
            raise bad(f"{where}.role", f"'{where}.role' must be one of "
                                       f"{', '.join(sorted(_ROLES))}, got {role!r}.")
        content = m.get("content")
        if isinstance(content, list):
            content = _content_parts(content, where)
        if content is None and role == "assistant":
            content = ""
        if not isinstance(content, (str, list)):
            raise bad(f"{where}.content", f"'{where}.content' must be a string or a list of "
                                          "content parts.")
        message = {"role": "system" if role == "developer" else role, "content": content}
        for key in ("name", "tool_call_id", "reasoning_content", "reasoning"):
            value = m.get(key)
            if value is not None:
                if not isinstance(value, str):
                    raise bad(f"{where}.{key}", f"'{where}.{key}' must be a string.")
                message[key] = value
        if m.get("tool_calls") is not None:
            if role != "assistant":
                raise bad(f"{where}.tool_calls", "only assistant messages carry 'tool_calls'.")
            message["tool_calls"] = _tool_calls(m["tool_calls"], f"{where}.tool_calls")
        out.append(message)
    return out


def _content_parts(content: list, where: str) -> str | list[dict[str, Any]]:
    """A message's content parts: the text parts joined, or, with image_url parts (a folder
    that takes images: serve/media.py), the parts as the template takes them."""
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "image_url":
            url = part.get("image_url")
            parts.append(image_part(url.get("url") if isinstance(url, dict) else url,
                                    f"{where}.content[{j}]", "an image_url part"))
            continue  # (``detail`` is accepted: the processor's own bounds decide the size)
        if kind in ("input_audio", "file"):
            raise text_only(f"{where}.content[{j}]", f"an {kind} part")
        if kind != "text" or not isinstance(part.get("text"), str):
            raise bad(f"{where}.content[{j}]", "only text and image_url content parts are "
                      "supported." if takes_images() else "only text content parts "
                      "({\"type\": \"text\", \"text\": ...}) are supported.")
        parts.append({"type": "text", "text": part["text"]})
    if any(p["type"] == "image" for p in parts):
        return parts
    return "".join(p["text"] for p in parts)


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """An assistant message's tool calls: [{"id", "type": "function", "function": {"name",
    "arguments"}}], arguments a JSON string (OpenAI's form) or an object. Templates get the
    arguments as an object (as transformers' and vLLM's chat handling gives them), so that
    ``arguments | tojson`` writes JSON rather than a quoted string."""
    if not isinstance(calls, list):
        raise bad(where, f"'{where}' must be a list of tool calls.")
    out = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or \
                not isinstance(function.get("arguments", ""), (str, dict)):
            raise bad(f"{where}[{j}]", f"'{where}[{j}]' must be {{\"id\": ..., \"type\": "
                                       "\"function\", \"function\": {\"name\": ..., "
                                       "\"arguments\": \"<JSON>\"}}.")
        arguments = function.get("arguments", "{}")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments or "{}")
            except ValueError:
                raise bad(f"{where}[{j}].function.arguments", f"'{where}[{j}].function."
                          "arguments' is not valid JSON.") from None
        out.append({**call, "function": {**function, "arguments": arguments}})
    return out


# ---------------------------------------------------------------------------------------------
# Render
# ---------------------------------------------------------------------------------------------

class ChatChoices(Choices):
    """Choices as assistant messages (whole) and deltas (streamed): thinking as
    ``reasoning_content`` (vLLM's and DeepSeek's field), the answer as ``content``, tool calls as
    ``tool_calls``."""

    chunk_object = "chat.completion.chunk"

    def __init__(self, plan: Plan, tokens: TokenText) -> None:
        super().__init__(plan, tokens)
        self.replies: dict[int, ReplyReader] = {}  # each streamed choice's reader

    def choice(self, index: int, result: Result) -> dict[str, Any]:
        plan = self.plan
        logprobs = None if plan.logprobs is None or result.logprobs is None else \
            chat_logprobs(result.logprobs, self.tokens)
        read = plan.chat.read(result) if plan.chat is not None else result
        calls = read.tool_calls or []
        message: dict[str, Any] = {"role": "assistant", "content": read.text, "refusal": None}
        if plan.thinking is not None:
            message["reasoning_content"] = read.reasoning
        if calls:
            message["content"] = read.text or None
            message["tool_calls"] = [tool_call(c) for c in calls]
        return {"index": index, "message": message, "logprobs": logprobs,
                "finish_reason": finish_reason(result.finish_reason, bool(calls))}

    def first(self, i: int) -> dict[str, Any]:
        return {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                "finish_reason": None}

    def _reply(self, i: int) -> ReplyReader | None:
        if self.plan.chat is None:
            return None
        if i not in self.replies:
            self.replies[i] = self.plan.chat.stream()
        return self.replies[i]

    def pieces(self, i: int, event: TokenEvent) -> list[Piece]:
        reply = self._reply(i)
        if reply is None:
            return [ChatPiece(event.text)] if event.text else []
        return reply.push(event.text, event.finish_reason is not None)

    def delta(self, i: int, event: TokenEvent, pieces: list[Piece]) -> dict[str, Any]:
        reply = self._reply(i)
        reason = None if event.finish_reason is None else \
            finish_reason(event.finish_reason, reply is not None and reply.tool_calls > 0)
        logprobs = None
        if self.plan.logprobs is not None and event.logprob is not None:
            logprobs = chat_logprobs([event.logprob], self.tokens)
        return {"index": i, "delta": _delta(pieces), "logprobs": logprobs,
                "finish_reason": reason}

    def cut_short(self, i: int) -> dict[str, Any]:
        reply = self._reply(i)
        return {"index": i, "delta": _delta(reply.push("", True) if reply is not None else [])}

    def tool_calls(self, i: int) -> int:
        reply = self._reply(i)
        return reply.tool_calls if reply is not None else 0


def response(plan: Plan, results: list[Result], tokens: TokenText) -> dict[str, Any]:
    """The whole answer of a chat plan."""
    return ChatChoices(plan, tokens).response(results)


def _delta(pieces: list[Piece]) -> dict[str, Any]:
    """A chat chunk's delta: thinking as ``reasoning_content``, the answer as ``content``, tool
    calls as ``tool_calls`` (OpenAI's streamed shape)."""
    delta: dict[str, Any] = {}
    for piece in pieces:
        if isinstance(piece, ToolCallDelta):
            delta.setdefault("tool_calls", []).append(tool_call_delta(piece))
            continue
        key = "reasoning_content" if piece.reasoning else "content"
        delta[key] = delta.get(key, "") + piece
    return delta


def tool_call(call: ToolCall) -> dict[str, Any]:
    """A message's tool call in OpenAI's shape (arguments as JSON text)."""
    return {"id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


def tool_call_delta(delta: ToolCallDelta) -> dict[str, Any]:
    """A streamed chunk's ``delta.tool_calls`` entry: the first of a call carries its id, type
    and name; every one may carry a piece of the arguments."""
    out: dict[str, Any] = {"index": delta.index}
    if delta.id is not None:
        out.update(id=delta.id, type="function",
                   function={"name": delta.name, "arguments": delta.arguments})
    else:
        out["function"] = {"arguments": delta.arguments}
    return out
