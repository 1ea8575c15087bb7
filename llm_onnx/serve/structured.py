"""The structured-output fields of a request: OpenAI's ``response_format``, vLLM's
``structured_outputs`` (and its older ``guided_*`` fields), ``tools`` with ``tool_choice`` and
``parallel_tool_calls``; and ``prepare``, which composes and compiles a plan's constraint off
the event loop.

    response_format     {"type": "text"} | {"type": "json_object"}
                        | {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}
    structured_outputs  {"json": schema} | {"regex": str} | {"choice": [str]} | {"grammar": str}
                        | {"json_object": true}          (one of them; vLLM's field)
    guided_json, guided_regex, guided_choice, guided_grammar     (vLLM before 0.10)

A schema, pattern or grammar that is invalid, or that the engine cannot honour, is a 400 whose
``param`` names the field and, for a schema, the path and keyword inside it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from llm_onnx.errors import GenerationError
from llm_onnx.runtime.chat.dialects.base import ToolChoice
from llm_onnx.runtime.chat.render import template_variables
from llm_onnx.runtime.chat.request import check_tool_choice, check_tools
from llm_onnx.runtime.structured.constraint import Constraint, ConstraintError
from llm_onnx.runtime.structured.matcher import Constraints
from llm_onnx.serve.errors import ApiError, bad
from llm_onnx.serve.plan import Plan

_STRUCTURED_KEYS = ("json", "regex", "choice", "grammar", "json_object")
_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
           "guided_grammar": "grammar"}


def answer_constraint(body: dict) -> Constraint | None:
    """The constraint a request puts on its answer (None: free text)."""
    given = [name for name in ("response_format", "structured_outputs", *_GUIDED)
             if body.get(name) is not None and not (name == "response_format" and
                                                    body[name] == {"type": "text"})]
    if len(given) > 1:
        raise bad(given[1], f"'{given[0]}' and '{given[1]}' both constrain the answer; give "
                            "one of them.")
    if not given:
        return None
    try:
        if given[0] == "response_format":
            return _response_format(body["response_format"])
        if given[0] == "structured_outputs":
            return _structured_outputs(body["structured_outputs"])
        return _one(_GUIDED[given[0]], body[given[0]], given[0])
    except ConstraintError as e:
        raise bad(e.where, str(e)) from None


def _response_format(value: Any) -> Constraint | None:
    where = "response_format"
    if not isinstance(value, dict) or value.get("type") not in ("text", "json_object",
                                                               "json_schema"):
        raise bad(f"{where}.type", "'response_format' must be {\"type\": \"text\"}, "
                                   "{\"type\": \"json_object\"} or {\"type\": \"json_schema\", "
                                   "\"json_schema\": {\"name\": ..., \"schema\": {...}}}.")
    kind = value["type"]
    extra = set(value) - {"type", "json_schema"}
    if extra:
        raise bad(f"{where}.{sorted(extra)[0]}", f"'{where}' has an unknown field "
                                                 f"{sorted(extra)[0]!r}.")
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint.json_object(where)
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise bad(f"{where}.json_schema", "'response_format.json_schema' must be an object "
                                          "{\"name\": ..., \"schema\": {...}, \"strict\": ...}.")
    unknown = set(spec) - {"name", "schema", "strict", "description"}
    if unknown:
        raise bad(f"{where}.json_schema.{sorted(unknown)[0]}", "'response_format.json_schema' "
                  f"has an unknown field {sorted(unknown)[0]!r} (it takes name, description, "
                  "schema, strict).")
    if "name" in spec and not isinstance(spec["name"], str):
        raise bad(f"{where}.json_schema.name", "'response_format.json_schema.name' must be a "
                                               "string.")
    if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
        raise bad(f"{where}.json_schema.strict", "'response_format.json_schema.strict' must be "
                                                 "true or false.")
    if "schema" not in spec:
        raise bad(f"{where}.json_schema.schema", "'response_format.json_schema.schema' is "
                                                 "missing: the JSON Schema the answer must "
                                                 "follow.")
    return Constraint.json_schema(spec["schema"], f"{where}.json_schema.schema")


def _structured_outputs(value: Any) -> Constraint | None:
    where = "structured_outputs"
    if not isinstance(value, dict):
        raise bad(where, "'structured_outputs' must be an object with one of "
                         f"{', '.join(_STRUCTURED_KEYS)}.")
    unknown = sorted(set(value) - set(_STRUCTURED_KEYS))
    if unknown:
        raise bad(f"{where}.{unknown[0]}", f"'{where}.{unknown[0]}' is not supported; this "
                                           f"server takes {', '.join(_STRUCTURED_KEYS)}.")
    given = [k for k in _STRUCTURED_KEYS if value.get(k) not in (None, False)]
    if len(given) != 1:
        raise bad(where, f"'{where}' must give exactly one of {', '.join(_STRUCTURED_KEYS)}"
                         f"{' (it gives ' + ' and '.join(given) + ')' if given else ''}.")
    return _one(given[0], value[given[0]], f"{where}.{given[0]}")


def _one(kind: str, value: Any, where: str) -> Constraint:
    if kind == "json":
        return Constraint.json_schema(value, where)
    if kind == "json_object":
        if value is not True:
            raise ConstraintError(f"'{where}' must be true.", where)
        return Constraint.json_object(where)
    if kind == "regex":
        return Constraint.regex(value, where)
    if kind == "choice":
        return Constraint.choice(value, where)
    return Constraint.grammar(value, where)


def tool_fields(body: dict, template: str) -> tuple[list[dict] | None, ToolChoice, bool]:
    """(tools to render, tool choice, parallel calls) of a chat request; tools are None without
    tools or with tool_choice "none"."""
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise bad("parallel_tool_calls", "'parallel_tool_calls' must be true or false.")
    if body.get("tools") not in (None, []) and "tools" not in template_variables(template):
        raise bad("tools", "'tools' is not supported by this model's chat template (it does not "
                           "render tools); start the server with --chat-template FILE naming a "
                           "template that does.")
    try:
        tools = check_tools(body.get("tools"))
        choice = check_tool_choice(body.get("tool_choice"), tools)
    except ConstraintError as e:
        raise bad(e.where, str(e)) from None
    return (None if choice == "none" else tools), choice, parallel


def prepare(plan: Plan, constraints: Constraints) -> None:
    """Compose the plan's constraint (tools, thinking) and compile it, caching it in the model's
    engine; the options of every prompt get it. Slow for a big schema: run off the event loop.
    Raises ApiError 400 naming the field."""
    field = plan.constraint.where if plan.constraint is not None else "tools"
    try:
        if plan.chat is not None:
            constraint = plan.chat.constraint()
        else:
            constraint = plan.constraint
        if constraint is None:
            return
        constraints.compile(constraint)
    except ConstraintError as e:
        raise bad(e.where or field, str(e)) from None
    except GenerationError as e:
        raise bad("messages" if plan.chat is not None else "prompt", str(e)) from None
    plan.options = [replace(o, constraint=constraint) for o in plan.options]


__all__ = ["ApiError", "answer_constraint", "prepare", "tool_fields"]
