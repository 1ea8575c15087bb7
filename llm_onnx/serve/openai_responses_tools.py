"""The tools of a Responses request as the chat path takes them, and the model's calls as the
Responses API's output items.

    function    {"type": "function", "name", "description", "parameters", "strict"}
    namespace   {"type": "namespace", "name", "description", "tools": [function | custom]}:
                each tool exposed under its own name; a call of one comes back with its
                ``namespace`` (Codex CLI groups its sub-agent tools so)
    custom      {"type": "custom", "name", "description", "format": {"type": "text"} |
                 {"type": "grammar", "syntax": "lark" | "regex", "definition"}}: free text,
                held to the grammar by the constraint engine. The model sees a function of one
                string argument, ``input`` (its description says so, with the grammar), and
                writes ``{"input": "<text>"}``; the call comes back as a ``custom_tool_call``
                item with that text (Codex's ``apply_patch``)
    others      built-in tools of OpenAI's platform (``web_search``, ``file_search``,
                ``local_shell``, ``code_interpreter``, ...) that nothing here runs: left out of
                what the model sees and reported as ignored (``tools.web_search``; a 400 under
                --strict-fields)
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from llm_onnx.runtime.structured.constraint import ConstraintError
from llm_onnx.runtime.structured.json_string_grammar import checked_grammar
from llm_onnx.serve.errors import bad
from llm_onnx.serve.policy import Fields

# Built-in tools tool_choice may name (it cannot force one: a 400)
BUILT_IN_TOOLS = {"web_search", "web_search_preview", "web_search_preview_2025_03_11",
                  "file_search", "computer_use_preview", "computer", "code_interpreter",
                  "image_generation", "mcp", "local_shell", "shell", "apply_patch"}
_INPUT = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"],
          "additionalProperties": False}


@dataclass
class Toolbox:
    """A request's tools: as Chat Completions takes them, and what each name is."""

    tools: list[dict[str, Any]] = field(default_factory=list)
    custom: set[str] = field(default_factory=set)  # names of custom tools (free text)
    namespaces: dict[str, str] = field(default_factory=dict)  # a tool's name -> its namespace

    def output_item(self, call_id: str, name: str, arguments: str,
                    status: str = "completed") -> dict[str, Any]:
        """A call as its output item: ``function_call``, or ``custom_tool_call`` with the
        text."""
        if name in self.custom:
            return {"id": new_id("ctc"), "type": "custom_tool_call", "call_id": call_id,
                    "name": name, "input": custom_input(arguments), "status": status}
        item = {"id": new_id("fc"), "type": "function_call", "call_id": call_id, "name": name,
                "arguments": arguments, "status": status}
        if name in self.namespaces:
            item["namespace"] = self.namespaces[name]
        return item


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def custom_input(arguments: str) -> str:
    """A custom tool's text out of the arguments the model wrote (``{"input": "..."}``)."""
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return ""
    text = value.get("input") if isinstance(value, dict) else None
    return text if isinstance(text, str) else ""


def read_tools(value: Any, fields: Fields) -> Toolbox:
    """The request's ``tools`` (see the module docstring); a malformed tool is a 400 naming
    it."""
    box = Toolbox()
    if value is None:
        return box
    if not isinstance(value, list):
        raise bad("tools", "'tools' must be a list of tools.")
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind == "namespace":
            inner = tool.get("tools")
            if not isinstance(tool.get("name"), str) or not isinstance(inner, list):
                raise bad(where, f"'{where}' must be a namespace with a 'name' and 'tools'.")
            for j, member in enumerate(inner):
                kind_j = member.get("type") if isinstance(member, dict) else None
                if kind_j not in ("function", "custom"):
                    raise bad(f"{where}.tools[{j}].type", f"'{where}.tools[{j}].type' must be "
                                                          f"'function' or 'custom', got "
                                                          f"{kind_j!r}.")
                box.tools.append(_tool(member, f"{where}.tools[{j}]", box))
                box.namespaces[member["name"]] = tool["name"]
        elif kind in ("function", "custom"):
            box.tools.append(_tool(tool, where, box))
        else:
            fields.tolerate(f"tools.{kind}", bad(
                f"{where}.type", f"'{where}' is the built-in tool {kind!r}, which this server "
                                 "does not run; give function or custom tools."))
    return box


def _tool(tool: dict, where: str, box: Toolbox) -> dict[str, Any]:
    """A function or custom tool as Chat Completions' function tool."""
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise bad(f"{where}.name", f"'{where}.name' must be a non-empty string.")
    if tool["type"] == "function":
        function = {k: tool[k] for k in ("name", "description", "parameters", "strict")
                    if tool.get(k) is not None}
        return {"type": "function", "function": function}
    box.custom.add(name)
    description = tool.get("description") or ""
    if not isinstance(description, str):
        raise bad(f"{where}.description", f"'{where}.description' must be a string.")
    fmt = tool.get("format") or {"type": "text"}
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    out: dict[str, Any] = {"type": "function", "function": {"name": name, "parameters": _INPUT}}
    if kind == "text":
        note = 'Call it with {"input": "<free text>"}.'
    elif kind == "grammar" and fmt.get("syntax") in ("lark", "regex") and \
            isinstance(fmt.get("definition"), str) and fmt["definition"].strip():
        at = f"{where}.format.definition"
        note = ('Call it with {"input": "<text>"}, the text (not JSON) in this '
                f"{'Lark grammar' if fmt['syntax'] == 'lark' else 'regular expression'}:\n"
                f"{fmt['definition']}")
        if fmt["syntax"] == "lark":
            try:
                checked_grammar(fmt["definition"], at)
            except ConstraintError as e:
                raise bad(e.where or at, str(e)) from None
            out["input_grammar"] = fmt["definition"]
        else:
            pattern = {"type": "string", "pattern": f"^(?:{fmt['definition']})$"}
            out["function"]["parameters"] = {**_INPUT, "properties": {"input": pattern}}
    else:
        raise bad(f"{where}.format", f"'{where}.format' must be {{\"type\": \"text\"}} or "
                                     "{\"type\": \"grammar\", \"syntax\": \"lark\" | \"regex\", "
                                     "\"definition\": ...}.")
    out["function"]["description"] = f"{description}\n\n{note}".strip()
    return out


def tool_choice(value: Any) -> Any:
    """'auto' | 'none' | 'required' | {"type": "function" | "custom", "name"} in Chat
    Completions' form."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and value.get("type") in ("function", "custom"):
        return {"type": "function", "function": {"name": value.get("name")}}
    if isinstance(value, dict) and value.get("type") in BUILT_IN_TOOLS:
        raise bad("tool_choice", f"'tool_choice' names the built-in tool {value['type']!r}, "
                                 "which this server does not run.")
    raise bad("tool_choice", "'tool_choice' must be 'auto', 'none', 'required' or "
                             "{\"type\": \"function\", \"name\": ...}.")
