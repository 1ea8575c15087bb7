"""A chat reply's constraint and its parts: tools and tool_choice, a reasoning model's think block,
a chat template given in place of the folder's.

``ChatRequest`` is what ``Model.chat`` and the server share: it renders the prompt, composes the
constraint of the reply (the answer's own constraint, a tool choice's grammar, a free think block
before either) and reads the reply back into thinking, content and tool calls.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import tokenizers

from llm_onnx.errors import GenerationError
from llm_onnx.runtime.chat.harmony import MARKERS, HarmonyReader, harmony_constraint
from llm_onnx.runtime.chat.render import render_chat
from llm_onnx.runtime.structured.constraint import Constraint, ConstraintError
from llm_onnx.runtime.structured.matcher import Constraints
from llm_onnx.runtime.chat.reasoning import (THINK, ChatPiece, ReasoningSplitter, ThinkTags,
                                             opens_thought)
from llm_onnx.runtime.generation.sequence import Result, ToolCall
from llm_onnx.runtime.chat.tools import (ToolCallDelta, ToolCallStream, ToolChoice, ToolFormat,
                                    get_format, parse, tool_constraint)

TOOL_CHOICES = ("none", "auto", "required")


class ChatModel(Protocol):
    """What a ChatRequest needs of its model (llm_onnx.runtime.Model is one)."""

    tokenizer: tokenizers.Tokenizer | None
    think_tags: ThinkTags | None  # None: no reasoning split
    tool_format: str | None

    @property
    def constraints(self) -> Constraints: ...


def check_tools(tools: Any, where: str = "tools") -> list[dict] | None:
    """OpenAI's tool list, checked: [{"type": "function", "function": {"name", "description",
    "parameters"}}]. None or [] -> None."""
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


def thinking_mode(prompt: str, tags: ThinkTags = THINK) -> str:
    """How a reply to ``prompt`` starts: inside a think block the prompt opened ("open"), after
    one it closed (thinking off: "none"), or free to open one ("optional")."""
    if opens_thought(prompt, tags):
        return "open"
    return "none" if prompt.rstrip().endswith(tags.end) else "optional"


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
        model: the model (its constraint engine, tool format, think tokens).
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
    format: ToolFormat | None = field(init=False, default=None)

    @property
    def harmony(self) -> bool:
        """The model writes harmony messages (gpt-oss): every reply is read by channel."""
        return self.model.tool_format == "harmony"

    def __post_init__(self) -> None:
        if self.tools and self.tool_choice != "none":
            if self.model.tool_format is None:
                raise ConstraintError("this model's chat template writes no tool calls that "
                                      "llm-onnx recognises: give --tool-call-format (gemma4, "
                                      "hermes, llama3_json, mistral, phi4_mini).", "tools")
            # A forced call (tool_choice "required" or a named function) leaves no text for an
            # answer's format to hold: the format then applies to nothing, as with OpenAI's API
            # (its Agents SDK sends both when an agent with a typed output must call a tool).
            self.format = get_format(self.model.tool_format)

    @property
    def thinking(self) -> bool | None:
        """True if the reply starts inside a think block; None: no reasoning split (a harmony
        reply is split by channel: False)."""
        if self.harmony:
            return False
        tags = self.model.think_tags
        return opens_thought(self.prompt, tags) if tags is not None else None

    def constraint(self) -> Constraint | None:
        """The reply's constraint: the tool choice's grammar (with the answer's constraint for
        "auto") or the answer's, after a free think block for a reasoning model."""
        constraint = self.answer
        if self.harmony:
            tools = self._checked_tools() if self.format is not None else None
            if tools is None and self.answer is None:
                return None
            try:
                return harmony_constraint(tools, self.tool_choice, self._special_id, self.answer)
            except ValueError as e:
                raise ConstraintError(str(e), "tools" if tools else "response_format") from None
        if self.format is not None:
            constraint = tool_constraint(self.format, self._checked_tools(), self.tool_choice,
                                         self.parallel, self._special_id, self.answer)
        elif constraint is not None:
            constraint = constraint.fenced()
        think = self.model.think_tags
        if constraint is not None and think is not None:
            constraints = self.model.constraints
            tags = (constraints.special_token(think.opener), constraints.special_token(think.end))
            constraint = constraint.after_thinking(
                thinking_mode(self.prompt, think), None if None in tags else tags)  # type: ignore[arg-type]
        return constraint

    def _checked_tools(self) -> list[dict]:
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
        """``options`` (GenerationOptions) with this reply's constraint (and, for harmony, its
        markers kept in the text for the reader)."""
        if self.harmony:
            keep = tuple(dict.fromkeys(options.keep_special + MARKERS))
            return replace(options, constraint=self.constraint(), keep_special=keep)
        return replace(options, constraint=self.constraint())

    def _special_id(self, marker: str) -> int | None:
        return self.model.constraints.special_token(marker)

    # ------------------------------------------------------------------ reading the reply

    @property
    def fenced(self) -> bool:
        """The answer is JSON that may come in a ```json fence (stripped when read)."""
        return self.format is None and self.answer is not None and not self.harmony and \
            self.answer.fenced().fence

    def splitter(self) -> ReasoningSplitter | HarmonyReader | None:
        if self.harmony:
            return HarmonyReader(self.prompt)
        tags = self.model.think_tags
        return ReasoningSplitter(bool(self.thinking), tags) if tags is not None else None

    def stream(self) -> ReplyStream:
        return ReplyStream(self)

    def read(self, result: Result) -> Result:
        """``result`` with its thinking apart (``reasoning``) and its tool calls parsed
        (``tool_calls``; ``text`` is then the content around them)."""
        reasoning, answer = None, result.text
        if self.harmony:
            reader = HarmonyReader(self.prompt)
            reader.push(result.text)
            reader.flush()
            return replace(result, text=reader.answer, reasoning=reader.reasoning,
                           tool_calls=reader.calls if self.format is not None else None)
        splitter = self.splitter()
        if splitter is not None:
            splitter.push(result.text)
            splitter.flush()
            reasoning, answer = splitter.reasoning, splitter.answer
        calls = None
        if self.format is not None:
            answer, calls, _complete = parse(self.format, answer)
        if self.fenced:
            fence = FenceStripper()
            answer = fence.push(answer) + fence.finish()
        return replace(result, text=answer, reasoning=reasoning, tool_calls=calls)


class ReplyStream:
    """A chat reply's text as it streams, in: ChatPieces (thinking or content) and
    ToolCallDeltas, out."""

    def __init__(self, request: ChatRequest) -> None:
        self.splitter = request.splitter()
        self.harmony = request.harmony
        self.tools = request.format is not None
        self.calls = ToolCallStream(request.format) if request.format is not None and \
            not self.harmony else None
        self.fence = FenceStripper() if request.fenced else None

    def push(self, text: str, last: bool = False) -> list[ChatPiece | ToolCallDelta]:
        if self.harmony:  # the reader gives the calls too (none kept without tools)
            out = self.splitter.push(text) + (self.splitter.flush() if last else [])
            return [p for p in out if self.tools or not isinstance(p, ToolCallDelta)]
        pieces = [ChatPiece(text)] if self.splitter is None else self.splitter.push(text)
        if last and self.splitter is not None:
            pieces += self.splitter.flush()
        if self.fence is not None:  # the answer's JSON without its fence
            pieces = [p if p.reasoning else ChatPiece(self.fence.push(p)) for p in pieces]
            if last:
                pieces.append(ChatPiece(self.fence.finish()))
        out: list[ChatPiece | ToolCallDelta] = []
        for piece in pieces:
            if piece.reasoning or self.calls is None:
                if piece:
                    out.append(piece)
            else:
                out += [ChatPiece(p) if isinstance(p, str) else p for p in self.calls.push(piece)]
        if last and self.calls is not None:
            out += [ChatPiece(p) if isinstance(p, str) else p for p in self.calls.finish()]
        return out

    @property
    def tool_calls(self) -> int:
        if self.harmony:
            return self.splitter.call_count if self.tools else 0
        return self.calls.calls if self.calls is not None else 0

    @property
    def complete(self) -> bool:
        if self.harmony:
            return self.splitter.complete
        return self.calls.complete if self.calls is not None else True


class FenceStripper:
    """A JSON answer's text without the ```json fence a model may put around it (and the
    whitespace around the document), as it streams: what could still be the fence or trailing
    whitespace is held back until the next piece shows it is not. A fence left incomplete at
    the end (the reply ran out of tokens) stays."""

    OPEN, CLOSE = "```json", "```"

    def __init__(self) -> None:
        self._head: str | None = ""  # text before the document, until decided (None: decided)
        self._held = ""
        self._fenced = False

    def push(self, text: str) -> str:
        if self._head is not None:
            self._head += text
            start = self._head.lstrip(" \t\n")
            if self.OPEN.startswith(start) and len(start) < len(self.OPEN):
                return ""  # "", "`", "```js": not decided yet
            if start.startswith(self.OPEN):
                rest = start[len(self.OPEN):].lstrip(" \t\n")
                if not rest:
                    return ""
                self._fenced = True
            else:
                rest = start
            self._head, text = None, rest
        self._held += text
        keep = self._tail(self._held)
        out, self._held = self._held[:len(self._held) - keep], self._held[len(self._held) - keep:]
        return out

    def finish(self) -> str:
        if self._head is not None:  # the document never began
            head, self._head = self._head, None
            return head
        tail, self._held = self._held, ""
        stripped = tail.rstrip(" \t\n")
        if self._fenced and stripped.endswith(self.CLOSE):
            stripped = stripped[:-len(self.CLOSE)].rstrip(" \t\n")
        return stripped  # whitespace and backticks only: a closing fence cut short, if any

    def _tail(self, text: str) -> int:
        """How much of the end of ``text`` could be trailing whitespace and the closing fence."""
        body = text.rstrip(" \t\n`")
        tail = text[len(body):]
        if not self._fenced and "`" in tail:
            tail = tail[tail.rindex("`") + 1:]
        return len(tail)


def collect_calls(deltas: Sequence[ToolCallDelta]) -> list[ToolCall]:
    """Whole calls from their streamed deltas (in index order)."""
    calls: dict[int, list[str]] = {}
    for d in deltas:
        if d.id is not None:
            calls[d.index] = [d.id, d.name or "", ""]
        calls[d.index][2] += d.arguments
    return [ToolCall(*calls[i]) for i in sorted(calls)]
