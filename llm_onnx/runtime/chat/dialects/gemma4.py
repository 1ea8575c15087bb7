"""Gemma 4's dialects: tool calls in its own syntax (read into JSON, with their grammar), and
thinking in its thought channel.

    <|tool_call>call:get_weather{city:<|"|>Oslo<|"|>,days:3}<tool_call|><|tool_response>

A call is ``call:NAME`` then the arguments as an object whose keys are bare words and whose
strings sit between ``<|"|>`` markers (numbers, true, false, null, lists and nested objects as
in JSON); the chat template writes arguments with their keys sorted (``dictsort``), and the
model stops at ``<|tool_response>`` (an end-of-sequence token in its generation config) for the
results, which the template writes as ``<|tool_response>response:NAME{value:...}``. The
markers are tokens of Gemma 4's tokenizer that decode as text. Thinking is the
``<|channel>thought ... <channel|>`` block (``THOUGHT``; its template closes an empty one in the
prompt when thinking is off, as Qwen3's does), where ``<|channel>`` and ``<channel|>`` are
tokens of their own.

``Gemma4`` is the tool dialect, ``Gemma4Thought`` the reasoning one. ``read_call`` reads one
call (or as much of it as the text holds); ``call_rules`` are the Lark rules of one call of
given tools: the function's name, then its arguments' keys in sorted order
with the required ones present, each top-level value of its schema's type (string, with its
``maxLength`` and ``enum``; integer, number, boolean; other values in Gemma's syntax, not checked
against their schemas). Written from the chat template and llama.cpp's reading of the format
(common/parsers/gemma4.cpp), whose grammar checks names only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, NamedTuple

from llm_onnx.runtime.chat.dialects.base import SpecialId
from llm_onnx.runtime.chat.dialects.tagged_calls import PartialCall, Scan, TaggedCalls
from llm_onnx.runtime.chat.dialects.think import ThinkBlock, ThinkTags
from llm_onnx.runtime.structured.constraint import ConstraintError

CALL_START, CALL_END, QUOTE = "<|tool_call>", "<tool_call|>", '<|"|>'
THOUGHT = ThinkTags("<|channel>thought", "<channel|>", opener="<|channel>")
_HEAD = "call:"
_SPACE = " \t\n\r"
_BARE = re.compile(r"[^,{}\[\]:\s<]+")  # a number, true, false, null (or a word, read as text)
_NAME = re.compile(r"[^{}\s<>,:]+")
_KEY = re.compile(r"[^{}\[\],:<>\"\s]+")


class GemmaCall(NamedTuple):
    """One call as far as the text goes: ``name`` once its ``{`` is written, ``arguments`` (JSON
    text) once the object closes, ``end`` the index after it."""

    name: str | None
    arguments: str | None
    end: int | None


class _Cut(Exception):
    """The text ends inside the value."""


class _Bad(Exception):
    """Not Gemma's syntax."""


def read_call(text: str, i: int) -> GemmaCall | None:
    """The call at ``text[i:]`` (after ``<|tool_call>``); None if it is not one."""
    i = _space(text, i)
    if not text.startswith(_HEAD, i):
        return GemmaCall(None, None, None) if _HEAD.startswith(text[i:]) else None
    brace = text.find("{", i + len(_HEAD))
    if brace < 0:
        rest = text[i + len(_HEAD):].strip()
        return GemmaCall(None, None, None) if not rest or _NAME.fullmatch(rest) else None
    name = text[i + len(_HEAD):brace].strip()
    if not _NAME.fullmatch(name):
        return None
    try:
        arguments, end = _object(text, brace + 1)
    except _Cut:
        return GemmaCall(name, None, None)
    except _Bad:
        return None
    return GemmaCall(name, json.dumps(arguments, ensure_ascii=False), end)


def _space(text: str, i: int) -> int:
    while i < len(text) and text[i] in _SPACE:
        i += 1
    return i


def _value(text: str, i: int) -> tuple[Any, int]:
    i = _space(text, i)
    if i >= len(text) or QUOTE.startswith(text[i:]):
        raise _Cut
    if text.startswith(QUOTE, i):
        end = text.find(QUOTE, i + len(QUOTE))
        if end < 0:
            raise _Cut
        return text[i + len(QUOTE):end], end + len(QUOTE)
    if text[i] == "{":
        return _object(text, i + 1)
    if text[i] == "[":
        return _list(text, i + 1)
    word = _BARE.match(text, i)
    if word is None:
        raise _Bad
    if word.end() == len(text):
        raise _Cut  # the number may go on
    return _scalar(word.group()), word.end()


def _scalar(word: str) -> Any:
    """A bare value: JSON's number, true, false or null (Python's True, False and None, as the
    template writes a value it does not know); anything else is text."""
    python = {"True": True, "False": False, "None": None}
    if word in python:
        return python[word]
    try:
        return json.loads(word)
    except ValueError:
        return word


def _object(text: str, i: int) -> tuple[dict[str, Any], int]:
    """The object after its ``{``: (the object, the index after its ``}``)."""
    out: dict[str, Any] = {}
    i = _space(text, i)
    if text.startswith("}", i):
        return out, i + 1
    while True:
        i = _space(text, i)
        colon = text.find(":", i)
        if colon < 0:
            rest = text[i:]
            if not rest or _KEY.fullmatch(rest) or rest.startswith(QUOTE) or \
                    QUOTE.startswith(rest):
                raise _Cut
            raise _Bad
        key = text[i:colon].strip()
        if key.startswith(QUOTE) and key.endswith(QUOTE) and len(key) >= 2 * len(QUOTE):
            key = key[len(QUOTE):-len(QUOTE)]  # a key written as a string
        elif not _KEY.fullmatch(key):
            raise _Bad
        out[key], i = _value(text, colon + 1)
        closed, i = _after_item(text, i, "}")
        if closed:
            return out, i


def _list(text: str, i: int) -> tuple[list[Any], int]:
    out: list[Any] = []
    i = _space(text, i)
    if text.startswith("]", i):
        return out, i + 1
    while True:
        item, i = _value(text, i)
        out.append(item)
        closed, i = _after_item(text, i, "]")
        if closed:
            return out, i


def _after_item(text: str, i: int, close: str) -> tuple[bool, int]:
    """After an object's or a list's item: (True, the index after ``close``) where it ends the
    container, (False, the index after the comma) where another item follows."""
    i = _space(text, i)
    if i >= len(text):
        raise _Cut
    if text[i] == close:
        return True, i + 1
    if text[i] != ",":
        raise _Bad
    return False, i + 1


# ---------------------------------------------------------------------------------------------
# The grammar of one call
# ---------------------------------------------------------------------------------------------

_GENERIC = [
    "g_value: g_string | g_object | g_list | G_NUMBER | \"true\" | \"false\" | \"null\"",
    "g_string: {q} G_TEXT {q}",
    "G_TEXT: /(?s:.*)/",  # the closing <|"|> is a token: no text matches it
    'g_object: "{{" (g_pair ("," g_pair)*)? "}}"',
    'g_pair: G_KEY ":" g_value',
    "G_KEY: /[A-Za-z_][A-Za-z0-9_]*/",
    'g_list: "[" (g_value ("," g_value)*)? "]"',
    "G_INTEGER: /-?(0|[1-9][0-9]*)/",
    "G_NUMBER: /-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?/",
]


def call_rules(tools: Sequence[dict], special_id: SpecialId) -> list[str]:
    """Lark rules whose ``call_json`` is one call of one of ``tools`` (OpenAI's tool objects,
    their schemas checked), after ``<|tool_call>`` and before ``<tool_call|>``."""
    token = special_id(QUOTE)
    if token is None:
        raise ConstraintError(f"the tokenizer has no {QUOTE} token: Gemma 4's tool calls "
                              "write their strings between them.", "tools")
    q = f"<[{token}]>"
    lines = [rule.format(q=q) for rule in _GENERIC]
    calls = []
    for t, tool in enumerate(tools):
        function = tool["function"]
        lines += _arguments_rules(f"t{t}", function.get("parameters") or {}, q)
        lines.append(f"t{t}: {json.dumps(function['name'])} t{t}_args")
        calls.append(f"t{t}")
    lines.append(f'call_json: "call:" ({" | ".join(calls)})')
    return lines


def _arguments_rules(prefix: str, schema: dict, q: str) -> list[str]:
    """``{prefix}_args``: the object of ``schema``'s properties, keys in the template's order
    (case-insensitive sort), the required ones present."""
    properties = schema.get("properties")
    if not isinstance(properties, dict) or not properties:
        return [f"{prefix}_args: g_object"]
    keys = sorted(properties, key=str.lower)
    required = set(schema.get("required") or ())
    lines = [f'{prefix}_args: "{{" {prefix}_r0 "}}"']
    for j, key in enumerate(keys):
        value, extra = _value_expr(f"{prefix.upper()}_{j}", properties[key], q)
        lines += extra
        pair, after = f"{prefix}_p{j}", f"{prefix}_s{j + 1}"
        lines.append(f'{pair}: {json.dumps(key)} ":" {value}')
        # r: no key written yet; s: after a key (the next one needs its comma)
        first, then = f"{pair} {after}", f'"," {pair} {after}'
        optional = key not in required
        lines.append(f"{prefix}_r{j}: {first}" + (f" | {prefix}_r{j + 1}" if optional else ""))
        if j:
            lines.append(f"{prefix}_s{j}: {then}" + (f" | {after}" if optional else ""))
    lines += [f'{prefix}_r{len(keys)}: ""', f'{prefix}_s{len(keys)}: ""']
    return lines


def _value_expr(name: str, schema: Any, q: str) -> tuple[str, list[str]]:
    """(a Lark expression of a value of ``schema``, the terminals it needs)."""
    if not isinstance(schema, dict):
        return "g_value", []
    enum = schema.get("enum")
    if isinstance(enum, list) and enum and all(isinstance(e, str) for e in enum):
        return f"{q} ({' | '.join(json.dumps(e) for e in enum)}) {q}", []
    kind = schema.get("type")
    if kind == "string":
        limit = schema.get("maxLength")
        if isinstance(limit, int) and not isinstance(limit, bool) and limit >= 0:
            return f"{q} {name} {q}", [f"{name}: /(?s:.{{0,{limit}}})/"]
        return "g_string", []
    if not isinstance(kind, str):  # several types (["string", "null"]) or none: any value
        return "g_value", []
    return {"integer": "G_INTEGER", "number": "G_NUMBER", "boolean": '("true" | "false")',
            "array": "g_list", "object": "g_object", "null": '"null"'}.get(kind, "g_value"), []


class Gemma4(TaggedCalls):
    """Gemma 4's tool calls: ``<|tool_call>call:NAME{...}<tool_call|>``, one block per call."""

    name = "gemma4"
    begin, end = CALL_START, CALL_END
    free_form = False  # a call's body is Gemma 4's own, not JSON

    @classmethod
    def detect(cls, template: str) -> bool:
        return CALL_START in template and CALL_END in template

    @property
    def markers(self) -> tuple[str, ...]:
        return (self.begin, self.end, QUOTE)

    def call_rules(self, tools: Sequence[dict], special_id: SpecialId) -> list[str]:
        return call_rules(tools, special_id)

    def read_call(self, text: str, i: int, out: Scan) -> int | None:
        call = read_call(text, i)
        if call is None:
            return None
        if call.name is not None:
            out.calls.append(PartialCall(call.name, call.arguments or "",
                                         call.arguments is not None))
        return call.end


class Gemma4Thought(ThinkBlock):
    """Gemma 4's thinking: the ``<|channel>thought ... <channel|>`` block."""

    name = "gemma4"
    tags = THOUGHT
