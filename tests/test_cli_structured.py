"""The CLI's constraint flags (--json-schema, --json-object, --regex, --grammar, --choice) and
--chat-template on `generate` and `chat`, on the tiny byte-level model (tests/byte_model.py):
outputs checked with jsonschema and Python's re; bad input is one line and exit code 1."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from click.testing import CliRunner

from llm_onnx.cli import main
from tests.byte_model import HERMES_TEMPLATE

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                           "n": {"type": "integer", "minimum": 0,
                                                 "maximum": 99}},
          "required": ["name", "n"], "additionalProperties": False}


def generate(folder, *args, **kwargs):
    return CliRunner().invoke(main, ["generate", "--model", str(folder), "-q",
                                     "--max-new-tokens", "200", *args], **kwargs)


def test_json_schema_from_a_file_and_inline(byte_model_folder, tmp_path):
    path = tmp_path / "person.schema.json"
    path.write_text(json.dumps(SCHEMA))
    for source in (str(path), json.dumps(SCHEMA)):
        result = generate(byte_model_folder, "--json-schema", source, "--temperature", "1",
                          "--seed", "2", "A person")
        assert result.exit_code == 0, result.output
        jsonschema.validate(json.loads(result.stdout), SCHEMA)
    data = json.loads(generate(byte_model_folder, "--json", "--json-schema", str(path),
                               "A person").stdout)
    assert data["finish_reason"] == "stop"
    jsonschema.validate(json.loads(data["text"]), SCHEMA)


def test_json_object_regex_choice_grammar(byte_model_folder, tmp_path):
    gbnf = tmp_path / "answer.gbnf"
    gbnf.write_text('root ::= "A" [0-9] [0-9]?\n')
    cases = [(["--json-object"], lambda t: isinstance(json.loads(t), dict)),
             (["--regex", r"[a-c]{2}\d"], lambda t: re.fullmatch(r"[a-c]{2}[0-9]", t)),
             (["--choice", "left", "--choice", "right"], lambda t: t in ("left", "right")),
             (["--grammar", str(gbnf)], lambda t: re.fullmatch(r"A[0-9][0-9]?", t)),
             (["--raw", "--choice", "up", "--choice", "down"], lambda t: t in ("up", "down"))]
    for flags, valid in cases:
        result = generate(byte_model_folder, *flags, "--temperature", "1", "--seed", "1", "Go")
        assert result.exit_code == 0 and valid(result.stdout.rstrip("\n")), (flags, result.output)


def test_chat_takes_the_flags_too(byte_model_folder):
    result = CliRunner().invoke(main, ["chat", "--model", str(byte_model_folder), "-q",
                                       "--choice", "yes", "--choice", "no"],
                                input="Is it?\nAnd now?\n")
    assert result.exit_code == 0, result.output
    assert [line for line in result.stdout.splitlines() if line] in \
        [[a, b] for a in ("yes", "no") for b in ("yes", "no")]


@pytest.mark.parametrize("flags, fragment", [
    (["--json-schema", '{"type": "object", "properties": {"n": {"minimum": "1"}}}'],
     "--json-schema at properties.n.minimum: 'minimum' must be a number"),
    (["--json-schema", "missing.json"], "no such file"),
    (["--json-schema", "{oops"], "not valid JSON"),
    (["--regex", "(x"], "--regex: invalid regex \"(x\": regex parse error: unclosed group"),
    (["--regex", "x", "--choice", "y"], "give one of --regex, --choice"),
    (["--chat-template", "README.md"], "does not render a two-message conversation"),
    (["--chat-template", "no-such-template"], "nor a template that comes with llm-onnx "
                                              "(chatml-tools)"),
])
def test_bad_constraints_are_one_line_and_exit_one(byte_model_folder, flags, fragment):
    result = generate(byte_model_folder, *flags, "Hi")
    assert result.exit_code == 1, result.output
    assert fragment in result.stderr and len(result.stderr.strip().splitlines()) == 1, \
        result.stderr


@pytest.mark.parametrize("template", [str(HERMES_TEMPLATE), "chatml-tools"])
def test_chat_template_file_is_used_instead_of_the_folders(byte_model_folder, template):
    result = generate(byte_model_folder, "--chat-template", template, "--json",
                      "--system", "Be brief.", "Hi")
    assert result.exit_code == 0, result.output
    from llm_onnx.runtime import Model

    model = Model.load(byte_model_folder, chat_template=HERMES_TEMPLATE)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    ref = model.chat(messages, max_new_tokens=200, temperature=0)
    assert json.loads(result.stdout)["token_ids"] == ref.token_ids
    folder_template = Model.load(byte_model_folder).chat_template
    assert folder_template != model.chat_template == HERMES_TEMPLATE.read_text()
