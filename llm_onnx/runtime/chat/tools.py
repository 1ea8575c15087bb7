"""Tool calls: the formats models write them in, the grammar that forces one, and parsing a reply
into OpenAI's ``tool_calls`` (whole, or streamed as deltas).

    hermes       Hermes 2 Pro, Qwen 2.5, Qwen3 (any template that writes <tool_call>):
                 <tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>  (one block per call)
    llama3_json  Llama 3.1-3.3 JSON tool calling: the reply is {"name": "f", "parameters": {...}}
                 (several separated by ";"; an optional <|python_tag|> first)
    mistral      Mistral v3 tokenizers: [TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]
    phi4_mini    Phi-4-mini: <|tool_call|>[{"name": "f", "arguments": {...}}]<|/tool_call|>
    gemma4       Gemma 4: <|tool_call>call:f{city:<|"|>Oslo<|"|>}<tool_call|> (one block per call;
                 the arguments in Gemma's own syntax: llm_onnx.runtime.chat.gemma4 reads them)
    harmony      gpt-oss: a commentary message to=functions.f whose body is the arguments
                 (the whole reply is channels: llm_onnx.runtime.chat.harmony reads it)

``detect_format(template)`` reads the format off a chat template; ``tool_constraint`` builds the
constraint of a request's ``tool_choice``: "required" or a named function force calls, their
arguments valid under each function's ``parameters`` schema; "auto" leaves the reply free until
the model opens a call (the format's marker), and constrains the rest (a lazy grammar).
``ToolCallStream`` turns reply text into content and tool-call deltas as it streams; ``parse``
is the same for a whole reply, so streamed deltas put together equal the whole reply's calls.
"""

from __future__ import annotations

import json
import random
import string
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from llm_onnx.runtime.chat import gemma4
from llm_onnx.runtime.structured.constraint import (JSON_OPTIONS, Constraint, ConstraintError,
                                                    grammar_list)
from llm_onnx.runtime.structured.json_scan import WHITESPACE, scan_object, skip_space
from llm_onnx.runtime.generation.sequence import ToolCall

ToolChoice = str | dict  # "none" | "auto" | "required" | {"type": "function", "function": {"name"}}


@dataclass(frozen=True)
class ToolFormat:
    """How one family of models writes tool calls (see the module docstring)."""

    name: str
    begin: str  # the marker before the calls ("" for llama3_json)
    end: str  # the marker after them ("" if none)
    key: str  # the arguments' key in a call object
    array: bool  # calls as one JSON array after ``begin``, not one object per begin/end block
    separator: str = ""  # between consecutive call objects, for llama3_json's ";"
    prefix: str = ""  # an optional marker before the calls (llama3_json's <|python_tag|>)
    syntax: str = "json"  # a call's body: a JSON object, or "gemma4" (call:NAME{...})

    @property
    def markers(self) -> tuple[str, ...]:
        quote = (gemma4.QUOTE,) if self.syntax == "gemma4" else ()
        return tuple(m for m in (self.begin, self.end, self.prefix) if m) + quote


FORMATS = {f.name: f for f in (
    ToolFormat("hermes", "<tool_call>", "</tool_call>", "arguments", array=False),
    ToolFormat("llama3_json", "", "", "parameters", array=False, separator=";",
               prefix="<|python_tag|>"),
    ToolFormat("mistral", "[TOOL_CALLS]", "", "arguments", array=True),
    ToolFormat("phi4_mini", "<|tool_call|>", "<|/tool_call|>", "arguments", array=True),
    ToolFormat("harmony", "<|channel|>", "<|call|>", "arguments", array=False),
    ToolFormat("gemma4", gemma4.CALL_START, gemma4.CALL_END, "arguments", array=False,
               syntax="gemma4"),
)}


def detect_format(template: str | None) -> str | None:
    """The tool-call format a chat template speaks (None: it renders no tools). A template that
    reads ``tools`` but shows none of the known markers is taken as Hermes, the common case."""
    if not template:
        return None
    if all(m in template for m in ("<|start|>", "<|channel|>", "<|message|>")):
        return "harmony"
    if gemma4.CALL_START in template and gemma4.CALL_END in template:
        return "gemma4"
    if "<tool_call>" in template:
        return "hermes"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<|tool_call|>" in template or "<|tool|>" in template:
        return "phi4_mini"
    if "<|start_header_id|>" in template and ("<|python_tag|>" in template or
                                             "parameters" in template):
        return "llama3_json"
    from llm_onnx.runtime.chat.render import template_variables

    return "hermes" if "tools" in template_variables(template) else None


def get_format(name: str) -> ToolFormat:
    if name not in FORMATS:
        raise ConstraintError(f"unknown tool-call format {name!r}; known: "
                              f"{', '.join(sorted(FORMATS))}.", "tool_call_format")
    return FORMATS[name]


def new_call_id(fmt: ToolFormat) -> str:
    """OpenAI's ``call_...`` ids; Mistral's templates insist on 9 letters and digits."""
    if fmt.name == "mistral":
        return "".join(random.choices(string.ascii_letters + string.digits, k=9))
    return f"call_{uuid.uuid4().hex[:24]}"


# ---------------------------------------------------------------------------------------------
# The grammar of a tool choice
# ---------------------------------------------------------------------------------------------

def chosen_tools(tools: Sequence[dict], choice: ToolChoice) -> list[dict]:
    """The tools a call may name under ``choice`` (all of them, or the named one)."""
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        picked = [t for t in tools if t["function"]["name"] == name]
        if not picked:
            raise ConstraintError(f"tool_choice names the function {name!r}, which is not in "
                                  f"tools ({', '.join(t['function']['name'] for t in tools)}).",
                                  "tool_choice")
        return picked
    return list(tools)


def call_schema(fmt: ToolFormat, tool: dict) -> dict[str, Any]:
    """The JSON schema of one call of ``tool`` in ``fmt`` (its name, then its arguments)."""
    function = tool["function"]
    parameters = function.get("parameters") or {"type": "object", "properties": {},
                                                "additionalProperties": False}
    return {"type": "object", "properties": {"name": {"const": function["name"]},
                                             fmt.key: parameters},
            "required": ["name", fmt.key], "additionalProperties": False}


def tool_constraint(fmt: ToolFormat, tools: Sequence[dict], choice: ToolChoice, parallel: bool,
                    special_id: Callable[[str], int | None],
                    answer: Constraint | None = None) -> Constraint:
    """The constraint of a reply under ``choice`` ("auto", "required" or a named function).

    Args:
        special_id: the token id of a marker that is a special token (referenced as a token in
            the grammar: it cannot be spelled), None for a marker written as text.
        answer: with "auto", what a reply that calls nothing must match (None: any text).
    """
    calls = [call_schema(fmt, t) for t in chosen_tools(tools, choice)]
    one = {"anyOf": calls} if len(calls) > 1 else calls[0]
    one = {**one, "x-guidance": JSON_OPTIONS}
    required = choice != "auto"
    many = parallel and not isinstance(choice, dict)

    def marker(text: str) -> str:
        token = special_id(text)
        return f"<[{token}]>" if token is not None else json.dumps(text)

    lines = ["%llguidance {}", 'WS: /[ \\n]{0,2}/', "TEXT: /(.|\\n)*/",
             f"call_json: %json {json.dumps(one)}"]
    if fmt.syntax == "gemma4":  # call:NAME{...} in place of a JSON object
        lines[3:] = gemma4.call_rules(chosen_tools(tools, choice), special_id)
    if fmt.array:  # the calls are one JSON array after the marker
        array = {"type": "array", "items": one, "minItems": 1, **({} if many else {"maxItems": 1})}
        close = f" WS? {marker(fmt.end)}" if fmt.end else ""
        lines[3] = f"calls_json: %json {json.dumps({**array, 'x-guidance': JSON_OPTIONS})}"
        body = f"WS? calls_json{close}"
        opener = marker(fmt.begin)
        lines.append(f"calls: {opener} {body}")
        start = "calls"
    elif fmt.begin:  # hermes: one marked block per call
        lines.append(f"call: {marker(fmt.begin)} WS? call_json WS? {marker(fmt.end)}")
        lines.append("calls: call (WS? call)*" if many else "calls: call")
        start = "calls"
    else:  # llama3_json: bare objects
        separator = json.dumps(fmt.separator)
        lines.append(f"calls: call_json ({separator} WS? call_json)*" if many else
                     "calls: call_json")
        start = "calls"
    grammars: list[dict[str, Any]] = []
    if required:
        lines.insert(1, f"start: {start}")
    elif answer is not None:  # text must match the answer's constraint, or be calls
        lines.insert(1, f"start: @llm_onnx_answer | WS? {start}")
        grammars = _subgrammars(answer)
    elif fmt.begin and special_id(fmt.begin) is not None:  # free text, then a special marker
        lines.insert(1, f"start: TEXT | TEXT {start}")
    elif fmt.begin:  # free text up to the first (text) marker, then calls
        lines.append(f"lead[lazy]: TEXT {json.dumps(fmt.begin)}")
        if fmt.array:
            lines.append(f"start: TEXT | lead {body}")
        else:
            lines.append(f"first: lead WS? call_json WS? {marker(fmt.end)}")
            lines.append("start: TEXT | first" + (" (WS? call)*" if many else ""))
    else:  # llama3_json: text that does not open with "{", or calls
        lines.insert(1, "start: PLAIN? | WS? calls")
        lines.append("PLAIN: /[^{ \\t\\n](.|\\n)*/")
    top = {"lark_grammar": "\n".join(lines) + "\n"}
    return Constraint("llguidance", json.dumps({"grammars": [top, *grammars]}),
                      where="tools", markers=fmt.markers)


def _subgrammars(answer: Constraint) -> list[dict[str, Any]]:
    grammars = grammar_list(answer.grammar_text())
    grammars[0] = {**grammars[0], "name": "llm_onnx_answer"}
    return grammars


# ---------------------------------------------------------------------------------------------
# Parsing replies
# ---------------------------------------------------------------------------------------------

@dataclass
class PartialCall:
    """A call as far as the text goes: ``arguments`` is its raw JSON text so far."""

    name: str | None
    arguments: str
    complete: bool


@dataclass
class Scan:
    """A reply read so far: ``content`` is the text outside tool calls that can no longer change
    (all of it, at the end); ``calls`` the calls begun."""

    content: str
    calls: list[PartialCall] = field(default_factory=list)


def scan(fmt: ToolFormat, text: str, final: bool) -> Scan:
    """Read ``text`` (a reply, or its beginning if not ``final``) in format ``fmt``."""
    if not fmt.begin:
        return _scan_bare(fmt, text, final)
    at = text.find(fmt.begin)
    if at < 0:
        if final:
            return Scan(text)
        held = _marker_tail(text, fmt.begin)
        return Scan(text[:len(text) - held].rstrip(WHITESPACE))
    out = Scan(text[:at].rstrip(WHITESPACE))
    i = at + len(fmt.begin)
    if fmt.array:
        _read_array(fmt, text, i, out)
        return out
    read = _read_gemma4 if fmt.syntax == "gemma4" else _read_object
    while True:
        i = read(fmt, text, i, out)
        if i is None:
            return out
        i = skip_space(text, i)
        if not text.startswith(fmt.end, i):
            return out
        i = skip_space(text, i + len(fmt.end))
        if not text.startswith(fmt.begin, i):
            return out
        i += len(fmt.begin)


def _scan_bare(fmt: ToolFormat, text: str, final: bool) -> Scan:
    """llama3_json: a reply that opens with "{" (or the prefix marker) is calls."""
    i = skip_space(text, 0)
    rest = text[i:]
    if not rest or (fmt.prefix.startswith(rest) and not final):
        return Scan("" if not final else text)
    if rest.startswith(fmt.prefix):
        i = skip_space(text, i + len(fmt.prefix))
    elif not rest.startswith("{"):
        return Scan(text)
    out = Scan("")
    while True:
        i = _read_object(fmt, text, i, out)
        if i is None:
            return out
        i = skip_space(text, i)
        if not text.startswith(fmt.separator, i):
            return out
        i += len(fmt.separator)


def _read_object(fmt: ToolFormat, text: str, i: int, out: Scan) -> int | None:
    """Read one call object at ``text[i:]`` into ``out``; the index after it (None: it is
    incomplete or not a call)."""
    obj = scan_object(text, i)
    if obj.broken:
        return None
    name = obj.value(text, "name") if "name" in obj.fields else None
    key = fmt.key if fmt.key in obj.fields or "arguments" not in obj.fields else "arguments"
    arguments = obj.text(text, key)
    if isinstance(name, str) or arguments is not None:
        complete = obj.end is not None
        out.calls.append(PartialCall(name if isinstance(name, str) else None,
                                     arguments if arguments is not None else
                                     ("{}" if complete else ""), complete))
    return obj.end


def _read_gemma4(fmt: ToolFormat, text: str, i: int, out: Scan) -> int | None:
    """``_read_object`` for Gemma 4's ``call:NAME{...}``."""
    call = gemma4.read_call(text, i)
    if call is None:
        return None
    if call.name is not None:
        out.calls.append(PartialCall(call.name, call.arguments or "", call.arguments is not None))
    return call.end


def _read_array(fmt: ToolFormat, text: str, i: int, out: Scan) -> None:
    """[call, call, ...] (or one bare call object) at ``text[i:]``."""
    i = skip_space(text, i)
    if i >= len(text):
        return
    if text[i] == "{":
        _read_object(fmt, text, i, out)
        return
    if text[i] != "[":
        return
    i += 1
    while True:
        i = skip_space(text, i)
        if i >= len(text) or text[i] == "]":
            return
        if text[i] == ",":
            i += 1
            continue
        end = _read_object(fmt, text, i, out)
        if end is None:
            return
        i = end


def _marker_tail(text: str, marker: str) -> int:
    """Length of the tail of ``text`` that could still grow into ``marker``."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[len(text) - size:]):
            return size
    return 0


def parse(fmt: ToolFormat, text: str) -> tuple[str, list[ToolCall], bool]:
    """(content, tool calls, every call complete) of a whole reply. A call cut short (the reply
    ran out of tokens) is left out: its arguments would not parse."""
    read = scan(fmt, text, final=True)
    calls = [ToolCall(new_call_id(fmt), c.name, c.arguments) for c in read.calls
             if c.name and c.complete]
    return read.content, calls, all(c.complete for c in read.calls if c.name)


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of a streamed call: its first piece has ``id`` and ``name``; every piece may add
    to the arguments' text."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None


class ToolCallStream:
    """Reply text in, content pieces (str) and ToolCallDeltas out, as the reply streams."""

    def __init__(self, fmt: ToolFormat) -> None:
        self.fmt = fmt
        self.text = ""
        self._content = 0
        self._calls: list[tuple[str, int]] = []  # (id, arguments characters sent)
        self.complete = True

    def push(self, piece: str) -> list[str | ToolCallDelta]:
        self.text += piece
        return self._diff(scan(self.fmt, self.text, final=False))

    def finish(self) -> list[str | ToolCallDelta]:
        read = scan(self.fmt, self.text, final=True)
        self.complete = all(c.complete for c in read.calls if c.name)
        return self._diff(read)

    @property
    def calls(self) -> int:
        return len(self._calls)

    def _diff(self, read: Scan) -> list[str | ToolCallDelta]:
        out: list[str | ToolCallDelta] = []
        if len(read.content) > self._content:
            out.append(read.content[self._content:])
            self._content = len(read.content)
        named = [c for c in read.calls if c.name]
        for index, call in enumerate(named):
            if index == len(self._calls):
                self._calls.append((new_call_id(self.fmt), 0))
                out.append(ToolCallDelta(index, "", self._calls[index][0], call.name))
            call_id, sent = self._calls[index]
            if len(call.arguments) > sent:
                out.append(ToolCallDelta(index, call.arguments[sent:]))
                self._calls[index] = (call_id, len(call.arguments))
        return out
