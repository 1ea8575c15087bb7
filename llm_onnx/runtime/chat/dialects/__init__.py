"""Chat dialects: how each family of models writes its replies, registered by name.

    TOOL_DIALECTS       how replies write tool calls, read off the chat template (in this
                        order: the first whose ``detect`` matches)
        harmony         gpt-oss: messages on channels (harmony.py; its thinking too)
        gemma4          Gemma 4: <|tool_call>call:f{...}<tool_call|> (gemma4.py)
        hermes, mistral, phi4_mini, llama3_json      JSON between markers (tagged_json.py)
    REASONING_DIALECTS  how replies write their thinking, read off the tokenizer
        think           <think> ... </think> (think.py: Qwen3, DeepSeek-R1, SmolLM3)
        gemma4          <|channel>thought ... <channel|> (gemma4.py)

``chat_dialect(template, tokenizer)`` is a model's ChatDialect: its tool dialect composed with
its reasoning dialect (base.py says what each gives). Adding a dialect is one module here with
one class (a ``TaggedCalls`` subclass for calls between markers, a ``ThinkBlock`` subclass for
thinking between tags, or a ``ToolDialect`` of its own), and one line below: its place in the
order of detection.
"""

from __future__ import annotations

import difflib

import tokenizers

from llm_onnx.runtime.chat.dialects.base import ChatDialect, ReasoningDialect, ToolDialect
from llm_onnx.runtime.chat.dialects.gemma4 import Gemma4, Gemma4Thought
from llm_onnx.runtime.chat.dialects.harmony import Harmony
from llm_onnx.runtime.chat.dialects.tagged import TaggedDialect
from llm_onnx.runtime.chat.dialects.tagged_json import Hermes, Llama3Json, Mistral, Phi4Mini
from llm_onnx.runtime.chat.dialects.think import ThinkBlock
from llm_onnx.runtime.chat.render import template_variables
from llm_onnx.runtime.structured.constraint import ConstraintError

TOOL_DIALECTS: dict[str, type[ToolDialect]] = {d.name: d for d in (
    Harmony,
    Gemma4,
    Hermes,
    Mistral,
    Phi4Mini,
    Llama3Json,
)}
REASONING_DIALECTS: dict[str, type[ReasoningDialect]] = {d.name: d for d in (
    ThinkBlock,
    Gemma4Thought,
)}
# A template that reads ``tools`` but writes none of the known markers: the common case.
FALLBACK_TOOL_DIALECT = "hermes"


def choosable_tool_dialects() -> list[str]:
    """The tool dialects a model may be told to use whatever its template (sorted)."""
    return sorted(name for name, d in TOOL_DIALECTS.items() if d.choosable)


def detect_tool_dialect(template: str | None) -> str | None:
    """The name of the tool dialect a chat template speaks (None: it renders no tools)."""
    if not template:
        return None
    found = next((name for name, d in TOOL_DIALECTS.items() if d.detect(template)), None)
    if found is None and "tools" in template_variables(template):
        return FALLBACK_TOOL_DIALECT
    return found


def detect_reasoning_dialect(tokenizer: tokenizers.Tokenizer | None) -> str | None:
    """The name of the reasoning dialect a tokenizer's model writes (None: its replies are all
    answer)."""
    return next((name for name, d in REASONING_DIALECTS.items() if d.detect(tokenizer)), None)


def tool_dialect(name: str) -> ToolDialect:
    """The tool dialect registered as ``name``; an unknown name is an error listing the known
    ones (and the closest, if one is close)."""
    if name not in TOOL_DIALECTS:
        close = difflib.get_close_matches(name, TOOL_DIALECTS, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConstraintError(f"unknown tool-call format {name!r}; known: "
                              f"{', '.join(sorted(TOOL_DIALECTS))}.{hint}", "tool_call_format")
    return TOOL_DIALECTS[name]()


def chat_dialect(template: str | None, tokenizer: tokenizers.Tokenizer | None,
                 tool_call_format: str | None = None) -> ChatDialect:
    """A model's dialect: the tool dialect ``tool_call_format`` names (default: read off
    ``template``; none if it renders no tools) with the reasoning dialect of ``tokenizer``."""
    name = tool_call_format or detect_tool_dialect(template)
    reasoning = detect_reasoning_dialect(tokenizer)
    thinks = REASONING_DIALECTS[reasoning]() if reasoning is not None else None
    if name is None:
        return TaggedDialect(None, thinks)
    return tool_dialect(name).chat(thinks)


__all__ = ["FALLBACK_TOOL_DIALECT", "REASONING_DIALECTS", "TOOL_DIALECTS", "ChatDialect",
           "chat_dialect", "choosable_tool_dialects", "detect_reasoning_dialect",
           "detect_tool_dialect", "tool_dialect"]
