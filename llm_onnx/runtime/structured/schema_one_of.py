"""``oneOf`` as the constraint engine can take it: an ``anyOf`` over branches no other branch
can match as well (see ``schema_rewrite`` for the whole list of rewrites). No value the
rewritten schema allows matches two branches, so none is let through that ``oneOf`` refuses."""

from __future__ import annotations

import copy
from typing import Any

from llm_onnx.runtime.structured.schema_check import TYPES, subschemas
from llm_onnx.runtime.structured.schema_settle import (
    constants,
    deref,
    killed,
    properties_of,
    required_of,
)


def exclusive_one_of(schema: Any) -> Any:
    """Each ``oneOf`` as an ``anyOf`` over branches no other branch can match as well: all of
    them where they take different types or different objects (a key one requires that the
    other forbids, or a required key whose allowed constants differ), else over the types or
    the branches that are exclusive, else its first branch with a key of every other branch
    forbidden. A ``oneOf`` none of this keeps exact can match nothing here."""
    out = copy.deepcopy(schema)
    dead = []
    for path, node in subschemas(out):
        branches = node.get("oneOf")
        if not isinstance(branches, list):
            continue
        branches = [b for b in branches if b is not False]  # a false branch matches nothing
        alone = [b for i, b in enumerate(branches)
                 if all(_disjoint(b, other, out) for k, other in enumerate(branches) if k != i)]
        if len(alone) == len(branches) and branches:  # exclusive: oneOf is anyOf
            _any_of(node, branches)
            continue
        types = [_types(b, out) for b in branches]
        if all(t is not None for t in types):
            kept = _own_types(branches, types)  # type: ignore[arg-type]
            if kept:
                _any_of(node, kept)
                continue
        if alone:
            _any_of(node, alone)
            continue
        first = _first_by_required(branches, out) if branches else None
        if first is not None:
            del node["oneOf"]
            node["allOf"] = list(node.get("allOf", [])) + first
            continue
        dead.append(path)  # nothing is exclusive: no rewrite keeps a valid document
    return killed(out, dead)


def _any_of(node: dict, branches: list) -> None:
    """``node``'s oneOf replaced by an anyOf of ``branches`` (beside an anyOf it has, both
    hold)."""
    del node["oneOf"]
    if "anyOf" in node:
        node["allOf"] = list(node.get("allOf", [])) + [{"anyOf": branches}]
    else:
        node["anyOf"] = branches


def _own_types(branches: list, types: list[set[str]]) -> list:
    """Each branch held to the types no other branch takes (values of those can match only
    it); branches left with none are dropped."""
    counts: dict[str, int] = {}
    for t in types:
        for name in t:
            counts[name] = counts.get(name, 0) + 1
    kept = []
    for branch, t in zip(branches, types):
        own = [name for name in TYPES if name in t and counts[name] == 1]
        if own:
            kept.append({"allOf": [branch, {"type": own if len(own) > 1 else own[0]}]})
    return kept


def _disjoint(a: Any, b: Any, root: Any) -> bool:
    """True where no value can match both ``a`` and ``b``, as far as their types, the keys
    their objects require and forbid, and the constants of a key both require show."""
    ta, tb = _types(a, root), _types(b, root)
    if ta is not None and tb is not None and not ta & tb:
        return True
    a, b = deref(a, root), deref(b, root)
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return False
    if _forbids_one_of(a, b) or _forbids_one_of(b, a):
        return True
    for key in set(required_of(a)) & set(required_of(b)):
        va, vb = constants(a, key, root), constants(b, key, root)
        if va is not None and vb is not None and not va & vb:
            return True
    return False


def _forbids_one_of(node: dict, other: dict) -> bool:
    """True if ``other`` forbids a key ``node`` requires."""
    listed = properties_of(other)
    closed = other.get("additionalProperties") is False and not other.get("patternProperties")
    return any(listed.get(k) is False or (closed and k not in listed) for k in required_of(node))


def _first_by_required(branches: list, root: Any) -> list | None:
    """A oneOf of object branches told apart by required keys, as its first branch with one
    required key of every other branch forbidden (so no other branch can match): None if some
    other branch requires no key the first does not."""
    forbid = {}
    first = deref(branches[0], root)
    mine = set(first.get("required", [])) if isinstance(first, dict) else set()
    for branch in branches[1:]:
        other = deref(branch, root)
        keys = [k for k in (other.get("required", []) if isinstance(other, dict) else [])
                if k not in mine]
        if not keys:
            return None
        forbid[keys[0]] = False
    return [branches[0], {"properties": forbid}]


def _types(branch: Any, root: Any, depth: int = 0) -> set[str] | None:
    """The JSON types a branch accepts (or more), as far as its ``type``, ``const``, ``enum``,
    local ``$ref`` or the branches of its ``anyOf`` / ``oneOf`` / ``allOf`` say; ``number`` and
    ``integer`` both stand for every number. None: unknown."""
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
    elif any(isinstance(branch.get(k), list) and branch[k] for k in ("anyOf", "oneOf")):
        names = set()  # the types of its branches, all of them
        for key in ("anyOf", "oneOf"):
            for sub in branch.get(key) or []:
                more = _types(sub, root, depth + 1)
                if more is None:
                    return None
                names |= more
    elif isinstance(branch.get("allOf"), list):  # the types every part it knows of allows
        known = [t for t in (_types(sub, root, depth + 1) for sub in branch["allOf"])
                 if t is not None]
        if not known:
            return None
        names = set.intersection(*known)
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
