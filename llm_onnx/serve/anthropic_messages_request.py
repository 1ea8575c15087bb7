"""Anthropic's Messages API request (POST /v1/messages, /v1/messages/count_tokens) read into a
chat plan, field by field (``anthropic_messages``' parse step); every refusal is a 400 naming
the field by its path (``messages.1.content.0``), as Anthropic names them.

    model           the served model's name
    system          "text" | [{"type": "text", "text"}]            -> the system message
    messages        [{"role": "user" | "assistant", "content": "text" | [block]}]
                      user blocks       text, tool_result {"tool_use_id", "content", "is_error"}
                      assistant blocks  text, thinking, redacted_thinking (dropped),
                                        tool_use {"id", "name", "input"}
    tools           [{"name", "description", "input_schema"}]        (client tools)
    tool_choice     {"type": "auto" | "any" | "tool" | "none", "name", "disable_parallel_tool_use"}
    thinking        {"type": "enabled", "budget_tokens"} | {"type": "adaptive"} | {"type": "disabled"}
    output_config   {"format": {"type": "json_schema", "schema"}}      (structured output)
    max_tokens (required), stop_sequences, temperature, top_p, top_k, stream, metadata
    seed, min_p, repetition_penalty                                   (llm-onnx's own)

As the chat template sees them (as OpenAI's chat does): tool_use blocks are the assistant's
``tool_calls``, tool_result blocks ``tool`` messages, thinking its ``reasoning_content``, the
text blocks of a message its content (joined by blank lines). Consecutive messages of one role
are one turn (Anthropic combines them); the first must be the user's. A final assistant message
is a prefill: the reply continues its text. Thinking is off unless asked for: with a template
that reads ``enable_thinking``, it gets that switch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from llm_onnx.errors import GenerationError
from llm_onnx.runtime.chat.render import template_variables
from llm_onnx.runtime.chat.request import ChatRequest, check_tool_choice, check_tools
from llm_onnx.runtime.chat.dialects.base import ToolChoice
from llm_onnx.runtime.model import Model
from llm_onnx.runtime.structured.constraint import Constraint, ConstraintError
from llm_onnx.serve.errors import ApiError, bad, text_only
from llm_onnx.serve.fields import (body_object, boolean, fit_length, integer, number, sampling,
                                   served_model, whole)
from llm_onnx.serve.plan import CHAT, Plan

# Fields of a Messages request (FIELDS; count_tokens takes COUNT_FIELDS). Accepted and ignored:
# they change nothing computed here. Unsupported: a 400 naming the field unless empty.
IGNORED_FIELDS = {"metadata", "service_tier", "cache_control", "inference_geo", "speed",
                  "diagnostics"}
UNSUPPORTED_FIELDS = {"container", "mcp_servers", "context_management"}
COUNT_FIELDS = {"model", "messages", "system", "tools", "tool_choice", "thinking",
                "output_config"} | IGNORED_FIELDS | UNSUPPORTED_FIELDS
# llm-onnx's own sampling fields (sent by the anthropic client as extra_body)
OWN_FIELDS = {"seed", "min_p", "repetition_penalty"}
FIELDS = COUNT_FIELDS | OWN_FIELDS | {"max_tokens", "stop_sequences", "temperature", "top_p",
                                      "top_k", "stream"}
_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")


@dataclass
class Conversation:
    """A checked Messages request: the chat as the template takes it, and how to answer."""

    messages: list[dict[str, Any]]
    tools: list[dict] | None  # OpenAI's shape, as templates take them (None: not rendered)
    choice: ToolChoice
    parallel: bool
    template_vars: dict[str, Any] | None
    prefill: bool  # the reply continues the final (assistant) message
    answer: Constraint | None
    omit_thinking: bool  # thinking.display "omitted": thinking blocks come back empty

    def render(self, model: Model) -> tuple[str, list[int]]:
        """The prompt's text and token ids."""
        try:
            text = model.render_chat(self.messages, tools=self.tools,
                                     template_vars=self.template_vars,
                                     continue_final_message=self.prefill)
            return text, model.encode_chat(text)
        except GenerationError as e:
            raise bad("messages", str(e)) from None


def messages_plan(body: Any, model: Model, served: str,
                  context: int) -> tuple[Plan, Conversation]:
    """POST /v1/messages, checked (its constraint is composed by structured.prepare)."""
    body = _fields(body, FIELDS, served)
    conv = conversation(body, model)
    if body.get("max_tokens") is None:
        raise bad("max_tokens", "Field required")
    options = _sampling(body, model)
    text, prompt = conv.render(model)
    try:
        chat = ChatRequest(model, text, conv.answer, conv.tools, conv.choice, conv.parallel)
    except ConstraintError as e:
        raise translated(bad(e.where, str(e))) from None
    new = fit_length(body, ("max_tokens",), prompt, context, None, "messages", low=0)
    stream = bool(boolean(body, "stream"))
    plan = Plan(CHAT, served, [prompt], [replace(options, max_new_tokens=new)], 1, stream,
                  chat=chat, constraint=conv.answer,
                  reuse_points=model.reuse_points(conv.messages, prompt, tools=conv.tools,
                                                  template_vars=conv.template_vars))
    plan.id = f"msg_{plan.id.rsplit('-', 1)[-1][:24]}"
    return plan, conv


def count_tokens(body: Any, model: Model, served: str) -> int:
    """POST /v1/messages/count_tokens: the prompt's length."""
    return len(conversation(_fields(body, COUNT_FIELDS, served), model).render(model)[1])


def _fields(body: Any, allowed: set[str], served: str) -> dict:
    body = body_object(body)
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise bad(unknown[0], "Extra inputs are not permitted")
    served_model(body, served)
    for name in sorted(UNSUPPORTED_FIELDS):
        if body.get(name) not in (None, [], {}):
            raise bad(name, "not supported by this server.")
    return body


def conversation(body: dict, model: Model) -> Conversation:
    if not model.chat_template:
        raise bad("messages", "this model has no chat template; use /v1/completions.")
    tools, choice, parallel = _tools(body, model.chat_template)
    answer = _output_format(body.get("output_config"))
    template_vars, omit = _thinking(body, model)
    messages, prefill = _messages(body.get("messages"), _system(body.get("system")))
    return Conversation(messages, None if choice == "none" else tools, choice, parallel,
                        template_vars, prefill, answer, omit)


def _system(system: Any) -> list[dict[str, Any]]:
    if system is None or system == "" or system == []:
        return []
    return [{"role": "system", "content": _text(system, "system")}]


def _text(content: Any, where: str) -> str:
    """A string, or a list of text blocks joined by blank lines."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(where, "must be a string or a list of text blocks.")
    texts = []
    for i, block in enumerate(content):
        kind = _kind(block, f"{where}.{i}")
        if kind in ("image", "document"):
            raise text_only(f"{where}.{i}", f"an {kind} block")
        if kind != "text":
            raise bad(f"{where}.{i}.type", f"expected a text block, got {kind!r}.")
        texts.append(_block_text(block, f"{where}.{i}"))
    return "\n\n".join(texts)


def _kind(block: Any, where: str) -> str:
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise bad(where, "a content block must be an object with a 'type'.")
    return block["type"]


def _block_text(block: dict, where: str) -> str:
    if not isinstance(block.get("text"), str) or not block["text"]:
        raise bad(f"{where}.text", "text content blocks must be non-empty strings.")
    return block["text"]


def _messages(messages: Any, system: list[dict]) -> tuple[list[dict[str, Any]], bool]:
    """The chat messages of ``messages`` after ``system``, and whether the last one is a
    prefill (see the module docstring)."""
    if not isinstance(messages, list) or not messages:
        raise bad("messages", "must be a non-empty list of {\"role\", \"content\"} objects.")
    turns: list[tuple[str, list[tuple[str, dict]]]] = []  # role, [(path, block)]
    for i, m in enumerate(messages):
        where = f"messages.{i}"
        if not isinstance(m, dict) or set(m) - {"role", "content"}:
            raise bad(where, "a message is an object with 'role' and 'content' only.")
        role = m.get("role")
        if role not in ("user", "assistant"):
            raise bad(f"{where}.role", f"must be 'user' or 'assistant', got {role!r} (a "
                                         "system prompt goes in the top-level 'system').")
        if not turns and role != "user":
            raise bad(f"{where}.role", "the first message must use the 'user' role.")
        content = m.get("content")
        blocks = [(f"{where}.content", {"type": "text", "text": content})] \
            if isinstance(content, str) else None
        if blocks is None:
            if not isinstance(content, list):
                raise bad(f"{where}.content", "must be a string or a list of content blocks.")
            blocks = [(f"{where}.content.{j}", b) for j, b in enumerate(content)]
        if not blocks:
            if role == "assistant" and i == len(messages) - 1:
                continue  # an empty final message: nothing to continue
            raise bad(f"{where}.content", "must not be empty (only the final assistant "
                                            "message may be).")
        if turns and turns[-1][0] == role:  # one turn, as Anthropic combines them
            turns[-1][1].extend(blocks)
        else:
            turns.append((role, blocks))
    out, calls = list(system), {}
    for k, (role, blocks) in enumerate(turns):
        last = k == len(turns) - 1
        if role == "user":
            out += _user(blocks, calls)
            calls = {}
        else:
            message, calls = _assistant(blocks, last)
            if message is not None:
                out.append(message)
    return out, out[-1]["role"] == "assistant"


def _user(blocks: list[tuple[str, dict]], calls: dict[str, str]) -> list[dict[str, Any]]:
    """A user turn: its tool results as ``tool`` messages, then its text."""
    out, texts, answered = [], [], set()
    for where, block in blocks:
        kind = _kind(block, where)
        if kind == "text":
            texts.append(_block_text(block, where))
        elif kind == "tool_result":
            out.append(_tool_result(block, where, calls))
            answered.add(block["tool_use_id"])
        elif kind in ("image", "document"):
            raise text_only(where, f"an {kind} block")
        else:
            raise bad(f"{where}.type", f"{kind!r} blocks are not supported in a user message "
                                         "(text and tool_result are).")
    missing = [i for i in calls if i not in answered]
    if missing:
        raise bad(blocks[0][0].rsplit(".content", 1)[0], "tool_use ids were found without "
                    f"tool_result blocks immediately after: {', '.join(missing)}. Each tool_use "
                    "block must have a tool_result block in the next message.")
    if texts:
        out.append({"role": "user", "content": "\n\n".join(texts)})
    return out


def _tool_result(block: dict, where: str, calls: dict[str, str]) -> dict[str, Any]:
    tool_id = block.get("tool_use_id")
    if not isinstance(tool_id, str):
        raise bad(f"{where}.tool_use_id", "must be a string (the tool_use block's id).")
    if tool_id not in calls:
        raise bad(f"{where}.tool_use_id", f"unexpected tool_use_id {tool_id!r} in a "
                    "tool_result block: each tool_result must answer a tool_use block of the "
                    "previous (assistant) message.")
    content = block.get("content", "")
    text = "" if content in ("", []) else _text(content, f"{where}.content")
    if block.get("is_error") not in (None, False, True):
        raise bad(f"{where}.is_error", "must be true or false.")
    if block.get("is_error"):
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": tool_id, "name": calls[tool_id], "content": text}


def _assistant(blocks: list[tuple[str, dict]], last: bool,
               ) -> tuple[dict[str, Any] | None, dict[str, str]]:
    """An assistant turn as one message (None: empty and last), and its calls {id: name}."""
    texts, thinking, calls = [], [], []
    for where, block in blocks:
        kind = _kind(block, where)
        if kind == "text":
            if block.get("text") == "" and last and len(blocks) == 1:
                return None, {}  # an empty final message: nothing to continue
            texts.append(_block_text(block, where))
        elif kind == "thinking":
            if not isinstance(block.get("thinking"), str):
                raise bad(f"{where}.thinking", "must be a string.")
            thinking.append(block["thinking"])
        elif kind == "tool_use":
            calls.append(_tool_use(block, where))
        elif kind != "redacted_thinking":
            raise bad(f"{where}.type", f"{kind!r} blocks are not supported in an assistant "
                        "message (text, thinking and tool_use are).")
    if last and calls:
        raise bad(blocks[0][0].rsplit(".content", 1)[0], "the final assistant message is "
                    "continued by the reply, so it may not hold tool_use blocks; add the "
                    "tool_result in a user message after it.")
    if last and texts and texts[-1] != texts[-1].rstrip():
        raise bad(blocks[-1][0], "final assistant content cannot end with trailing "
                                   "whitespace.")
    if last and not texts:
        raise bad(blocks[0][0], "the final assistant message (a prefill the reply "
                                  "continues) must hold text.")
    message: dict[str, Any] = {"role": "assistant", "content": "\n\n".join(texts)}
    if thinking:
        message["reasoning_content"] = "\n\n".join(thinking)
    if calls:
        message["tool_calls"] = calls
    return message, {c["id"]: c["function"]["name"] for c in calls}


def _tool_use(block: dict, where: str) -> dict[str, Any]:
    if not isinstance(block.get("id"), str) or not block["id"]:
        raise bad(f"{where}.id", "must be a non-empty string.")
    if not isinstance(block.get("name"), str) or not block["name"]:
        raise bad(f"{where}.name", "must be a non-empty string.")
    if not isinstance(block.get("input"), dict):
        raise bad(f"{where}.input", "must be an object (the tool's arguments).")
    return {"id": block["id"], "type": "function",
            "function": {"name": block["name"], "arguments": block["input"]}}


def _tools(body: dict, template: str) -> tuple[list[dict] | None, ToolChoice, bool]:
    """Anthropic's tools and tool_choice as OpenAI's (what ChatRequest and templates take)."""
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise bad("tools", "must be a list of tools.")
    converted = [_tool(t, f"tools.{i}") for i, t in enumerate(tools or [])]
    if converted and "tools" not in template_variables(template):
        raise bad("tools", "this model's chat template does not render tools; start the "
                             "server with --chat-template FILE naming a template that does.")
    choice, parallel = _tool_choice(body.get("tool_choice"))
    if not converted and choice not in (None, "auto", "none"):
        raise bad("tool_choice", "forces a tool call, but no tools are given.")
    try:
        checked = check_tools(converted)
        return checked, check_tool_choice(choice if checked else None, checked), parallel
    except ConstraintError as e:
        raise translated(bad(e.where, str(e))) from None


def _tool(tool: Any, where: str) -> dict[str, Any]:
    if not isinstance(tool, dict):
        raise bad(where, "a tool must be an object with 'name' and 'input_schema'.")
    if tool.get("type") not in (None, "custom"):
        raise bad(f"{where}.type", f"server tools ({tool['type']!r}) are not supported by "
                                     "this server; give tools with a name and input_schema.")
    name = tool.get("name")
    if not isinstance(name, str) or not _TOOL_NAME.match(name):
        raise bad(f"{where}.name", "must be 1 to 128 letters, digits, '_' or '-'.")
    schema = tool.get("input_schema")
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise bad(f"{where}.input_schema", "must be a JSON Schema object with \"type\": "
                                             "\"object\".")
    if not isinstance(tool.get("description", ""), str):
        raise bad(f"{where}.description", "must be a string.")
    function = {"name": name, "parameters": schema}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


_CHOICES = {"auto": "auto", "any": "required", "none": "none"}


def _tool_choice(choice: Any) -> tuple[ToolChoice | None, bool]:
    """(OpenAI's tool_choice, parallel calls) of Anthropic's."""
    if choice is None:
        return None, True
    if not isinstance(choice, dict) or choice.get("type") not in (*_CHOICES, "tool"):
        raise bad("tool_choice", "must be {\"type\": \"auto\"}, {\"type\": \"any\"}, "
                                   "{\"type\": \"tool\", \"name\": ...} or {\"type\": \"none\"}.")
    single = choice.get("disable_parallel_tool_use")
    if single not in (None, True, False):
        raise bad("tool_choice.disable_parallel_tool_use", "must be true or false.")
    if choice["type"] != "tool":
        return _CHOICES[choice["type"]], not single
    if not isinstance(choice.get("name"), str):
        raise bad("tool_choice.name", "must name one of the tools.")
    return {"type": "function", "function": {"name": choice["name"]}}, not single


def _thinking(body: dict, model: Model) -> tuple[dict[str, Any] | None, bool]:
    """(template variables, whether thinking comes back omitted) of ``thinking``."""
    thinking = body.get("thinking")
    kinds = ("enabled", "adaptive", "disabled")
    if thinking is not None and (not isinstance(thinking, dict) or
                                 thinking.get("type") not in kinds):
        raise bad("thinking", "must be {\"type\": \"enabled\", \"budget_tokens\": N}, "
                                "{\"type\": \"adaptive\"} or {\"type\": \"disabled\"}.")
    on = thinking is not None and thinking["type"] != "disabled"
    if on and thinking["type"] == "enabled":
        budget, limit = whole(thinking.get("budget_tokens")), whole(body.get("max_tokens"))
        if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
            raise bad("thinking.budget_tokens", "Field required" if budget is None else
                        f"must be an integer >= 1 (and less than max_tokens), got {budget!r}.")
        if isinstance(limit, int) and budget >= limit:
            raise bad("thinking.budget_tokens", f"must be less than max_tokens ({limit}).")
    display = thinking.get("display") if on else None
    if display not in (None, "summarized", "omitted"):
        raise bad("thinking.display", "must be 'summarized' or 'omitted'.")
    if "enable_thinking" not in template_variables(model.chat_template or ""):
        return None, display == "omitted"
    return {"enable_thinking": on}, display == "omitted"


def _output_format(config: Any) -> Constraint | None:
    if config is None:
        return None
    if not isinstance(config, dict) or set(config) - {"format", "effort"}:
        raise bad("output_config", "must be an object with 'format' (and 'effort').")
    fmt = config.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or \
            not isinstance(fmt.get("schema"), dict):
        raise bad("output_config.format", "must be {\"type\": \"json_schema\", \"schema\": "
                                            "{...}}.")
    try:
        return Constraint.json_schema(fmt["schema"], "output_config.format.schema")
    except ConstraintError as e:
        raise bad(e.where, str(e)) from None


def _sampling(body: dict, model: Model) -> Any:
    stops = body.get("stop_sequences")
    if stops is not None and (not isinstance(stops, list) or not all(
            isinstance(s, str) and s for s in stops)):
        raise bad("stop_sequences", "must be a list of non-empty strings.")
    fields = {"stop": stops, **{name: body[name] for name in OWN_FIELDS if name in body}}
    for name, value in (("temperature", number(body, "temperature", 0, 1)),
                        ("top_p", number(body, "top_p", 0, 1, low_open=True)),
                        ("top_k", integer(body, "top_k", 0))):
        fields[name] = value
    return sampling(fields, model.defaults, model.engine.vocab_size)


_PATHS = [(re.compile(r"tools\[(\d+)\]\.function\.parameters"), r"tools.\1.input_schema"),
          (re.compile(r"tools\[(\d+)\]\.function\.(\w+)"), r"tools.\1.\2"),
          (re.compile(r"tools\[(\d+)\]"), r"tools.\1"),
          (re.compile(r"tool_choice\.function\.name"), "tool_choice.name")]


def translated(error: ApiError) -> ApiError:
    """``error`` with the fields of OpenAI's shapes (``tools[0].function.parameters``) named as
    a Messages request names them (``tools.0.input_schema``)."""
    def rename(text: str | None) -> str | None:
        for pattern, name in _PATHS:
            text = pattern.sub(name, text) if text is not None else None
        return text

    error.param, error.message = rename(error.param), rename(error.message)
    return error


__all__ = ["Conversation", "count_tokens", "messages_plan", "translated"]
