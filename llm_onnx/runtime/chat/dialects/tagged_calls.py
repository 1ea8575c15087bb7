"""Tool calls written between markers: the grammar that forces one, and a reply read into
OpenAI's ``tool_calls`` (whole, or streamed as deltas).

``TaggedCalls`` is the base of every such tool dialect: a call is a body after a ``begin``
marker (up to an ``end`` marker, if any), one block per call, or one JSON array of calls after
the marker (``array``), or bare objects with no marker at all (``begin`` empty, Llama 3's). The
body is a JSON object ``{"name": ..., KEY: {...}}``; a dialect with a body of its own overrides
``call_rules`` (its grammar) and ``read_call`` (its reader), as Gemma 4's does.

A tool with an ``input_grammar`` (OpenAI's custom tools: free text in a Lark grammar) is called
with ``{"input": "<text>"}`` as its arguments, the text held to the grammar inside the JSON
string (structured/json_string_grammar.py); a dialect whose calls are one JSON array
(``array``) or a body of its own cannot write it (``free_form`` False).

``grammar`` builds the constraint of a request's ``tool_choice``: "required" or a named function
force calls, their arguments valid under each function's ``parameters`` schema; "auto" leaves
the reply free until the model opens a call (the begin marker), and constrains the rest (a lazy
grammar). ``stream`` turns reply text into content and tool-call deltas as it streams; ``parse``
is the same for a whole reply, so streamed deltas put together equal the whole reply's calls.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from llm_onnx.runtime.chat.dialects.base import (
    ChatDialect,
    ReasoningDialect,
    SpecialId,
    ToolCallDelta,
    ToolChoice,
    ToolDialect,
    call_schema,
    chosen_tools,
    new_call_id,
)
from llm_onnx.runtime.chat.dialects.tagged import TaggedDialect
from llm_onnx.runtime.generation.results import ToolCall
from llm_onnx.runtime.structured.constraint import JSON_OPTIONS, Constraint, grammar_list
from llm_onnx.runtime.structured.json_scan import WHITESPACE, scan_object, skip_space
from llm_onnx.runtime.structured.json_string_grammar import json_string_grammar


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


class TaggedCalls(ToolDialect):
    """Calls between markers (see the module docstring); a subclass declares its markers and
    ``detect``.

    Attributes:
        begin: the marker before the calls ("" for bare JSON objects).
        end: the marker after them ("" if none).
        key: the arguments' key in a call object.
        array: calls as one JSON array after ``begin``, not one object per begin/end block.
        separator: between consecutive bare call objects (Llama 3's ";").
        prefix: an optional marker before bare calls (Llama 3's ``<|python_tag|>``).
        free_form: a call can carry a custom tool's free text (``input_grammar``).
    """

    begin: ClassVar[str]
    end: ClassVar[str] = ""
    key: ClassVar[str] = "arguments"
    array: ClassVar[bool] = False
    separator: ClassVar[str] = ""
    prefix: ClassVar[str] = ""
    free_form: ClassVar[bool] = True

    @property
    def markers(self) -> tuple[str, ...]:
        """The format's special tokens, kept in the reply's text for the reader."""
        return tuple(m for m in (self.begin, self.end, self.prefix) if m)

    def chat(self, reasoning: ReasoningDialect | None) -> ChatDialect:
        return TaggedDialect(self, reasoning)

    def call_id(self) -> str:
        """A new call's id (OpenAI's ``call_...``)."""
        return new_call_id()

    # ------------------------------------------------------------------ the grammar

    def call_rules(self, tools: Sequence[dict], special_id: SpecialId) -> list[str]:
        """Lark rules whose ``call_json`` is one call of one of ``tools``: a JSON object (a
        tool with an ``input_grammar``: its text in the subgrammar ``@llm_onnx_input_N``)."""
        plain = [t for t in tools if "input_grammar" not in t]
        if len(plain) == len(tools):
            return [f"call_json: %json {json.dumps(self._one_call(tools))}"]
        rules, names = [], []
        if plain:
            rules.append(f"plain_call: %json {json.dumps(self._one_call(plain))}")
            names.append("plain_call")
        for i, tool in enumerate(t for t in tools if "input_grammar" in t):
            head = json.dumps({"name": tool["function"]["name"], self.key: {"input": ""}})
            rules.append(f"free_call_{i}: {json.dumps(head[:-3])} @llm_onnx_input_{i} "
                         f"{json.dumps(head[-3:])}")
            names.append(f"free_call_{i}")
        return [*rules, "call_json: " + " | ".join(names)]

    @staticmethod
    def input_grammars(tools: Sequence[dict]) -> list[dict[str, Any]]:
        """The subgrammars of the tools' free text (see ``call_rules``), in tool order."""
        return [{"name": f"llm_onnx_input_{i}",
                 "lark_grammar": json_string_grammar(t["input_grammar"], "tools")}
                for i, t in enumerate(t for t in tools if "input_grammar" in t)]

    def _one_call(self, tools: Sequence[dict]) -> dict[str, Any]:
        """The JSON schema of one call of one of ``tools``."""
        calls = [call_schema(t, self.key) for t in tools]
        one = {"anyOf": calls} if len(calls) > 1 else calls[0]
        return {**one, "x-guidance": JSON_OPTIONS}

    def grammar(self, tools: Sequence[dict], choice: ToolChoice, parallel: bool,
                special_id: SpecialId, answer: Constraint | None = None) -> Constraint:
        """The constraint of a reply under ``choice`` ("auto", "required" or a named function).

        Args:
            special_id: the token id of a marker that is a special token (referenced as a token
                in the grammar: it cannot be spelled), None for a marker written as text.
            answer: with "auto", what a reply that calls nothing must match (None: any text).
        """
        picked = chosen_tools(tools, choice)
        required = choice != "auto"
        many = parallel and not isinstance(choice, dict)

        def marker(text: str) -> str:
            token = special_id(text)
            return f"<[{token}]>" if token is not None else json.dumps(text)

        lines = ["%llguidance {}", 'WS: /[ \\n]{0,2}/', "TEXT: /(.|\\n)*/",
                 *self.call_rules(picked, special_id)]
        if self.array:  # the calls are one JSON array after the marker
            array = {"type": "array", "items": self._one_call(picked), "minItems": 1,
                     **({} if many else {"maxItems": 1})}
            close = f" WS? {marker(self.end)}" if self.end else ""
            lines[3] = f"calls_json: %json {json.dumps({**array, 'x-guidance': JSON_OPTIONS})}"
            body = f"WS? calls_json{close}"
            lines.append(f"calls: {marker(self.begin)} {body}")
        elif self.begin:  # hermes: one marked block per call
            lines.append(f"call: {marker(self.begin)} WS? call_json WS? {marker(self.end)}")
            lines.append("calls: call (WS? call)*" if many else "calls: call")
        else:  # llama3_json: bare objects
            separator = json.dumps(self.separator)
            lines.append(f"calls: call_json ({separator} WS? call_json)*" if many else
                         "calls: call_json")
        grammars: list[dict[str, Any]] = []
        if required:
            lines.insert(1, "start: calls")
        elif answer is not None:  # text must match the answer's constraint, or be calls
            lines.insert(1, "start: @llm_onnx_answer | WS? calls")
            grammars = grammar_list(answer.grammar_text())
            grammars[0] = {**grammars[0], "name": "llm_onnx_answer"}
        elif self.begin and special_id(self.begin) is not None:  # text, then a special marker
            lines.insert(1, "start: TEXT | TEXT calls")
        elif self.begin:  # free text up to the first (text) marker, then calls
            lines.append(f"lead[lazy]: TEXT {json.dumps(self.begin)}")
            if self.array:
                lines.append(f"start: TEXT | lead {body}")
            else:
                lines.append(f"first: lead WS? call_json WS? {marker(self.end)}")
                lines.append("start: TEXT | first" + (" (WS? call)*" if many else ""))
        else:  # llama3_json: text that does not open with "{", or calls
            lines.insert(1, "start: PLAIN? | WS? calls")
            lines.append("PLAIN: /[^{ \\t\\n](.|\\n)*/")
        top = {"lark_grammar": "\n".join(lines) + "\n"}
        grammars += self.input_grammars(picked)
        return Constraint("llguidance", json.dumps({"grammars": [top, *grammars]}),
                          where="tools", markers=self.markers)

    # ------------------------------------------------------------------ reading replies

    def scan(self, text: str, final: bool) -> Scan:
        """Read ``text`` (a reply, or its beginning if not ``final``)."""
        if not self.begin:
            return self._scan_bare(text, final)
        at = text.find(self.begin)
        if at < 0:
            if final:
                return Scan(text)
            held = _marker_tail(text, self.begin)
            return Scan(text[:len(text) - held].rstrip(WHITESPACE))
        out = Scan(text[:at].rstrip(WHITESPACE))
        i = at + len(self.begin)
        if self.array:
            self._read_array(text, i, out)
            return out
        while True:
            after = self.read_call(text, i, out)
            if after is None:
                return out
            i = skip_space(text, after)
            if not text.startswith(self.end, i):
                return out
            i = skip_space(text, i + len(self.end))
            if not text.startswith(self.begin, i):
                return out
            i += len(self.begin)

    def _scan_bare(self, text: str, final: bool) -> Scan:
        """llama3_json: a reply that opens with "{" (or the prefix marker) is calls."""
        i = skip_space(text, 0)
        rest = text[i:]
        if not rest or (self.prefix.startswith(rest) and not final):
            return Scan("" if not final else text)
        if rest.startswith(self.prefix):
            i = skip_space(text, i + len(self.prefix))
        elif not rest.startswith("{"):
            return Scan(text)
        out = Scan("")
        while True:
            after = self.read_call(text, i, out)
            if after is None:
                return out
            i = skip_space(text, after)
            if not text.startswith(self.separator, i):
                return out
            i += len(self.separator)

    def read_call(self, text: str, i: int, out: Scan) -> int | None:
        """Read one call object at ``text[i:]`` into ``out``; the index after it (None: it is
        incomplete or not a call)."""
        obj = scan_object(text, i)
        if obj.broken:
            return None
        name = obj.value(text, "name") if "name" in obj.fields else None
        key = self.key if self.key in obj.fields or "arguments" not in obj.fields else "arguments"
        arguments = obj.text(text, key)
        if isinstance(name, str) or arguments is not None:
            complete = obj.end is not None
            out.calls.append(PartialCall(name if isinstance(name, str) else None,
                                         arguments if arguments is not None else
                                         ("{}" if complete else ""), complete))
        return obj.end

    def _read_array(self, text: str, i: int, out: Scan) -> None:
        """[call, call, ...] (or one bare call object) at ``text[i:]``."""
        i = skip_space(text, i)
        if i >= len(text):
            return
        if text[i] == "{":
            self.read_call(text, i, out)
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
            end = self.read_call(text, i, out)
            if end is None:
                return
            i = end

    def parse(self, text: str) -> tuple[str, list[ToolCall], bool]:
        """(content, tool calls, every call complete) of a whole reply. A call cut short (the
        reply ran out of tokens) is left out: its arguments would not parse."""
        read = self.scan(text, final=True)
        calls = [ToolCall(self.call_id(), c.name, c.arguments) for c in read.calls
                 if c.name and c.complete]
        return read.content, calls, all(c.complete for c in read.calls if c.name)

    def stream(self) -> ToolCallStream:
        """A reader of the reply as it streams."""
        return ToolCallStream(self)


def _marker_tail(text: str, marker: str) -> int:
    """Length of the tail of ``text`` that could still grow into ``marker``."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[len(text) - size:]):
            return size
    return 0


class ToolCallStream:
    """Reply text in, content pieces (str) and ToolCallDeltas out, as the reply streams."""

    def __init__(self, dialect: TaggedCalls) -> None:
        self.dialect = dialect
        self.text = ""
        self._content = 0
        self._calls: list[tuple[str, int]] = []  # (id, arguments characters sent)
        self.complete = True

    def push(self, piece: str) -> list[str | ToolCallDelta]:
        self.text += piece
        return self._diff(self.dialect.scan(self.text, final=False))

    def finish(self) -> list[str | ToolCallDelta]:
        read = self.dialect.scan(self.text, final=True)
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
                self._calls.append((self.dialect.call_id(), 0))
                out.append(ToolCallDelta(index, "", self._calls[index][0], call.name))
            call_id, sent = self._calls[index]
            if len(call.arguments) > sent:
                out.append(ToolCallDelta(index, call.arguments[sent:]))
                self._calls[index] = (call_id, len(call.arguments))
        return out
