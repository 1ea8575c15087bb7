"""Rewrites that let the constraint engine take a schema it refuses as written, never loosening
it: every document the rewritten schema allows is valid under the original.

- ``format`` values the engine does not know (OpenAPI's ``byte``, a project's own) are dropped:
  JSON Schema makes an unknown format an annotation, which validators ignore, so this is exact.
- A ``oneOf`` the engine cannot prove exclusive (``[{"type": ["string", "null"]}, {"type":
  ["number", "null"]}]``, Kubernetes' Quantity) becomes an ``anyOf`` over the types exactly one
  branch allows: a value of such a type can match only that branch, so it is valid under
  ``oneOf`` exactly when it matches it. Values of a type two branches allow (``null`` here, which
  the ``oneOf`` refuses when both branches take it) are left out. ``integer`` counts as a
  ``number``.
- ``uniqueItems`` on an array of at most one item is dropped (one item is always unique).

``tighten(schema, message)`` applies the rewrite the engine's ``message`` asks for; None when
none applies (the schema is then refused as before).
"""

from __future__ import annotations

import copy
import re
from typing import Any

from llm_onnx.runtime.schema_check import TYPES, subschemas


def tighten(schema: Any, message: str) -> Any | None:
    """A tightened copy of ``schema`` for the engine's refusal ``message`` (None: no rewrite)."""
    unknown = re.search(r"Unknown format: (.+)", message)
    if unknown is not None:
        return _drop_format(schema, unknown.group(1).strip().rstrip("."))
    if "oneOf constraints are not supported" in message:
        return _exclusive_one_of(schema)
    if "uniqueItems" in message:
        return _trivially_unique(schema)
    return None


def _drop_format(schema: Any, name: str) -> Any | None:
    out = copy.deepcopy(schema)
    changed = False
    for _path, node in subschemas(out):
        if node.get("format") == name:
            del node["format"]
            changed = True
    return out if changed else None


def _trivially_unique(schema: Any) -> Any | None:
    out = copy.deepcopy(schema)
    changed = False
    for _path, node in subschemas(out):
        if node.get("uniqueItems") is not None and isinstance(node.get("maxItems"), int) \
                and node["maxItems"] <= 1:
            del node["uniqueItems"]
            changed = True
    return out if changed else None


def _exclusive_one_of(schema: Any) -> Any | None:
    out = copy.deepcopy(schema)
    changed = False
    for _path, node in subschemas(out):
        branches = node.get("oneOf")
        if not isinstance(branches, list):
            continue
        types = [_types(b, out) for b in branches]
        if any(t is None for t in types):
            continue
        counts: dict[str, int] = {}
        for t in types:
            for name in t:  # type: ignore[union-attr]
                counts[name] = counts.get(name, 0) + 1
        if all(c == 1 for c in counts.values()):
            continue  # already exclusive by type: the refusal is about something else
        kept = []
        for branch, t in zip(branches, types):
            own = [name for name in TYPES if name in t and counts[name] == 1]  # type: ignore[operator]
            if own:
                kept.append({"allOf": [branch, {"type": own if len(own) > 1 else own[0]}]})
        if not kept:
            return None  # nothing is exclusive: no rewrite keeps a valid document
        del node["oneOf"]
        node["anyOf"] = kept
        changed = True
    return out if changed else None


def _types(branch: Any, root: Any, depth: int = 0) -> set[str] | None:
    """The JSON types a branch accepts, as far as its ``type``, ``const``, ``enum`` or local
    ``$ref`` say; ``number`` and ``integer`` both stand for every number. None: unknown."""
    if not isinstance(branch, dict) or depth > 16:
        return None
    if "$ref" in branch and isinstance(branch["$ref"], str) and branch["$ref"].startswith("#/"):
        target: Any = root
        for part in branch["$ref"][2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, dict) or part not in target:
                return None
            target = target[part]
        return _types(target, root, depth + 1)
    kind = branch.get("type")
    if kind is not None:
        names = set(kind if isinstance(kind, list) else [kind])
    elif "const" in branch:
        names = {_json_type(branch["const"])}
    elif isinstance(branch.get("enum"), list) and branch["enum"]:
        names = {_json_type(v) for v in branch["enum"]}
    else:
        return None
    if names & {"integer", "number"}:
        names = (names - {"integer"}) | {"number"}
    return names


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"
