"""One rewrite per JSON Schema keyword the constraint engine refuses (``schema_rewrite`` says
what each does and picks one by the engine's message). Each keeps the schema exact where it can
and never loosens it: a part no rewrite keeps exact is made ``false`` (``schema_settle``)."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from llm_onnx.runtime.structured.schema_check import subschemas
from llm_onnx.runtime.structured.schema_settle import (
    ANNOTATIONS,
    bare,
    constants,
    killed,
    properties_of,
    required_of,
    resolve,
)


def unique_items(schema: Any) -> Any:
    """Arrays whose items must be distinct hold at most one (one item is always unique); one
    that must hold two or more can match nothing here."""
    out = copy.deepcopy(schema)
    dead = []
    for path, node in subschemas(out):
        if "uniqueItems" not in node:
            continue
        if node["uniqueItems"] is True:
            if node.get("minItems", 0) > 1:
                dead.append(path)  # two or more distinct items: no exact rewrite
                continue
            node["maxItems"] = min(node.get("maxItems", 1), 1)
        del node["uniqueItems"]
    return killed(out, dead)


def conditionals(schema: Any) -> Any:
    """Conditionals that test one key against constants become a choice over its values (see
    ``_discriminated``); any other ``if`` / ``then`` without ``else``: the ``then`` part holds
    (then the conditional holds whatever the condition); with an ``else``: the condition and
    its ``then`` hold."""
    out = copy.deepcopy(schema)
    for _path, node in subschemas(out):
        _discriminated(node, out)
        if "if" not in node:
            node.pop("then", None)  # without an if, then and else mean nothing
            node.pop("else", None)
            continue
        condition, then = node.pop("if"), node.pop("then", True)
        parts = [condition, then] if "else" in node else [then]
        node.pop("else", None)
        node["allOf"] = list(node.get("allOf", [])) + [s for s in parts if s is not True]
    for _path, node in subschemas(out):
        _merge_required(node, out)
    return out


def _merge_required(node: dict, root: Any) -> None:
    """``allOf`` parts that only require keys of ``node`` (their properties, if any, say
    nothing ``node``'s own do not: the same schema, a reference to it, or anything) merged into
    its ``required`` (exact; the engine otherwise intersects the two, which can grow past its
    size limit: Dependabot's "schedule is required unless ...")."""
    parts = node.get("allOf")
    if not isinstance(parts, list):
        return
    flat = []
    for part in parts:  # an allOf inside an allOf part without other keys is the same allOf
        inner = bare(part)
        if isinstance(inner, dict) and set(inner) == {"allOf"} and isinstance(inner["allOf"],
                                                                           list):
            flat += inner["allOf"]
        else:
            flat.append(part)
    own = properties_of(node)
    kept = []
    for part in flat:
        inner = bare(part)
        if isinstance(inner, dict) and not set(inner) - {"properties", "required", "type"} \
                and inner.get("type", "object") == "object" and node.get("type") == "object" \
                and all(k in own and (_same(sub, own[k], root)) for k, sub in
                        (inner.get("properties") or {}).items()):
            node["required"] = list(dict.fromkeys(required_of(node) + required_of(inner)))
        else:
            kept.append(part)
    if kept:
        node["allOf"] = kept
    else:
        del node["allOf"]


def _same(sub: Any, mine: Any, root: Any) -> bool:
    """True if property schema ``sub`` adds nothing to ``mine`` (the node's own)."""
    sub = bare(sub)
    if sub in (True, {}) or sub == bare(mine):
        return True
    return isinstance(sub, dict) and set(sub) == {"$ref"} and isinstance(sub["$ref"], str) \
        and resolve(root, sub["$ref"]) is mine


def _discriminated(node: dict, root: Any) -> None:
    """An object whose conditionals (its own and its ``allOf``'s) all test the same key
    against a constant, as ``{"if": {"properties": {"type": {"const": "input"}}}, "then":
    ...}``: an ``anyOf`` with one branch per value the key may take, each holding that value
    and the ``then`` / ``else`` parts it selects. Exact where the key is required and its
    values listed; else the key is required and takes the values the conditionals test."""
    parts = [m for m in node.get("allOf", []) if _test_of(m) is not None]
    if "if" in node:
        parts.append({k: node[k] for k in ("if", "then", "else") if k in node})
    found = [_test_of(m) for m in parts]
    tests = [t for t in found if t is not None]
    if not parts or len(tests) < len(found) or len({key for key, _v in tests}) != 1:
        return
    key = tests[0][0]
    allowed = constants(node, key, root) if key in required_of(node) else None
    values = [json.loads(v) for v in sorted(allowed)] if allowed is not None else \
        [json.loads(t) for t in dict.fromkeys(v for _k, v in tests)]
    branches = []
    for value in values:
        text = json.dumps(value, sort_keys=True)
        chosen = [m.get("then", True) if v == text else m.get("else", True)
                  for m, (_k, v) in zip(parts, tests)]
        branches.append({"properties": {key: {"const": value}}, "required": [key],
                         "allOf": [c for c in chosen if c is not True]})
    for k in ("if", "then", "else"):
        node.pop(k, None)
    node["allOf"] = [m for m in node.get("allOf", []) if _test_of(m) is None]
    if not node["allOf"]:
        del node["allOf"]
    if "anyOf" in node:
        node.setdefault("allOf", []).append({"anyOf": branches})
    else:
        node["anyOf"] = branches


def _test_of(part: Any) -> tuple[str, str] | None:
    """(key, constant as JSON text) for a conditional whose condition is that one key equals a
    constant; None for anything else."""
    if not isinstance(part, dict) or "if" not in part or set(part) - ANNOTATIONS - {
            "if", "then", "else"}:
        return None
    condition = bare(part["if"])
    if not isinstance(condition, dict) or set(condition) - {"properties", "required", "type"}:
        return None
    properties = condition.get("properties")
    if not isinstance(properties, dict) or len(properties) != 1 or \
            condition.get("type", "object") != "object" or \
            condition.get("required", list(properties)) != list(properties):
        return None
    (key, test), = properties.items()
    test = bare(test)
    if isinstance(test, dict) and set(test) == {"const"}:
        return key, json.dumps(test["const"], sort_keys=True)
    if isinstance(test, dict) and set(test) == {"enum"} and isinstance(test["enum"], list) \
            and len(test["enum"]) == 1:
        return key, json.dumps(test["enum"][0], sort_keys=True)
    return None


def property_names(schema: Any) -> Any:
    out = copy.deepcopy(schema)
    dead = []
    for path, node in subschemas(out):
        if "propertyNames" not in node:
            continue
        names = bare(node.pop("propertyNames"))
        if names is True or names == {} or names == {"type": "string"}:
            continue  # every property name is a string
        if not isinstance(names, dict) or names.get("type", "string") != "string":
            dead.append(path)
            continue
        names = {k: v for k, v in names.items() if k != "type"}
        if set(names) == {"enum"} and all(isinstance(v, str) for v in names["enum"]):
            rest = node.pop("additionalProperties", True)
            properties = node.setdefault("properties", {})
            for name in names["enum"]:  # the allowed names, each judged as the others were
                properties.setdefault(name, rest)
            for name in list(properties):
                if name not in names["enum"]:
                    properties[name] = False
        elif set(names) == {"pattern"} and not node.get("patternProperties"):
            rest = node.pop("additionalProperties", True)
            properties = node.setdefault("properties", {})
            node["patternProperties"] = {names["pattern"]: rest}
            for name in list(properties):
                if not re.search(names["pattern"], name):
                    properties[name] = False
        else:
            dead.append(path)
            continue
        node["additionalProperties"] = False
    return killed(out, dead)


def not_required(schema: Any) -> Any:
    """``not`` of required keys: those keys are forbidden; ``not`` of anything: ``false``; any
    other ``not``: its subschema can match nothing here."""
    def rewrite(node: Any) -> Any:
        if not isinstance(node, dict) or "not" not in node:
            return node
        negated = bare(node["not"])
        keys = _required_keys(negated)
        if negated == {} or negated is True or keys is None:
            return False
        node = {k: v for k, v in node.items() if k != "not"}
        properties = dict(node.get("properties", {}))
        for key in keys:
            properties[key] = False
        node["properties"] = properties
        return node

    return _map(copy.deepcopy(schema), rewrite)


def _required_keys(schema: Any) -> list[str] | None:
    """Keys whose presence ``schema`` tests ({"required": [...]} or an anyOf of such; a type of
    object and properties that accept anything may stand beside)."""
    schema = bare(schema)
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


def unevaluated(schema: Any) -> Any:
    """``unevaluatedProperties`` becomes ``additionalProperties``; beside an
    ``additionalProperties`` (which judges every key its object's properties do not) it has no
    key left to judge and is dropped."""
    def rewrite(node: Any) -> Any:
        if not isinstance(node, dict) or "unevaluatedProperties" not in node:
            return node
        rest = {k: v for k, v in node.items() if k != "unevaluatedProperties"}
        if "additionalProperties" in node:
            return rest
        return {**rest, "additionalProperties": node["unevaluatedProperties"]}

    return _map(copy.deepcopy(schema), rewrite)


def dependencies(schema: Any) -> Any:
    """``dependencies`` / ``dependentRequired`` of keys on keys: the dependent keys are
    required outright (a key that needs others then always has them); a schema a key depends
    on (``dependentSchemas``, ``dependencies`` with a schema) holds outright (``allOf``)."""
    def rewrite(node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        out = dict(node)
        for key in ("dependencies", "dependentRequired", "dependentSchemas"):
            table = out.pop(key, None)
            if table is None:
                continue
            if not isinstance(table, dict):
                return False
            for needs in table.values():
                if isinstance(needs, list):
                    out["required"] = list(dict.fromkeys(list(out.get("required", [])) +
                                                         needs))
                else:
                    out["allOf"] = list(out.get("allOf", [])) + [needs]
        return out

    return _map(copy.deepcopy(schema), rewrite)


def drop_format(schema: Any, name: str) -> Any | None:
    out = copy.deepcopy(schema)
    changed = False
    for _path, node in subschemas(out):
        if node.get("format") == name:
            del node["format"]
            changed = True
    return out if changed else None


def property_counts(schema: Any) -> Any:
    """``minProperties`` / ``maxProperties`` beside optional properties (the engine counts keys
    only where every listed one is required): the object is closed (a required key it does
    not list is listed, as its extra keys were judged), as many optional properties as
    ``minProperties`` still needs become required, those beyond what ``maxProperties`` leaves
    room for are forbidden, and the counts, now kept by construction, go."""
    out = copy.deepcopy(schema)
    dead = []
    for path, node in subschemas(out):
        low, high = node.get("minProperties"), node.get("maxProperties")
        properties = node.get("properties")
        if low is None and high is None or not isinstance(properties, dict) or \
                node.get("patternProperties"):
            continue
        optional = [k for k in properties if k not in required_of(node) and
                    properties[k] is not False]
        if not optional:
            continue  # the engine counts keys itself
        rest = node.get("additionalProperties", True)
        for key in required_of(node):
            if key not in properties and rest is not False:
                properties[key] = {} if rest is True else rest
        required = required_of(node)
        need = max(0, int(low or 0) - len(required))
        room = None if high is None else int(high) - len(required) - need
        if need > len(optional) or room is not None and room < 0:
            dead.append(path)
            continue
        node["additionalProperties"] = False
        node["required"] = required + optional[:need]
        for key in optional[need + room:] if room is not None else []:
            properties[key] = False
        node.pop("minProperties", None)
        node.pop("maxProperties", None)
    return killed(out, dead)


def bare_refs(schema: Any) -> Any:
    """Annotations beside each ``$ref`` dropped (they validate nothing; the engine refuses a
    cycle of references with keys beside them)."""
    out = copy.deepcopy(schema)
    for _path, node in subschemas(out):
        if "$ref" in node:
            for key in (ANNOTATIONS - {"$id", "$schema"}) & set(node):  # $id moves the base
                del node[key]
    return out


def sibling_refs(schema: Any, message: str) -> Any | None:
    """The subschemas that reference the pointer the engine names (in a cycle) with keys beside
    the reference made ``false``; where none does, the pointer's own subschema."""
    found = re.search(r"not supported: \S*?(#[^\s]*?)\.?$", message.strip())
    if found is None:
        return None
    pointer = found.group(1) if found.group(1) != "#/" else "#"
    out = copy.deepcopy(schema)
    dead = [path for path, node in subschemas(out)
            if node.get("$ref") == pointer and set(node) - ANNOTATIONS - {"$ref"}]
    return killed(out, dead) if dead else unsatisfiable(schema, message)


def unsatisfiable(schema: Any, message: str) -> Any | None:
    """The engine found a part that matches nothing (a contradiction inside an ``allOf``, say)
    or that it cannot compile (a cycle of references through keys beside them): the
    definition it names is made ``false``, to be left out where it may be absent."""
    found = re.search(r"(?:while processing|not supported:) \S*#(/[^\s.]+)", message)
    if found is None:
        return None
    pointer = "#" + found.group(1)
    out = copy.deepcopy(schema)
    parts = pointer[2:].split("/")
    parent = resolve(out, "#/" + "/".join(parts[:-1])) if len(parts) > 1 else out
    key = parts[-1].replace("~1", "/").replace("~0", "~")
    if isinstance(parent, dict) and key in parent and parent[key] is not False:
        parent[key] = False
        return out
    return None


def without_largest_definition(schema: Any) -> Any | None:
    """For a schema the engine finds too large: its largest definition (by the size of its
    JSON) that the schema lets be absent, made ``false`` and settled (``schema_settle``), so
    the places that use it are left out; None if every definition is required."""
    from llm_onnx.runtime.structured.schema_settle import settle

    if not isinstance(schema, dict):
        return None
    found = [(len(json.dumps(sub)), key, name) for key in ("$defs", "definitions")
             if isinstance(schema.get(key), dict)
             for name, sub in schema[key].items() if sub is not False]
    for _size, key, name in sorted(found, reverse=True)[:3]:
        out = copy.deepcopy(schema)
        out[key][name] = False
        settled = settle(out)
        if settled is not None:
            return settled
    return None
