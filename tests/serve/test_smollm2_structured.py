"""The README's structured-output walk-through on the real SmolLM2-135M-Instruct behind
`llm-onnx serve --chat-template chatml-tools`, through the official client: a validated
pydantic object from ``parse()``, JSON schemas at temperature 1 (every choice validates:
jsonschema), a parsed tool call and a second turn after the tool's result."""

from __future__ import annotations

import json

import jsonschema
import pytest
from pydantic import BaseModel

from tests.serve.conftest import ServerProcess

pytestmark = pytest.mark.slow

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 30}, "age": {"type": "integer", "minimum": 0},
    "job": {"type": "string", "maxLength": 40}},
    "required": ["name", "age", "job"], "additionalProperties": False}


class City(BaseModel):
    name: str
    country: str
    population: int


@pytest.fixture(scope="module")
def served(smollm2_export):
    from openai import OpenAI

    folder = smollm2_export("fp32")
    server = ServerProcess(folder, "--max-batch", "4", "--threads", "2", "--chat-template",
                           "chatml-tools")
    yield OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                 timeout=300), folder.name
    server.stop()


def test_parse_gives_a_pydantic_object(served):
    client, model = served
    completion = client.chat.completions.parse(
        model=model, response_format=City, max_tokens=200,
        messages=[{"role": "user", "content": "Describe Paris as JSON."}])
    city = completion.choices[0].message.parsed
    assert isinstance(city, City) and completion.choices[0].finish_reason == "stop"


def test_json_schema_at_temperature_one_every_choice_validates(served):
    client, model = served
    r = client.chat.completions.create(
        model=model, n=4, temperature=1.0, seed=3, max_tokens=300,
        messages=[{"role": "user", "content": "Invent a person: name, age and job, as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "person",
                                                                "schema": PERSON}})
    for choice in r.choices:
        assert choice.finish_reason == "stop", choice
        jsonschema.validate(json.loads(choice.message.content), PERSON)


def test_a_tool_call_and_a_second_turn(served):
    client, model = served
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    reply = client.chat.completions.create(model=model, messages=messages, tools=[WEATHER],
                                           tool_choice="required", max_tokens=100)
    assert reply.choices[0].finish_reason == "tool_calls"
    call = reply.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, WEATHER["function"]["parameters"])
    messages += [reply.choices[0].message, {"role": "tool", "tool_call_id": call.id,
                                            "content": "22 degrees, sunny"}]
    second = client.chat.completions.create(model=model, messages=messages, tools=[WEATHER],
                                            max_tokens=60, temperature=0)
    assert second.choices[0].message.content or second.choices[0].message.tool_calls
    assert second.usage.prompt_tokens > reply.usage.prompt_tokens
