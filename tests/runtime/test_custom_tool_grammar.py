"""Custom tools (OpenAI's free-text tools with a Lark grammar, Codex's ``apply_patch``) written
inside a JSON tool call: the grammar rewritten for a JSON string's contents accepts exactly the
escaped sentences of the original (llguidance's own matcher judges both), and on the tiny
byte-level model a forced call of such a tool, at temperature 1, writes arguments whose
``input`` is a sentence of the grammar, beside function tools."""

from __future__ import annotations

import json
import re

import llguidance
import pytest

from llm_onnx.runtime import Model
from llm_onnx.runtime.structured.constraint import ConstraintError
from llm_onnx.runtime.structured.json_string_grammar import checked_grammar, json_string_grammar
from tests.byte_model import HERMES_TEMPLATE, VOCAB, save_byte_tokenizer

# Codex CLI's apply_patch grammar (as its binary sends it)
APPLY_PATCH = r'''start: begin_patch hunk+ end_patch
begin_patch: "*** Begin Patch" LF
end_patch: "*** End Patch" LF?

hunk: add_hunk | delete_hunk | update_hunk
add_hunk: "*** Add File: " filename LF add_line+
delete_hunk: "*** Delete File: " filename LF
update_hunk: "*** Update File: " filename LF change_move? change?

filename: /(.+)/
add_line: "+" /(.*)/ LF -> line

change_move: "*** Move to: " filename LF
change: (change_context | change_line)+ eof_line?
change_context: ("@@" | "@@ " /(.+)/) LF
change_line: ("+" | "-" | " ") /(.*)/ LF
eof_line: "*** End of File" LF

%import common.LF
'''
PATCH = ('*** Begin Patch\n*** Add File: a "q".txt\n+hello\t"x" \\ y\x01\n'
         '*** Update File: b.py\n@@ def f():\n-    return 1\n+    return 2\n*** End Patch\n')


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from tokenizers import Tokenizer

    folder = tmp_path_factory.mktemp("bytes-tok")
    save_byte_tokenizer(folder)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    return tok, llguidance.LLTokenizer(tok.to_str(), n_vocab=VOCAB, eos_token=[2])


def accepts(tokenizer, grammar: str, text: str) -> bool:
    tok, lltok = tokenizer
    matcher = llguidance.LLMatcher(lltok, llguidance.grammar_from("lark", grammar),
                                   log_level=0)
    assert not matcher.get_error(), matcher.get_error()
    ok = matcher.consume_tokens(tok.encode(text, add_special_tokens=False).ids)
    return bool(ok) and matcher.is_accepting() and not matcher.get_error()


def escaped(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)[1:-1]


@pytest.mark.parametrize("grammar, sentence", [
    (APPLY_PATCH, PATCH),
    ('start: "a"i "b" /[^x]+/', 'Ab\n"\\'),
    ('start: SIGNED_NUMBER "/" CNAME\n%import common (SIGNED_NUMBER, CNAME)', "-1.5e3/x_1"),
    ("start: x+\nx: WORD\n%import common.WORD\n%import common.WS\n%ignore WS", "ab  cd\nef"),
    ('start: /a|b|(cd)?e/ /[\\x00-\\x1f"\\\\]+/', 'cde\x00\x1f\n"\\'),
    ('start: ("a".."c")+ WS\n%import common.WS', "abc\n\t"),
])
def test_the_rewritten_grammar_takes_the_escaped_sentences(tokenizer, grammar, sentence):
    assert accepts(tokenizer, grammar, sentence)
    inside = json_string_grammar(grammar)
    assert accepts(tokenizer, inside, escaped(sentence))
    if escaped(sentence) != sentence:
        assert not accepts(tokenizer, inside, sentence)  # raw newlines, quotes: not JSON


def test_a_newline_is_not_taken_where_the_grammar_has_none(tokenizer):
    inside = json_string_grammar(APPLY_PATCH)
    broken = PATCH.replace("*** Add File: a", "*** Add File: a\nb")  # a filename holds no \n
    assert not accepts(tokenizer, APPLY_PATCH, broken)
    assert not accepts(tokenizer, inside, escaped(broken))


@pytest.mark.parametrize("grammar, words", [
    ('start: <[12]> "a"', "special tokens"),
    ('start: x\nx: %json {"type": "object"}', "%json"),
    (r'start: /(a)\1/', "back-references"),
    (r'start: /a(?=b)/', "look-around"),
    ("start: X\n%import common.ESCAPED_STRING", "%import common.ESCAPED_STRING"),
    ("start: X\n%import other.X", "only Lark's common terminals"),
    ('start: "a" (', "tools[0].format.definition"),
])
def test_what_cannot_be_rewritten_is_refused_naming_the_field(grammar, words):
    with pytest.raises(ConstraintError, match=re.escape(words)) as info:
        checked_grammar(grammar, "tools[0].format.definition")
    assert info.value.where == "tools[0].format.definition"


# ------------------------------------------------------------------ on a model

SMALL = 'start: WORD ("\\n" /[a-z"\\\\]{1,6}/){1,2}\n%import common.WORD'
SMALL_RE = re.compile(r'[A-Za-z]+(\n[a-z"\\]{1,6}){1,2}')
PATCHER = {"type": "function", "input_grammar": SMALL, "function": {
    "name": "patch", "description": "Free text.", "parameters": {
        "type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"],
        "additionalProperties": False}}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
    "additionalProperties": False}}}
USER = [{"role": "user", "content": "Patch it."}]


@pytest.fixture(scope="module")
def model(byte_model_folder):
    return Model.load(byte_model_folder, provider="cpu", threads=1, chat_template=HERMES_TEMPLATE)


@pytest.mark.parametrize("seed", range(3))
def test_a_forced_custom_call_writes_its_text_in_the_grammar(model, seed):
    choice = {"type": "function", "function": {"name": "patch"}}
    r = model.chat(USER, tools=[PATCHER, ADD], tool_choice=choice, temperature=1.0, seed=seed,
                   max_new_tokens=200)
    assert r.finish_reason == "stop", r
    [call] = r.tool_calls
    text = json.loads(call.arguments)["input"]
    assert call.name == "patch" and SMALL_RE.fullmatch(text), text


def test_required_picks_among_custom_and_function_tools(model):
    for seed in range(3):
        r = model.chat(USER, tools=[PATCHER, ADD], tool_choice="required", temperature=1.0,
                       seed=seed, max_new_tokens=200, parallel_tool_calls=False)
        assert r.finish_reason == "stop", r
        [call] = r.tool_calls
        arguments = json.loads(call.arguments)
        if call.name == "patch":
            assert SMALL_RE.fullmatch(arguments["input"])
        else:
            assert call.name == "add" and isinstance(arguments["a"], int)


def test_a_format_without_free_text_refuses_a_custom_tool(byte_model_folder):
    mistral = Model.load(byte_model_folder, provider="cpu", threads=1,
                         chat_template=HERMES_TEMPLATE, tool_call_format="mistral")
    with pytest.raises(ConstraintError, match="takes free text in a grammar") as info:
        mistral.chat(USER, tools=[PATCHER], tool_choice="required", max_new_tokens=4)
    assert info.value.where == "tools[0]"
