"""Chat templates rendered with Jinja2 the way transformers renders them.

Same environment as transformers' ``apply_chat_template``: a sandboxed, immutable environment with
``trim_blocks`` and ``lstrip_blocks``, loop controls, a ``tojson`` filter that keeps non-ASCII
text, ``raise_exception`` and ``strftime_now`` globals, ``{% generation %}`` blocks rendered as
their body, and the tokenizer's special tokens (``bos_token``, ``eos_token``, ...) as variables.
Messages are prepared as transformers prepares them: keys whose value is None are dropped (the
OpenAI client sends ``"content": null`` beside ``tool_calls``), and a message's reasoning given as
``reasoning`` or ``thinking`` is also passed as ``reasoning_content``, the name templates read;
as vLLM does, a tool call's ``arguments`` given as JSON text reach the template as an object.

Callers add their own variables (``enable_thinking=False``, ...) as keywords; they override a
special token of the same name, as in transformers. One deliberate difference: a template that
lists tools from ``xml_tools`` and never reads ``tools`` (SmolLM3's first release, whose model
card says ``apply_chat_template(..., xml_tools=tools)``) gets the tools under that name, so an
OpenAI-style request's tools reach the model; transformers would leave them out.
"""

from __future__ import annotations

import datetime
import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

import jinja2
from jinja2 import meta, nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

from llm_onnx.errors import GenerationError

Message = dict[str, Any]

# What every render passes itself: a template variable of the same name would collide.
RESERVED_VARIABLES = frozenset({"messages", "tools", "documents", "add_generation_prompt"})
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


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


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationBlock, "jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(template)
    except jinja2.TemplateSyntaxError as e:
        raise GenerationError(f"the model's chat template does not parse: {e.message} "
                              f"(line {e.lineno}).") from e


@functools.lru_cache(maxsize=16)
def template_variables(template: str) -> frozenset[str]:
    """The names a chat template reads without setting them itself: ``messages``,
    ``add_generation_prompt``, special tokens, and the switches a caller may set
    (``enable_thinking``, ``tools``, ...)."""
    env = _compile(template).environment
    return frozenset(meta.find_undeclared_variables(env.parse(template))) - set(env.globals)


def check_template_vars(variables: Mapping[str, Any] | None) -> dict[str, Any]:
    """``variables`` as a dict of template variables, or a GenerationError saying what is wrong."""
    if variables is None:
        return {}
    if not isinstance(variables, Mapping):
        raise GenerationError(f"template variables must be a dict of names to values, got "
                              f"{type(variables).__name__}.")
    for name in variables:
        if not isinstance(name, str) or not name.isidentifier():
            raise GenerationError(f"template variable {name!r} is not a valid name (letters, "
                                  "digits and underscores, not starting with a digit).")
        if name in RESERVED_VARIABLES:
            raise GenerationError(f"template variable {name!r} is set by the renderer itself "
                                  f"(reserved: {', '.join(sorted(RESERVED_VARIABLES))}); pass "
                                  "tools as tools=... .")
    return dict(variables)


def check_messages(messages: Sequence[Message]) -> list[Message]:
    """Copies of the messages as templates see them (see the module docstring)."""
    if isinstance(messages, (str, bytes)) or not messages:
        raise GenerationError("chat messages must be a non-empty list of {'role': ..., "
                              "'content': ...} dicts.")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m:
            raise GenerationError(f"chat message {i} must be a dict with 'role' and 'content'.")
        m = {k: v for k, v in m.items() if v is not None}
        if "content" not in m and not m.get("tool_calls"):
            raise GenerationError(f"chat message {i} must be a dict with 'role' and 'content' "
                                  "(or an assistant's 'tool_calls').")
        if not isinstance(m["role"], str):
            raise GenerationError(f"chat message {i}: 'role' must be a string.")
        reasoning = next((m[k] for k in _REASONING_FIELDS if k in m), None)
        if reasoning is not None:
            m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
        if isinstance(m.get("tool_calls"), list):
            m["tool_calls"] = [_arguments_as_object(c) for c in m["tool_calls"]]
        out.append(m)
    return out


def _arguments_as_object(call: Any) -> Any:
    """A tool call whose ``function.arguments`` is OpenAI's JSON string, with the arguments as
    an object (as vLLM gives them to templates: ``arguments | tojson`` then writes JSON, not a
    quoted string). Text that is not a JSON object stays as it is."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
        return call
    try:
        arguments = json.loads(function["arguments"])
    except ValueError:
        return call
    if not isinstance(arguments, dict):
        return call
    return {**call, "function": {**function, "arguments": arguments}}


def continue_final(rendered: str, messages: Sequence[Message]) -> str:
    """``rendered`` (``messages`` rendered without a generation prompt) cut right after the
    final message's text, so that a reply continues it rather than starting a turn of its own:
    transformers' ``continue_final_message`` (the text is found stripped, as templates often
    trim it)."""
    content = messages[-1].get("content") if messages and isinstance(messages[-1], dict) else None
    if isinstance(content, list):
        texts = [p.get("text") for p in content if isinstance(p, dict)]
        content = texts[-1] if texts else None
    final = content.strip() if isinstance(content, str) else ""
    at = rendered.rfind(final) if final else -1
    if at < 0:
        raise GenerationError("the final message cannot be continued: its text is empty or "
                              "the chat template does not write it as given.")
    return rendered[:at + len(final)]


def render_chat(template: str, messages: Sequence[Message], special_tokens: dict[str, str],
                add_generation_prompt: bool = True, *, tools: Sequence[dict] | None = None,
                documents: Sequence[dict] | None = None, **variables: Any) -> str:
    """The prompt text for ``messages``, as transformers' ``apply_chat_template(tokenize=False,
    tools=tools, documents=documents, **variables)`` would render it."""
    messages = check_messages(messages)
    context = {**special_tokens, **check_template_vars(variables)}
    if tools is not None and "xml_tools" not in context:
        names = template_variables(template)
        if "xml_tools" in names and "tools" not in names:  # SmolLM3's first template
            context["xml_tools"] = list(tools)
    try:
        return _compile(template).render(
            messages=messages, tools=None if tools is None else list(tools),
            documents=None if documents is None else list(documents),
            add_generation_prompt=add_generation_prompt, **context)
    except jinja2.exceptions.TemplateError as e:
        raise GenerationError(f"the model's chat template failed: {e}") from e
