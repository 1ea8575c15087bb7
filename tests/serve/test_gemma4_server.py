"""Gemma 4's chat format through `llm-onnx serve` and the official `openai` client, on the tiny
gemma4 export with Gemma 4's real chat template (tests/gemma4_chat_model.py): with thinking on
(``chat_template_kwargs``), the thought channel comes back as ``reasoning_content`` and the
``call:NAME{...}`` call as parsed ``tool_calls``, whole and streamed, and its result continues
the conversation in the same turn; with thinking off (the template's default) the Responses API
gives the call as a function_call item.

The scripted server (tests/serve/scripted_server.py) has the random model write what a trained
Gemma 4 writes, as its chat template renders it; the template's rendering itself is checked
against transformers in tests/runtime/test_chat_gemma4.py."""

from __future__ import annotations

import json

import pytest

from tests.serve.conftest import scripted_server

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                   "required": ["city"]}}}
THOUGHT = "The user asks for Oslo's weather; get_weather gives it."
CALL = '<|tool_call>call:get_weather{city:<|"|>Oslo<|"|>}<tool_call|><|tool_response>'
SCRIPT = [
    # thinking on: the prompt ends with the model's turn, the reply opens its thought
    ["Weather in Oslo?<turn|>\n<|turn>model\n", f"<|channel>thought\n{THOUGHT}<channel|>{CALL}"],
    # thinking off: the prompt has closed an empty thought
    ["Weather in Oslo?<turn|>\n<|turn>model\n<|channel>thought\n<channel|>", CALL],
    # the call's result: the model answers in the same turn
    ['response:get_weather{value:<|"|>12 C<|"|>}<tool_response|>',
     "It is 12 °C in Oslo.<turn|>"],
]
NAME = "tiny-gemma4-chat"
THINK = {"chat_template_kwargs": {"enable_thinking": True}}


@pytest.fixture(scope="module")
def scripted(gemma4_chat_model_folder, tmp_path_factory):
    yield from scripted_server(gemma4_chat_model_folder, SCRIPT, tmp_path_factory)


@pytest.fixture
def client(scripted):
    from openai import OpenAI

    return OpenAI(base_url=scripted.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_the_model_says_it_reasons_and_speaks_gemma4(scripted):
    import httpx

    model = httpx.get(scripted.url + "/v1/models").json()["data"][0]
    assert (model["id"], model["reasoning"], model["tool_call_format"]) == \
        (NAME, True, "gemma4")


def test_a_call_comes_back_parsed_with_the_thought_apart_and_its_result_continues(client):
    messages = [{"role": "user", "content": "Weather in Oslo?"}]
    r = client.chat.completions.create(model=NAME, messages=messages, tools=[WEATHER],
                                       max_tokens=200, temperature=0, extra_body=THINK)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.reasoning_content == THOUGHT and not choice.message.content
    [call] = choice.message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == \
        ("get_weather", {"city": "Oslo"})
    messages += [{"role": "assistant", "content": None, "reasoning_content": THOUGHT,
                  "tool_calls": [call.model_dump()]},
                 {"role": "tool", "tool_call_id": call.id, "content": "12 C"}]
    r = client.chat.completions.create(model=NAME, messages=messages, tools=[WEATHER],
                                       max_tokens=200, temperature=0, extra_body=THINK)
    assert r.choices[0].message.content == "It is 12 °C in Oslo."
    assert r.choices[0].finish_reason == "stop" and not r.choices[0].message.tool_calls
    assert getattr(r.choices[0].message, "reasoning_content", None) is None


def test_streamed_deltas_add_up_to_the_same(client):
    # reasoning_effort switches Gemma 4's thinking on as chat_template_kwargs does
    stream = client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "Weather in Oslo?"}], tools=[WEATHER],
        max_tokens=200, temperature=0, stream=True, reasoning_effort="low")
    reasoning, content, arguments, names, finish = "", "", "", [], None
    for chunk in stream:
        delta = chunk.choices[0].delta
        reasoning += getattr(delta, "reasoning_content", None) or ""
        content += delta.content or ""
        for call in delta.tool_calls or []:
            names += [call.function.name] if call.function.name else []
            arguments += call.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert (reasoning, content, names, json.loads(arguments), finish) == \
        (THOUGHT, "", ["get_weather"], {"city": "Oslo"}, "tool_calls")


def test_thinking_off_the_responses_api_gives_a_function_call(client):
    tools = [{"type": "function", **WEATHER["function"]}]
    r = client.responses.create(model=NAME, input="Weather in Oslo?", max_output_tokens=200,
                                temperature=0, tools=tools)
    assert [item.type for item in r.output] == ["function_call"]
    assert (r.output[0].name, json.loads(r.output[0].arguments)) == ("get_weather",
                                                                      {"city": "Oslo"})
    follow = client.responses.create(
        model=NAME, previous_response_id=r.id, max_output_tokens=200, temperature=0,
        input=[{"type": "function_call_output", "call_id": r.output[0].call_id,
                "output": "12 C"}], tools=tools)
    assert follow.output_text == "It is 12 °C in Oslo."
