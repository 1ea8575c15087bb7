"""Anthropic's Messages API request (POST /v1/messages, /v1/messages/count_tokens) read into a
chat plan, field by field (``anthropic_messages``' parse step); every refusal is a 400 naming
the field by its path (``messages.1.content.0``), as Anthropic names them.

    model           the served model's name
    system          "text" | [{"type": "text", "text"}]            -> the system message
    messages        [{"role": "user" | "assistant" | "system", "content": "text" | [block]}]
                      user blocks       text, tool_result {"tool_use_id", "content", "is_error"}
                      assistant blocks  text, thinking, redacted_thinking (dropped),
                                        tool_use {"id", "name", "input"}
                      (anthropic_messages_turns.py)
    tools           [{"name", "description", "input_schema"}]        (client tools; "type"
                    absent or "custom"; a server tool is dropped and reported)
    tool_choice     {"type": "auto" | "any" | "tool" | "none", "name", "disable_parallel_tool_use"}
    thinking        {"type": "enabled", "budget_tokens"} | {"type": "adaptive"} | {"type": "disabled"}
    output_config   {"format": {"type": "json_schema", "schema"}, "effort"}
    max_tokens (required), stop_sequences, temperature, top_p, top_k, stream
    seed, min_p, repetition_penalty                                   (llm-onnx's own)

Thinking is off unless asked for: with a template that reads ``enable_thinking``, it gets that
switch; ``output_config.effort`` reaches a template that reads ``reasoning_effort`` (gpt-oss's).
``max_tokens`` beyond the context's room is cut to the room (a 400 under --strict-fields).
What the server accepts and ignores (``metadata``, ``cache_control`` blocks,
``context_management``, ``budget_tokens``, an effort the model has no levels of) is reported by
the field policy (policy.py). The ``anthropic-beta`` and ``anthropic-version`` headers are not
read: the fields a beta adds are what the policy sorts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from llm_onnx.errors import GenerationError
from llm_onnx.runtime.chat.dialects.base import ToolChoice
from llm_onnx.runtime.chat.render import template_variables
from llm_onnx.runtime.chat.request import ChatRequest, check_tool_choice, check_tools
from llm_onnx.runtime.model import Model
from llm_onnx.runtime.structured.constraint import Constraint, ConstraintError
from llm_onnx.serve.anthropic_messages_turns import chat_messages
from llm_onnx.serve.errors import ApiError, bad
from llm_onnx.serve.fields import (
    body_object,
    boolean,
    fit_length,
    integer,
    number,
    sampling,
    served_model,
    whole,
)
from llm_onnx.serve.media import MediaPolicy, accepting, place_images, policy_for, split
from llm_onnx.serve.names import ModelNames
from llm_onnx.serve.plan import CHAT, Plan
from llm_onnx.serve.policy import Fields
from llm_onnx.serve.system_turns import rendered

API = "messages"  # in the field policy's reports (policy.py)
# The field policy (policy.py). Ignored: hints and metadata. Tolerated: server-side context
# editing (Claude Code asks to keep everything). Unsupported: server-run containers and MCP.
IGNORED_FIELDS = {"metadata", "service_tier", "cache_control", "inference_geo", "speed",
                  "diagnostics"}
TOLERATED_FIELDS = {"context_management"}
UNSUPPORTED_FIELDS = {"container", "mcp_servers"}
COUNT_FIELDS = {"model", "messages", "system", "tools", "tool_choice", "thinking",
                "output_config"}  # count_tokens: the rest of FIELDS are tolerated there
# llm-onnx's own sampling fields (sent by the anthropic client as extra_body)
OWN_FIELDS = {"seed", "min_p", "repetition_penalty"}
FIELDS = COUNT_FIELDS | OWN_FIELDS | {"max_tokens", "stop_sequences", "temperature", "top_p",
                                      "top_k", "stream"}
EFFORTS = ("low", "medium", "high", "xhigh", "max")
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
    images: Any = None  # the prompt's images in place (RowImages), once rendered

    def render(self, model: Model) -> tuple[str, list[int]]:
        """The prompt's text and token ids (``messages`` become those rendered: system turns
        folded where the template needs it, system_turns.py)."""
        messages, sources = split(model, self.messages)
        try:
            self.messages, text = rendered(model, messages, tools=self.tools,
                                           template_vars=self.template_vars,
                                           continue_final_message=self.prefill)
            ids = model.encode_chat(text)
        except GenerationError as e:
            raise bad("messages", str(e)) from None
        if sources:
            self.images = place_images(model, ids, sources, text)
            ids = self.images.ids
        return text, ids


def messages_plan(body: Any, model: Model, served: str | ModelNames, context: int,
                  fields: Fields | None = None, media: MediaPolicy | None = None,
                  ) -> tuple[Plan, Conversation]:
    """POST /v1/messages, checked (its constraint is composed by structured.prepare;
    ``fields``: the field policy, lenient by default; ``media``: where images may come from,
    serve/media.py)."""
    fields = fields or Fields(API)
    body = _fields(body, FIELDS, served, fields)
    with accepting(policy_for(model, media)):
        conv = conversation(body, model, fields)
    if body.get("max_tokens") is None:
        raise bad("max_tokens", "Field required")
    options = _sampling(body, model)
    text, prompt = conv.render(model)
    try:
        chat = ChatRequest(model, text, conv.answer, conv.tools, conv.choice, conv.parallel)
    except ConstraintError as e:
        raise translated(bad(e.where, str(e))) from None
    # max_tokens is a bound: past the context it is cut to the room left (Claude Code asks
    # 32,000 of every model), as llama-server does; --strict-fields keeps Anthropic's 400
    new = fit_length(body, ("max_tokens",), prompt, context, None, "messages", low=0,
                     cut=not fields.strict)
    stream = bool(boolean(body, "stream"))
    plan = Plan(CHAT, str(served), [prompt], [replace(options, max_new_tokens=new)], 1, stream,
                  chat=chat, constraint=conv.answer, images=conv.images,
                  reuse_points=[] if conv.images is not None else model.reuse_points(
                      conv.messages, prompt, tools=conv.tools, template_vars=conv.template_vars))
    plan.id = f"msg_{plan.id.rsplit('-', 1)[-1][:24]}"
    return plan, conv


def count_tokens(body: Any, model: Model, served: str | ModelNames,
                 fields: Fields | None = None, media: MediaPolicy | None = None) -> int:
    """POST /v1/messages/count_tokens: the prompt's length (its images' tokens too)."""
    fields = fields or Fields(API)
    body = _fields(body, COUNT_FIELDS, served, fields)
    with accepting(policy_for(model, media)):
        conv = conversation(body, model, fields)
    return len(conv.render(model)[1])


def _fields(body: Any, allowed: set[str], served: str | ModelNames, fields: Fields) -> dict:
    body = body_object(body)
    fields.check(body, allowed, IGNORED_FIELDS, TOLERATED_FIELDS, UNSUPPORTED_FIELDS,
                 unknown=lambda name: "Extra inputs are not permitted")
    served_model(body, served)
    return body


def conversation(body: dict, model: Model, fields: Fields) -> Conversation:
    if not model.chat_template:
        raise bad("messages", "this model has no chat template; use /v1/completions.")
    tools, choice, parallel = _tools(body, model.chat_template, fields)
    answer, effort = _output_config(body.get("output_config"), model, fields)
    template_vars, omit = _thinking(body, model, fields)
    if effort:
        template_vars = {**(template_vars or {}), **effort}
    if _cache_control(body):
        fields.ignore("cache_control")
    messages, prefill = chat_messages(body.get("messages"), body.get("system"))
    return Conversation(messages, None if choice == "none" else tools, choice, parallel,
                        template_vars, prefill, answer, omit)


def _cache_control(body: dict) -> bool:
    """Whether a block or a tool carries ``cache_control`` (prompt caching needs no marks
    here: a request reuses whatever prefix the server holds)."""
    system = body.get("system")
    blocks = [*(body.get("tools") or []), *(system if isinstance(system, list) else [])]
    for m in body.get("messages") or []:
        if isinstance(m, dict) and isinstance(m.get("content"), list):
            blocks += m["content"]
    return any(isinstance(b, dict) and "cache_control" in b for b in blocks)


def _tools(body: dict, template: str, fields: Fields,
           ) -> tuple[list[dict] | None, ToolChoice, bool]:
    """Anthropic's tools and tool_choice as OpenAI's (what ChatRequest and templates take); a
    server tool (a ``type`` other than "custom": web search, code execution, ...) is left out of
    what the model sees and reported."""
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise bad("tools", "must be a list of tools.")
    converted = []
    for i, tool in enumerate(tools or []):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind not in (None, "custom"):
            fields.tolerate(f"tools.{kind}", bad(f"tools.{i}.type", f"server tools ({kind!r}) "
                            "are not run by this server; give tools with a name and "
                            "input_schema."))
            continue
        converted.append(_tool(tool, f"tools.{i}"))
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


def _thinking(body: dict, model: Model, fields: Fields) -> tuple[dict[str, Any] | None, bool]:
    """(template variables, whether thinking comes back omitted) of ``thinking``. A budget is
    checked but not kept to (the model thinks until it closes its block or max_tokens): it is
    reported as ignored, as is thinking asked of a model that does not think."""
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
        fields.ignore("thinking.budget_tokens")
    display = thinking.get("display") if on else None
    if display not in (None, "summarized", "omitted"):
        raise bad("thinking.display", "must be 'summarized' or 'omitted'.")
    switch = "enable_thinking" in template_variables(model.chat_template or "")
    if on and not switch and not model.splits_reasoning:
        fields.ignore("thinking")
    if not switch:
        return None, display == "omitted"
    return {"enable_thinking": on}, display == "omitted"


def _output_config(config: Any, model: Model, fields: Fields,
                   ) -> tuple[Constraint | None, dict[str, Any] | None]:
    """(the answer's constraint, template variables) of ``output_config``: a ``format``'s JSON
    schema constrains the text; an ``effort`` reaches a template that reads
    ``reasoning_effort`` (gpt-oss's low, medium, high) and is reported as ignored otherwise."""
    if config is None:
        return None, None
    if not isinstance(config, dict):
        raise bad("output_config", "must be an object with 'format' and/or 'effort'.")
    for key in sorted(set(config) - {"format", "effort"}, key=str):
        fields.tolerate(f"output_config.{key}", "Extra inputs are not permitted")
    effort, variables = config.get("effort"), None
    if effort is not None:
        if effort not in EFFORTS:
            raise bad("output_config.effort", f"must be one of {', '.join(EFFORTS)}, got "
                                                f"{effort!r}.")
        if "reasoning_effort" in template_variables(model.chat_template or ""):
            variables = {"reasoning_effort": "high" if effort in ("xhigh", "max") else effort}
        else:
            fields.ignore("output_config.effort")
    fmt = config.get("format")
    if fmt is None:
        return None, variables
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or \
            not isinstance(fmt.get("schema"), dict):
        raise bad("output_config.format", "must be {\"type\": \"json_schema\", \"schema\": "
                                            "{...}}.")
    try:
        return Constraint.json_schema(fmt["schema"], "output_config.format.schema"), variables
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
