"""The tool dialects whose calls are JSON objects between markers, each read off its template:

    hermes       Hermes 2 Pro, Qwen 2.5, Qwen3, SmolLM3 (any template that writes <tool_call>):
                 <tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>
                 (one block per call)
    mistral      Mistral v3 tokenizers: [TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]
    phi4_mini    Phi-4-mini: <|tool_call|>[{"name": "f", "arguments": {...}}]<|/tool_call|>
    llama3_json  Llama 3.1-3.3 JSON tool calling: the reply is {"name": "f", "parameters": {...}}
                 (several separated by ";"; an optional <|python_tag|> first)

A template that reads ``tools`` but shows none of the known markers is taken as Hermes, the
common case (``dialects.FALLBACK_TOOL_DIALECT``).
"""

from __future__ import annotations

import random
import string

from llm_onnx.runtime.chat.dialects.tagged_calls import TaggedCalls


class Hermes(TaggedCalls):
    name = "hermes"
    begin, end = "<tool_call>", "</tool_call>"

    @classmethod
    def detect(cls, template: str) -> bool:
        return "<tool_call>" in template


class Mistral(TaggedCalls):
    name = "mistral"
    begin, array, free_form = "[TOOL_CALLS]", True, False

    @classmethod
    def detect(cls, template: str) -> bool:
        return "[TOOL_CALLS]" in template

    def call_id(self) -> str:
        """Mistral's templates insist on ids of 9 letters and digits."""
        return "".join(random.choices(string.ascii_letters + string.digits, k=9))


class Phi4Mini(TaggedCalls):
    name = "phi4_mini"
    begin, end, array, free_form = "<|tool_call|>", "<|/tool_call|>", True, False

    @classmethod
    def detect(cls, template: str) -> bool:
        return "<|tool_call|>" in template or "<|tool|>" in template


class Llama3Json(TaggedCalls):
    name = "llama3_json"
    begin, key, separator, prefix = "", "parameters", ";", "<|python_tag|>"

    @classmethod
    def detect(cls, template: str) -> bool:
        return "<|start_header_id|>" in template and ("<|python_tag|>" in template or
                                                      "parameters" in template)
