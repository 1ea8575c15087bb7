"""Constrained decoding in the runtime, on a tiny random model with a byte-level tokenizer
(tests/byte_model.py): whatever the weights, every complete output is valid, checked by an
independent validator (jsonschema, Python's re, the Lark grammar's language written as a regex).
"""

from __future__ import annotations

import json
import re
import time

import jsonschema
import numpy as np
import pytest

from llm_onnx.errors import GenerationError
from llm_onnx.runtime import Model
from llm_onnx.runtime.generation.scheduler import Scheduler
from llm_onnx.runtime.structured.constraint import Constraint, ConstraintError
from tests.byte_model import EOS

USER = [{"role": "user", "content": "Describe a person."}]
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        "ok": {"type": "boolean"},
        "score": {"type": ["number", "null"]},
    },
    "required": ["name", "age", "tags", "ok"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def model(byte_model_folder):
    return Model.load(byte_model_folder, provider="cpu", threads=1)


def prompt(model):
    return model.chat_prompt(USER)


# ------------------------------------------------------------------ every kind, any weights

@pytest.mark.parametrize("seed", range(6))
def test_json_schema_outputs_validate_at_temperature_one(model, seed):
    result = model.generate(prompt(model), json_schema=PERSON, temperature=1.0, seed=seed,
                            max_new_tokens=300)
    assert result.finish_reason == "stop", result
    jsonschema.validate(json.loads(result.text), PERSON)


def test_json_object_regex_choice_grammars(model):
    p = prompt(model)
    cases = [
        (dict(json_object=True), lambda t: isinstance(json.loads(t), dict)),
        (dict(regex=r"(\d{3})-[a-f]{2,4}!"), lambda t: re.fullmatch(r"[0-9]{3}-[a-f]{2,4}!", t)),
        (dict(choice=["red", "green", "blue"]), lambda t: t in ("red", "green", "blue")),
        # Lark: a list of small numbers; the same language as a Python regex
        (dict(grammar='start: "[" num ("," num)* "]"\nnum: /[1-9][0-9]?/'),
         lambda t: re.fullmatch(r"\[[1-9][0-9]?(,[1-9][0-9]?)*\]", t)),
        # GBNF, converted to Lark by llguidance
        (dict(grammar='root ::= "yes" | "no" | ("maybe " [0-9])'),
         lambda t: re.fullmatch(r"yes|no|maybe [0-9]", t)),
    ]
    for kwargs, valid in cases:
        for seed in range(3):
            r = model.generate(p, temperature=1.0, seed=seed, max_new_tokens=200, **kwargs)
            assert r.finish_reason == "stop" and valid(r.text), (kwargs, r.text)


def test_end_of_sequence_waits_for_a_complete_document(model):
    """The model wants to stop at once (logit_bias on eos); the grammar does not let it."""
    r = model.generate(prompt(model), json_schema=PERSON, logit_bias={EOS: 100.0},
                       max_new_tokens=300)
    assert r.finish_reason == "stop"
    jsonschema.validate(json.loads(r.text), PERSON)
    free = model.generate(prompt(model), logit_bias={EOS: 100.0}, max_new_tokens=8)
    assert free.text == "" and free.token_ids == [EOS]  # unconstrained, it does stop


def test_running_out_of_tokens_is_length_with_the_partial_text(model):
    r = model.generate(prompt(model), json_schema=PERSON, max_new_tokens=5)
    assert r.finish_reason == "length" and len(r.token_ids) == 5
    with pytest.raises(json.JSONDecodeError):
        json.loads(r.text)
    assert r.text.startswith("{")


def test_a_complete_grammar_ends_without_asking_for_end_of_sequence(model):
    r = model.generate(prompt(model), choice=["yes", "no"], max_new_tokens=50)
    assert r.finish_reason == "stop" and r.text in ("yes", "no")
    assert EOS not in r.token_ids and len(r.token_ids) == len(r.text.encode())


def test_ignore_eos_still_ends_a_complete_grammar(model):
    r = model.generate(prompt(model), regex="[a-z]{3}", ignore_eos=True, max_new_tokens=50)
    assert r.finish_reason == "stop" and re.fullmatch("[a-z]{3}", r.text)


def test_stop_strings_and_stop_tokens_still_apply(model):
    r = model.generate(prompt(model), regex="abc(def)?", max_new_tokens=50, stop=["cd"])
    assert r.finish_reason == "stop_string" and r.text == "ab"


# ------------------------------------------------------------------ logprobs, fast-forward

def test_logprobs_are_those_of_the_masked_distribution(model):
    """First step of choice ["yes", "no"]: only 'y' and 'n' are allowed; their logprobs are the
    log-softmax of the raw logits over those two (numpy reference)."""
    p = prompt(model)
    gen = model.generator(choice=["yes", "no"], max_new_tokens=10)
    gen.append_tokens(p, logprobs=5)
    first = gen.generate_next_token()
    lp = first.logprob
    assert {t for t, _ in lp.top} == {model.encode("y")[0], model.encode("n")[0]}
    cache = model.engine.new_cache(1, len(p) + 1)
    raw = model.engine.prefill(cache, 0, p).astype(np.float64)
    allowed = np.array([model.encode("y")[0], model.encode("n")[0]])
    ref = raw[allowed] - np.log(np.exp(raw[allowed]).sum())
    assert dict(lp.top) == pytest.approx(dict(zip(allowed.tolist(), ref.tolist())), abs=1e-4)
    rest = []
    while not gen.is_done():  # "es" or "o" are forced: logprob 0
        rest.append(gen.generate_next_token())
    assert rest and all(e.logprob.logprob == 0.0 and e.logprob.top == ((e.token_id, 0.0),)
                        for e in rest)
    assert gen.result().text in ("yes", "no")


def test_fast_forward_saves_runs_and_changes_no_token(model):
    """A compact schema forces its keys: fast-forward appends them without a pick and runs them
    in one chunk; the tokens are those picked one step at a time under a one-token mask."""
    schema = {**PERSON, "x-guidance": {"whitespace_flexible": False}}
    p = prompt(model)

    def run(fast_forward: bool):
        model.constraints.fast_forward = fast_forward
        try:
            gen = model.generator(json_schema=schema, max_new_tokens=300)
            gen.append_tokens(p)
            for _ in gen.events():
                pass
            return gen.result(), gen.stats
        finally:
            model.constraints.fast_forward = True

    (fast, fast_stats), (slow, slow_stats) = run(True), run(False)
    assert fast.token_ids == slow.token_ids and fast.finish_reason == "stop"
    jsonschema.validate(json.loads(fast.text), PERSON)
    assert fast_stats.forced_tokens >= len('{"name":"",age":,"tags":[],"ok":')
    assert slow_stats.forced_tokens == 0
    assert fast_stats.decode_runs + fast_stats.forced_tokens <= slow_stats.decode_runs + 1


def test_generate_next_token_hands_out_forced_tokens_one_by_one(model):
    gen = model.generator(regex="Hello, [a-z]{2}!", max_new_tokens=40)
    gen.append_tokens(prompt(model))
    events = []
    while not gen.is_done():
        events.append(gen.generate_next_token())
    assert "".join(e.text for e in events) == gen.result().text
    assert [e.token_id for e in events] == gen.result().token_ids
    assert re.fullmatch("Hello, [a-z]{2}!", gen.result().text)


def test_rewind_rolls_the_matcher_back(model):
    """Rewinding k tokens (into fast-forwarded ones too) and generating again gives the same
    greedy output; rewinding everything restarts the grammar."""
    p = prompt(model)
    gen = model.generator(json_schema=PERSON, max_new_tokens=300)
    gen.append_tokens(p)
    for _ in gen.events():
        pass
    full = gen.result()
    for k in (1, 3, 9, len(full.token_ids)):
        gen.rewind(k)
        assert gen.tokens() == p + full.token_ids[:len(full.token_ids) - k]
        for _ in gen.events():
            pass
        assert gen.result().token_ids == full.token_ids and gen.result().finish_reason == "stop"


# ------------------------------------------------------------------ batches

def test_different_constraints_in_one_batch_equal_each_alone(model):
    p = prompt(model)
    requests = [dict(json_schema=PERSON), dict(regex=r"[0-9]{4}"), dict(choice=["x", "yz"]),
                {}, dict(json_object=True), dict(grammar='start: "(" ("a"|"b")+ ")"')]
    alone = [model.generate(p, max_new_tokens=120, **kw) for kw in requests]
    with Scheduler(model, max_batch=4, prefill_chunk=16) as scheduler:
        jobs = [scheduler.submit(p, model.options(max_new_tokens=120, **kw)) for kw in requests]
        together = [job.result(timeout=60) for job in jobs]
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]
    jsonschema.validate(json.loads(together[0].text), PERSON)
    assert re.fullmatch("[0-9]{4}", together[1].text) and together[2].text in ("x", "yz")
    assert scheduler.generator.stats.mask_rows > 0


# ------------------------------------------------------------------ bad constraints

@pytest.mark.parametrize("kwargs, where, fragment", [
    (dict(json_schema={"type": "object", "properties": {"age": {"type": "int"}}}),
     "json_schema.properties.age.type", "'type' must be one of"),
    (dict(json_schema={"properties": {"a": {"minimum": "3"}}}),
     "json_schema.properties.a.minimum", "must be a number"),
    (dict(json_schema={"type": "array", "items": {"type": "string"}, "uniqueItems": True,
                       "minItems": 2}),
     "json_schema.uniqueItems", "cannot be enforced"),
    (dict(json_schema={"type": "object", "properties": {"a": {"type": "string"}},
                       "not": {"const": {"a": "x"}}}), "json_schema.not", "cannot be enforced"),
    (dict(json_schema={"type": "object", "properties": {"p": {"$ref": "#/$defs/missing"}}}),
     "json_schema.properties.p.$ref", "points to nothing"),
    (dict(json_schema={"$ref": "https://example.com/schema.json"}), "json_schema.$ref",
     "nothing is fetched"),
    (dict(json_schema={"type": "string", "pattern": "(unclosed"}), "json_schema.pattern",
     "regex"),
    (dict(json_schema="{not json"), "json_schema", "not valid JSON"),
    (dict(regex="(a"), "regex", "unclosed group"),
    (dict(grammar="start: missing_rule"), "grammar", "unknown name"),
    (dict(grammar='root ::= "a" | undefined'), "grammar", "not found"),
    (dict(choice=[]), "choice", "non-empty list"),
])
def test_bad_constraints_name_the_field_and_path(model, kwargs, where, fragment):
    with pytest.raises(ConstraintError) as info:
        model.generate(prompt(model), max_new_tokens=4, **kwargs)
    assert info.value.where == where and fragment in str(info.value), str(info.value)
    assert str(info.value).startswith(where)


def test_a_grammar_too_big_is_refused_within_bounded_time(model):
    huge = {"enum": [f"value-{i}-" + "x" * (i % 40) for i in range(120_000)]}
    began = time.perf_counter()
    with pytest.raises(ConstraintError, match="too big"):
        model.constraints.compile(Constraint.json_schema(huge))
    assert time.perf_counter() - began < 10


def test_one_constraint_at_a_time(model):
    with pytest.raises(GenerationError, match="give one constraint"):
        model.options(json_schema=PERSON, regex="a")


def test_compiled_grammars_are_cached_by_content(model):
    engine = model.constraints
    before = engine.compiles
    for _ in range(3):
        engine.start(Constraint.json_schema({"type": "object", "properties": {"q": {}}}))
    assert engine.compiles == before + 1


# ------------------------------------------------------------------ schemas tightened, never loosened

TIGHTENED = [
    # Kubernetes' Quantity: both branches take null, which oneOf then refuses
    {"type": "object", "properties": {"q": {"oneOf": [{"type": ["string", "null"]},
                                                      {"type": ["number", "null"]}]}},
     "required": ["q"]},
    # a oneOf over a $ref'd object and a string
    {"$defs": {"call": {"type": "object", "properties": {"f": {"enum": ["x", "y"]}},
                        "required": ["f"]}},
     "type": "array", "maxItems": 3,
     "items": {"oneOf": [{"type": "string", "maxLength": 4}, {"$ref": "#/$defs/call"},
                         {"type": ["object", "boolean"]}]}},
    # an unknown format is an annotation; items that must be unique: at most one
    {"type": "object", "properties": {"blob": {"type": "string", "format": "byte",
                                               "maxLength": 8},
                                      "tags": {"type": "array", "items": {"enum": ["a", "b"]},
                                               "uniqueItems": True}},
     "required": ["blob", "tags"]},
    # a conditional: its condition and then-branch both hold
    {"type": "object", "properties": {"kind": {"enum": ["a", "b"]}, "n": {"type": "integer"},
                                      "s": {"type": "string", "maxLength": 5}},
     "required": ["kind"], "additionalProperties": False,
     "if": {"properties": {"kind": {"const": "a"}}},
     "then": {"required": ["n"]}, "else": {"required": ["s"]}},
    # an optional property the engine cannot enforce is left out
    {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                      "b": {"type": "string", "not": {"pattern": "^x"}}},
     "required": ["a"]},
    # property names by pattern, and keys that must not appear
    {"type": "object", "propertyNames": {"pattern": "^[a-c]{1,3}$"},
     "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 9}, "maxProperties": 3,
     "not": {"anyOf": [{"required": ["ab"]}, {"required": ["ba"]}]}},
    # definitions grouped under a plain key (Travis CI's form); unique items there
    {"definitions": {"group": {"tags": {"type": "array", "uniqueItems": True, "minItems": 1,
                                        "items": {"enum": ["x", "y"]}}}},
     "type": "object", "properties": {"t": {"$ref": "#/definitions/group/tags"}},
     "required": ["t"]},
    # a oneOf of objects told apart by a key's constants (GitHub Actions' runs), and one whose
    # closed branch forbids the key the other requires, their branches by reference
    {"$defs": {"js": {"type": "object", "required": ["using", "main"],
                      "properties": {"using": {"enum": ["node20", "node24"]},
                                     "main": {"type": "string", "maxLength": 4}}},
               "docker": {"type": "object", "required": ["using", "image"],
                          "properties": {"using": {"const": "docker"},
                                         "image": {"type": "string", "maxLength": 4}}},
               "a": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0,
                                                            "maximum": 9}},
                     "required": ["a"], "additionalProperties": False},
               "b": {"type": "object", "properties": {"b": {"type": "boolean"}},
                     "required": ["b"]}},
     "type": "object", "required": ["runs", "w"], "properties": {
        "runs": {"oneOf": [{"$ref": "#/$defs/js"}, {"$ref": "#/$defs/docker"}]},
        "w": {"oneOf": [{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/b"}]}}},
    # conditionals on one key's constant (GitHub issue forms), items that must differ at a
    # place that may be absent, and counts of keys beside optional ones
    {"type": "object", "required": ["item"], "properties": {
        "item": {"type": "object", "required": ["type"],
                 "properties": {"type": {"enum": ["text", "flag"]}},
                 "allOf": [{"if": {"properties": {"type": {"const": "text"}}},
                            "then": {"properties": {"type": {}, "v": {"type": "string",
                                                                      "maxLength": 3}},
                                     "required": ["type", "v"], "additionalProperties": False}},
                           {"if": {"properties": {"type": {"const": "flag"}}},
                            "then": {"properties": {"type": {}, "on": {"type": "boolean"}},
                                     "required": ["type", "on"],
                                     "additionalProperties": False}}]},
        "pairs": {"type": "array", "items": {"type": "string", "maxLength": 2},
                  "uniqueItems": True, "minItems": 2},
        "opts": {"type": "object", "minProperties": 1, "maxProperties": 2,
                 "properties": {"p": {"type": "boolean"}, "q": {"type": "boolean"},
                                "r": {"type": "boolean"}}}}},
    # a cycle of references with notes beside them (CircleCI's logic), a key's schema that
    # holds when another key is there, and unevaluatedProperties beside additionalProperties
    {"$defs": {"logic": {"oneOf": [{"type": "boolean"}, {
        "type": "object", "additionalProperties": False, "maxProperties": 1,
        "properties": {"not": {"$ref": "#/$defs/logic", "markdownDescription": "not"}}}]}},
     "type": "object", "required": ["when"],
     "properties": {"when": {"$ref": "#/$defs/logic", "description": "a condition"},
                    "x": {"type": "integer", "minimum": 0, "maximum": 5}},
     "dependentSchemas": {"x": {"required": ["when"]}},
     "additionalProperties": False, "unevaluatedProperties": False},
]


@pytest.mark.parametrize("schema", TIGHTENED)
def test_schemas_the_engine_refuses_as_written_are_tightened_and_outputs_validate(model, schema):
    """Every output validates under the schema as the user wrote it (jsonschema)."""
    import llguidance

    as_written = Constraint.json_schema(schema).grammar_text()
    assert llguidance.LLMatcher.validate_grammar(as_written, model.constraints.tokenizer)
    for seed in range(4):
        r = model.generate(prompt(model), json_schema=schema, temperature=1.0, seed=seed,
                           max_new_tokens=400)
        assert r.finish_reason == "stop", r
        jsonschema.validate(json.loads(r.text), schema)
    tightened = model.constraints.compile(Constraint.json_schema(schema))
    assert tightened.source != json.dumps(schema)


def test_a_schema_too_large_for_the_engine_leaves_its_largest_optional_definition_out(model):
    """Azure Pipelines' form: a definition the engine finds too large (three choices of 40
    that it multiplies out) used where the schema lets it be absent; a conditional that only
    requires a key (Dependabot's form)."""
    import llguidance

    tasks = {"allOf": [{"anyOf": [{"type": "object", "properties": {f"k{j}": {"const": i}}}
                                  for i in range(40)]} for j in range(3)]}
    schema = {"definitions": {"task": tasks, "script": {"type": "string", "maxLength": 6}},
              "type": "object", "required": ["steps", "name"], "additionalProperties": False,
              "properties": {"name": {"type": "string", "maxLength": 5},
                             "when": {"type": "string", "maxLength": 3},
                             "steps": {"type": "array", "maxItems": 2, "items": {"anyOf": [
                                 {"$ref": "#/definitions/task"},
                                 {"$ref": "#/definitions/script"}]}}},
              "allOf": [{"if": {"not": {"required": ["name"]}},
                         "then": {"properties": {"when": {"$ref": "#/properties/when"}},
                                  "required": ["when"]}}]}
    error = llguidance.LLMatcher.validate_grammar(Constraint.json_schema(
        {k: v for k, v in schema.items() if k != "allOf"}).grammar_text(),
        model.constraints.tokenizer)
    assert "too large" in error
    run = json.loads(model.constraints.compile(Constraint.json_schema(schema)).source)
    assert run["definitions"]["task"] is False and run["required"] == ["steps", "name", "when"]
    for seed in range(3):
        r = model.generate(prompt(model), json_schema=schema, temperature=1.0, seed=seed,
                           max_new_tokens=300)
        assert r.finish_reason == "stop", r
        jsonschema.validate(json.loads(r.text), schema)


def test_objects_are_closed_unless_the_schema_opens_them(model):
    """An object listing its properties gets no others (a weak model invents keys forever);
    "additionalProperties": true keeps it open; an allOf's parts stay as written."""
    listed = {"type": "object", "properties": {"a": {"type": "string"}}}
    run = model.constraints.compile(Constraint.json_schema(listed))
    assert json.loads(run.source)["additionalProperties"] is False
    opened = {**listed, "additionalProperties": True}
    assert model.constraints.compile(Constraint.json_schema(opened)).source == json.dumps(opened)
    parts = {"allOf": [{"properties": {"a": {"type": "string"}}, "required": ["a"]},
                       {"properties": {"b": {"type": "string"}}, "required": ["b"]}]}
    assert model.constraints.compile(Constraint.json_schema(parts)).source == json.dumps(parts)
    r = model.generate(prompt(model), json_schema=parts, temperature=1.0, seed=1,
                       max_new_tokens=300)
    jsonschema.validate(json.loads(r.text), parts)


def test_integers_without_bounds_get_sixteen_digits(model):
    """Pushed to repeat a digit (logit_bias on '1', as SmolLM2 does greedily), an unbounded
    integer would run to max_new_tokens; bounded at 16 digits (llama.cpp's limit) the document
    ends. A schema's own bounds are kept, and a bound beyond 16 digits is not cut."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    one = model.encode("1")[0]
    r = model.generate(prompt(model), json_schema=schema, logit_bias={one: 40.0},
                       max_new_tokens=200)
    assert r.finish_reason == "stop", r
    value = json.loads(r.text)["n"]
    jsonschema.validate({"n": value}, schema)
    assert len(str(abs(value))) == 16
    big = {"type": "integer", "minimum": 10**17}
    assert json.loads(model.constraints.compile(Constraint.json_schema(big)).source) == big
    own = {"type": ["integer", "null"], "maximum": 5}
    rewritten = json.loads(model.constraints.compile(Constraint.json_schema(own)).source)
    assert rewritten == {**own, "minimum": -(10**16 - 1)}


def test_numbers_get_sixteen_digits_and_ten_after_the_point(model):
    """Pushed to repeat a digit (logit_bias on '3', less on '.'), a number ends after 16 digits
    before the point and 10 after it (3.333... would run to max_new_tokens); listed values and
    a schema's own step are kept."""
    schema = {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}
    three, point = model.encode("3")[0], model.encode(".")[0]
    r = model.generate(prompt(model), json_schema=schema, logit_bias={three: 40.0, point: 20.0},
                       max_new_tokens=200)
    assert r.finish_reason == "stop", r
    jsonschema.validate(json.loads(r.text), schema)
    written = re.search(r'"x"\s*:\s*(\S+?)\s*}', r.text)
    assert written, r.text
    written = written.group(1)
    whole, _, fraction = written.partition(".")
    assert (len(whole.lstrip("-")), len(fraction)) == (16, 10), written
    for kept in ({"type": "number", "const": 3.14159265358979}, {"type": "number",
                                                               "multipleOf": 0.25}):
        rewritten = json.loads(model.constraints.compile(Constraint.json_schema(kept)).source)
        assert rewritten.get("multipleOf") == kept.get("multipleOf")


def test_a_one_of_no_rewrite_can_keep_exact_is_still_refused(model):
    overlapping = {"oneOf": [{"type": "string", "minLength": 1}, {"type": "string",
                                                                   "maxLength": 3}]}
    with pytest.raises(ConstraintError, match="json_schema.oneOf: the schema keyword 'oneOf'"):
        model.constraints.compile(Constraint.json_schema(overlapping))


def test_a_chat_answer_may_come_in_a_json_fence_which_is_stripped(model):
    """Pushed to open a Markdown fence (logit_bias on '`'), the model writes ```json ... ```;
    the grammar allows it around the document (as llama-server's does) and the reply's text is
    the document alone, whole and streamed. A plain generate() has no fence."""
    backtick, brace = model.encode("`")[0], model.encode("}")[0]
    kwargs = dict(json_schema=PERSON, logit_bias={backtick: 30.0, brace: 5.0},
                  max_new_tokens=300)
    r = model.chat(USER, **kwargs)
    assert model.decode(r.token_ids).startswith("```json") and r.finish_reason == "stop"
    assert not r.text.startswith("`")
    jsonschema.validate(json.loads(r.text), PERSON)
    assert "".join(model.stream_chat(USER, **kwargs)) == r.text
    plain = model.generate(prompt(model), **kwargs)
    assert plain.finish_reason in ("stop", "length") and not plain.text.startswith("`")
