"""gpt-oss's harmony replies through `llm-onnx serve` and the official `openai` client: the
reasoning (analysis channel) apart from the content (final channel), a function call (commentary
to=functions.NAME) as parsed tool_calls, streamed as deltas, its result continuing the
conversation, the same through the Responses API; reasoning_effort reaching the template; and,
on the unscripted random model, a forced call that validates against its schema.

The scripted server (tests/serve/scripted_server.py) has the tiny harmony model write the
messages a trained gpt-oss writes, as the format's description shows them."""

from __future__ import annotations

import json

import jsonschema
import pytest

from tests.runtime.test_harmony import A_BIAS
from tests.serve.conftest import ServerProcess, scripted_server

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                   "required": ["city"], "additionalProperties": False}}}
THOUGHT = "The user asks for Oslo's weather; get_weather gives it."
SCRIPT = [
    ["Weather in Oslo?<|end|><|start|>assistant",
     f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>assistant<|channel|>commentary "
     'to=functions.get_weather <|constrain|>json<|message|>{"city":"Oslo"}<|call|>'],
    ['"12 C"<|end|><|start|>assistant',
     "<|channel|>analysis<|message|>It is 12 C.<|end|><|start|>assistant<|channel|>final"
     "<|message|>It is 12 °C in Oslo.<|return|>"],
]
NAME = "tiny-harmony"


@pytest.fixture(scope="module")
def scripted(harmony_model_folder, tmp_path_factory):
    yield from scripted_server(harmony_model_folder, SCRIPT, tmp_path_factory)


@pytest.fixture
def client(scripted):
    from openai import OpenAI

    return OpenAI(base_url=scripted.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_a_call_comes_back_parsed_with_the_reasoning_apart_and_its_result_continues(client):
    messages = [{"role": "user", "content": "Weather in Oslo?"}]
    r = client.chat.completions.create(model=NAME, messages=messages, tools=[WEATHER],
                                       max_tokens=200, temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.reasoning_content == THOUGHT and not choice.message.content
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Oslo"}
    messages += [{"role": "assistant", "content": None, "reasoning_content": THOUGHT,
                  "tool_calls": [call.model_dump()]},
                 {"role": "tool", "tool_call_id": call.id, "content": "12 C"}]
    r = client.chat.completions.create(model=NAME, messages=messages, tools=[WEATHER],
                                       max_tokens=200, temperature=0)
    assert r.choices[0].message.content == "It is 12 °C in Oslo."
    assert r.choices[0].message.reasoning_content == "It is 12 C."
    assert r.choices[0].finish_reason == "stop" and not r.choices[0].message.tool_calls


def test_streamed_deltas_add_up_to_the_same(client):
    stream = client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "Weather in Oslo?"}], tools=[WEATHER],
        max_tokens=200, temperature=0, stream=True)
    reasoning, arguments, names, finish = "", "", [], None
    for chunk in stream:
        delta = chunk.choices[0].delta
        reasoning += getattr(delta, "reasoning_content", None) or ""
        for call in delta.tool_calls or []:
            names += [call.function.name] if call.function.name else []
            arguments += call.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert (reasoning, names, json.loads(arguments), finish) == \
        (THOUGHT, ["get_weather"], {"city": "Oslo"}, "tool_calls")


def test_the_responses_api_gives_a_reasoning_item_and_a_function_call(client):
    r = client.responses.create(model=NAME, input="Weather in Oslo?", max_output_tokens=200,
                                temperature=0, tools=[{"type": "function", **WEATHER["function"]}])
    kinds = [item.type for item in r.output]
    assert kinds == ["reasoning", "function_call"]
    assert r.output[0].content[0].text == THOUGHT
    assert (r.output[1].name, json.loads(r.output[1].arguments)) == ("get_weather", {"city": "Oslo"})
    follow = client.responses.create(
        model=NAME, previous_response_id=r.id, max_output_tokens=200, temperature=0,
        input=[{"type": "function_call_output", "call_id": r.output[1].call_id,
                "output": "12 C"}], tools=[{"type": "function", **WEATHER["function"]}])
    assert follow.output_text == "It is 12 °C in Oslo."


def test_the_model_says_it_reasons_and_reasoning_effort_reaches_the_template(scripted):
    import httpx

    model = httpx.get(scripted.url + "/v1/models").json()["data"][0]
    assert model["reasoning"] is True and model["tool_call_format"] == "harmony"
    used = {}
    for effort in ("low", "high", None, "minimal", "max"):
        r = httpx.post(scripted.url + "/v1/chat/completions", timeout=60, json={
            "model": NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1,
            **({"reasoning_effort": effort} if effort else {})})
        if effort == "max":
            assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning_effort"
        else:
            used[effort] = r.json()["usage"]["prompt_tokens"]
    # one token a byte: the system message says "Reasoning: low", "high" or "medium" (unset)
    assert (used["high"] - used["low"], used[None] - used["low"]) == (1, 3)
    assert used["minimal"] == used["low"]  # gpt-oss knows low, medium and high


def test_the_random_model_makes_a_valid_forced_call(harmony_model_folder):
    from openai import OpenAI

    proc = ServerProcess(harmony_model_folder)
    try:
        client = OpenAI(base_url=proc.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        r = client.chat.completions.create(
            model=NAME, messages=[{"role": "user", "content": "Weather?"}], tools=[WEATHER],
            tool_choice="required", max_tokens=120, temperature=0,
            logit_bias={str(k): v for k, v in A_BIAS.items()})
        [call] = r.choices[0].message.tool_calls
        jsonschema.validate(json.loads(call.function.arguments),
                            WEATHER["function"]["parameters"])
    finally:
        proc.stop()
