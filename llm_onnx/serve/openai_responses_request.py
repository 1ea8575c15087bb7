"""The Responses API's request (POST /v1/responses) read into a plan: ``ResponsePlan``.

A Responses request is a conversation under other names: ``instructions`` is the system
message, ``input`` a string or a list of items (messages with text parts, ``function_call`` and
``custom_tool_call`` items the model made, ``function_call_output`` and
``custom_tool_call_output`` items with their results, earlier ``reasoning`` items), ``tools``
function, namespace and custom tools (openai_responses_tools.py), ``text.format`` the response
format, ``max_output_tokens`` the limit. It is translated into the Chat Completions body that
API already checks (``chat_body``), so both APIs render, constrain and sample the same way;
errors keep naming the Responses fields (``responses_names``).

Reasoning items carry ``encrypted_content`` when ``include`` asks for it: on a local server it
is the reasoning's text, base64-encoded after ``llm-onnx:v1:`` (``sealed``), not encrypted (the
client holds the text already; OpenAI encrypts what it keeps from its clients). A client that
keeps nothing (``store: false``, as Codex CLI) sends it back with the next request and the
thinking reaches the template as the stored conversation would give it; a value this server did
not write is reported as ignored.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from llm_onnx.runtime.generation.results import Result
from llm_onnx.serve import openai_chat
from llm_onnx.serve.errors import ApiError, bad, text_only
from llm_onnx.serve.fields import body_object, integer
from llm_onnx.serve.media import accepting, policy_for, takes_images
from llm_onnx.serve.openai_responses_tools import Toolbox, new_id, read_tools, tool_choice
from llm_onnx.serve.policy import Fields

API = "responses"  # in the field policy's reports (policy.py)
FIELDS = {
    "model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "tools",
    "tool_choice", "parallel_tool_calls", "text", "reasoning", "stream", "metadata", "store",
    "previous_response_id", "user", "include", "top_logprobs", "seed",
}
# Hints that change nothing here. Prompt caching needs no field: every request reuses the
# longest prefix a free row of the cache holds, so prompt_cache_* are accepted and unused;
# max_tool_calls bounds built-in tool calls, and there are none here.
IGNORED_FIELDS = {"safety_identifier", "service_tier", "prompt_cache_key",
                  "prompt_cache_retention", "prompt_cache_options", "max_tool_calls",
                  "stream_options"}
# Conveniences of OpenAI's servers: Codex CLI's telemetry, server-side context compaction
TOLERATED_FIELDS = {"client_metadata", "context_management"}
# Fields this server cannot honour: a 400 naming the field unless the value asks for nothing
# (null, false, "disabled").
UNSUPPORTED_FIELDS = {
    "background": (False, "background responses are not run here: leave 'background' out"),
    "conversation": (None, "conversations are not stored here: continue with "
                           "'previous_response_id'"),
    "prompt": (None, "stored prompt templates live on OpenAI's platform: send 'instructions' "
                     "and 'input'"),
    "moderation": (None, "moderation is not run here"),
    "truncation": ("disabled", "'truncation' auto is not done here: an input longer than the "
                               "context is a 400 as with 'disabled'"),
}
# include values: the output logprobs and encrypted reasoning are served; the rest name items
# of built-in tools (none here): reported as ignored.
INCLUDE_VALUES = {"file_search_call.results", "web_search_call.results",
                  "web_search_call.action.sources", "message.input_image.image_url",
                  "computer_call_output.output.image_url", "code_interpreter_call.outputs",
                  "reasoning.encrypted_content", "message.output_text.logprobs"}
# Items of built-in tools' calls (another server's history): left out, reported
BUILT_IN_ITEMS = {"web_search_call", "file_search_call", "computer_call",
                  "computer_call_output", "code_interpreter_call", "image_generation_call",
                  "local_shell_call", "local_shell_call_output", "mcp_call", "mcp_list_tools",
                  "tool_search_call", "tool_search_output"}
SEAL = "llm-onnx:v1:"
# Chat Completions' field names in errors, told in the Responses API's own words.
FIELD_NAMES = {"max_tokens": "max_output_tokens", "response_format": "text.format",
               "messages": "input", "reasoning_effort": "reasoning.effort"}


def _text_parts(content: Any, where: str, role: str) -> str | list[dict[str, Any]]:
    """A message's content: a string, or text parts (input_text, output_text) joined; with
    input_image parts (a folder that takes images), Chat Completions' text and image_url parts.
    A file or audio part is refused."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(where, f"'{where}' must be a string or a list of content parts.")
    out: list[Any] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text", "summary_text", "reasoning_text"):
            if not isinstance(part.get("text"), str):
                raise bad(f"{where}[{j}].text", f"'{where}[{j}].text' must be a string.")
            out.append(part["text"])
        elif kind == "input_image" and takes_images():
            if not isinstance(part.get("image_url"), str):  # (a file_id: no file store here)
                raise bad(f"{where}[{j}].image_url", f"'{where}[{j}]' needs image_url, a data: "
                                                     "URL (file_id is not supported).")
            out.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        elif kind in ("input_image", "input_file", "input_audio"):
            raise text_only(f"{where}[{j}]", f"an {kind} part")
        elif kind == "refusal" and role == "assistant":
            out.append(part.get("refusal") or "")
        else:
            raise bad(f"{where}[{j}].type", f"'{where}[{j}].type' {kind!r} is not a content part "
                                            "this server reads (input_text, output_text).")
    if any(isinstance(p, dict) for p in out):
        return [p if isinstance(p, dict) else {"type": "text", "text": p} for p in out]
    return "".join(out)


def input_messages(items: Any, known_calls: set[str], fields: Fields,
                   ) -> list[dict[str, Any]]:
    """``input`` as chat messages: consecutive calls (``function_call``, ``custom_tool_call``)
    become one assistant message's tool_calls; an output (``function_call_output``,
    ``custom_tool_call_output``) must answer a call made earlier (in this input or the
    responses it continues: ``known_calls``). Items of built-in tools are left out and
    reported."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise bad("input", "'input' must be a string or a non-empty list of items.")
    messages: list[dict[str, Any]] = []
    calls = set(known_calls)
    reasoning: str | None = None
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad(where, f"'{where}' must be an object.")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise bad(f"{where}.role", f"'{where}.role' must be user, system, developer or "
                                           f"assistant, got {role!r}.")
            message: dict[str, Any] = {"role": "system" if role == "developer" else role,
                                       "content": _text_parts(item.get("content"),
                                                              f"{where}.content", role)}
            if role == "assistant" and reasoning is not None:
                message["reasoning_content"], reasoning = reasoning, None
            messages.append(message)
        elif kind in ("function_call", "custom_tool_call"):
            value = "arguments" if kind == "function_call" else "input"
            for key in ("call_id", "name", value):
                if not isinstance(item.get(key), str):
                    raise bad(f"{where}.{key}", f"'{where}.{key}' must be a string.")
            calls.add(item["call_id"])
            arguments = item["arguments"] if kind == "function_call" else \
                json.dumps({"input": item["input"]}, ensure_ascii=False)
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": arguments}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            else:
                message = {"role": "assistant", "content": None, "tool_calls": [call]}
                if reasoning is not None:
                    message["reasoning_content"], reasoning = reasoning, None
                messages.append(message)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            call_id = item.get("call_id")
            if call_id not in calls:
                raise bad(f"{where}.call_id", f"'{where}.call_id' {call_id!r} answers no "
                                              "call made in this conversation.")
            output = item.get("output")
            text = output if isinstance(output, str) else \
                _text_parts(output, f"{where}.output", "tool")
            messages.append({"role": "tool", "tool_call_id": call_id, "content": text})
        elif kind == "reasoning":  # an earlier reply's thinking: goes with the next assistant turn
            parts = item.get("content") or item.get("summary") or []
            reasoning = _text_parts(parts, f"{where}.content", "assistant") or \
                _unsealed(item.get("encrypted_content"), fields) or None
        elif kind in BUILT_IN_ITEMS:
            fields.tolerate(f"input.{kind}", bad(f"{where}.type", f"'{where}' is an item of the "
                                                 f"built-in tool call {kind!r}, which this "
                                                 "server does not run."))
        else:
            raise bad(f"{where}.type", f"'{where}.type' {kind!r} is not an input item this server "
                                       "reads (message, function_call, function_call_output, "
                                       "custom_tool_call, custom_tool_call_output, reasoning).")
    return messages


def sealed(text: str) -> str:
    """A reasoning item's ``encrypted_content`` (see the module docstring)."""
    return SEAL + base64.b64encode(text.encode("utf-8")).decode("ascii")


def _unsealed(value: Any, fields: Fields) -> str | None:
    """The text of ``encrypted_content`` this server wrote; another's is reported ignored."""
    if not isinstance(value, str) or not value:
        return None
    if value.startswith(SEAL):
        try:
            return base64.b64decode(value[len(SEAL):], validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            pass
    fields.ignore("input.reasoning.encrypted_content")
    return None


def text_format(text: Any, fields: Fields) -> dict[str, Any] | None:
    """``text.format`` as Chat Completions' response_format (``text.verbosity``, a style hint,
    is reported as ignored)."""
    if text is None:
        return None
    if not isinstance(text, dict):
        raise bad("text", "'text' must be an object like {\"format\": {\"type\": \"text\"}}.")
    for key in sorted(set(text) - {"format"}, key=str):
        fields.ignore(f"text.{key}")
    fmt = text.get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    raise bad("text.format.type", "'text.format.type' must be text, json_object or json_schema, "
                                  f"got {kind!r}.")


def reasoning_effort(reasoning: Any, fields: Fields) -> str | None:
    """``reasoning.effort`` as Chat Completions' ``reasoning_effort`` (max read as xhigh): a
    harmony template's effort, or for a template with ``enable_thinking``, none turns thinking
    off; the model's own length otherwise. A summary is not written (thinking comes back
    whole): ``reasoning.summary`` is reported as ignored."""
    if reasoning is None:
        return None
    if not isinstance(reasoning, dict):
        raise bad("reasoning", "'reasoning' must be an object like {\"effort\": \"low\"}.")
    for key in sorted(set(reasoning) - {"effort"}, key=str):
        if reasoning[key] is not None:
            fields.ignore(f"reasoning.{key}")
    effort = reasoning.get("effort")
    if effort not in (None, "none", "minimal", "low", "medium", "high", "xhigh", "max"):
        raise bad("reasoning.effort", f"'reasoning.effort' {effort!r} is not one of none, "
                                      "minimal, low, medium, high, xhigh, max.")
    return "xhigh" if effort == "max" else effort


def chat_body(body: dict[str, Any], history: list[dict[str, Any]], known_calls: set[str],
              box: Toolbox, fields: Fields) -> dict[str, Any]:
    """The Chat Completions body of a Responses request (``history``: the conversation of the
    response it continues; ``box``: its tools, read_tools)."""
    messages = list(history)
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise bad("instructions", "'instructions' must be a string.")
        messages = [m for m in messages if m["role"] != "system"]  # replaced, not stacked
        messages.insert(0, {"role": "system", "content": instructions})
    logprobs = wanted_logprobs(body, fields)
    messages += input_messages(body.get("input"), known_calls, fields)
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages,
                            "stream": bool(body.get("stream"))}
    for ours, theirs in (("max_output_tokens", "max_tokens"), ("temperature", "temperature"),
                         ("top_p", "top_p"), ("parallel_tool_calls", "parallel_tool_calls"),
                         ("seed", "seed")):
        if body.get(ours) is not None:
            chat[theirs] = body[ours]
    converted = {"tools": box.tools or None, "tool_choice": tool_choice(body.get("tool_choice")),
                 "response_format": text_format(body.get("text"), fields),
                 "reasoning_effort": reasoning_effort(body.get("reasoning"), fields)}
    chat.update({k: v for k, v in converted.items() if v is not None})
    if logprobs is not None:
        chat.update(logprobs=True, top_logprobs=logprobs)
    if not chat.get("tools"):
        chat.pop("tool_choice", None)
    return chat


def wanted_logprobs(body: dict[str, Any], fields: Fields) -> int | None:
    """How many alternatives each output token's logprob comes with, or None for no logprobs:
    asked for by ``include: ["message.output_text.logprobs"]`` or by ``top_logprobs``. The
    include values that name built-in tools' results are reported as ignored."""
    include = body.get("include")
    if include is not None:
        if not isinstance(include, list) or not all(isinstance(v, str) for v in include):
            raise bad("include", "'include' must be a list of strings.")
        for i, value in enumerate(include):
            if value not in INCLUDE_VALUES:
                raise bad(f"include[{i}]", f"'include[{i}]' {value!r} is not one of "
                                           f"{', '.join(sorted(INCLUDE_VALUES))}.")
            if value not in ("reasoning.encrypted_content", "message.output_text.logprobs"):
                fields.ignore(f"include.{value}")
    top = integer(body, "top_logprobs", 0, 20)
    if top is None and "message.output_text.logprobs" not in (include or []):
        return None
    return top or 0


def metadata(value: Any) -> dict[str, str] | None:
    """OpenAI's metadata: at most 16 pairs, keys up to 64 characters, values up to 512."""
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > 16 or not all(
            isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512
            for k, v in value.items()):
        raise bad("metadata", "'metadata' must be an object of at most 16 string pairs (keys up "
                              "to 64 characters, values up to 512).")
    return dict(value)


@contextmanager
def responses_names() -> Iterator[None]:
    """Errors raised inside name Chat Completions' fields in the Responses API's words."""
    try:
        yield
    except ApiError as e:
        if e.param is not None:
            head = e.param.split("[")[0].split(".")[0]
            if head in FIELD_NAMES:
                e.param = FIELD_NAMES[head] + e.param[len(head):]
                e.message = e.message.replace(f"'{head}'", f"'{FIELD_NAMES[head]}'")
        raise


class ResponsePlan:
    """A checked Responses request: the chat plan it runs as, and what the response echoes."""

    def __init__(self, body: Any, service: Any, fields: Fields | None = None) -> None:
        fields = fields or Fields(API)
        body = body_object(body)
        fields.check(body, FIELDS, IGNORED_FIELDS, TOLERATED_FIELDS, UNSUPPORTED_FIELDS)
        scheduler = service.generating()  # (a 400 for an embedding model)
        self.body = body
        self.store = body.get("store", True) is not False
        self.metadata = metadata(body.get("metadata"))
        self.sealed = "reasoning.encrypted_content" in (body.get("include") or [])
        self.tools = read_tools(body.get("tools"), fields)
        previous = body.get("previous_response_id")
        history, calls = [], set()
        if previous is not None:
            if not isinstance(previous, str):
                raise bad("previous_response_id", "'previous_response_id' must be a string.")
            _, history, calls = service.responses.get(previous)
        with responses_names(), accepting(policy_for(service.model, service.media)):
            chat = chat_body(body, history, calls, self.tools, fields)
            self.plan = openai_chat.chat_plan(chat, service.model, service.names,
                                              scheduler.max_length, fields, service.media)
        self.conversation = chat["messages"]
        self.calls = calls | {c["id"] for m in self.conversation for c in m.get("tool_calls") or []}
        self.id = new_id("resp")
        self.created = time.time()

    def response(self, status: str, output: list[dict[str, Any]], result: Result | None,
                 ) -> dict[str, Any]:
        """The Response object (``result``: for its usage, once finished)."""
        body, ran = self.body, self.plan.options[0]
        fmt = (body.get("text") or {}).get("format") or {"type": "text"}
        out: dict[str, Any] = {
            "id": self.id, "object": "response", "created_at": self.created, "status": status,
            "error": None, "incomplete_details": None, "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"), "model": self.plan.model,
            "output": output, "parallel_tool_calls": _given(body, "parallel_tool_calls", True),
            "previous_response_id": body.get("previous_response_id"),
            "reasoning": {"effort": (body.get("reasoning") or {}).get("effort"),
                          "summary": None},
            # what ran, not OpenAI's defaults (1.0): left out, a request runs the model's
            # generation defaults (greedy unless the folder ships sampling defaults)
            "store": self.store, "temperature": ran.temperature,
            "text": {"format": fmt}, "tool_choice": _given(body, "tool_choice", "auto"),
            "tools": body.get("tools") or [], "top_p": ran.top_p,
            "truncation": "disabled", "metadata": self.metadata or {},
        }
        if body.get("user") is not None:  # an optional string, never null
            out["user"] = body["user"]
        if status == "incomplete":
            out["incomplete_details"] = {"reason": "max_output_tokens"}
        if result is not None:
            cached = max(0, result.prompt_tokens - result.timings.prefill_tokens)
            out["usage"] = {"input_tokens": result.prompt_tokens,
                            "input_tokens_details": {"cached_tokens": cached,
                                                     "cache_write_tokens":
                                                         result.prompt_tokens - cached},
                            "output_tokens": len(result.token_ids),
                            "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
                            "total_tokens": result.prompt_tokens + len(result.token_ids)}
        return out

    reasoning_tokens = 0


def _given(body: dict[str, Any], key: str, default: Any) -> Any:
    """A request field echoed in the Response: the default when left out or null."""
    value = body.get(key)
    return default if value is None else value
