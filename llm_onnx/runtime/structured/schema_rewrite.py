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
  Numbers get the same bounds and at most 10 digits after the point (``"multipleOf": 1e-10``,
  the finest step the engine takes; llama.cpp's grammars allow 16): a weak model otherwise
  writes ``0.33333...`` until ``max_tokens``. No exponent is written then (``1e5`` is
  ``100000``). Listed values (``enum``, ``const``) and a schema's own ``multipleOf`` are kept.
- ``format`` values the engine does not know (OpenAPI's ``byte``, a project's own) are dropped:
  JSON Schema makes an unknown format an annotation, which validators ignore, so this is exact.
- A ``oneOf`` the engine cannot prove exclusive becomes an ``anyOf``: as it is when no value
  can match two branches (they take different types; or they are objects and one requires a
  key the other forbids, or both require a key with different constants); over the types
  exactly one branch allows when they share some (``[{"type": ["string", "null"]}, {"type":
  ["number", "null"]}]``, Kubernetes' Quantity): a value of such a type can match only that
  branch, so it is valid under ``oneOf`` exactly when it matches it. Values of a type two
  branches allow (``null`` here, which the ``oneOf`` refuses when both branches take it) are
  left out. ``integer`` counts as a ``number``. Else over the branches no other can match.
- ``uniqueItems``: an array whose items must be distinct holds at most one (one item is always
  unique).
- Conditionals that test one key against constants (an object's own and its ``allOf``'s):
  an ``anyOf`` with a branch per value of the key, holding the parts each value selects.
  Other ``if`` / ``then``: the ``then`` part holds; with an ``else``: the condition and its
  ``then`` both hold (``allOf``), the ``else`` branch is never taken.
- ``propertyNames``: ``{"type": "string"}`` always holds and is dropped; a ``pattern`` moves the
  object's other keys under ``patternProperties`` with that pattern, an ``enum`` lists them
  under ``properties`` (others are forbidden, and so are listed properties whose names do not
  match).
- ``not`` of ``required`` keys (or of an ``anyOf`` of them): those keys are forbidden; ``not``
  of nothing (``{}``): the subschema is ``false``.
- A ``oneOf`` of object branches told apart by required keys: its first branch, with a key
  every other branch requires forbidden (so exactly that branch matches).
- ``dependencies`` / ``dependentRequired`` of keys on keys: the dependent keys are required;
  a schema a key depends on holds outright.
- ``unevaluatedProperties`` becomes ``additionalProperties``: keys the object's own
  ``properties`` do not list are then judged by it even where an ``allOf`` part lists them;
  beside an ``additionalProperties`` it judges nothing and is dropped.
- ``minProperties`` / ``maxProperties`` beside optional properties: the object is closed, as
  many optional properties as the minimum needs become required, those beyond the maximum
  are forbidden.
- References into definitions grouped under a plain key are pointed at copies under
  ``$defs``; annotations beside references in a cycle are dropped (the engine refuses them).

- Last, a part none of this keeps exact (``not`` of a pattern, ``uniqueItems`` of two or
  more, an overlapping ``oneOf``, a contradiction the engine finds) is made ``false``, and
  ``schema_settle.settle`` leaves it out where the schema lets it be absent: an optional
  property is forbidden, an ``anyOf`` branch dropped, an array whose items can match nothing
  kept empty, through required keys, ``allOf`` parts and references up to the first such
  place. A schema this leaves unsatisfiable is refused. A schema the engine finds too large
  loses its largest definition that may be absent, the same way, until it fits.

``default_rewrite(schema)`` (objects closed and ordered, integers bounded) is the default;
``tighten(schema, message)`` applies the rewrite the engine's refusal ``message`` asks for (None
when none applies: the schema is refused).
"""

from __future__ import annotations

import copy
import re
from typing import Any, TypeGuard

from llm_onnx.runtime.structured.schema_check import subschemas
from llm_onnx.runtime.structured.schema_keywords import (
    bare_refs,
    conditionals,
    dependencies,
    drop_format,
    not_required,
    property_counts,
    property_names,
    sibling_refs,
    unevaluated,
    unique_items,
    unsatisfiable,
    without_largest_definition,
)
from llm_onnx.runtime.structured.schema_one_of import exclusive_one_of
from llm_onnx.runtime.structured.schema_settle import at, hoist_refs, resolve, settle

_COMBINING = ("allOf", "if", "then", "else", "not", "dependentSchemas", "dependencies")


INTEGER_BOUND = 10**16 - 1  # 16 digits, as llama.cpp's schema grammars
FRACTION_STEP = 1e-10  # 10 digits after the point (the engine takes steps down to 1e-10)


def default_rewrite(schema: Any) -> Any | None:
    """``schema`` with required properties first, its open objects closed and its integers
    and numbers bounded (see the module docstring); None if that changes nothing."""
    out = copy.deepcopy(schema)
    # definitions an allOf or a conditional reaches
    shared = _reached([node for path, node in subschemas(out) if _combined(path)], out)
    changed = False
    for path, node in subschemas(out):
        changed |= _bound_digits(node)
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


def _bound_digits(node: dict) -> bool:
    """Give an integer or number schema without a lower or upper bound one of 16 digits, and a
    number one without ``multipleOf`` at most 10 digits after the point (True if changed).
    Left alone where a bound is a draft-4 flag, the value is listed (``enum``, ``const``) or the
    new bound would leave nothing."""
    types = node.get("type")
    types = types if isinstance(types, list) else [types]
    if "integer" not in types and "number" not in types or "enum" in node or "const" in node:
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
    if "number" in types and "multipleOf" not in node:
        node["multipleOf"] = FRACTION_STEP
        changed = True
    return changed


def _is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def tighten(schema: Any, message: str) -> Any | None:
    """A tightened copy of ``schema`` for the engine's refusal ``message`` (None: no rewrite).
    A part no exact rewrite keeps is made ``false`` and left out where the schema lets it be
    absent (``schema_settle``)."""
    hoisted = hoist_refs(schema)
    if hoisted is not None:  # the rewrites then see every part the engine compiles
        return hoisted
    unknown = re.search(r"Unknown format: (.+)", message)
    if unknown is not None:
        return drop_format(schema, unknown.group(1).strip().rstrip("."))
    rewritten = None
    keys = re.search(r"Unimplemented keys: \[(.*?)\]", message)
    names = set(re.findall(r'"([^"]+)"', keys.group(1))) if keys else set()
    if "oneOf constraints are not supported" in message:
        rewritten = exclusive_one_of(schema)
    elif "uniqueItems" in names:
        rewritten = unique_items(schema)
    elif names & {"if", "then", "else"}:
        rewritten = conditionals(schema)
    elif "propertyNames" in names:
        rewritten = property_names(schema)
    elif "not" in names:
        rewritten = not_required(schema)
    elif "unevaluatedProperties" in names:
        rewritten = unevaluated(schema)
    elif names & {"dependencies", "dependentRequired", "dependentSchemas"}:
        rewritten = dependencies(schema)
    elif "min/maxProperties" in message:
        rewritten = property_counts(schema)
    elif "circular references with sibling keys" in message:
        rewritten = bare_refs(schema)
        if rewritten == schema:
            rewritten = sibling_refs(schema, message)
    elif "Unsatisfiable" in message:
        rewritten = unsatisfiable(schema, message)
    elif "schema too large" in message:
        rewritten = without_largest_definition(schema)
    if rewritten is None or rewritten == schema:  # nothing to rewrite: leave the part out
        rewritten = _prune(schema, message)
    if rewritten is None or rewritten == schema:
        return None
    return settle(rewritten)


def _prune(schema: Any, message: str) -> Any | None:
    """The subschema holding the keyword the engine refuses made ``false`` (``settle`` then
    leaves it out where the schema lets it be absent); None where it is the whole schema."""
    from llm_onnx.runtime.structured.schema_check import locate

    found = locate(schema, message)
    if found is None or len(found[0]) < 2:
        return None
    out = copy.deepcopy(schema)
    *up, key = found[0][:-1]
    at(out, up)[key] = False
    return out


def _combined(path: list[str | int]) -> bool:
    return any(part in _COMBINING for part in path if isinstance(part, str))


def _pointer(path: list[str | int]) -> str:
    return "#/" + "/".join(str(p).replace("~", "~0").replace("/", "~1") for p in path)


def _reached(nodes: list, root: Any) -> set[str]:
    """The local ``$ref`` targets reachable from ``nodes`` (transitively), each walked once."""
    found: set[str] = set()
    todo = [ref for node in nodes if isinstance(ref := node.get("$ref"), str)]
    while todo:
        ref = todo.pop()
        if not ref.startswith("#/") or ref in found:
            continue
        found.add(ref)
        target = resolve(root, ref)
        if isinstance(target, dict):
            todo += [r for _path, sub in subschemas(target) if isinstance(r := sub.get("$ref"), str)]
    return found
