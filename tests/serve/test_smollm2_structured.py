"""The structured-output walk-through of docs/structured-output.md on the real
SmolLM2-135M-Instruct behind `llm-onnx serve --chat-template chatml-tools`, through the official
client: a validated pydantic object from ``parse()``, JSON schemas at temperature 1 (every
choice validates: jsonschema), a parsed tool call and a second turn after the tool's result. The
same on the chat page, whose screenshots in docs/ come from here."""

from __future__ import annotations

import json

import jsonschema
import pytest
from pydantic import BaseModel

from tests.serve.browser import ChatPage
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
def server(smollm2_export):
    proc = ServerProcess(smollm2_export("fp32"), "--max-batch", "4", "--threads", "2",
                         "--chat-template", "chatml-tools")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def served(server, smollm2_export):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                  timeout=300), smollm2_export("fp32").name


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


def test_the_chat_page_answers_as_the_runtime_and_calls_tools(server, smollm2_export,
                                                              browser, tmp_path):
    """Two turns on the chat page equal the runtime's greedy chat; then a tool call, shown as
    such, equals the runtime's, and its result goes back with the next message. With
    LLM_ONNX_SCREENSHOTS=docs these are docs/chat-page.png and docs/chat-page-tools.png."""
    from llm_onnx.runtime import Model

    model = Model.load(smollm2_export("fp32"), threads=2, chat_template="chatml-tools")
    chat = ChatPage(browser, server).open()
    chat.settings(temperature=0, max_tokens=60)
    messages: list[dict] = []
    for question in ("What is the capital of France?", "Write a haiku about the sea."):
        messages.append({"role": "user", "content": question})
        expected = model.chat(messages, max_new_tokens=60, temperature=0).text
        answer = chat.ask(question)
        assert chat.raw(answer) == expected and answer.get_attribute("data-state") == "done"
        messages.append({"role": "assistant", "content": expected})
    assert "Paris" in messages[1]["content"]
    chat.screenshot("chat-page.png", tmp_path)

    chat.page.click("#new-chat")
    chat.settings(max_tokens=100, tools=json.dumps([WEATHER]), tool_choice="required",
                  parallel=False)
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    expected = model.chat(question, tools=[WEATHER], tool_choice="required",
                          parallel_tool_calls=False, max_new_tokens=100, temperature=0)
    answer = chat.ask(question[0]["content"])
    card = answer.locator(".tool-call")
    assert card.count() == 1 and card.locator(".tool-name").text_content() == "get_weather"
    assert json.loads(card.locator("pre").text_content()) == \
        json.loads(expected.tool_calls[0].arguments)
    card.locator("input.tool-result").fill("22 degrees, sunny")
    chat.settings(tool_choice="auto")
    answer = chat.ask("Do I need a coat?")
    assert answer.get_attribute("data-state") == "done"
    assert chat.errors == [] and chat.off_server() == []
    chat.screenshot("chat-page-tools.png", tmp_path)
    chat.close()
