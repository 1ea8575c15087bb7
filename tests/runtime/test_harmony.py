"""Harmony (gpt-oss's chat format): replies read into reasoning, content and tool calls, whole or
streamed in any pieces; gpt-oss's own chat template rendering tools, tool results and the
reasoning effort; a tiny model with harmony's tokens through Model.chat, stream_chat, a chat
session and the constraint of each tool choice.

The replies read here are written as the format's description (github.com/openai/harmony,
docs/format.md) shows gpt-oss writing them, both orders of a call's header included."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from llm_onnx.runtime import Model
from llm_onnx.runtime.chat.dialects import detect_tool_dialect
from llm_onnx.runtime.chat.dialects.base import ToolCallDelta
from llm_onnx.runtime.chat.dialects.harmony import HarmonyReader
from llm_onnx.runtime.chat.render import render_chat
from llm_onnx.runtime.chat.request import collect_calls
from tests.harmony_model import GPT_OSS_TEMPLATE

TEMPLATE = GPT_OSS_TEMPLATE.read_text(encoding="utf-8")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                   "required": ["city"], "additionalProperties": False}}}
ANALYSIS = "<|channel|>analysis<|message|>The user wants the weather. Call get_weather.<|end|>"
CALL = ("<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
        '<|message|>{"city": "Oslo"}<|call|>')
CALL_RECIPIENT_FIRST = ('<|start|>assistant to=functions.get_weather<|channel|>commentary json'
                        '<|message|>{"city": "Oslo"}<|call|>')
FINAL = "<|start|>assistant<|channel|>final<|message|>It is 12 °C in Oslo.<|return|>"
A_BIAS = {ord("a") + 8: -100.0}  # the byte "a": steers a random model off the analysis channel


def read(text: str, prompt: str = "<|start|>assistant"):
    reader = HarmonyReader(prompt)
    out = reader.push(text) + reader.flush()
    return reader, out


def pieces_in(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 30))))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


@pytest.mark.parametrize("call", [CALL, CALL_RECIPIENT_FIRST])
def test_analysis_then_a_call(call):
    reader, _ = read(ANALYSIS + call)
    assert reader.reasoning == "The user wants the weather. Call get_weather."
    assert reader.answer == ""
    [made] = reader.calls
    assert (made.name, json.loads(made.arguments)) == ("get_weather", {"city": "Oslo"})


def test_analysis_then_final_and_a_preamble_is_content():
    reader, _ = read(ANALYSIS + FINAL)
    assert reader.reasoning.startswith("The user wants") and reader.answer == "It is 12 °C in Oslo."
    assert reader.calls == []
    preamble = "<|channel|>commentary<|message|>Checking the weather now.<|end|>"
    reader, _ = read(preamble + CALL)
    assert reader.answer == "Checking the weather now." and reader.reasoning is None
    assert [c.name for c in reader.calls] == ["get_weather"]


def test_streamed_in_any_pieces_equals_whole():
    rng = random.Random(0)
    text = ANALYSIS + "<|start|>assistant<|channel|>commentary<|message|>One moment.<|end|>" + CALL
    whole, whole_out = read(text)
    for _ in range(50):
        reader = HarmonyReader("<|start|>assistant")
        out = []
        for piece in pieces_in(text, rng):
            out += reader.push(piece)
        out += reader.flush()
        reasoning = "".join(p for p in out if not isinstance(p, ToolCallDelta) and p.reasoning)
        content = "".join(p for p in out if not isinstance(p, ToolCallDelta) and not p.reasoning)
        assert (reasoning, content) == (whole.reasoning, whole.answer)
        calls = collect_calls([p for p in out if isinstance(p, ToolCallDelta)])
        assert [(c.name, c.arguments) for c in calls] == \
            [(c.name, c.arguments) for c in whole.calls]


def test_a_call_is_whole_when_its_arguments_are_and_cut_short_is_left_out():
    """<|call|> ends generation (an end-of-sequence token), so a made call reaches the text
    without it; a call whose arguments stop mid-way (the token limit) is not a call."""
    reader, _ = read(ANALYSIS + CALL.removesuffix("<|call|>"))
    assert [c.arguments for c in reader.calls] == ['{"city": "Oslo"}']
    reader, _ = read(ANALYSIS + CALL[:CALL.index("Oslo")])
    assert reader.calls == [] and not reader.complete


def test_a_reply_that_is_not_harmony_is_all_content_and_markers_cut_in_two_are_held():
    reader, out = read("plain text, no channels <| not a marker")
    assert reader.answer == "plain text, no channels <| not a marker" and reader.reasoning is None
    reader = HarmonyReader("<|start|>assistant")
    out = reader.push("<|chan") + reader.push("nel|>final<|mess") + reader.push("age|>Hi")
    assert "".join(out) == "Hi"


def test_a_prompt_that_opens_the_final_channel_makes_the_reply_content():
    reader, _ = read("Straight to it.", prompt="<|start|>assistant<|channel|>final<|message|>")
    assert reader.answer == "Straight to it." and reader.reasoning is None


def test_the_template_renders_tools_results_and_effort():
    assert detect_tool_dialect(TEMPLATE) == "harmony"
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Weather in Oslo?"},
                {"role": "assistant", "content": None, "reasoning_content": "Need the tool.",
                 "tool_calls": [{"id": "call_1", "type": "function", "function": {
                     "name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "12 C"}]
    text = render_chat(TEMPLATE, messages, {}, True, tools=[WEATHER], reasoning_effort="high")
    assert "Reasoning: high" in text
    assert "<|start|>developer<|message|># Instructions\n\nBe brief." in text
    assert "type get_weather = (_: {\ncity: string,\n}) => any;" in text
    # the earlier call and its analysis (no final answer after it yet), then its result
    assert ("<|start|>assistant<|channel|>analysis<|message|>Need the tool.<|end|>"
            "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
            '{"city": "Oslo"}<|call|>') in text
    assert text.endswith('<|start|>functions.get_weather to=assistant<|channel|>commentary'
                         '<|message|>"12 C"<|end|><|start|>assistant')
    # what the reader makes of that call is what the template rendered
    reader, _ = read(text[text.index("<|channel|>analysis"):text.index("<|call|>") + 8])
    assert json.loads(reader.calls[0].arguments) == {"city": "Oslo"}


@pytest.fixture(scope="module")
def harmony(harmony_model_folder):
    return Model.load(harmony_model_folder, provider="cpu", threads=1, speculative="off")


MESSAGES = [{"role": "user", "content": "Weather in Oslo?"}]


@pytest.mark.parametrize("choice", ["required", {"type": "function",
                                                 "function": {"name": "get_weather"}}])
def test_a_forced_call_is_a_valid_call_whole_and_streamed(harmony, choice):
    r = harmony.chat(MESSAGES, tools=[WEATHER], tool_choice=choice, max_new_tokens=120,
                     logit_bias=A_BIAS)
    assert r.finish_reason == "stop" and r.text == ""
    [call] = r.tool_calls
    assert call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER["function"]["parameters"])
    streamed = list(harmony.stream_chat(MESSAGES, tools=[WEATHER], tool_choice=choice,
                                        max_new_tokens=120, logit_bias=A_BIAS))
    [again] = collect_calls([p for p in streamed if isinstance(p, ToolCallDelta)])
    assert (again.name, again.arguments) == (call.name, call.arguments)
    # the raw reply is harmony: the call's header as gpt-oss writes it
    request, opts = harmony._chat_request(MESSAGES, None, {"max_new_tokens": 120,
                                                           "logit_bias": A_BIAS},
                                          [WEATHER], choice, True, None)
    raw = harmony.generate(harmony.encode_chat(request.prompt), opts).text
    assert raw.startswith("<|channel|>commentary to=functions.get_weather <|constrain|>json"
                          "<|message|>")


def test_an_answer_format_holds_in_the_final_channel(harmony):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    r = harmony.chat(MESSAGES, max_new_tokens=60, logit_bias=A_BIAS, json_schema=schema)
    assert r.finish_reason == "stop"
    jsonschema.validate(json.loads(r.text), schema)


def test_reasoning_effort_and_a_chat_session(harmony):
    prompt = harmony.render_chat(MESSAGES, template_vars={"reasoning_effort": "low"})
    assert "Reasoning: low" in prompt
    session = harmony.chat_session("Be brief.")
    first = session.send("Hi", max_new_tokens=6)
    second = session.send("Again", max_new_tokens=6)
    assert [m["role"] for m in session.messages] == ["system", "user", "assistant", "user",
                                                     "assistant"]
    assert session.messages[2]["content"] == first.text and second.finish_reason == "length"
