"""Two structural steps of tightening a JSON schema (``schema_rewrite``), neither of which lets a
document through that the schema refuses:

- ``hoist_refs``: a local ``$ref`` whose target no schema keyword leads to (schemas that group
  definitions under a plain key, ``#/definitions/notifications/slack``) points at a copy of the
  target under ``$defs`` instead. The same schema, but every part the engine compiles is one the
  rewrites can see.
- ``settle``: a part that can match nothing (``false``) is carried up to the nearest place the
  schema lets it be absent. An optional property that can match nothing is forbidden, an
  ``anyOf`` / ``oneOf`` branch dropped (a branch that matches nothing changes neither), an array
  whose items can match nothing kept empty; a required property, an ``allOf`` part, a ``$ref``
  or the items of an array that must have some make their own subschema match nothing, and so
  on up. None when the whole schema can match nothing.

A rewrite that cannot keep a part exact makes that part ``false``; ``settle`` then leaves out
as little around it as the schema allows. The small accessors at the end (a node by path, a
reference followed, a key's constants) are the rewrites' shared vocabulary.

    {"properties": {"a": {"$ref": "#/$defs/d"}, "b": {"type": "integer"}}, "required": ["b"],
     "$defs": {"d": {"type": "object", "properties": {"x": false}, "required": ["x"]}}}
    settles to
    {"properties": {"a": false, "b": {"type": "integer"}}, "required": ["b"],
     "$defs": {"d": false}}
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from llm_onnx.runtime.structured.schema_check import subschemas

ANNOTATIONS = frozenset({"description", "title", "$comment", "markdownDescription", "examples",
                         "default", "deprecated", "readOnly", "writeOnly", "$id", "$schema"})
_DROPPABLE_MAPS = ("patternProperties", "$defs", "definitions", "dependentSchemas")
_DROPPABLE_ONE = ("additionalProperties", "unevaluatedProperties", "additionalItems",
                  "unevaluatedItems")


def resolve(root: Any, ref: str) -> Any:
    """The node a local JSON pointer (``#/a/b/0``) names in ``root``; None if none."""
    target = root
    for part in ref[2:].split("/") if ref != "#" else []:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(target, dict) and part in target:
            target = target[part]
        elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
            target = target[int(part)]
        else:
            return None
    return target


def hoist_refs(schema: Any) -> Any | None:
    """``schema`` with every local ``$ref`` target that no keyword reaches copied under
    ``$defs`` and the references pointed at the copy (see the module docstring); None if every
    target is reached already."""
    if not isinstance(schema, dict) or _stray_ref(schema) is None:
        return None
    out = copy.deepcopy(schema)
    while (stray := _stray_ref(out)) is not None:
        defs = out.get("$defs")
        if not isinstance(defs, dict):
            defs = out["$defs"] = {}
        base = "hoisted-" + re.sub(r"[^A-Za-z0-9_-]+", "-", stray[2:])
        name, n = base, 1
        while name in defs:
            n += 1
            name = f"{base}-{n}"
        defs[name] = copy.deepcopy(resolve(out, stray))
        for _path, node in subschemas(out):
            if node.get("$ref") == stray:
                node["$ref"] = f"#/$defs/{name}"
    return out


def _stray_ref(schema: dict) -> str | None:
    """A local ``$ref`` of ``schema`` whose target no keyword reaches (None: there is none)."""
    nodes = [node for _path, node in subschemas(schema)]
    reached = {id(node) for node in nodes}
    for node in nodes:
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/") and \
                isinstance(target := resolve(schema, ref), dict) and id(target) not in reached:
            return ref
    return None


def settle(schema: Any) -> Any | None:
    """``schema`` (changed in place) with the parts that can match nothing carried up to where
    the schema lets them be absent (see the module docstring); None if the whole schema can
    match nothing."""
    if _dead(schema, schema):
        return None
    while True:
        changed = False
        for _path, node in list(subschemas(schema)):
            changed |= _settle_children(node, schema)
        if _dead(schema, schema):
            return None
        if not changed:
            return schema


def _dead(node: Any, root: Any) -> bool:
    """True where ``node`` can match nothing, judged by its own keywords and its children as
    they stand (``settle`` repeats until nothing changes)."""
    if node is False:
        return True
    if not isinstance(node, dict):
        return False
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#") and resolve(root, ref) is False:
        return True
    if node.get("enum") == [] or _anything(node.get("not")):
        return True
    if any(_dead(part, root) for part in _list(node.get("allOf"))):
        return True
    for key in ("anyOf", "oneOf"):
        branches = node.get(key)
        if isinstance(branches, list) and all(_dead(b, root) for b in branches):
            return True
    properties = properties_of(node)
    for name in _list(node.get("required")):
        if name in properties:
            if _dead(properties[name], root):
                return True
        elif node.get("additionalProperties") is False and not node.get("patternProperties"):
            return True
    least = node.get("minItems", 0)
    items = node.get("items")
    prefix = node.get("prefixItems")
    if not isinstance(prefix, list):
        prefix = items if isinstance(items, list) else []
    if isinstance(least, int) and least > 0:
        if any(_dead(p, root) for p in prefix[:least]):
            return True
        if not isinstance(items, list) and least > len(prefix) and _dead(items, root):
            return True
    return False


def _settle_children(node: dict, root: Any) -> bool:
    """Replace ``node``'s children that can match nothing where it may do without them; True
    if anything changed."""
    changed = False
    for key in ("anyOf", "oneOf"):
        branches = node.get(key)
        if isinstance(branches, list) and len(branches) > 1:
            alive = [b for b in branches if not _dead(b, root)]
            if alive and len(alive) < len(branches):
                node[key] = alive
                changed = True
    properties = node.get("properties")
    if isinstance(properties, dict):
        for name, sub in properties.items():
            if sub is not False and _dead(sub, root):
                properties[name] = False  # required ones make the node itself dead
                changed = True
    for key in _DROPPABLE_MAPS:
        table = node.get(key)
        if isinstance(table, dict):
            for name, sub in table.items():
                if sub is not False and _dead(sub, root):
                    table[name] = False
                    changed = True
    for key in _DROPPABLE_ONE:
        if key in node and node[key] is not False and _dead(node[key], root):
            node[key] = False
            changed = True
    items = node.get("items")
    if isinstance(items, dict) and _dead(items, root) and not node.get("minItems"):
        node["items"] = False
        node["maxItems"] = len(node["prefixItems"]) if isinstance(node.get("prefixItems"),
                                                                    list) else 0
        changed = True
    return changed


def _anything(schema: Any) -> bool:
    """True for a schema every value matches (``true``, ``{}``, annotations only)."""
    return schema is True or (isinstance(schema, dict) and not set(schema) - ANNOTATIONS)


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def bare(schema: Any) -> Any:
    """``schema`` without the keywords that only annotate (they validate nothing)."""
    if not isinstance(schema, dict):
        return schema
    return {k: v for k, v in schema.items() if k not in ANNOTATIONS}


def killed(out: Any, paths: list[list[str | int]]) -> Any:
    """``out`` with the subschemas at ``paths`` made ``false`` (``settle`` then leaves each
    out where the schema lets it be absent); ``false`` itself if one is the root."""
    for path in sorted(paths, key=len, reverse=True):
        if not path:
            return False
        try:
            at(out, path[:-1])[path[-1]] = False
        except (KeyError, IndexError, TypeError):
            continue  # inside a part already made false
    return out


def at(root: Any, path: list[str | int]) -> Any:
    node = root
    for part in path:
        node = node[part]
    return node


def properties_of(node: dict) -> dict:
    properties = node.get("properties")
    return properties if isinstance(properties, dict) else {}


def required_of(node: dict) -> list:
    required = node.get("required")
    return [k for k in required if isinstance(k, str)] if isinstance(required, list) else []


def constants(node: dict, key: str, root: Any) -> set[str] | None:
    """The values (as JSON text) ``node`` allows for its property ``key``, where a ``const``
    or an ``enum`` lists them; None if it does not."""
    properties = node.get("properties")
    sub = deref(properties.get(key), root) if isinstance(properties, dict) else None
    if not isinstance(sub, dict):
        return None
    if "const" in sub:
        return {json.dumps(sub["const"], sort_keys=True)}
    if isinstance(sub.get("enum"), list):
        return {json.dumps(v, sort_keys=True) for v in sub["enum"]}
    return None


def deref(branch: Any, root: Any) -> Any:
    if isinstance(branch, dict) and isinstance(branch.get("$ref"), str) and \
            branch["$ref"].startswith("#/"):
        return resolve(root, branch["$ref"])
    return branch
