"""Structured output and tool calls through a real `llm-onnx serve`, with the official `openai`
client: a tiny random model with a byte-level tokenizer (tests/byte_model.py) and a Hermes tools
template given by --chat-template. Whatever the weights, every output validates (jsonschema, the
independent check); bad constraints are 400s naming the field and path; the server keeps
serving."""

from __future__ import annotations

import concurrent.futures
import json
import re
import time

import httpx
import jsonschema
import pytest
from pydantic import BaseModel, Field

from tests.byte_model import HERMES_TEMPLATE
from tests.serve.browser import ChatPage
from tests.serve.conftest import ServerProcess

NAME = "tiny-bytes"
USER = [{"role": "user", "content": "Describe a person."}]
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "tags", "ok"],
    "additionalProperties": False,
}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "parameters": {"type": "object", "properties": {
        "a": {"type": "integer", "minimum": -999, "maximum": 999},
        "b": {"type": "integer", "minimum": -999, "maximum": 999}},
        "required": ["a", "b"], "additionalProperties": False}}}
TOOLS = [WEATHER, ADD]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
TOOL_CALL_TOKEN = 3
BACKTICK, CLOSE_BRACE = 7 + ord("`"), 7 + ord("}")  # byte tokens follow the 7 added ones


class Person(BaseModel):
    name: str = Field(max_length=8)
    age: int = Field(ge=0, le=150)
    ok: bool


@pytest.fixture(scope="module")
def server(byte_model_folder):
    proc = ServerProcess(byte_model_folder, "--max-batch", "4", "--chat-template",
                         str(HERMES_TEMPLATE))
    yield proc
    proc.stop()


@pytest.fixture
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def post(server, body, path="/v1/chat/completions"):
    return httpx.post(server.url + path, json={"model": NAME, **body}, timeout=60)


def check_calls(calls):
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


# ------------------------------------------------------------------ response formats

def test_parse_gives_a_validated_pydantic_object(client):
    completion = client.chat.completions.parse(model=NAME, messages=USER, response_format=Person,
                                               max_tokens=200, temperature=0)
    message = completion.choices[0].message
    assert completion.choices[0].finish_reason == "stop"
    assert isinstance(message.parsed, Person) and message.refusal is None
    assert Person.model_validate_json(message.content) == message.parsed


def test_json_schema_at_temperature_one_every_choice_validates(client):
    r = client.chat.completions.create(
        model=NAME, messages=USER, n=4, temperature=1.0, seed=7, max_tokens=300,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    assert len(r.choices) == 4
    for choice in r.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), PERSON)


def test_json_object(client):
    """Any object: nothing bounds a random model's keys, so '}' is pushed (logit_bias); the
    reply is one JSON object, without any ```json fence the model wrote around it."""
    r = client.chat.completions.create(model=NAME, messages=USER, temperature=1.0, seed=3,
                                       max_tokens=300, response_format={"type": "json_object"},
                                       logit_bias={str(CLOSE_BRACE): 8})
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_a_fenced_json_answer_comes_back_without_its_fence(client):
    """A model may write ```json ... ``` around its JSON (llama-server allows it too): pushed
    to open a fence, the content is the document alone, streamed and not."""
    kwargs = dict(model=NAME, messages=USER, temperature=0, max_tokens=300,
                  logit_bias={str(BACKTICK): 30, str(CLOSE_BRACE): 5},
                  response_format={"type": "json_schema",
                                   "json_schema": {"name": "p", "schema": PERSON}})
    whole = client.chat.completions.create(**kwargs).choices[0]
    assert whole.finish_reason == "stop" and not whole.message.content.startswith("`")
    jsonschema.validate(json.loads(whole.message.content), PERSON)
    streamed = "".join(c.choices[0].delta.content or "" for c in
                       client.chat.completions.create(stream=True, **kwargs) if c.choices)
    assert streamed == whole.message.content


def test_vllm_structured_outputs_regex_choice_grammar(client):
    cases = [({"regex": r"\d{3}-[a-z]{2}"}, lambda t: re.fullmatch(r"[0-9]{3}-[a-z]{2}", t)),
             ({"choice": ["positive", "negative"]}, lambda t: t in ("positive", "negative")),
             ({"grammar": 'start: "(" ("x" | "y")+ ")"'}, lambda t: re.fullmatch(r"\([xy]+\)", t))]
    for spec, valid in cases:
        r = client.chat.completions.create(model=NAME, messages=USER, temperature=1.0, seed=1,
                                           max_tokens=100, extra_body={"structured_outputs": spec})
        assert r.choices[0].finish_reason == "stop" and valid(r.choices[0].message.content), spec
    # the completions endpoint and vLLM's older guided_* fields too
    r = client.completions.create(model=NAME, prompt="Answer:", max_tokens=20,
                                  extra_body={"guided_choice": ["yes", "no"]})
    assert r.choices[0].text in ("yes", "no")


def test_running_out_of_tokens_is_length_never_stop(client):
    r = client.chat.completions.create(model=NAME, messages=USER, max_tokens=4,
                                       response_format={"type": "json_schema", "json_schema": {
                                           "name": "p", "schema": PERSON}})
    assert r.choices[0].finish_reason == "length"
    assert r.choices[0].message.content.startswith("{")


# ------------------------------------------------------------------ tools

def test_tool_choice_required_and_named(client):
    r = client.chat.completions.create(model=NAME, messages=USER, tools=TOOLS,
                                       tool_choice="required", temperature=1.0, seed=4,
                                       max_tokens=400)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    check_calls(choice.message.tool_calls)
    r = client.chat.completions.create(
        model=NAME, messages=USER, tools=TOOLS, temperature=1.0, seed=5, max_tokens=400,
        tool_choice={"type": "function", "function": {"name": "add"}})
    calls = r.choices[0].message.tool_calls
    assert len(calls) == 1 and calls[0].function.name == "add"
    check_calls(calls)


def test_a_forced_call_with_a_response_format_is_a_call(client):
    """tool_choice "required" beside a response format (OpenAI's Agents SDK sends both for an
    agent with a typed output that must call a tool): the reply is the call; no text is left
    for the format to hold, and none is written."""
    r = client.chat.completions.create(model=NAME, messages=USER, tools=TOOLS,
                                       tool_choice="required", temperature=1.0, seed=4,
                                       max_tokens=400, response_format={"type": "json_object"})
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    check_calls(choice.message.tool_calls)


def test_tool_choice_auto_streamed_equals_whole(client):
    """auto: the model opens a call (pushed by logit_bias); from there the grammar holds. The
    stream's deltas put together equal the non-streamed reply."""
    kwargs = dict(model=NAME, messages=USER, tools=TOOLS, tool_choice="auto", max_tokens=400,
                  temperature=0, logit_bias={str(TOOL_CALL_TOKEN): 50},
                  parallel_tool_calls=False)
    whole = client.chat.completions.create(**kwargs)
    assert whole.choices[0].finish_reason == "tool_calls"
    calls = whole.choices[0].message.tool_calls
    assert len(calls) == 1
    check_calls(calls)
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    pieces: dict[int, dict] = {}
    content = ""
    for chunk in chunks:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for d in delta.tool_calls or []:
            entry = pieces.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
            entry["id"] = d.id or entry["id"]
            if d.function is not None:
                entry["name"] = d.function.name or entry["name"]
                entry["arguments"] += d.function.arguments or ""
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert content == (whole.choices[0].message.content or "")
    assert [(p["name"], p["arguments"]) for p in pieces.values()] == \
        [(c.function.name, c.function.arguments) for c in calls]
    assert all(p["id"] for p in pieces.values())


def test_a_second_turn_after_a_tool_result(client):
    first = client.chat.completions.create(model=NAME, messages=USER, tools=TOOLS,
                                           tool_choice="required", max_tokens=400,
                                           parallel_tool_calls=False)
    message = first.choices[0].message
    call = message.tool_calls[0]
    messages = USER + [message.model_dump(exclude_none=True),
                       {"role": "tool", "tool_call_id": call.id, "content": "22 degrees"}]
    second = client.chat.completions.create(model=NAME, messages=messages, tools=TOOLS,
                                            max_tokens=8, temperature=0,
                                            logit_bias={str(TOOL_CALL_TOKEN): -100})
    assert second.choices[0].finish_reason in ("stop", "length")
    assert second.usage.prompt_tokens > first.usage.prompt_tokens


def test_the_chat_page_shows_tool_calls_and_json_answers(server, browser):
    """Tool calls as cards (name, arguments as JSON) whose results go back as `tool` messages
    with the next turn; a JSON answer shown as JSON."""
    chat = ChatPage(browser, server).open()
    bodies: list[dict] = []
    chat.page.on("request", lambda r: r.url.endswith("/chat/completions") and
                 bodies.append(r.post_data_json))
    chat.settings(temperature=0, max_tokens=400, tools=json.dumps([WEATHER]),
                  tool_choice="required", parallel=False)
    answer = chat.ask("What is the weather in Paris?")
    assert bodies[0]["tools"] == [WEATHER] and bodies[0]["tool_choice"] == "required"
    assert bodies[0]["parallel_tool_calls"] is False
    cards = answer.locator(".tool-call").all()
    assert len(cards) == 1
    for card in cards:
        assert card.locator(".tool-name").text_content() == "get_weather"
        jsonschema.validate(json.loads(card.locator("pre").text_content()),
                            SCHEMAS["get_weather"])
    assert answer.locator(".numbers").inner_text().endswith("ms")  # no "cut at max tokens"
    cards[0].locator("input.tool-result").fill("22 degrees")
    chat.settings(tool_choice="none", max_tokens=4)
    chat.ask("Thanks.")
    sent = bodies[1]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "user"]
    assert sent[1]["content"] is None and len(sent[1]["tool_calls"]) == 1
    assert sent[2] == {"role": "tool", "tool_call_id": sent[1]["tool_calls"][0]["id"],
                       "content": "22 degrees"}

    chat.page.click("#new-chat")
    chat.settings(tools="", format="json_schema", schema=json.dumps(
        {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
         "additionalProperties": False}), max_tokens=50)
    answer = chat.ask("Is it warm?")
    assert answer.locator(".json-answer .label").text_content() == "JSON answer"
    assert isinstance(json.loads(answer.locator(".json-answer pre").text_content())["ok"], bool)
    assert chat.errors == [] and chat.off_server() == []
    chat.close()


# ------------------------------------------------------------------ batches and metrics

def test_concurrent_constraints_each_valid_and_equal_to_alone(server):
    bodies = [
        {"response_format": {"type": "json_schema", "json_schema": {"name": "p",
                                                                     "schema": PERSON}}},
        {"structured_outputs": {"regex": "[0-9]{5}"}},
        {"structured_outputs": {"choice": ["alpha", "beta"]}},
        {"tools": TOOLS, "tool_choice": "required"},
        {},
        {"response_format": {"type": "json_object"}},
    ]
    bodies = [{"messages": USER, "max_tokens": 300, "temperature": 0, **b} for b in bodies]
    alone = [post(server, b).json() for b in bodies]
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        together = [f.result().json() for f in [pool.submit(post, server, b) for b in bodies]]
    assert [a["choices"][0]["message"] for a in alone] == \
        [_same_ids(t, a) for t, a in zip(together, alone)]
    jsonschema.validate(json.loads(together[0]["choices"][0]["message"]["content"]), PERSON)
    assert re.fullmatch("[0-9]{5}", together[1]["choices"][0]["message"]["content"])
    metrics = httpx.get(server.url + "/metrics").text
    assert 'llm_onnx_constrained_requests_total{kind="json_schema"}' in metrics
    assert 'llm_onnx_constrained_requests_total{kind="tools"}' in metrics
    mask = re.search(r"^llm_onnx_constraint_mask_seconds_total (\S+)", metrics, re.M)
    assert mask and float(mask.group(1)) > 0
    assert re.search(r"^llm_onnx_tool_calls_total [1-9]", metrics, re.M)


def _same_ids(together: dict, alone: dict) -> dict:
    """The message of ``together`` with tool call ids taken from ``alone`` (ids are random)."""
    message = dict(together["choices"][0]["message"])
    if message.get("tool_calls"):
        message["tool_calls"] = [{**c, "id": a["id"]} for c, a in
                                 zip(message["tool_calls"], alone["choices"][0]["message"]
                                     ["tool_calls"])]
    return message


# ------------------------------------------------------------------ bad input

@pytest.mark.parametrize("body, param, fragment", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {
        "type": "object", "properties": {"age": {"type": "int"}}}}}},
     "response_format.json_schema.schema.properties.age.type", "'type' must be one of"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {
        "type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True,
                                                  "minItems": 2}},
        "required": ["tags"]}}}},
     "response_format.json_schema.schema.properties.tags.uniqueItems", "cannot be enforced"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "p"}}},
     "response_format.json_schema.schema", "is missing"),
    ({"response_format": {"type": "yaml"}}, "response_format.type", "must be"),
    ({"structured_outputs": {"regex": "(a"}}, "structured_outputs.regex", "unclosed group"),
    ({"structured_outputs": {"grammar": "start: nothing_here"}}, "structured_outputs.grammar",
     "unknown name"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs.choice", "non-empty"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs",
     "exactly one"),
    ({"structured_outputs": {"json_schema": {}}}, "structured_outputs.json_schema",
     "not supported"),
    ({"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}},
     "structured_outputs", "give one of them"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"not": {"type": "string"}}},
        "required": ["x"]}}}],
      "tool_choice": "required"}, "tools[0].function.parameters.properties.x.not",
     "cannot be enforced"),
    ({"tool_choice": "required"}, "tool_choice", "no tools are given"),
    ({"logit_bias": {"99999": 5}}, "logit_bias", "not a token id"),
])
def test_bad_constraints_are_400s_naming_the_field(server, body, param, fragment):
    response = post(server, {"messages": USER, "max_tokens": 4, **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and fragment in error["message"], error
    assert error["type"] == "invalid_request_error"


def test_a_huge_schema_is_refused_in_bounded_time_and_the_server_keeps_serving(server):
    huge = {"enum": [f"value-{i}-" + "x" * (i % 40) for i in range(120_000)]}
    began = time.perf_counter()
    response = post(server, {"messages": USER, "max_tokens": 4, "response_format": {
        "type": "json_schema", "json_schema": {"name": "h", "schema": huge}}})
    assert response.status_code == 400 and time.perf_counter() - began < 15
    assert "too big" in response.json()["error"]["message"]
    ok = post(server, {"messages": USER, "max_tokens": 30,
                       "structured_outputs": {"choice": ["fine", "well"]}})
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] in \
        ("fine", "well")
