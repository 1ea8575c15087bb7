"""schema_settle: parts that can match nothing carried up to where a schema lets them be absent,
and references that no keyword reaches made reachable, checked against jsonschema: every
document the result allows is one the original allows, and what it keeps still validates."""

from __future__ import annotations

import copy

import jsonschema
import pytest

from llm_onnx.runtime.structured.schema_settle import hoist_refs, settle


def valid(schema, document) -> bool:
    return jsonschema.Draft202012Validator(schema).is_valid(document)


def test_a_dead_definition_forbids_the_optional_property_that_uses_it():
    schema = {"properties": {"a": {"$ref": "#/$defs/d"}, "b": {"type": "integer"}},
              "required": ["b"],
              "$defs": {"d": {"type": "object", "properties": {"x": False}, "required": ["x"]}}}
    settled = settle(copy.deepcopy(schema))
    assert settled["properties"]["a"] is False and settled["$defs"]["d"] is False
    assert settled["properties"]["b"] == {"type": "integer"}
    assert valid(settled, {"b": 1}) and not valid(settled, {"b": 1, "a": {}})


def test_death_climbs_through_required_keys_all_of_and_items_to_an_any_of_branch():
    inner = {"type": "object", "required": ["k"], "properties": {"k": False}}
    schema = {"anyOf": [
        {"type": "object", "required": ["p"], "properties": {
            "p": {"allOf": [{"type": "array", "minItems": 1, "items": inner}]}}},
        {"type": "string", "maxLength": 3}]}
    settled = settle(copy.deepcopy(schema))
    assert settled == {"anyOf": [{"type": "string", "maxLength": 3}]}
    for document in ("ab", {"p": [{"k": 1}]}, {"p": []}):
        assert not valid(settled, document) or valid(schema, document)


def test_items_that_can_match_nothing_leave_an_optional_array_empty():
    schema = {"type": "object", "properties": {"xs": {"type": "array", "items": {"enum": []}}}}
    settled = settle(copy.deepcopy(schema))
    assert settled["properties"]["xs"]["maxItems"] == 0
    assert valid(settled, {"xs": []}) and valid(schema, {"xs": []})


@pytest.mark.parametrize("schema", [
    False,
    {"type": "object", "required": ["a"], "properties": {"a": {"not": {}}}},
    {"oneOf": [False, {"allOf": [True, False]}]},
    {"type": "object", "required": ["z"], "properties": {"a": {}}, "additionalProperties": False},
])
def test_a_schema_that_can_match_nothing_settles_to_none(schema):
    assert settle(copy.deepcopy(schema)) is None


def test_references_under_a_plain_key_are_hoisted_to_defs_and_mean_the_same():
    schema = {"definitions": {"notifications": {"slack": {"type": "string", "maxLength": 4}}},
              "type": "object", "properties": {"s": {"$ref": "#/definitions/notifications/slack"}}}
    hoisted = hoist_refs(schema)
    ref = hoisted["properties"]["s"]["$ref"]
    assert ref.startswith("#/$defs/") and hoisted["$defs"][ref.split("/")[-1]] == \
        schema["definitions"]["notifications"]["slack"]
    for document in ({"s": "abc"}, {"s": "abcdef"}, {"s": 3}):
        assert valid(hoisted, document) == valid(schema, document)
    assert hoist_refs(hoisted) is None  # every target now reached
