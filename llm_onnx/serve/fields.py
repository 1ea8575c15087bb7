"""Checks of single request fields, shared by the APIs: each refusal is a 400 (``errors.bad``)
naming the field and what it accepts."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from llm_onnx.errors import GenerationError
from llm_onnx.runtime.generation.options import GenerationOptions
from llm_onnx.serve.errors import ApiError, bad
from llm_onnx.serve.names import ModelNames


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


def served_model(body: dict, served: str | ModelNames) -> str:
    """The request's ``model``, one of the names the served model answers to (names.py); the
    served model's primary name, which the answer carries."""
    names = served if isinstance(served, ModelNames) else ModelNames(served)
    name = body.get("model")
    if name is None:
        raise bad("model", "you must provide a model parameter (GET /v1/models lists the one "
                           "served here).")
    if not isinstance(name, str):
        raise bad("model", f"'model' must be a string, got {name!r}.")
    if not names.accepts(name):
        raise model_not_found(name, names)
    return names.primary


def model_not_found(name: str, names: ModelNames) -> ApiError:
    return ApiError(404, f"The model `{name}` does not exist. This server serves "
                         f"{names.listed()}.", param="model", code="model_not_found")


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
                default: int | None, what: str, low: int = 1, cut: bool = False) -> int:
    """max_new_tokens for one prompt: the request's value, at least ``low`` (refused if prompt
    + it exceed the context, or with ``cut`` cut to the room left) or ``default`` cut to the
    room left (None: all of it)."""
    if len(prompt) >= context:
        raise bad("messages" if what == "messages" else "prompt",
                  f"This model's maximum context length is {context} tokens. However, your "
                  f"{what} resulted in {len(prompt)} tokens. Please reduce the length of the "
                  f"{what}.", code="context_length_exceeded")
    room = context - len(prompt)
    for name in names:
        value = integer(body, name, low)
        if value is not None:
            if value > room and cut:
                return room
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
