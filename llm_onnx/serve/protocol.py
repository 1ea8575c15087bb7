"""OpenAI's API shapes, shared by the request and response modules: errors, the checked plan of
a request, and the checks of single fields.

Every refusal is an ``ApiError`` with the status, ``type``, ``param`` and ``code`` OpenAI's API
uses, and a message naming the field and what it accepts. No web framework here. The request
bodies are read in ``requests`` (and their structured-output fields in ``structured``), the
answers written in ``responses``.
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
from llm_onnx.runtime.chat.request import ChatRequest
from llm_onnx.runtime.structured.constraint import Constraint
from llm_onnx.runtime.generation.options import row_options
from llm_onnx.runtime.generation.options import GenerationOptions

CHAT, COMPLETION = "chat.completion", "text_completion"

# Fields a body may carry. Accepted and ignored: they change nothing we compute.
_IGNORED = {"user", "metadata", "store", "service_tier", "modalities", "prediction",
            "reasoning_effort", "safety_identifier", "prompt_cache_key"}
_COMMON = {"model", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options", "stop",
           "seed", "presence_penalty", "frequency_penalty", "logit_bias", "logprobs",
           "response_format",
           # llm-onnx's own options, sent by the openai client as extra_body
           "top_k", "min_p", "repetition_penalty", "ignore_eos",
           # vLLM's structured outputs (and the guided_* fields of its older releases)
           "structured_outputs", "guided_json", "guided_regex", "guided_choice",
           "guided_grammar"} | _IGNORED
_CHAT = _COMMON | {"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice",
                   "parallel_tool_calls", "functions", "function_call",
                   # vLLM's extra field: chat template variables ({"enable_thinking": false})
                   "chat_template_kwargs", "reasoning_effort"}
_COMPLETIONS = _COMMON | {"prompt", "echo", "suffix", "best_of"}
MAX_N = 128
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # as OpenAI's legacy completions endpoint


class ApiError(Exception):
    """An error response in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 type: str = "invalid_request_error", code: str | None = None) -> None:
        message, param = _encodable(message), _encodable(param)  # a lone surrogate quoted
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def anthropic_body(self) -> dict[str, Any]:
        """The same error in Anthropic's shape (the Messages API's routes answer with it):
        {"type": "error", "error": {"type", "message"}}, the type by status."""
        kind = ANTHROPIC_ERROR_TYPES.get(self.status, "api_error")
        message = self.message if self.param is None or self.message.startswith(self.param) \
            else f"{self.param}: {self.message}"
        return {"type": "error", "error": {"type": kind, "message": message}}


def _encodable(text: str | None) -> str | None:
    """``text`` as UTF-8 can carry it: a lone surrogate from the request (a JSON "\\ud800")
    written as its escape, so that the error can be sent at all."""
    return None if text is None else text.encode("utf-8", "backslashreplace").decode("utf-8")


# Anthropic's error types by HTTP status (docs.anthropic.com, "Errors")
ANTHROPIC_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                         403: "permission_error", 404: "not_found_error",
                         413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
                         503: "overloaded_error", 529: "overloaded_error"}


def bad(param: str | None, message: str, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def api_key_error(authorization: str, key: str | None, x_api_key: str = "") -> ApiError | None:
    """None if the ``Authorization`` header carries ``Bearer <key>``, or ``X-API-Key`` carries
    the key (Anthropic's clients send it so), or no key is set; else the 401 to answer.
    Constant-time comparison."""
    if key is None:
        return None
    if x_api_key and not authorization:
        if hmac.compare_digest(x_api_key.strip().encode(), key.encode()):
            return None
        return ApiError(401, "Incorrect API key provided.", code="invalid_api_key")
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
    # Chat: the reply's tools, tool choice and think block (how it is constrained and read back)
    chat: ChatRequest | None = None
    # The constraint of the answer (before tools and thinking compose it; see structured.prepare)
    constraint: Constraint | None = None
    # Chat: where later prompts may part from this one (a recurrent state's checkpoints)
    reuse_points: list[int] = field(default_factory=list)
    # Completions with echo and logprobs: each prompt token's logprob and k alternatives
    prompt_logprobs: int | None = None
    id: str = ""
    created: int = 0

    def __post_init__(self) -> None:
        prefix = "chatcmpl" if self.kind == CHAT else "cmpl"
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    @property
    def thinking(self) -> bool | None:
        """Chat with a reasoning model: True if the prompt leaves a <think> block open (replies
        are split into reasoning_content and content). None: no split."""
        return self.chat.thinking if self.chat is not None else None

    @property
    def constraint_kind(self) -> str | None:
        """What constrains the replies, for the metrics: tools, json_schema, regex, ..."""
        if self.chat is not None and self.chat.calls_tools:
            return "tools"
        return self.constraint.kind if self.constraint is not None else None

    def jobs(self) -> list[tuple[list[int], GenerationOptions]]:
        """(prompt, options) of every choice, prompt-major: choice index = prompt * n + j; the
        j-th choice of a prompt samples with seed + j."""
        return [(p, row_options(o, j)) for p, o in zip(self.prompts, self.options)
                for j in range(self.n)]


# ---------------------------------------------------------------------------------------------
# Field checks
# ---------------------------------------------------------------------------------------------

def number(body: dict, name: str, low: float, high: float, *, low_open: bool = False,
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


def whole(value: Any) -> Any:
    """A JSON number with no fraction as an int (``6.0`` is the integer 6: JSON Schema's
    "integer", which OpenAI's API description uses, counts it as one); anything else as is."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value


def integer(body: dict, name: str, low: int, high: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    value = whole(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise bad(name, f"'{name}' must be an integer, got {value!r}.")
    if value < low or (high is not None and value > high):
        allowed = f">= {low}" if high is None else f"between {low} and {high}"
        raise bad(name, f"'{name}' must be an integer {allowed}, got {value}.")
    return value


def boolean(body: dict, name: str) -> bool | None:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise bad(name, f"'{name}' must be true or false, got {value!r}.")
    return value


def stop_strings(body: dict) -> tuple[str, ...]:
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


def known_fields(body: dict, allowed: set[str]) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise bad(unknown[0], f"Unrecognized request argument supplied: {unknown[0]}.")


def served_model(body: dict, served: str) -> str:
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


def unsupported(body: dict, name: str, allowed: object = None) -> None:
    value = body.get(name)
    if value not in (None, allowed) and value != [] and value != {}:
        raise bad(name, f"'{name}' is not supported by this server.")


def _logit_bias(body: dict, vocab: int) -> dict[int, float] | None:
    """OpenAI's logit_bias: {"token id": bias in [-100, 100]}."""
    value = body.get("logit_bias")
    if value is None or value == {}:
        return None
    if not isinstance(value, dict):
        raise bad("logit_bias", "'logit_bias' must be an object of token ids to numbers between "
                                "-100 and 100.")
    out = {}
    for key, bias in value.items():
        where = f"logit_bias.{key}"
        if not isinstance(key, str) or not key.isdigit() or int(key) >= vocab:
            raise bad("logit_bias", f"'logit_bias' key {key!r} is not a token id of this model "
                                    f"(0..{vocab - 1}).")
        if not isinstance(bias, numbers.Real) or isinstance(bias, bool) \
                or not -100 <= bias <= 100:
            raise bad(where, f"'{where}' must be a number between -100 and 100, got {bias!r}.")
        out[int(key)] = float(bias)
    return out


def sampling(body: dict, base: GenerationOptions, vocab: int) -> GenerationOptions:
    """Sampling fields over the model's defaults (``base``)."""
    fields: dict[str, Any] = {}
    bias = _logit_bias(body, vocab)
    if bias:
        fields["logit_bias"] = bias
    for name, value in (
        ("temperature", number(body, "temperature", 0, 2)),
        ("top_p", number(body, "top_p", 0, 1, low_open=True)),
        ("presence_penalty", number(body, "presence_penalty", -2, 2)),
        ("frequency_penalty", number(body, "frequency_penalty", -2, 2)),
        ("min_p", number(body, "min_p", 0, 1, high_open=True)),
        ("repetition_penalty", number(body, "repetition_penalty", 0, math.inf, low_open=True)),
        ("ignore_eos", boolean(body, "ignore_eos")),
    ):
        if value is not None:
            fields[name] = value
    top_k = integer(body, "top_k", -1)
    if top_k is not None:
        fields["top_k"] = max(top_k, 0)  # -1 (vLLM's "off") and 0 both mean off
    seed = whole(body.get("seed"))
    if seed is not None:
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise bad("seed", f"'seed' must be an integer, got {seed!r}.")
        fields["seed"] = seed % 2**63  # any integer; numpy seeds are non-negative
    fields["stop"] = stop_strings(body)
    try:
        return replace(base, **fields).validated()
    except GenerationError as e:  # a combination the sampler refuses: name the option
        raise bad(str(e).split("=")[0].strip(), str(e)) from None


def fit_length(body: dict, names: Sequence[str], prompt: list[int], context: int,
                default: int | None, what: str, low: int = 1) -> int:
    """max_new_tokens for one prompt: the request's value, at least ``low`` (refused if prompt
    + it exceed the context) or ``default`` cut to the room left (None: all of it)."""
    if len(prompt) >= context:
        raise bad("messages" if what == "messages" else "prompt",
                  f"This model's maximum context length is {context} tokens. However, your "
                  f"{what} resulted in {len(prompt)} tokens. Please reduce the length of the "
                  f"{what}.", code="context_length_exceeded")
    room = context - len(prompt)
    for name in names:
        value = integer(body, name, low)
        if value is not None:
            if value > room:
                raise bad(name, f"This model's maximum context length is {context} tokens. "
                                f"However, you requested {len(prompt) + value} tokens "
                                f"({len(prompt)} in the {what}, {value} in the completion). "
                                f"Please reduce the length of the {what} or '{name}'.",
                          code="context_length_exceeded")
            return value
    return room if default is None else min(default, room)


def stream_fields(body: dict) -> tuple[bool, bool]:
    stream = bool(boolean(body, "stream"))
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


def body_object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise bad(None, "the request body must be a JSON object.")
    return body
