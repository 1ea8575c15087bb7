"""A chat reply's constraint and its parts: tools and tool_choice, a reasoning model's think block,
a chat template given in place of the folder's.

``ChatRequest`` is what ``Model.chat`` and the server share: it holds the model's dialect
(``llm_onnx.runtime.chat.dialects``) and asks it for the reply's constraint (the answer's own
constraint, a tool choice's grammar, a free think block before either), the reader of the reply
as it streams and the reply read back into thinking, content and tool calls.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from llm_onnx.errors import GenerationError
from llm_onnx.runtime.chat.dialects import ChatDialect, choosable_tool_dialects
from llm_onnx.runtime.chat.dialects.base import ReplyReader, ToolCallDelta, ToolChoice
from llm_onnx.runtime.chat.render import render_chat
from llm_onnx.runtime.generation.results import Result, ToolCall
from llm_onnx.runtime.structured.constraint import Constraint, ConstraintError
from llm_onnx.runtime.structured.matcher import Constraints

TOOL_CHOICES = ("none", "auto", "required")


class ChatModel(Protocol):
    """What a ChatRequest needs of its model (llm_onnx.runtime.Model is one)."""

    dialect: ChatDialect  # how its replies write thinking and tool calls

    @property
    def constraints(self) -> Constraints: ...


def check_tools(tools: Any, where: str = "tools") -> list[dict] | None:
    """OpenAI's tool list, checked: [{"type": "function", "function": {"name", "description",
    "parameters"}}]. None or [] -> None. A tool may also carry ``input_grammar`` (a Lark
    grammar: OpenAI's custom tools): it is called with ``{"input": "<text in the grammar>"}``
    (dialects/tagged_calls.py)."""
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise ConstraintError(f"'{where}' must be a list of {{\"type\": \"function\", "
                              "\"function\": {...}} objects.", where)
    names = set()
    for i, tool in enumerate(tools):
        at = f"{where}[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise ConstraintError(f"'{at}' must be an object with \"type\": \"function\".", at)
        function = tool.get("function")
        if not isinstance(function, dict):
            raise ConstraintError(f"'{at}.function' must be an object with a 'name' (and "
                                  "'description', 'parameters').", f"{at}.function")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise ConstraintError(f"'{at}.function.name' must be a non-empty string.",
                                  f"{at}.function.name")
        if name in names:
            raise ConstraintError(f"'{at}.function.name': {name!r} is named twice.",
                                  f"{at}.function.name")
        names.add(name)
        if not isinstance(function.get("description", ""), str):
            raise ConstraintError(f"'{at}.function.description' must be a string.",
                                  f"{at}.function.description")
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise ConstraintError(f"'{at}.function.parameters' must be a JSON Schema object.",
                                  f"{at}.function.parameters")
    return tools


def check_tool_choice(choice: Any, tools: list[dict] | None, where: str = "tool_choice",
                      ) -> ToolChoice:
    """"none" | "auto" | "required" | {"type": "function", "function": {"name": ...}}; the
    default is "auto" with tools, "none" without."""
    if choice is None:
        return "auto" if tools else "none"
    if isinstance(choice, str):
        if choice not in TOOL_CHOICES:
            raise ConstraintError(f"'{where}' must be one of {', '.join(TOOL_CHOICES)} or "
                                  "{\"type\": \"function\", \"function\": {\"name\": ...}}, got "
                                  f"{choice!r}.", where)
    elif not (isinstance(choice, dict) and choice.get("type") == "function"
              and isinstance(choice.get("function"), dict)
              and isinstance(choice["function"].get("name"), str)):
        raise ConstraintError(f"'{where}' must be \"none\", \"auto\", \"required\" or "
                              "{\"type\": \"function\", \"function\": {\"name\": ...}}.", where)
    if choice != "none" and not tools:
        raise ConstraintError(f"'{where}' is {json.dumps(choice)} but no tools are given.", where)
    if isinstance(choice, dict):
        name = choice["function"]["name"]
        if name not in [t["function"]["name"] for t in tools or []]:
            raise ConstraintError(f"'{where}' names the function {name!r}, which is not in "
                                  "tools.", f"{where}.function.name")
    return choice


TEMPLATES = Path(__file__).parent / "templates"  # chat templates shipped with llm-onnx


def builtin_templates() -> list[str]:
    """Names of the chat templates that come with llm-onnx (``--chat-template NAME``)."""
    return sorted(p.stem for p in TEMPLATES.glob("*.jinja"))


def read_chat_template(source: str | Path, special_tokens: dict[str, str]) -> str:
    """A chat template given in place of a folder's, checked: it must render a two-message
    conversation. ``source`` is a file (a Jinja template, or a tokenizer_config.json with a
    ``chat_template``), the name of one that comes with llm-onnx (``chatml-tools``), or the
    template's text itself (a string with ``{{`` or ``{%``). The error names the file."""
    if isinstance(source, str) and ("{{" in source or "{%" in source):
        text, label = source, "--chat-template"
    else:
        path = Path(source)
        if not path.exists() and str(source) in builtin_templates():
            path = TEMPLATES / f"{source}.jinja"
        label = f"--chat-template {path}"
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise GenerationError(f"{label}: no such file, nor a template that comes with "
                                  f"llm-onnx ({', '.join(builtin_templates())}).") from None
        except OSError as e:
            raise GenerationError(f"{label}: cannot read it ({e.strerror}).") from None
        except UnicodeDecodeError as e:
            raise GenerationError(f"{label}: not valid UTF-8 (byte {e.start}).") from None
        if path.suffix == ".json":  # tokenizer_config.json
            try:
                text = json.loads(text)["chat_template"]
            except (ValueError, KeyError, TypeError):
                raise GenerationError(f"{label}: a JSON file must hold a \"chat_template\" "
                                      "string (as tokenizer_config.json does).") from None
            if not isinstance(text, str):
                raise GenerationError(f"{label}: its \"chat_template\" is not a single "
                                      "template string.")
    user, reply = "Where is the user's message?", "Here is the assistant's reply."
    try:
        both = render_chat(text, [{"role": "user", "content": user},
                                  {"role": "assistant", "content": reply}], special_tokens, False)
        render_chat(text, [{"role": "user", "content": user}], special_tokens, True)
    except GenerationError as e:
        raise GenerationError(f"{label}: it does not render a two-message conversation: "
                              f"{e}") from None
    if user not in both or reply not in both:
        raise GenerationError(f"{label}: it does not render a two-message conversation (the "
                              "messages' contents are not in its output); is it a chat "
                              "template?")
    return text


@dataclass
class ChatRequest:
    """One chat reply to produce: its prompt's tools and tool choice, the answer's constraint.

    Args:
        model: the model (its dialect, its constraint engine).
        prompt: the rendered prompt text.
        answer: what a reply that calls no tool must match (None: any text).
        tools, tool_choice, parallel: OpenAI's tools, tool_choice, parallel_tool_calls.
    """

    model: ChatModel
    prompt: str
    answer: Constraint | None = None
    tools: list[dict] | None = None
    tool_choice: ToolChoice = "none"
    parallel: bool = True
    # the prompt's images, each (source, the name errors give it): chat/image_parts.py
    images: list = field(default_factory=list)
    dialect: ChatDialect = field(init=False)

    def __post_init__(self) -> None:
        self.dialect = self.model.dialect
        if self.calls_tools and self.dialect.tool_format is None:
            raise ConstraintError("this model's chat template writes no tool calls that "
                                  "llm-onnx recognises: give --tool-call-format ("
                                  f"{', '.join(choosable_tool_dialects())}).", "tools")
        free = [i for i, t in enumerate(self.tools or []) if "input_grammar" in t]
        if self.calls_tools and free and not self.dialect.free_form:
            raise ConstraintError(f"'tools[{free[0]}]' takes free text in a grammar, which this "
                                  f"model's tool-call format ({self.dialect.tool_format}) "
                                  "cannot write; give it as a function tool.",
                                  f"tools[{free[0]}]")
        # A forced call (tool_choice "required" or a named function) leaves no text for an
        # answer's format to hold: the format then applies to nothing, as with OpenAI's API
        # (its Agents SDK sends both when an agent with a typed output must call a tool).

    @property
    def calls_tools(self) -> bool:
        """The reply may call tools: tools are given and tool_choice is not "none"."""
        return bool(self.tools) and self.tool_choice != "none"

    @property
    def thinking(self) -> bool | None:
        """True if the reply starts inside a think block; None: no reasoning split (a harmony
        reply is split by channel: False)."""
        return self.dialect.thinking(self.prompt)

    def constraint(self) -> Constraint | None:
        """The reply's constraint: the tool choice's grammar (with the answer's constraint for
        "auto") or the answer's, after a free think block for a reasoning model."""
        return self.dialect.constraint(self)

    def checked_tools(self) -> list[dict]:
        """The tools with each schema as the constraint engine takes it (tightened if need be;
        a schema's errors name its path)."""
        constraints = self.model.constraints
        tools = []
        for i, tool in enumerate(self.tools or []):
            parameters = tool["function"].get("parameters")
            if parameters is not None:
                parameters = json.loads(constraints.compile(Constraint.json_schema(
                    parameters, where=f"tools[{i}].function.parameters")).source)
                tool = {**tool, "function": {**tool["function"], "parameters": parameters}}
            tools.append(tool)
        return tools

    def options_for(self, options: Any) -> Any:
        """``options`` (GenerationOptions) with this reply's constraint (and the dialect's
        markers kept in the text for its reader)."""
        keep = self.dialect.keep_special
        if keep:
            keep = tuple(dict.fromkeys(options.keep_special + keep))
            return replace(options, constraint=self.constraint(), keep_special=keep)
        return replace(options, constraint=self.constraint())

    def special_id(self, marker: str) -> int | None:
        """The token id of ``marker`` if it is a special token of the tokenizer."""
        return self.model.constraints.special_token(marker)

    # ------------------------------------------------------------------ reading the reply

    def stream(self) -> ReplyReader:
        """The reply's reader as it streams: text in, ChatPieces and ToolCallDeltas out."""
        return self.dialect.reader(self)

    def read(self, result: Result) -> Result:
        """``result`` with its thinking apart (``reasoning``) and its tool calls parsed
        (``tool_calls``; ``text`` is then the content around them)."""
        text, reasoning, calls = self.dialect.read(self, result.text)
        return replace(result, text=text, reasoning=reasoning, tool_calls=calls)


def collect_calls(deltas: Sequence[ToolCallDelta]) -> list[ToolCall]:
    """Whole calls from their streamed deltas (in index order)."""
    calls: dict[int, list[str]] = {}
    for d in deltas:
        if d.id is not None:
            calls[d.index] = [d.id, d.name or "", ""]
        calls[d.index][2] += d.arguments
    return [ToolCall(*calls[i]) for i in sorted(calls)]
