"""Request bodies read into plans: POST /v1/chat/completions and /v1/completions, checked field
by field (the structured-output fields in ``structured``)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from llm_onnx.errors import GenerationError
from llm_onnx.runtime.chat.render import check_template_vars, template_variables
from llm_onnx.runtime.chat.request import ChatRequest
from llm_onnx.runtime.structured.constraint import ConstraintError
from llm_onnx.runtime.model import Model
from llm_onnx.serve.protocol import (_CHAT, _COMPLETIONS, CHAT, COMPLETION,
                                     COMPLETIONS_DEFAULT_MAX_TOKENS, MAX_N, Plan, bad,
                                     body_object, boolean, fit_length, integer, known_fields,
                                     sampling, served_model, stream_fields, unsupported)
from llm_onnx.serve.structured import answer_constraint, tool_fields


def chat_plan(body: Any, model: Model, served: str, context: int) -> Plan:
    """POST /v1/chat/completions, checked (its constraint is composed by structured.prepare)."""
    body = body_object(body)
    known_fields(body, _CHAT)
    name = served_model(body, served)
    unsupported(body, "functions")
    unsupported(body, "function_call", "none")
    if not model.chat_template:
        raise bad("messages", "this model has no chat template; use /v1/completions.")
    answer = answer_constraint(body)
    tools, choice, parallel = tool_fields(body, model.chat_template)
    template_vars = _reasoning_vars(body, model.chat_template, _template_kwargs(body))
    messages = _messages(body.get("messages"))
    try:
        text = model.render_chat(messages, tools=tools, template_vars=template_vars)
        prompt = model.encode(text, add_special_tokens=False)
        chat = ChatRequest(model, text, answer, tools, choice, parallel)
    except ConstraintError as e:
        raise bad(e.where, str(e)) from None
    except GenerationError as e:
        raise bad("messages", str(e)) from None
    n = integer(body, "n", 1, MAX_N) or 1
    stream, usage = stream_fields(body)
    logprobs = None
    if boolean(body, "logprobs"):
        logprobs = integer(body, "top_logprobs", 0, 20) or 0
    elif body.get("top_logprobs") is not None:
        raise bad("top_logprobs", "'top_logprobs' needs 'logprobs' set to true.")
    options = sampling(body, model.defaults, model.engine.vocab_size)
    new = fit_length(body, ("max_completion_tokens", "max_tokens"), prompt, context, None,
                     "messages")
    return Plan(CHAT, name, [prompt], [replace(options, max_new_tokens=new)], n, stream, usage,
                logprobs, chat=chat, constraint=answer,
                reuse_points=model.reuse_points(messages, prompt, tools=tools,
                                                template_vars=template_vars))


REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


def _reasoning_vars(body: dict, template: str, variables: dict[str, Any] | None,
                    ) -> dict[str, Any] | None:
    """``reasoning_effort`` (OpenAI's field, which vLLM and Ollama also take) as the chat
    template's own switch: gpt-oss's ``reasoning_effort`` (low, medium, high: none and minimal
    read as low, xhigh as high), or for a template with ``enable_thinking``, thinking off for
    none and on for any other effort (Qwen3 and SmolLM3 think by default, Gemma 4 does not).
    chat_template_kwargs, if it sets the same variable, wins."""
    effort = body.get("reasoning_effort")
    if effort is None:
        return variables
    if effort not in REASONING_EFFORTS:
        raise bad("reasoning_effort", f"'reasoning_effort' must be one of "
                                      f"{', '.join(REASONING_EFFORTS)}, got {effort!r}.")
    names = template_variables(template)
    extra: dict[str, Any] = {}
    if "reasoning_effort" in names:
        extra["reasoning_effort"] = {"none": "low", "minimal": "low", "xhigh": "high"}.get(
            effort, effort)
    elif "enable_thinking" in names:
        extra["enable_thinking"] = effort != "none"
    return {**extra, **(variables or {})} or variables


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
    "arguments"}}], arguments a JSON string (OpenAI's form) or an object. Templates get the
    arguments as an object (as transformers' and vLLM's chat handling gives them), so that
    ``arguments | tojson`` writes JSON rather than a quoted string."""
    if not isinstance(calls, list):
        raise bad(where, f"'{where}' must be a list of tool calls.")
    out = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or \
                not isinstance(function.get("arguments", ""), (str, dict)):
            raise bad(f"{where}[{j}]", f"'{where}[{j}]' must be {{\"id\": ..., \"type\": "
                                       "\"function\", \"function\": {\"name\": ..., "
                                       "\"arguments\": \"<JSON>\"}}.")
        arguments = function.get("arguments", "{}")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments or "{}")
            except ValueError:
                raise bad(f"{where}[{j}].function.arguments", f"'{where}[{j}].function."
                          "arguments' is not valid JSON.") from None
        out.append({**call, "function": {**function, "arguments": arguments}})
    return out


def completion_plan(body: Any, model: Model, served: str, context: int) -> Plan:
    """POST /v1/completions, checked."""
    body = body_object(body)
    known_fields(body, _COMPLETIONS)
    name = served_model(body, served)
    unsupported(body, "suffix", "")
    answer = answer_constraint(body)
    n = integer(body, "n", 1, MAX_N) or 1
    best_of = integer(body, "best_of", 1, MAX_N)
    if best_of is not None and best_of != n:
        raise bad("best_of", "'best_of' different from 'n' is not supported.")
    echo = bool(boolean(body, "echo"))
    logprobs = integer(body, "logprobs", 0, 5)
    scored = logprobs if echo else None  # the echoed prompt's logprobs too (vLLM's answer)
    if scored is not None and not getattr(model.engine, "verifies", False):
        raise bad("echo", "'echo' with 'logprobs' needs the logits of every prompt position, "
                          "which this model folder's prefill.onnx does not return; re-export it "
                          "with this version of llm-onnx.")
    stream, usage = stream_fields(body)
    texts, prompts = _prompts(body.get("prompt"), model)
    options = sampling(body, model.defaults, model.engine.vocab_size)
    fitted = [replace(options, max_new_tokens=fit_length(  # 0 with echo: the prompt only
        body, ("max_tokens",), p, context, COMPLETIONS_DEFAULT_MAX_TOKENS, "prompt",
        low=0 if echo else 1)) for p in prompts]
    if len(prompts) * n > MAX_N:
        raise bad("n", f"{len(prompts)} prompts x n={n} is more than {MAX_N} choices.")
    return Plan(COMPLETION, name, prompts, fitted, n, stream, usage, logprobs, echo, texts,
                constraint=answer, prompt_logprobs=scored)


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


