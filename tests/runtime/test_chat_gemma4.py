"""Gemma 4's chat format through the runtime: its real chat template rendered as transformers
renders it (tools, a call and its result, thinking on and off), the format read off it, a
reply's thought channel and ``call:NAME{...}`` calls read back whole and streamed, and the
grammar of a tool choice: on a fake engine that wants to think and then stop, "required" gives
a call whose arguments validate, after a free thought.

tests/gemma4_chat_model.py says where the template and the tokenizer's token types come from.
"""

from __future__ import annotations

import copy
import json

import jsonschema
import pytest
from tokenizers import Tokenizer

from llm_onnx.runtime import Model
from llm_onnx.runtime.chat.dialects import (
    REASONING_DIALECTS,
    detect_reasoning_dialect,
    detect_tool_dialect,
    tool_dialect,
)
from llm_onnx.runtime.chat.dialects.base import ToolCallDelta
from llm_onnx.runtime.chat.dialects.gemma4 import THOUGHT, read_call
from llm_onnx.runtime.chat.dialects.think import split_reasoning, thinking_mode
from llm_onnx.runtime.chat.render import render_chat
from llm_onnx.runtime.chat.request import collect_calls
from tests.gemma4_chat_model import EOS, GEMMA4_TEMPLATE, SPECIAL_TOKENS, save_gemma4_tokenizer
from tests.runtime.fakes import FakeEngine
from tests.runtime.test_tool_calls import check_whole_and_streamed

GEMMA4 = GEMMA4_TEMPLATE.read_text(encoding="utf-8")
Q = '<|"|>'
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city (°C).",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12, "description": "The city."},
        "days": {"type": "integer"}, "unit": {"type": "string", "enum": ["c", "f"]}},
        "required": ["city", "unit"]}}}
USER = {"role": "user", "content": "What is the weather in Oslo?"}
CALL = {"id": "c1", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}}
ROUND_TRIP = [USER, {"role": "assistant", "reasoning_content": "Oslo: get_weather.",
                     "tool_calls": [CALL]},
              {"role": "tool", "tool_call_id": "c1", "content": "12 C"}]
CONVERSATIONS = {
    "user": [USER],
    "system": [{"role": "system", "content": "Be brief."}, USER],
    "tool round trip": ROUND_TRIP,
    "answered, next question": ROUND_TRIP + [
        {"role": "assistant", "content": "It is 12 °C."},
        {"role": "user", "content": "And in Zürich? 日本は？"}],
    "earlier thought stripped": [USER, {"role": "assistant",
                                        "content": "<|channel>thought\nHm.<channel|>Sunny."},
                                 {"role": "user", "content": "Thanks."}],
}


@pytest.fixture(scope="module")
def hf_tokenizer():
    """transformers' tokenizer carrying Gemma 4's template (the vocabulary does not matter)."""
    from tokenizers import models
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"x": 0}, unk_token="x")),
        chat_template=GEMMA4, **SPECIAL_TOKENS)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gemma4-tokenizer")
    save_gemma4_tokenizer(folder)
    return Tokenizer.from_file(str(folder / "tokenizer.json"))


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("generation_prompt", [True, False])
@pytest.mark.parametrize("variables", [{}, {"enable_thinking": False}, {"enable_thinking": True}],
                         ids=["default", "no-think", "think"])
@pytest.mark.parametrize("tools", [None, [WEATHER]], ids=["no-tools", "tools"])
def test_gemma4_renders_as_transformers(hf_tokenizer, name, generation_prompt, variables, tools):
    messages = CONVERSATIONS[name]
    ours = render_chat(GEMMA4, messages, SPECIAL_TOKENS, generation_prompt, tools=tools,
                       **variables)
    theirs = hf_tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                              add_generation_prompt=generation_prompt,
                                              **variables)
    assert ours == theirs


def test_the_prompt_says_how_a_reply_starts_and_calls_render_in_gemmas_syntax():
    off = render_chat(GEMMA4, [USER], SPECIAL_TOKENS)
    assert off.endswith("<|turn>model\n<|channel>thought\n<channel|>")  # thinking off: closed
    assert thinking_mode(off, THOUGHT) == "none"
    on = render_chat(GEMMA4, [USER], SPECIAL_TOKENS, tools=[WEATHER], enable_thinking=True)
    assert on.startswith("<bos><|turn>system\n<|think|>\n<|tool>declaration:get_weather{")
    assert on.endswith("<|turn>model\n") and thinking_mode(on, THOUGHT) == "optional"
    # OpenAI's arguments as JSON text reach the template as an object (as with vLLM)
    as_text = [USER, {"role": "assistant", "content": None, "reasoning_content": "Oslo: get_weather.",
                      "tool_calls": [{**CALL, "function": {
                          "name": "get_weather", "arguments": json.dumps(
                              CALL["function"]["arguments"])}}]}, ROUND_TRIP[2]]
    prompt = render_chat(GEMMA4, as_text, SPECIAL_TOKENS, tools=[WEATHER])
    assert prompt == render_chat(GEMMA4, ROUND_TRIP, SPECIAL_TOKENS, tools=[WEATHER])
    assert prompt.endswith(f"<|channel>thought\nOslo: get_weather.\n<channel|><|tool_call>call:"
                           f"get_weather{{city:{Q}Oslo{Q},unit:{Q}c{Q}}}<tool_call|>"
                           f"<|tool_response>response:get_weather{{value:{Q}12 C{Q}}}"
                           "<tool_response|>")  # no new turn: the model answers in the same one
    assert thinking_mode(prompt, THOUGHT) == "optional"


def test_the_format_and_the_think_tags_are_read_off_the_template_and_tokenizer(tokenizer):
    assert detect_tool_dialect(GEMMA4) == "gemma4"
    assert detect_reasoning_dialect(tokenizer) == "gemma4"
    assert REASONING_DIALECTS["gemma4"].tags == THOUGHT
    assert tool_dialect("gemma4").markers == ("<|tool_call>", "<tool_call|>", Q)


# ------------------------------------------------------------------ replies read back

EXAMPLES = [
    # Gemma 4's prompt-formatting guide: one call
    (f"<|tool_call>call:get_current_temperature{{location:{Q}London{Q}}}<tool_call|>",
     "", [("get_current_temperature", {"location": "London"})]),
    # text first, two calls, every kind of value, keys sorted as the template writes them
    (f"Checking.<|tool_call>call:f{{a:-1.5e2,b:true,c:null,d:[1,{Q}x, y{Q}],e:{{n:0}}}}"
     f"<tool_call|><|tool_call>call:g{{}}<tool_call|>",
     "Checking.", [("f", {"a": -150.0, "b": True, "c": None, "d": [1, "x, y"], "e": {"n": 0}}),
                   ("g", {})]),
    # a string holding Gemma's own punctuation and JSON's
    (f'<|tool_call>call:say{{text:{Q}a:{{b}}, "c"\n{Q}}}<tool_call|>', "",
     [("say", {"text": 'a:{b}, "c"\n'})]),
    ("No call here.", "No call here.", []),
]


@pytest.mark.parametrize("text, content, calls", EXAMPLES)
def test_calls_parse_whole_and_streamed(text, content, calls):
    check_whole_and_streamed(tool_dialect("gemma4"), text, content, calls)


def test_a_call_cut_short_or_broken_is_left_out():
    fmt = tool_dialect("gemma4")
    assert fmt.parse(f"<|tool_call>call:f{{a:{Q}Os")[1:] == ([], False)
    assert read_call(f"call:f{{a:{Q}Os", 0) == ("f", None, None)
    assert read_call("call:f{a 1}", 0) is None and read_call("{}", 0) is None


def test_the_thought_channel_is_the_reasoning():
    reply = "<|channel>thought\nThe user wants Oslo.\n<channel|>It is 12 °C."
    assert split_reasoning(reply, tags=THOUGHT) == ("The user wants Oslo.", "It is 12 °C.")
    assert split_reasoning("It is 12 °C.", tags=THOUGHT) == (None, "It is 12 °C.")


# ------------------------------------------------------------------ the grammar, on a fake model

@pytest.mark.parametrize("thinking", [True, False], ids=["think", "no-think"])
def test_a_required_call_validates_after_a_free_thought(tokenizer, thinking):
    """The model wants <|channel> thought h m <channel|> (where thinking is on), then to end
    its turn; elsewhere every logit ties (the lowest allowed id wins: a string's closing
    marker, 12, before any byte)."""
    thought = [tokenizer.token_to_id("<|channel>"),
               *tokenizer.encode("thought\nhm", add_special_tokens=False).ids,
               tokenizer.token_to_id("<channel|>")]
    engine = FakeEngine((thought if thinking else []) + [EOS[1]], context_length=4096)
    engine.vocab_size = 272
    model = Model.from_parts(engine, tokenizer, tuple(EOS), GEMMA4, SPECIAL_TOKENS)
    assert model.splits_reasoning and model.tool_format == "gemma4"
    kwargs = dict(tools=[WEATHER], tool_choice="required", max_new_tokens=200,
                  template_vars={"enable_thinking": thinking})
    r = model.chat([USER], **kwargs)
    assert r.finish_reason == "stop" and r.text == "" and len(r.tool_calls) == 1, r
    assert r.tool_calls[0].name == "get_weather"
    jsonschema.validate(json.loads(r.tool_calls[0].arguments), WEATHER["function"]["parameters"])
    assert r.reasoning == ("hm" if thinking else None)
    items = list(model.stream_chat([USER], **kwargs))
    assert "".join(i for i in items if getattr(i, "reasoning", False)) == (r.reasoning or "")
    streamed = collect_calls([i for i in items if isinstance(i, ToolCallDelta)])
    assert [(c.name, c.arguments) for c in streamed] == \
        [(c.name, c.arguments) for c in r.tool_calls]


def test_a_parameter_of_several_types_takes_any_value(tokenizer):
    """A parameter typed ["string", "null"] (how optional parameters are often written) is any
    value in the call's grammar; building the grammar was a TypeError (a list as a dict key)."""
    tool = copy.deepcopy(WEATHER)
    tool["function"]["parameters"]["properties"]["note"] = {"type": ["string", "null"]}
    tool["function"]["parameters"]["required"].append("note")
    engine = FakeEngine([EOS[1]], context_length=4096)
    engine.vocab_size = 272
    model = Model.from_parts(engine, tokenizer, tuple(EOS), GEMMA4, SPECIAL_TOKENS)
    r = model.chat([USER], tools=[tool], tool_choice="required", max_new_tokens=200,
                   template_vars={"enable_thinking": False})
    assert [c.name for c in r.tool_calls] == ["get_weather"], r
    jsonschema.validate(json.loads(r.tool_calls[0].arguments), tool["function"]["parameters"])
