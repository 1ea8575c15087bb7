"""Where in a JSON schema a problem is: structural checks that name the path and the keyword, and
a locator for the keywords the constraint engine reports without a path.

``check_schema(schema, where)`` walks every subschema (``properties``, ``items``, ``anyOf``,
``$defs``, ...) and refuses, with the path of the offending keyword, what no JSON Schema draft
allows: ``"type": "strin"``, ``"minimum": "x"``, ``"required": "name"``, a ``$ref`` that points
nowhere in the document, a remote ``$ref`` (never fetched: the runtime works offline). What the
engine cannot honour (``uniqueItems``, ``not``, ...) it reports itself; ``locate`` then finds the
first subschema that uses the keyword it names, so that message carries a path too.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import Any

TYPES = ("string", "number", "integer", "boolean", "object", "array", "null")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONE = ("additionalProperties", "additionalItems", "unevaluatedProperties",
               "unevaluatedItems", "contains", "propertyNames", "not", "if", "then", "else")
_COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties",
           "minContains", "maxContains")
_NUMBERS = ("minimum", "maximum")


class SchemaProblem(Exception):
    """A problem at ``path`` (a list of keys and indexes from the schema's root)."""

    def __init__(self, path: list[str | int], message: str) -> None:
        super().__init__(message)
        self.path, self.message = path, message


def dotted(where: str, path: list[str | int]) -> str:
    """``where`` followed by ``path`` as OpenAI names fields: ``a.b[0].c``; after a command-line
    flag: ``--json-schema at b[0].c``."""
    flag = where.startswith("--")
    out = "" if flag else where
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return (f"{where} at {out}" if out else where) if flag else out


def subschemas(node: Any, path: list[str | int] | None = None,
               ) -> Iterator[tuple[list[str | int], dict]]:
    """Every subschema that is an object, with its path, root first (depth first). A node's
    children are read after the caller has seen it (it may rewrite them)."""
    stack: list[tuple[list[str | int], Any]] = [(path or [], node)]
    while stack:
        here, node = stack.pop()
        if not isinstance(node, dict):
            continue
        yield here, node
        children: list[tuple[list[str | int], Any]] = []
        for key in _SCHEMA_MAPS:
            value = node.get(key)
            if isinstance(value, dict):
                children += [(here + [key, name], sub) for name, sub in value.items()]
        for key in _SCHEMA_LISTS:
            value = node.get(key)
            if isinstance(value, list):
                children += [(here + [key, i], sub) for i, sub in enumerate(value)]
        children += [(here + [key], node[key]) for key in _SCHEMA_ONE
                     if isinstance(node.get(key), dict)]
        items = node.get("items")
        if isinstance(items, list):  # draft 4-7 tuples
            children += [(here + ["items", i], sub) for i, sub in enumerate(items)]
        elif isinstance(items, dict):
            children.append((here + ["items"], items))
        dependencies = node.get("dependencies")
        if isinstance(dependencies, dict):
            children += [(here + ["dependencies", name], sub)
                         for name, sub in dependencies.items()]
        stack += reversed(children)


def check_schema(schema: Any) -> None:
    """Raise SchemaProblem for the first structural error (see the module docstring)."""
    if not isinstance(schema, (dict, bool)):
        raise SchemaProblem([], f"a JSON schema must be an object (or true/false), got "
                                f"{type(schema).__name__}")
    _check_node(schema, [], schema)


def _check_node(node: Any, path: list[str | int], root: Any) -> None:
    if isinstance(node, bool):
        return
    if not isinstance(node, dict):
        raise SchemaProblem(path, f"a subschema must be an object or a boolean, got "
                                  f"{_short(node)}")
    _check_keywords(node, path, root)
    for key in _SCHEMA_MAPS:
        value = node.get(key)
        if value is None:
            continue
        if not isinstance(value, dict):
            raise SchemaProblem(path + [key], f"'{key}' must be an object of subschemas, got "
                                              f"{_short(value)}")
        for name, sub in value.items():
            _check_node(sub, path + [key, name], root)
    for key in _SCHEMA_LISTS:
        value = node.get(key)
        if value is None:
            continue
        if not isinstance(value, list) or (not value and key != "prefixItems"):
            raise SchemaProblem(path + [key], f"'{key}' must be a non-empty list of subschemas, "
                                              f"got {_short(value)}")
        for i, sub in enumerate(value):
            _check_node(sub, path + [key, i], root)
    for key in _SCHEMA_ONE:
        if key in node:
            _check_node(node[key], path + [key], root)
    if "items" in node:
        items = node["items"]
        if isinstance(items, list):
            for i, sub in enumerate(items):
                _check_node(sub, path + ["items", i], root)
        else:
            _check_node(items, path + ["items"], root)


def _check_keywords(node: dict, path: list[str | int], root: Any) -> None:
    kind = node.get("type")
    if kind is not None:
        kinds = kind if isinstance(kind, list) else [kind]
        bad = [k for k in kinds if k not in TYPES]
        if bad or not kinds:
            raise SchemaProblem(path + ["type"], f"'type' must be one of {', '.join(TYPES)} (or "
                                                 f"a list of them), got {_short(kind)}")
    for key in _NUMBERS + ("multipleOf",):
        if key in node and not _is_number(node[key]):
            raise SchemaProblem(path + [key], f"'{key}' must be a number, got {_short(node[key])}")
    if "multipleOf" in node and not node["multipleOf"] > 0:
        raise SchemaProblem(path + ["multipleOf"], f"'multipleOf' must be greater than 0, got "
                                                   f"{_short(node['multipleOf'])}")
    for key in ("exclusiveMinimum", "exclusiveMaximum"):  # a number, or a flag in draft 4
        if key in node and not (_is_number(node[key]) or isinstance(node[key], bool)):
            raise SchemaProblem(path + [key], f"'{key}' must be a number, got {_short(node[key])}")
    for key in _COUNTS:
        value = node.get(key)
        if key in node and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise SchemaProblem(path + [key], f"'{key}' must be an integer >= 0, got "
                                              f"{_short(value)}")
    required = node.get("required")
    if required is not None and not isinstance(required, bool) and (
            not isinstance(required, list) or not all(isinstance(r, str) for r in required)):
        raise SchemaProblem(path + ["required"], f"'required' must be a list of property names, "
                                                 f"got {_short(required)}")
    if "enum" in node and not isinstance(node["enum"], list):
        raise SchemaProblem(path + ["enum"], f"'enum' must be a list of values, got "
                                             f"{_short(node['enum'])}")
    for key in ("pattern", "format"):
        if key in node and not isinstance(node[key], str):
            raise SchemaProblem(path + [key], f"'{key}' must be a string, got {_short(node[key])}")
    if "$ref" in node:
        _check_ref(node["$ref"], path + ["$ref"], root)


def _check_ref(ref: Any, path: list[str | int], root: Any) -> None:
    if not isinstance(ref, str):
        raise SchemaProblem(path, f"'$ref' must be a string, got {_short(ref)}")
    if not ref.startswith("#"):
        raise SchemaProblem(path, f"'$ref' {ref!r} points outside the schema; only references "
                                  "within it ('#/$defs/...') are followed (nothing is fetched)")
    if ref == "#" or not ref.startswith("#/"):
        return  # the root, or a named anchor (resolved by the engine)
    node = root
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise SchemaProblem(path, f"'$ref' {ref!r} points to nothing in the schema")


def locate(schema: Any, message: str) -> tuple[list[str | int], str] | None:
    """The path and keyword an engine message is about (None: it names none we can find)."""
    unimplemented = re.search(r"Unimplemented keys: \[(.*?)\]", message)
    if unimplemented:
        keys = re.findall(r'"([^"]+)"', unimplemented.group(1))
        for path, node in subschemas(schema):
            for key in keys:
                if key in node:
                    return path + [key], key
    checks = (
        (r"Unknown format: (.+)", "format"),
        (r"oneOf constraints are not supported", "oneOf"),
        (r"Pointer '(.*?)' does not exist", "$ref"),
        (r"for '(\w+)'", None),
    )
    for pattern, keyword in checks:
        found = re.search(pattern, message)
        if not found:
            continue
        key = keyword or found.group(1)
        value = found.group(1) if keyword in ("format",) and found.groups() else None
        for path, node in subschemas(schema):
            if key in node and (value is None or str(node[key]) == value.strip()):
                return path + [key], key
    if "regex" in message:  # a pattern the regex engine refuses: the first one it refuses
        import llguidance

        for path, node in subschemas(schema):
            for key in ("pattern",):
                if isinstance(node.get(key), str) and llguidance.LLMatcher.validate_grammar(
                        llguidance.LLMatcher.grammar_from_regex(node[key])):
                    return path + [key], key
            for name in (node.get("patternProperties") or {}):
                if llguidance.LLMatcher.validate_grammar(
                        llguidance.LLMatcher.grammar_from_regex(name)):
                    return path + ["patternProperties", name], "patternProperties"
    return None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
