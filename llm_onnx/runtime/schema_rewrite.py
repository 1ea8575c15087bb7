"""Rewrites of a JSON schema that never loosen it: every document the rewritten schema allows is
valid under the original. One is a default; the others let the engine take a schema it refuses
as written.

- Required properties come first (in their order), then the optional ones: the order the model
  writes them in, as llama.cpp's schema grammars order them (validity does not depend on it; a
  weak model that wanders in an optional list has written what is required by then).
- Objects are closed: an object schema that lists ``properties`` and says nothing of others
  (no ``additionalProperties``, ``patternProperties``, ``unevaluatedProperties``) gets
  ``"additionalProperties": false``, as llama.cpp's schema grammars and OpenAI's strict mode do
  (a weak model otherwise invents key after key). ``"additionalProperties": true`` keeps an
  object open. Objects that an ``allOf`` or a conditional combines with others stay as written
  (closing each part would forbid the other parts' keys); so does a schema where closing leaves
  nothing satisfiable.
- Integers without a bound get one of 16 digits (``-9999999999999999`` to
  ``9999999999999999``), as llama.cpp's schema grammars write at most 16 digits: a weak model
  otherwise repeats a digit until ``max_tokens`` (SmolLM2 greedy, "population": 1111...). Larger
  integers are beyond what JSON parsers read exactly (2^53) anyway; a schema's own bound is kept.
  Numbers with a fraction are not bounded (their digits cannot be counted by a schema keyword).
- ``format`` values the engine does not know (OpenAPI's ``byte``, a project's own) are dropped:
  JSON Schema makes an unknown format an annotation, which validators ignore, so this is exact.
- A ``oneOf`` the engine cannot prove exclusive becomes an ``anyOf``: as it is when its branches
  take different types (a string or a list of them); over the types exactly one branch allows
  when they share some (``[{"type": ["string", "null"]}, {"type": ["number", "null"]}]``,
  Kubernetes' Quantity): a value of such a type can match only that branch, so it is valid under
  ``oneOf`` exactly when it matches it. Values of a type two branches allow (``null`` here, which
  the ``oneOf`` refuses when both branches take it) are left out. ``integer`` counts as a
  ``number``.
- ``uniqueItems``: an array whose items must be distinct holds at most one (one item is always
  unique); refused if it must hold two or more.
- ``if`` / ``then`` / ``else``: the condition and its ``then`` must both hold (``allOf``); the
  ``else`` branch is never taken.
- ``propertyNames``: ``{"type": "string"}`` always holds and is dropped; a ``pattern`` moves the
  object's other keys under ``patternProperties`` with that pattern, an ``enum`` lists them
  under ``properties`` (others are forbidden, and so are listed properties whose names do not
  match).
- ``not`` of ``required`` keys (or of an ``anyOf`` of them): those keys are forbidden; ``not``
  of nothing (``{}``): the subschema is ``false``.
- A ``oneOf`` of object branches told apart by required keys: its first branch, with a key
  every other branch requires forbidden (so exactly that branch matches).
- ``dependencies`` / ``dependentRequired`` of keys on keys: the dependent keys are required.
- ``unevaluatedProperties`` becomes ``additionalProperties``: keys the object's own
  ``properties`` do not list are then judged by it even where an ``allOf`` part lists them.

- Last, a part the engine still refuses is left out where the schema lets it be absent: an
  optional property is forbidden, an ``anyOf`` branch dropped, a definition made ``false``
  (every place using it then fails), an array whose items may not appear kept empty, extra keys
  refused. A schema this leaves unsatisfiable is refused.

``default_rewrite(schema)`` (objects closed and ordered, integers bounded) is the default; ``tighten(schema, message)`` applies the rewrite the
engine's refusal ``message`` asks for (None when none applies: the schema is refused).
"""

from __future__ import annotations

import copy
import re
from typing import Any

from llm_onnx.runtime.schema_check import TYPES, subschemas


_COMBINING = ("allOf", "if", "then", "else", "not", "dependentSchemas", "dependencies")


INTEGER_BOUND = 10**16 - 1  # 16 digits, as llama.cpp's schema grammars


def default_rewrite(schema: Any) -> Any | None:
    """``schema`` with required properties first, its open objects closed and its integers
    bounded (see the module docstring); None if that changes nothing."""
    out = copy.deepcopy(schema)
    shared: set[str] = set()  # definitions an allOf or a conditional reaches
    for path, node in subschemas(out):
        if _combined(path):
            shared |= _reached(node, out)
    changed = False
    for path, node in subschemas(out):
        changed |= _bound_integer(node)
        properties, required = node.get("properties"), node.get("required")
        if isinstance(properties, dict) and isinstance(required, list):
            first = [k for k in properties if k in required]
            ordered = {k: properties[k] for k in first + [k for k in properties
                                                          if k not in required]}
            if list(ordered) != list(properties):
                node["properties"] = ordered
                changed = True
        if _combined(path) or _pointer(path) in shared or not node.get("properties"):
            continue
        if any(k in node for k in ("additionalProperties", "patternProperties",
                                   "unevaluatedProperties", "allOf", "if", "$ref")):
            continue
        node["additionalProperties"] = False
        changed = True
    return out if changed else None


def _bound_integer(node: dict) -> bool:
    """Give an integer schema without a lower or upper bound one of 16 digits (True if
    changed). Left alone where a bound is a draft-4 flag or the new bound would leave nothing."""
    types = node.get("type")
    if not (types == "integer" or isinstance(types, list) and "integer" in types):
        return False
    if isinstance(node.get("exclusiveMinimum"), bool) \
            or isinstance(node.get("exclusiveMaximum"), bool):
        return False
    low = [v for k in ("minimum", "exclusiveMinimum") if _is_number(v := node.get(k))]
    high = [v for k in ("maximum", "exclusiveMaximum") if _is_number(v := node.get(k))]
    changed = False
    if not low and not any(v < -INTEGER_BOUND for v in high):
        node["minimum"] = -INTEGER_BOUND
        changed = True
    if not high and not any(v > INTEGER_BOUND for v in low):
        node["maximum"] = INTEGER_BOUND
        changed = True
    return changed


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def tighten(schema: Any, message: str) -> Any | None:
    """A tightened copy of ``schema`` for the engine's refusal ``message`` (None: no rewrite)."""
    unknown = re.search(r"Unknown format: (.+)", message)
    if unknown is not None:
        return _drop_format(schema, unknown.group(1).strip().rstrip("."))
    rewritten = None
    keys = re.search(r"Unimplemented keys: \[(.*?)\]", message)
    names = set(re.findall(r'"([^"]+)"', keys.group(1))) if keys else set()
    if "oneOf constraints are not supported" in message:
        rewritten = _exclusive_one_of(schema)
    elif "uniqueItems" in names:
        rewritten = _unique(schema)
    elif names & {"if", "then", "else"}:
        rewritten = _conditional(schema)
    elif "propertyNames" in names:
        rewritten = _property_names(schema)
    elif "not" in names:
        rewritten = _not_required(schema)
    elif "unevaluatedProperties" in names:
        rewritten = _unevaluated(schema)
    elif names & {"dependencies", "dependentRequired"}:
        rewritten = _dependencies(schema)
    return rewritten if rewritten is not None else _prune(schema, message)


def _prune(schema: Any, message: str) -> Any | None:
    """The part of ``schema`` the engine refuses, left out where the schema lets it be absent:
    an optional property is forbidden, an anyOf branch dropped, a definition made ``false``
    (every place that uses it then fails), an array whose items may not appear kept empty, extra
    keys refused. Upward from the refused keyword to the first such place; None at the root."""
    from llm_onnx.runtime.schema_check import locate

    found = locate(schema, message)
    if found is None:
        return None
    out = copy.deepcopy(schema)
    path = found[0][:-1]  # the subschema holding the refused keyword
    while path:
        *up, key = path
        parent = _at(out, up)
        if len(up) >= 1 and up[-1] == "properties" and isinstance(key, str):
            owner = _at(out, up[:-1])
            if key not in (owner.get("required") or []):
                parent[key] = False
                return out
        elif len(up) >= 1 and up[-1] in ("$defs", "definitions", "patternProperties"):
            parent[key] = False
            return out
        elif len(up) >= 1 and up[-1] == "anyOf" and isinstance(key, int) and len(parent) > 1:
            del parent[key]
            return out
        elif key in ("additionalProperties", "unevaluatedProperties"):
            parent[key] = False
            return out
        elif key == "items" and not isinstance(parent.get("items"), list) and \
                parent.get("minItems", 0) == 0:
            parent["items"] = False
            parent["maxItems"] = 0
            return out
        path = up[:-1] if up and up[-1] in ("properties", "anyOf", "oneOf", "allOf", "$defs",
                                           "definitions", "patternProperties", "prefixItems") \
            else up
    return None


def _at(root: Any, path: list[str | int]) -> Any:
    node = root
    for part in path:
        node = node[part]
    return node


def _combined(path: list[str | int]) -> bool:
    return any(part in _COMBINING for part in path if isinstance(part, str))


def _pointer(path: list[str | int]) -> str:
    return "#/" + "/".join(str(p).replace("~", "~0").replace("/", "~1") for p in path)


def _reached(node: Any, root: Any) -> set[str]:
    """The local ``$ref`` targets reachable from ``node`` (transitively)."""
    found: set[str] = set()
    todo = [node]
    while todo:
        for _path, sub in subschemas(todo.pop()):
            ref = sub.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/") and ref not in found:
                found.add(ref)
                target = _resolve(root, ref)
                if target is not None:
                    todo.append(target)
    return found


def _resolve(root: Any, ref: str) -> Any:
    target = root
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(target, dict) or part not in target:
            return None
        target = target[part]
    return target


def _unique(schema: Any) -> Any | None:
    out = copy.deepcopy(schema)
    for _path, node in subschemas(out):
        if "uniqueItems" not in node:
            continue
        if node["uniqueItems"] is True:
            if node.get("minItems", 0) > 1:
                return None  # two or more distinct items: no exact rewrite
            node["maxItems"] = min(node.get("maxItems", 1), 1)
        del node["uniqueItems"]
    return out


def _conditional(schema: Any) -> Any | None:
    out = copy.deepcopy(schema)
    for _path, node in subschemas(out):
        if "if" not in node:
            node.pop("then", None)  # without an if, then and else mean nothing
            node.pop("else", None)
            continue
        condition, then = node.pop("if"), node.pop("then", True)
        node.pop("else", None)
        node["allOf"] = list(node.get("allOf", [])) + [s for s in (condition, then)
                                                       if s is not True]
    return out


_ANNOTATIONS = frozenset({"description", "title", "$comment", "markdownDescription", "examples",
                          "default", "deprecated", "readOnly", "writeOnly", "$id", "$schema"})


def _bare(schema: Any) -> Any:
    """``schema`` without the keywords that only annotate (they validate nothing)."""
    if not isinstance(schema, dict):
        return schema
    return {k: v for k, v in schema.items() if k not in _ANNOTATIONS}


def _property_names(schema: Any) -> Any | None:
    out = copy.deepcopy(schema)
    for _path, node in subschemas(out):
        if "propertyNames" not in node:
            continue
        names = _bare(node.pop("propertyNames"))
        if names is True or names == {} or names == {"type": "string"}:
            continue  # every property name is a string
        if not isinstance(names, dict) or names.get("type", "string") != "string":
            return None
        names = {k: v for k, v in names.items() if k != "type"}
        rest = node.pop("additionalProperties", True)
        properties = node.setdefault("properties", {})
        if set(names) == {"enum"} and all(isinstance(v, str) for v in names["enum"]):
            for name in names["enum"]:  # the allowed names, each judged as the others were
                properties.setdefault(name, rest)
            for name in list(properties):
                if name not in names["enum"]:
                    properties[name] = False
        elif set(names) == {"pattern"} and not node.get("patternProperties"):
            node["patternProperties"] = {names["pattern"]: rest}
            for name in list(properties):
                if not re.search(names["pattern"], name):
                    properties[name] = False
        else:
            return None
        node["additionalProperties"] = False
    return out


def _not_required(schema: Any) -> Any | None:
    changed = False

    def rewrite(node: Any) -> Any:
        nonlocal changed
        if not isinstance(node, dict) or "not" not in node:
            return node
        negated = _bare(node["not"])
        if negated == {} or negated is True:  # not anything: nothing is valid here
            changed = True
            return False
        keys = _required_keys(negated)
        if keys is None:
            raise _NoRewrite
        node = {k: v for k, v in node.items() if k != "not"}
        properties = dict(node.get("properties", {}))
        for key in keys:
            properties[key] = False
        node["properties"] = properties
        changed = True
        return node

    try:
        out = _map(copy.deepcopy(schema), rewrite)
    except _NoRewrite:
        return None
    return out if changed else None


class _NoRewrite(Exception):
    pass


def _map(node: Any, fn: Any) -> Any:
    """``node`` with ``fn`` applied to every subschema, innermost first."""
    if not isinstance(node, dict):
        return node
    out = dict(node)
    for key in ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas"):
        if isinstance(out.get(key), dict):
            out[key] = {name: _map(sub, fn) for name, sub in out[key].items()}
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        if isinstance(out.get(key), list):
            out[key] = [_map(sub, fn) for sub in out[key]]
    for key in ("additionalProperties", "additionalItems", "unevaluatedProperties",
                "unevaluatedItems", "contains", "propertyNames", "if", "then", "else"):
        if key in out:
            out[key] = _map(out[key], fn)
    if isinstance(out.get("items"), list):
        out["items"] = [_map(sub, fn) for sub in out["items"]]
    elif "items" in out:
        out["items"] = _map(out["items"], fn)
    return fn(out)


def _unevaluated(schema: Any) -> Any | None:
    changed = False

    def rewrite(node: Any) -> Any:
        nonlocal changed
        if not isinstance(node, dict) or "unevaluatedProperties" not in node:
            return node
        if "additionalProperties" in node:
            raise _NoRewrite
        changed = True
        rest = {k: v for k, v in node.items() if k != "unevaluatedProperties"}
        return {**rest, "additionalProperties": node["unevaluatedProperties"]}

    try:
        out = _map(copy.deepcopy(schema), rewrite)
    except _NoRewrite:
        return None
    return out if changed else None


def _dependencies(schema: Any) -> Any | None:
    """``dependencies`` / ``dependentRequired`` of keys on keys: the dependent keys are
    required outright (a key that needs others then always has them)."""
    changed = False

    def rewrite(node: Any) -> Any:
        nonlocal changed
        if not isinstance(node, dict):
            return node
        out = dict(node)
        for key in ("dependencies", "dependentRequired"):
            table = out.pop(key, None)
            if table is None:
                continue
            if not isinstance(table, dict) or not all(isinstance(v, list) for v in
                                                        table.values()):
                raise _NoRewrite  # schema dependencies: no rewrite keeps it exact
            needed = [k for keys in table.values() for k in keys]
            out["required"] = list(dict.fromkeys(list(out.get("required", [])) + needed))
            changed = True
        return out

    try:
        out = _map(copy.deepcopy(schema), rewrite)
    except _NoRewrite:
        return None
    return out if changed else None


def _required_keys(schema: Any) -> list[str] | None:
    """Keys whose presence ``schema`` tests ({"required": [...]} or an anyOf of such; a type of
    object and properties that accept anything may stand beside)."""
    schema = _bare(schema)
    if not isinstance(schema, dict):
        return None
    rest = {k: v for k, v in schema.items() if k not in ("type", "properties", "required")}
    if schema.get("type", "object") != "object" or any(
            v not in (True, {}) for v in (schema.get("properties") or {}).values()):
        return None
    if not rest and isinstance(schema.get("required"), list):
        return list(schema["required"])
    if set(rest) == {"anyOf"} and "required" not in schema and isinstance(rest["anyOf"], list):
        keys: list[str] = []
        for branch in rest["anyOf"]:
            more = _required_keys(branch)
            if more is None:
                return None
            keys += more
        return keys
    return None


def _drop_format(schema: Any, name: str) -> Any | None:
    out = copy.deepcopy(schema)
    changed = False
    for _path, node in subschemas(out):
        if node.get("format") == name:
            del node["format"]
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
            first = _first_by_required(branches, out)
            if first is not None:
                del node["oneOf"]
                node["allOf"] = list(node.get("allOf", [])) + first
                changed = True
            continue
        counts: dict[str, int] = {}
        for t in types:
            for name in t:  # type: ignore[union-attr]
                counts[name] = counts.get(name, 0) + 1
        if all(c == 1 for c in counts.values()):  # exclusive by type: oneOf is anyOf
            node["anyOf"] = node.pop("oneOf")
            changed = True
            continue
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


def _first_by_required(branches: list, root: Any) -> list | None:
    """A oneOf of object branches told apart by required keys, as its first branch with one
    required key of every other branch forbidden (so no other branch can match): None if some
    other branch requires no key the first does not."""
    forbid = {}
    first = _deref(branches[0], root)
    mine = set(first.get("required", [])) if isinstance(first, dict) else set()
    for branch in branches[1:]:
        other = _deref(branch, root)
        keys = [k for k in (other.get("required", []) if isinstance(other, dict) else [])
                if k not in mine]
        if not keys:
            return None
        forbid[keys[0]] = False
    return [branches[0], {"properties": forbid}]


def _deref(branch: Any, root: Any) -> Any:
    if isinstance(branch, dict) and isinstance(branch.get("$ref"), str) and \
            branch["$ref"].startswith("#/"):
        return _resolve(root, branch["$ref"])
    return branch


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
