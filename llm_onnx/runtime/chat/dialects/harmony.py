"""The harmony dialect (gpt-oss, OpenAI's format): a reply is a run of messages, each on a
channel.

    <|channel|>analysis<|message|>thinking...<|end|>
    <|start|>assistant<|channel|>commentary to=functions.weather <|constrain|>json<|message|>{"city": "Oslo"}<|call|>
    <|start|>assistant<|channel|>final<|message|>the answer<|return|>

The prompt ends with ``<|start|>assistant``; the model writes the rest of each message's header
(its channel, a recipient ``to=...`` before or after the channel, a content type), then
``<|message|>``, the body, and ``<|end|>`` (more messages follow), ``<|call|>`` (a tool call:
the reply stops for its result) or ``<|return|>`` (done). ``analysis`` is the reasoning,
``final`` the answer, ``commentary`` to ``functions.NAME`` a tool call whose body is the JSON
arguments (commentary without a recipient is a preamble meant for the user: content).
The markers are special tokens the decoder keeps in the reply's text (``MARKERS``).

``Harmony`` is the dialect, tools and thinking in one (its channels carry both): detected from a
template that writes ``<|start|>``, ``<|channel|>`` and ``<|message|>``. ``HarmonyReader`` reads
a reply as it streams (or whole) into reasoning and content pieces (``ChatPiece``) and
``ToolCallDelta``s; ``harmony_constraint`` is the grammar of a tool choice or an answer's format
over the same messages. Written from the format's published description
(github.com/openai/harmony); OpenAI's ``openai-harmony`` package is not used: it is a compiled
renderer that fetches its tokenizer's vocabulary over the network on first use, and the
checkpoint's own chat template renders prompts here as it does for every other family.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from llm_onnx.runtime.chat.dialects.base import (
    ChatDialect,
    ChatPiece,
    ReasoningDialect,
    Reply,
    SpecialId,
    ToolCallDelta,
    ToolChoice,
    ToolDialect,
    call_schema,
    chosen_tools,
    new_call_id,
)
from llm_onnx.runtime.generation.results import ToolCall
from llm_onnx.runtime.structured.constraint import (
    JSON_OPTIONS,
    Constraint,
    ConstraintError,
    grammar_list,
)

START, END, MESSAGE, CHANNEL = "<|start|>", "<|end|>", "<|message|>", "<|channel|>"
CONSTRAIN, RETURN, CALL = "<|constrain|>", "<|return|>", "<|call|>"
MARKERS = (START, END, MESSAGE, CHANNEL, CONSTRAIN, RETURN, CALL)
_ENDS = (END, RETURN, CALL)
_HEADER, _BODY = range(2)
_CHANNEL_NAME = re.compile(r"<\|channel\|>\s*([A-Za-z_]+)")
_RECIPIENT = re.compile(r"to=([^\s<]+)")


class Harmony(ToolDialect, ChatDialect):
    """gpt-oss's replies: every one read by channel, with or without tools (the reasoning
    dialect a tokenizer may also show is not used: the analysis channel is the thinking)."""

    name = "harmony"
    choosable = False  # (only a harmony template renders the prompt a reply continues)
    tool_format = "harmony"
    reasons = True
    keep_special = MARKERS

    @classmethod
    def detect(cls, template: str) -> bool:
        return all(m in template for m in (START, CHANNEL, MESSAGE))

    def chat(self, reasoning: ReasoningDialect | None) -> ChatDialect:
        return self

    def thinking(self, prompt: str) -> bool | None:
        return False  # split by channel, not by a block the prompt opened

    def splitter(self, prompt: str) -> HarmonyReader:
        return HarmonyReader(prompt)

    def constraint(self, reply: Reply) -> Constraint | None:
        tools = reply.checked_tools() if reply.calls_tools else None
        if tools is None and reply.answer is None:
            return None
        try:
            return harmony_constraint(tools, reply.tool_choice, reply.special_id, reply.answer)
        except ValueError as e:
            raise ConstraintError(str(e), "tools" if tools else "response_format") from None

    def reader(self, reply: Reply) -> HarmonyStream:
        return HarmonyStream(HarmonyReader(reply.prompt), reply.calls_tools)

    def read(self, reply: Reply, text: str) -> tuple[str, str | None, list[ToolCall] | None]:
        reader = HarmonyReader(reply.prompt)
        reader.push(text)
        reader.flush()
        return reader.answer, reader.reasoning, reader.calls if reply.calls_tools else None


class HarmonyStream:
    """A harmony reply as it streams (ReplyReader): the reader's pieces, its tool calls kept
    only when the request has tools."""

    def __init__(self, reader: HarmonyReader, tools: bool) -> None:
        self.reader = reader
        self.tools = tools

    def push(self, text: str, last: bool = False) -> list[ChatPiece | ToolCallDelta]:
        out = self.reader.push(text) + (self.reader.flush() if last else [])
        return [p for p in out if self.tools or not isinstance(p, ToolCallDelta)]

    @property
    def tool_calls(self) -> int:
        return self.reader.call_count if self.tools else 0

    @property
    def complete(self) -> bool:
        return self.reader.complete


class HarmonyReader:
    """A harmony reply in (text pieces, markers kept), ChatPieces and ToolCallDeltas out.

    Args:
        prompt: the rendered prompt; a reply continues its last message's header (or body, if
            the prompt already opened one).
    """

    def __init__(self, prompt: str = "") -> None:
        self._held = ""  # text that may be the start of a marker
        self._state = _HEADER
        self._header = ""
        self._kind = "final"  # the open body's use: analysis, final or call
        self._reasoning: list[str] = []
        self._answer: list[str] = []
        self._loose: list[str] = []  # text outside any message
        self._calls: list[list[str]] = []  # [id, name, arguments, complete ("1" or "")]
        self.saw_message = False
        self.saw_reasoning = False
        at = prompt.rfind(START)
        if at >= 0:
            self._feed(prompt[at:], out=None)
        self.saw_message = self._state == _BODY

    # ------------------------------------------------------------------ results

    @property
    def reasoning(self) -> str | None:
        """The analysis channel's text; None if the reply wrote none."""
        return "".join(self._reasoning) if self.saw_reasoning else None

    @property
    def answer(self) -> str:
        """The final (and commentary) text; a reply that never opened a message is all answer."""
        return "".join(self._answer) if self.saw_message else "".join(self._loose)

    @property
    def calls(self) -> list[ToolCall]:
        """The finished tool calls (a call cut short by the token limit is left out)."""
        return [ToolCall(c[0], c[1], c[2]) for c in self._calls if c[3]]

    @property
    def complete(self) -> bool:
        return all(c[3] for c in self._calls)

    @property
    def call_count(self) -> int:
        return len(self._calls)

    # ------------------------------------------------------------------ reading

    def push(self, text: str) -> list[ChatPiece | ToolCallDelta]:
        out: list[ChatPiece | ToolCallDelta] = []
        self._feed(self._held + text, out)
        return out

    def flush(self) -> list[ChatPiece | ToolCallDelta]:
        out: list[ChatPiece | ToolCallDelta] = []
        held, self._held = self._held, ""
        self._text(held, out)
        if self._state == _BODY and self._kind == "call" and not self._calls[-1][3]:
            # <|call|> is an end-of-sequence token, so a reply that made its call ends before
            # the marker reaches the text: the call is whole if its arguments are.
            try:
                json.loads(self._calls[-1][2])
                self._calls[-1][3] = "1"
            except ValueError:
                pass
        if not self.saw_message and self._state == _HEADER and self._loose:
            out.append(ChatPiece("".join(self._loose)))  # not harmony after all: all answer
        return out

    def _feed(self, text: str, out: list | None) -> None:
        self._held = ""
        i = 0
        while i < len(text):
            at = text.find("<|", i)
            if at < 0:
                if text.endswith("<"):  # perhaps the start of a marker
                    self._text(text[i:-1], out)
                    self._held = "<"
                else:
                    self._text(text[i:], out)
                return
            self._text(text[i:at], out)
            marker = next((m for m in MARKERS if text.startswith(m, at)), None)
            if marker is not None:
                self._marker(marker, out)
                i = at + len(marker)
                continue
            tail = text[at:]
            if any(m.startswith(tail) for m in MARKERS):  # may still become a marker
                self._held = tail
                return
            self._text("<|", out)
            i = at + 2

    def _text(self, text: str, out: list | None) -> None:
        if not text:
            return
        if self._state == _HEADER:
            self._header += text
            if out is not None and not self.saw_message:
                self._loose.append(text)
            return
        if self._kind == "analysis":
            self._reasoning.append(text)
        elif self._kind == "call":
            self._calls[-1][2] += text
        else:
            self._answer.append(text)
        if out is None:
            return
        if self._kind == "call":
            out.append(ToolCallDelta(len(self._calls) - 1, text))
        else:
            out.append(ChatPiece(text, reasoning=self._kind == "analysis"))

    def _marker(self, marker: str, out: list | None) -> None:
        if marker == MESSAGE and self._state == _HEADER:
            self._open(out)
        elif marker in _ENDS:
            if self._state == _BODY and self._kind == "call":
                self._calls[-1][3] = "1"
            self._state, self._header = _HEADER, ""
        elif marker == START:
            self._state, self._header = _HEADER, ""
        elif marker in (CHANNEL, CONSTRAIN):
            if self._state == _BODY:  # a header with no end before it
                self._state, self._header = _HEADER, ""
            self._header += marker

    def _open(self, out: list | None) -> None:
        """``<|message|>`` after a header: what the body that follows is."""
        header = self._header
        channel = _CHANNEL_NAME.search(header)
        recipient = _RECIPIENT.search(header)
        name = channel.group(1) if channel else "final"
        self._state = _BODY
        self.saw_message = True
        if recipient is not None and recipient.group(1) != "assistant":
            target = recipient.group(1)
            function = target[len("functions."):] if target.startswith("functions.") else target
            self._kind = "call"
            call_id = new_call_id()
            self._calls.append([call_id, function, "", ""])
            if out is not None:
                out.append(ToolCallDelta(len(self._calls) - 1, "", call_id, function))
        elif name == "analysis":
            self._kind = "analysis"
            self.saw_reasoning = True
        else:
            self._kind = "final"


# ---------------------------------------------------------------------------------------------
# Grammars
# ---------------------------------------------------------------------------------------------

def harmony_constraint(tools: Sequence[dict] | None, choice: ToolChoice, special_id: SpecialId,
                       answer: Constraint | None = None) -> Constraint:
    """The constraint of a harmony reply: any number of analysis messages, then a final message
    (its text matching ``answer`` if given) or, with tools, one call whose arguments match the
    function's schema ("required" or a named function: a call and nothing else). The reply ends
    at ``<|call|>`` or when the final message is complete."""
    def token(marker: str) -> str:
        found = special_id(marker)
        if found is None:
            raise ValueError(f"the tokenizer has no {marker} token: not a harmony tokenizer.")
        return f"<[{found}]>"

    lines = ["%llguidance {}", "TEXT: /(.|\\n)*/",
             f'analysis: {token(CHANNEL)} "analysis" {token(MESSAGE)} TEXT {token(END)} '
             f'{token(START)} "assistant"']
    grammars: list[dict[str, Any]] = []
    final_body = "TEXT"
    if answer is not None:
        grammars = grammar_list(answer.grammar_text())
        grammars[0] = {**grammars[0], "name": "llm_onnx_answer"}
        final_body = "@llm_onnx_answer"
    lines.append(f'final: {token(CHANNEL)} "final" {token(MESSAGE)} {final_body}')
    ends = ["final"]
    if tools:
        calls = []
        for i, tool in enumerate(chosen_tools(tools, choice)):
            function = tool["function"]
            schema = call_schema(tool)["properties"]["arguments"]
            lines.append(f"args{i}: %json {json.dumps({**schema, 'x-guidance': JSON_OPTIONS})}")
            lines.append(f'call{i}: {json.dumps(function["name"])} " " {token(CONSTRAIN)} "json" '
                         f"{token(MESSAGE)} args{i} {token(CALL)}")
            calls.append(f"call{i}")
        lines.append(f'call: {token(CHANNEL)} "commentary to=functions." '
                     f"({' | '.join(calls)})")
        ends = ["call"] if choice != "auto" else ["final", "call"]
    lines.insert(1, f"start: analysis* ({' | '.join(ends)})")
    top = {"lark_grammar": "\n".join(lines) + "\n"}
    return Constraint("llguidance", json.dumps({"grammars": [top, *grammars]}),
                      where="tools" if tools else "response_format", markers=MARKERS)
