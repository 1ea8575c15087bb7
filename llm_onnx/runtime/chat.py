"""Chat templates rendered with Jinja2 the way transformers renders them.

Same environment as transformers' ``apply_chat_template``: a sandboxed, immutable environment with
``trim_blocks`` and ``lstrip_blocks``, loop controls, a ``tojson`` filter that keeps non-ASCII
text, ``raise_exception`` and ``strftime_now`` globals, ``{% generation %}`` blocks rendered as
their body, and the tokenizer's special tokens (``bos_token``, ``eos_token``, ...) as variables.
"""

from __future__ import annotations

import datetime
import functools
import json
from collections.abc import Sequence
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

from llm_onnx.errors import GenerationError

Message = dict[str, Any]


class _GenerationBlock(Extension):
    """``{% generation %}...{% endgeneration %}`` marks assistant text for training masks;
    rendering just keeps the body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def _raise(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


@functools.lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationBlock, "jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    try:
        return env.from_string(template)
    except jinja2.TemplateSyntaxError as e:
        raise GenerationError(f"the model's chat template does not parse: {e.message} "
                              f"(line {e.lineno}).") from e


def check_messages(messages: Sequence[Message]) -> list[Message]:
    if isinstance(messages, (str, bytes)) or not messages:
        raise GenerationError("chat messages must be a non-empty list of {'role': ..., "
                              "'content': ...} dicts.")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise GenerationError(f"chat message {i} must be a dict with 'role' and 'content'.")
        if not isinstance(m["role"], str):
            raise GenerationError(f"chat message {i}: 'role' must be a string.")
        out.append(dict(m))
    return out


def render_chat(template: str, messages: Sequence[Message], special_tokens: dict[str, str],
                add_generation_prompt: bool = True, **kwargs: Any) -> str:
    """The prompt text for ``messages``, as transformers' ``apply_chat_template(tokenize=False)``
    would render it."""
    messages = check_messages(messages)
    try:
        return _compile(template).render(messages=messages, tools=kwargs.pop("tools", None),
                                         documents=kwargs.pop("documents", None),
                                         add_generation_prompt=add_generation_prompt,
                                         **special_tokens, **kwargs)
    except jinja2.exceptions.TemplateError as e:
        raise GenerationError(f"the model's chat template failed: {e}") from e
