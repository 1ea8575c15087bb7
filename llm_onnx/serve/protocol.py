"""OpenAI's request and response shapes: a request body checked field by field into what the
scheduler runs, and the JSON objects (completions, chunks, errors) sent back.

Every refusal is an ``ApiError`` with the status, ``type``, ``param`` and ``code`` OpenAI's API
uses, and a message naming the field and what it accepts. No web framework here.
"""

from __future__ import annotations

import hmac
import math
import numbers
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from llm_onnx.errors import GenerationError
from llm_onnx.runtime.chat import check_template_vars, template_variables
from llm_onnx.runtime.generator import row_options
from llm_onnx.runtime.model import Model
from llm_onnx.runtime.reasoning import opens_thought, split_reasoning
from llm_onnx.runtime.sampling import GenerationOptions
from llm_onnx.runtime.sequence import Result, TokenLogprob

CHAT, COMPLETION = "chat.completion", "text_completion"

# Fields a body may carry. Accepted and ignored: they change nothing we compute.
_IGNORED = {"user", "metadata", "store", "service_tier", "parallel_tool_calls", "modalities",
            "prediction", "reasoning_effort", "safety_identifier", "prompt_cache_key"}
_COMMON = {"model", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options", "stop",
           "seed", "presence_penalty", "frequency_penalty", "logit_bias", "logprobs",
           # llm-onnx's own options, sent by the openai client as extra_body
           "top_k", "min_p", "repetition_penalty", "ignore_eos"} | _IGNORED
_CHAT = _COMMON | {"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice",
                   "functions", "function_call", "response_format",
                   # vLLM's extra field: chat template variables ({"enable_thinking": false})
                   "chat_template_kwargs"}
_COMPLETIONS = _COMMON | {"prompt", "echo", "suffix", "best_of"}
MAX_N = 128
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # as OpenAI's legacy completions endpoint


class ApiError(Exception):
    """An error response in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 type: str = "invalid_request_error", code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def bad(param: str | None, message: str, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def api_key_error(authorization: str, key: str | None) -> ApiError | None:
    """None if the ``Authorization`` header carries ``Bearer <key>`` (or no key is set), else
    the 401 to answer. Constant-time comparison."""
    if key is None:
        return None
    if not authorization:
        return ApiError(401, "You didn't provide an API key. Send it in the Authorization header "
                             "as 'Bearer <key>'.", code="invalid_api_key")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
        return ApiError(401, "Incorrect API key provided.", code="invalid_api_key")
    return None


@dataclass
class Plan:
    """A checked request: what to run and how to answer."""

    kind: str  # CHAT or COMPLETION
    model: str
    prompts: list[list[int]]  # token ids, one list per prompt
    options: list[GenerationOptions]  # one per prompt (max_new_tokens fitted to its length)
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    logprobs: int | None = None  # None: off; k: the chosen token and k alternatives
    echo: bool = False
    prompt_texts: list[str] = field(default_factory=list)
    # Chat with a reasoning model: replies are split into reasoning_content and content; True if
    # the prompt leaves a <think> block open. None: no split (content is the whole reply).
    thinking: bool | None = None
    id: str = ""
    created: int = 0

    def __post_init__(self) -> None:
        prefix = "chatcmpl" if self.kind == CHAT else "cmpl"
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def jobs(self) -> list[tuple[list[int], GenerationOptions]]:
        """(prompt, options) of every choice, prompt-major: choice index = prompt * n + j; the
        j-th choice of a prompt samples with seed + j."""
        return [(p, row_options(o, j)) for p, o in zip(self.prompts, self.options)
                for j in range(self.n)]


# ---------------------------------------------------------------------------------------------
# Field checks
# ---------------------------------------------------------------------------------------------

def _number(body: dict, name: str, low: float, high: float, *, low_open: bool = False,
            high_open: bool = False) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not math.isfinite(value):
        raise bad(name, f"'{name}' must be a number, got {value!r}.")
    below = value <= low if low_open else value < low
    above = value >= high if high_open else value > high
    if below or above:
        lo, hi = ("(" if low_open else "["), (")" if high_open else "]")
        raise bad(name, f"'{name}' must be in {lo}{low:g}, {high:g}{hi}, got {value!r}.")
    return float(value)


def _integer(body: dict, name: str, low: int, high: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise bad(name, f"'{name}' must be an integer, got {value!r}.")
    if value < low or (high is not None and value > high):
        allowed = f">= {low}" if high is None else f"between {low} and {high}"
        raise bad(name, f"'{name}' must be an integer {allowed}, got {value}.")
    return value


def _boolean(body: dict, name: str) -> bool | None:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise bad(name, f"'{name}' must be true or false, got {value!r}.")
    return value


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise bad("stop", "'stop' must be a string or a list of strings.")
    if any(not s for s in stop):
        raise bad("stop", "'stop' strings must not be empty.")
    return tuple(stop)


def _known_fields(body: dict, allowed: set[str]) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise bad(unknown[0], f"Unrecognized request argument supplied: {unknown[0]}.")


def _model(body: dict, served: str) -> str:
    name = body.get("model")
    if name is None:
        raise bad("model", "you must provide a model parameter (GET /v1/models lists the one "
                           "served here).")
    if not isinstance(name, str):
        raise bad("model", f"'model' must be a string, got {name!r}.")
    if name != served:
        raise ApiError(404, f"The model `{name}` does not exist. This server serves "
                            f"`{served}`.", param="model", code="model_not_found")
    return name


def _unsupported(body: dict, name: str, allowed: object = None) -> None:
    value = body.get(name)
    if value not in (None, allowed) and value != [] and value != {}:
        raise bad(name, f"'{name}' is not supported by this server.")


def _sampling(body: dict, base: GenerationOptions) -> GenerationOptions:
    """Sampling fields over the model's defaults (``base``)."""
    fields: dict[str, Any] = {}
    for name, value in (
        ("temperature", _number(body, "temperature", 0, 2)),
        ("top_p", _number(body, "top_p", 0, 1, low_open=True)),
        ("presence_penalty", _number(body, "presence_penalty", -2, 2)),
        ("frequency_penalty", _number(body, "frequency_penalty", -2, 2)),
        ("min_p", _number(body, "min_p", 0, 1, high_open=True)),
        ("repetition_penalty", _number(body, "repetition_penalty", 0, math.inf, low_open=True)),
        ("ignore_eos", _boolean(body, "ignore_eos")),
    ):
        if value is not None:
            fields[name] = value
    top_k = _integer(body, "top_k", -1)
    if top_k is not None:
        fields["top_k"] = max(top_k, 0)  # -1 (vLLM's "off") and 0 both mean off
    seed = body.get("seed")
    if seed is not None:
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise bad("seed", f"'seed' must be an integer, got {seed!r}.")
        fields["seed"] = seed % 2**63  # any integer; numpy seeds are non-negative
    fields["stop"] = _stop(body)
    try:
        return replace(base, **fields).validated()
    except GenerationError as e:  # a combination the sampler refuses: name the option
        raise bad(str(e).split("=")[0].strip(), str(e)) from None


def _fit_length(body: dict, names: Sequence[str], prompt: list[int], context: int,
                default: int | None, what: str) -> int:
    """max_new_tokens for one prompt: the request's value (refused if prompt + it exceed the
    context) or ``default`` cut to the room left (None: all of it)."""
    if len(prompt) >= context:
        raise bad("messages" if what == "messages" else "prompt",
                  f"This model's maximum context length is {context} tokens. However, your "
                  f"{what} resulted in {len(prompt)} tokens. Please reduce the length of the "
                  f"{what}.", code="context_length_exceeded")
    room = context - len(prompt)
    for name in names:
        value = _integer(body, name, 1)
        if value is not None:
            if value > room:
                raise bad(name, f"This model's maximum context length is {context} tokens. "
                                f"However, you requested {len(prompt) + value} tokens "
                                f"({len(prompt)} in the {what}, {value} in the completion). "
                                f"Please reduce the length of the {what} or '{name}'.",
                          code="context_length_exceeded")
            return value
    return room if default is None else min(default, room)


def _stream(body: dict) -> tuple[bool, bool]:
    stream = bool(_boolean(body, "stream"))
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not stream:
        raise bad("stream_options", "'stream_options' is only allowed when 'stream' is true.")
    if not isinstance(options, dict) or set(options) - {"include_usage", "continuous_usage_stats"}:
        raise bad("stream_options", "'stream_options' must be an object like "
                                    "{\"include_usage\": true}.")
    usage = options.get("include_usage", False)
    if not isinstance(usage, bool):
        raise bad("stream_options.include_usage", "'include_usage' must be true or false.")
    return stream, usage


# ---------------------------------------------------------------------------------------------
# Requests
# ---------------------------------------------------------------------------------------------

def _object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise bad(None, "the request body must be a JSON object.")
    return body


def chat_plan(body: Any, model: Model, served: str, context: int) -> Plan:
    """POST /v1/chat/completions, checked."""
    body = _object(body)
    _known_fields(body, _CHAT)
    name = _model(body, served)
    _unsupported(body, "functions")
    _unsupported(body, "function_call", "none")
    _unsupported(body, "logit_bias")
    fmt = body.get("response_format")
    if fmt is not None and fmt != {"type": "text"}:
        raise bad("response_format", "only {\"type\": \"text\"} is supported as "
                                     "'response_format'.")
    if not model.chat_template:
        raise bad("messages", "this model has no chat template; use /v1/completions.")
    tools = _tools(body, model.chat_template)
    template_vars = _template_kwargs(body)
    messages = _messages(body.get("messages"))
    try:
        text = model.render_chat(messages, tools=tools, template_vars=template_vars)
        prompt = model.encode(text, add_special_tokens=False)
    except GenerationError as e:
        raise bad("messages", str(e)) from None
    n = _integer(body, "n", 1, MAX_N) or 1
    stream, usage = _stream(body)
    logprobs = None
    if _boolean(body, "logprobs"):
        logprobs = _integer(body, "top_logprobs", 0, 20) or 0
    elif body.get("top_logprobs") is not None:
        raise bad("top_logprobs", "'top_logprobs' needs 'logprobs' set to true.")
    options = _sampling(body, model.defaults)
    new = _fit_length(body, ("max_completion_tokens", "max_tokens"), prompt, context, None,
                      "messages")
    return Plan(CHAT, name, [prompt], [replace(options, max_new_tokens=new)], n, stream, usage,
                logprobs, thinking=opens_thought(text) if model.splits_reasoning else None)


def _tools(body: dict, template: str) -> list[dict] | None:
    """The tools to render into the prompt (OpenAI's function schemas, passed to the template as
    transformers passes them); None without tools or with tool_choice "none". Tool calls in the
    reply are not parsed: they come back as the text the model wrote."""
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise bad("tool_choice", "'tool_choice' may be \"auto\" or \"none\"; forcing a tool "
                                 "call is not supported by this server.")
    tools = body.get("tools")
    if tools is None or tools == []:
        return None
    if "tools" not in template_variables(template):
        raise bad("tools", "'tools' is not supported by this model's chat template (it does not "
                           "render tools).")
    if not isinstance(tools, list):
        raise bad("tools", "'tools' must be a list of {\"type\": \"function\", \"function\": "
                           "{...}} objects.")
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise bad(where, f"'{where}' must be an object with \"type\": \"function\".")
        function = tool.get("function")
        if not isinstance(function, dict):
            raise bad(f"{where}.function", f"'{where}.function' must be an object with a "
                                           "'name' (and 'description', 'parameters').")
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise bad(f"{where}.function.name", f"'{where}.function.name' must be a non-empty "
                                                "string.")
        if not isinstance(function.get("description", ""), str):
            raise bad(f"{where}.function.description",
                      f"'{where}.function.description' must be a string.")
        if not isinstance(function.get("parameters", {}), dict):
            raise bad(f"{where}.function.parameters",
                      f"'{where}.function.parameters' must be a JSON Schema object.")
    return None if choice == "none" else tools


def _template_kwargs(body: dict) -> dict[str, Any] | None:
    """vLLM's ``chat_template_kwargs``: variables for the chat template. Names the template does
    not read are ignored, as transformers and vLLM ignore them."""
    value = body.get("chat_template_kwargs")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad("chat_template_kwargs", "'chat_template_kwargs' must be an object of chat "
                                          "template variables, like {\"enable_thinking\": false}.")
    try:
        return check_template_vars(value)
    except GenerationError as e:
        raise bad("chat_template_kwargs", f"'chat_template_kwargs': {e}") from None


_ROLES = {"system", "developer", "user", "assistant", "tool"}


def _messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list):
        raise bad("messages", "'messages' must be a list of {\"role\", \"content\"} objects.")
    if not messages:
        raise bad("messages", "'messages' must not be empty.")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(where, f"'{where}' must be an object with 'role' and 'content'.")
        role = m.get("role")
        if role not in _ROLES:
            raise bad(f"{where}.role", f"'{where}.role' must be one of "
                                       f"{', '.join(sorted(_ROLES))}, got {role!r}.")
        content = m.get("content")
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" \
                        or not isinstance(part.get("text"), str):
                    raise bad(f"{where}.content[{j}]", "only text content parts "
                              "({\"type\": \"text\", \"text\": ...}) are supported.")
                texts.append(part["text"])
            content = "".join(texts)
        if content is None and role == "assistant":
            content = ""
        if not isinstance(content, str):
            raise bad(f"{where}.content", f"'{where}.content' must be a string or a list of "
                                          "text parts.")
        message = {"role": "system" if role == "developer" else role, "content": content}
        for key in ("name", "tool_call_id", "reasoning_content", "reasoning"):
            value = m.get(key)
            if value is not None:
                if not isinstance(value, str):
                    raise bad(f"{where}.{key}", f"'{where}.{key}' must be a string.")
                message[key] = value
        if m.get("tool_calls") is not None:
            if role != "assistant":
                raise bad(f"{where}.tool_calls", "only assistant messages carry 'tool_calls'.")
            message["tool_calls"] = _tool_calls(m["tool_calls"], f"{where}.tool_calls")
        out.append(message)
    return out


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """An assistant message's tool calls: [{"id", "type": "function", "function": {"name",
    "arguments"}}], arguments a JSON string (OpenAI's form) or an object."""
    if not isinstance(calls, list):
        raise bad(where, f"'{where}' must be a list of tool calls.")
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or \
                not isinstance(function.get("arguments", ""), (str, dict)):
            raise bad(f"{where}[{j}]", f"'{where}[{j}]' must be {{\"id\": ..., \"type\": "
                                       "\"function\", \"function\": {\"name\": ..., "
                                       "\"arguments\": \"<JSON>\"}}.")
    return calls


def completion_plan(body: Any, model: Model, served: str, context: int) -> Plan:
    """POST /v1/completions, checked."""
    body = _object(body)
    _known_fields(body, _COMPLETIONS)
    name = _model(body, served)
    _unsupported(body, "logit_bias")
    _unsupported(body, "suffix", "")
    n = _integer(body, "n", 1, MAX_N) or 1
    best_of = _integer(body, "best_of", 1, MAX_N)
    if best_of is not None and best_of != n:
        raise bad("best_of", "'best_of' different from 'n' is not supported.")
    echo = bool(_boolean(body, "echo"))
    logprobs = _integer(body, "logprobs", 0, 5)
    if echo and logprobs is not None:
        raise bad("echo", "'echo' together with 'logprobs' (prompt logprobs) is not supported.")
    stream, usage = _stream(body)
    texts, prompts = _prompts(body.get("prompt"), model)
    options = _sampling(body, model.defaults)
    fitted = [replace(options, max_new_tokens=_fit_length(
        body, ("max_tokens",), p, context, COMPLETIONS_DEFAULT_MAX_TOKENS, "prompt"))
        for p in prompts]
    if len(prompts) * n > MAX_N:
        raise bad("n", f"{len(prompts)} prompts x n={n} is more than {MAX_N} choices.")
    return Plan(COMPLETION, name, prompts, fitted, n, stream, usage, logprobs, echo, texts)


def _prompts(prompt: Any, model: Model) -> tuple[list[str], list[list[int]]]:
    """A string, a list of strings, a list of token ids or a list of those."""
    vocab = model.engine.vocab_size
    if prompt is None:
        raise bad("prompt", "you must provide a 'prompt'.")
    items = [prompt] if isinstance(prompt, str) or (
        isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)) else prompt
    if not isinstance(items, list) or not items:
        raise bad("prompt", "'prompt' must be a string, a list of strings, a list of token ids "
                            "or a list of lists of token ids, and not empty.")
    texts, ids = [], []
    for i, item in enumerate(items):
        if isinstance(item, str):
            if not item:
                raise bad("prompt", "a prompt must not be an empty string.")
            try:
                tokens = model.encode(item)
            except GenerationError as e:
                raise bad("prompt", str(e)) from None
            texts.append(item)
        elif isinstance(item, list) and item and all(
                isinstance(t, int) and not isinstance(t, bool) for t in item):
            outside = [t for t in item if not 0 <= t < vocab]
            if outside:
                raise bad("prompt", f"token id {outside[0]} in prompt {i} is outside the "
                                    f"vocabulary (0..{vocab - 1}).")
            tokens = list(item)
            texts.append(model.decode(tokens) if model.tokenizer is not None else "")
        else:
            raise bad("prompt", f"prompt {i} must be a non-empty string or list of token ids.")
        if not tokens:
            raise bad("prompt", f"prompt {i} has no tokens.")
        ids.append(tokens)
    return texts, ids


# ---------------------------------------------------------------------------------------------
# Responses
# ---------------------------------------------------------------------------------------------

def finish_reason(reason: str) -> str:
    """Our finish reasons in OpenAI's words ("cancelled" only reaches a client whose request the
    server ended while shutting down)."""
    return {"stop": "stop", "stop_string": "stop", "length": "length"}.get(reason, "abort")


class TokenText:
    """Token strings and bytes for logprobs: a byte-level BPE token's own bytes (a character may
    span tokens), else the token decoded alone."""

    def __init__(self, model: Model) -> None:
        self.tokenizer = model.tokenizer
        self._byte_level = False
        if self.tokenizer is not None:
            import json

            decoder = json.loads(self.tokenizer.to_str()).get("decoder") or {}
            kinds = [decoder.get("type")] + [d.get("type") for d in decoder.get("decoders", [])]
            self._byte_level = "ByteLevel" in kinds
        self._unbyte = _unicode_to_bytes()

    def bytes(self, token_id: int) -> bytes:
        if self.tokenizer is None:
            return str(token_id).encode()
        if self._byte_level:
            piece = self.tokenizer.id_to_token(token_id) or ""
            if all(c in self._unbyte for c in piece):
                return bytes(self._unbyte[c] for c in piece)
        return self.tokenizer.decode([token_id], skip_special_tokens=False).encode("utf-8")

    def text(self, token_id: int) -> str:
        return self.bytes(token_id).decode("utf-8", errors="replace")


def _unicode_to_bytes() -> dict[str, int]:
    """The inverse of GPT-2's byte-to-printable-character table (ByteLevel pre-tokenizers)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def chat_logprobs(items: Sequence[TokenLogprob], text: TokenText) -> dict[str, Any]:
    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        raw = text.bytes(token_id)
        return {"token": raw.decode("utf-8", errors="replace"), "logprob": logprob,
                "bytes": list(raw)}

    return {"content": [dict(entry(lp.token_id, lp.logprob),
                             top_logprobs=[entry(t, v) for t, v in lp.top]) for lp in items],
            "refusal": None}


def completion_logprobs(items: Sequence[TokenLogprob], text: TokenText,
                        offset: int = 0) -> dict[str, Any]:
    tokens, offsets = [], []
    for lp in items:
        offsets.append(offset)
        tokens.append(text.text(lp.token_id))
        offset += len(tokens[-1])
    return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in items],
            "top_logprobs": [{text.text(t): v for t, v in lp.top} for lp in items],
            "text_offset": offsets}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def response(plan: Plan, results: Sequence[Result], text: TokenText) -> dict[str, Any]:
    """The whole (non-streamed) answer: one choice per result, prompt-major."""
    choices = []
    for index, r in enumerate(results):
        if plan.kind == CHAT:
            message: dict[str, Any] = {"role": "assistant", "content": r.text, "refusal": None}
            if plan.thinking is not None:
                message["reasoning_content"], message["content"] = \
                    split_reasoning(r.text, plan.thinking)
            choice = {"index": index, "message": message,
                      "logprobs": None if plan.logprobs is None or r.logprobs is None
                      else chat_logprobs(r.logprobs, text),
                      "finish_reason": finish_reason(r.finish_reason)}
        else:
            prefix = plan.prompt_texts[index // plan.n] if plan.echo else ""
            choice = {"index": index, "text": prefix + r.text,
                      "logprobs": None if plan.logprobs is None or r.logprobs is None
                      else completion_logprobs(r.logprobs, text),
                      "finish_reason": finish_reason(r.finish_reason)}
        choices.append(choice)
    return {"id": plan.id, "object": plan.kind, "created": plan.created, "model": plan.model,
            "choices": choices, "usage": usage(sum(len(p) for p in plan.prompts),
                                               sum(len(r.token_ids) for r in results)),
            "system_fingerprint": None}


def chunk(plan: Plan, choices: list[dict[str, Any]], usage_: dict[str, int] | None = None,
          ) -> dict[str, Any]:
    """One server-sent event's object (``chat.completion.chunk`` or ``text_completion``)."""
    out = {"id": plan.id, "object": "chat.completion.chunk" if plan.kind == CHAT else COMPLETION,
           "created": plan.created, "model": plan.model, "choices": choices,
           "system_fingerprint": None}
    if plan.include_usage:
        out["usage"] = usage_
    return out
