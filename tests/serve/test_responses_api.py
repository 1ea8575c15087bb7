"""OpenAI's Responses API against a real `llm-onnx serve`, through the official `openai` client:
plain and streamed replies equal the in-process Model's chat, the streamed events follow OpenAI's
sequence and add up to the final response, `responses.parse` gives a validated pydantic object,
function tools come back as function_call items whose arguments validate, a function's output
continues the conversation by `previous_response_id`, stored responses can be read and deleted,
a reasoning model's thinking comes back as a reasoning item; bad input is a 400 (404 for an
unknown response) in OpenAI's error shape naming the field."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
from pydantic import BaseModel, Field

from llm_onnx.runtime import Model
from tests.byte_model import HERMES_TEMPLATE
from tests.serve.conftest import ServerProcess

NAME = "tiny-bytes"
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string",
                                                                    "maxLength": 12}},
                          "required": ["city"], "additionalProperties": False}, "strict": True}


class Person(BaseModel):
    name: str = Field(max_length=8)
    age: int = Field(ge=0, le=150)


@pytest.fixture(scope="module")
def server(byte_model_folder):
    proc = ServerProcess(byte_model_folder, "--max-batch", "2", "--chat-template",
                         str(HERMES_TEMPLATE), "--stored-responses", "3")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def model(byte_model_folder):
    return Model.load(byte_model_folder, provider="cpu", threads=1,
                      chat_template=str(HERMES_TEMPLATE), speculative="off")


@pytest.fixture
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_a_reply_equals_the_in_process_chat(client, model):
    r = client.responses.create(model=NAME, instructions="Be brief.", input="Name a color.",
                                max_output_tokens=20, temperature=0)
    want = model.chat([{"role": "system", "content": "Be brief."},
                       {"role": "user", "content": "Name a color."}], max_new_tokens=20,
                      temperature=0)
    assert r.output_text == want.text
    assert r.status == ("incomplete" if want.finish_reason == "length" else "completed")
    assert r.usage.output_tokens == len(want.token_ids) and r.usage.input_tokens > 0
    assert [item.type for item in r.output] == ["message"]


def test_the_response_echoes_the_sampling_that_ran(client, model):
    """Left out, temperature and top_p are the model's defaults (greedy here), not OpenAI's
    1.0: the echo says what ran, and the text is the greedy one."""
    r = client.responses.create(model=NAME, input="Name a color.", max_output_tokens=8)
    want = model.chat([{"role": "user", "content": "Name a color."}], max_new_tokens=8,
                      temperature=0)
    assert (r.temperature, r.top_p, r.output_text) == (0.0, 1.0, want.text)
    given = client.responses.create(model=NAME, input="Name a color.", max_output_tokens=8,
                                    temperature=0.5, top_p=0.9, extra_body={"seed": 3})
    assert (given.temperature, given.top_p) == (0.5, 0.9)


def test_streamed_events_follow_the_sequence_and_add_up(client):
    kwargs = dict(model=NAME, input="Tell me a story.", max_output_tokens=24, temperature=0)
    plain = client.responses.create(**kwargs)
    events = list(client.responses.create(stream=True, **kwargs))
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == plain.output_text == events[-1].response.output_text
    assert events[-1].response.status == plain.status
    # The client's stream helper over a reply that completes (a schema ends it): its deltas
    # add up to the final, parsed response
    parsed = dict(model=NAME, input="Describe a person.", text_format=Person,
                  max_output_tokens=200, temperature=0)
    with client.responses.stream(**parsed) as stream:
        pieces = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(pieces) == final.output_text
    assert final.output_parsed == client.responses.parse(**parsed).output_parsed


def test_parse_gives_a_validated_pydantic_object(client):
    r = client.responses.parse(model=NAME, input="Describe a person.", text_format=Person,
                               max_output_tokens=200, temperature=0)
    assert r.status == "completed"
    assert isinstance(r.output_parsed, Person)
    assert Person.model_validate_json(r.output_text) == r.output_parsed


def test_a_function_call_and_its_output_continue_by_previous_response_id(client):
    r = client.responses.create(model=NAME, input="Weather in Oslo?", tools=[WEATHER],
                                tool_choice="required", max_output_tokens=200,
                                parallel_tool_calls=False, temperature=0)
    assert r.status == "completed"  # one call, and the grammar ends the reply
    calls = [item for item in r.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and calls[0].call_id
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER["parameters"])
    follow = client.responses.create(
        model=NAME, previous_response_id=r.id, tools=[WEATHER], max_output_tokens=16,
        temperature=0, input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                               "output": "12 degrees, rain"}])
    assert follow.previous_response_id == r.id and follow.status in ("completed", "incomplete")
    assert follow.usage.input_tokens > r.usage.input_tokens  # the whole conversation went in
    # streamed: the call's item, its argument deltas adding up, in the client's stream helper
    with client.responses.stream(model=NAME, input="Weather in Oslo?", tools=[WEATHER],
                                 tool_choice="required", max_output_tokens=200,
                                 parallel_tool_calls=False, temperature=0) as stream:
        deltas = [e.delta for e in stream if e.type == "response.function_call_arguments.delta"]
        final = stream.get_final_response()
    call = next(item for item in final.output if item.type == "function_call")
    assert "".join(deltas) == call.arguments == calls[0].arguments


def test_stored_responses_are_read_deleted_and_bounded(client, server):
    made = [client.responses.create(model=NAME, input=f"Say {i}.", max_output_tokens=4,
                                    temperature=0) for i in range(4)]
    assert client.responses.retrieve(made[3].id).output_text == made[3].output_text
    with pytest.raises(Exception) as e:  # --stored-responses 3: the oldest was dropped
        client.responses.retrieve(made[0].id)
    assert getattr(e.value, "status_code", None) == 404 and made[0].id in str(e.value)
    client.responses.delete(made[3].id)
    r = httpx.get(f"{server.url}/v1/responses/{made[3].id}")
    assert r.status_code == 404 and r.json()["error"]["param"] == "response_id"
    unstored = client.responses.create(model=NAME, input="Hi.", max_output_tokens=4, store=False)
    assert httpx.get(f"{server.url}/v1/responses/{unstored.id}").status_code == 404
    r = httpx.post(f"{server.url}/v1/responses", json={
        "model": NAME, "input": "Hi", "previous_response_id": "resp_nope"})
    assert r.status_code == 404 and "resp_nope" in r.json()["error"]["message"]


@pytest.mark.parametrize("body, param, words", [
    ({"input": [{"type": "weird_item"}]}, "input[0].type", "not an input item"),
    ({"input": [{"type": "function_call_output", "call_id": "call_x", "output": "1"}]},
     "input[0].call_id", "answers no call made"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0]", "is an input_image part: this model folder takes text only; export "
     "it from the multimodal checkpoint."),
    ({"input": "Hi", "text": {"format": {"type": "yaml"}}}, "text.format.type", "text, json_obj"),
    ({"input": "Hi", "max_output_tokens": 0}, "max_output_tokens", ""),
    ({"input": []}, "input", "non-empty"),
    ({"input": "Hi", "background": True}, "background", "not supported"),
    ({"input": "Hi", "conversation": "conv_1"}, "conversation", "previous_response_id"),
    ({"input": "Hi", "prompt": {"id": "pmpt_1"}}, "prompt", "not supported"),
    ({"input": "Hi", "truncation": "auto"}, "truncation", "not supported"),
    ({"input": "Hi", "include": ["everything"]}, "include[0]", "message.output_text.logprobs"),
    ({"input": "Hi", "top_logprobs": 21}, "top_logprobs", "between 0 and 20"),
])
def test_bad_input_is_a_400_naming_the_field(server, body, param, words):
    r = httpx.post(f"{server.url}/v1/responses", json={"model": NAME, **body}, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"]
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_fields_that_ask_for_nothing_are_accepted(server):
    r = httpx.post(f"{server.url}/v1/responses", timeout=60, json={
        "model": NAME, "input": "Hi", "max_output_tokens": 4, "background": False,
        "truncation": "disabled", "conversation": None, "prompt_cache_key": "user-7",
        "prompt_cache_retention": "24h", "safety_identifier": "u7", "max_tool_calls": 3,
        "include": ["reasoning.encrypted_content"], "service_tier": "auto", "user": "u7"})
    assert r.status_code == 200, r.text
    assert r.json()["user"] == "u7"
    assert r.json()["output"][0]["content"][0]["logprobs"] == []  # none asked for
    assert r.headers["llm-onnx-ignored"] == ("max_tool_calls, prompt_cache_key, "
                                             "prompt_cache_retention, safety_identifier, "
                                             "service_tier")


def test_logprobs_equal_chat_completions_and_the_stream_carries_the_same(client):
    """include message.output_text.logprobs: the tokens and values Chat Completions gives for
    the same conversation (its logprobs are checked against a numpy reference in
    tests/serve/test_openai_api.py), streamed or not."""
    chat = client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "Count."}], max_tokens=12,
        temperature=0, logprobs=True, top_logprobs=2)
    want = [(c.token, round(c.logprob, 4), [(a.token, round(a.logprob, 4)) for a in c.top_logprobs])
            for c in chat.choices[0].logprobs.content]
    r = client.responses.create(model=NAME, input="Count.", max_output_tokens=12, temperature=0,
                                include=["message.output_text.logprobs"], top_logprobs=2)
    part = r.output[0].content[0]
    got = [(c.token, round(c.logprob, 4), [(a.token, round(a.logprob, 4)) for a in c.top_logprobs])
           for c in part.logprobs]
    assert part.text == chat.choices[0].message.content and got == want
    events = list(client.responses.create(model=NAME, input="Count.", max_output_tokens=12,
                                          temperature=0, top_logprobs=2, stream=True))
    streamed = [(c.token, round(c.logprob, 4)) for e in events
                if e.type == "response.output_text.delta" for c in e.logprobs]
    assert streamed == [(token, value) for token, value, _ in want]


# A template that opens the think block in the prompt (as DeepSeek-R1's does): the reply is
# thinking until </think>, so a random model's whole reply is reasoning.
THINKING_CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
                   "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
                   "{{ '<|im_start|>assistant\\n<think>\\n' }}{% endif %}")


def test_a_reasoning_models_thinking_is_a_reasoning_item(byte_think_model_folder, tmp_path):
    from openai import OpenAI

    template = tmp_path / "thinking.jinja"
    template.write_text(THINKING_CHATML)
    proc = ServerProcess(byte_think_model_folder, "--chat-template", str(template))
    try:
        client = OpenAI(base_url=proc.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        model = Model.load(byte_think_model_folder, provider="cpu", threads=1,
                           chat_template=str(template), speculative="off")
        want = model.chat([{"role": "user", "content": "Why?"}], max_new_tokens=30,
                          temperature=0)
        assert want.reasoning
        r = client.responses.create(model="tiny-bytes-think", input="Why?",
                                    max_output_tokens=30, temperature=0)
        reasoning = [item for item in r.output if item.type == "reasoning"]
        assert reasoning and reasoning[0].content[0].text == want.reasoning
        assert r.output_text == want.text
        events = list(client.responses.create(model="tiny-bytes-think", input="Why?",
                                              max_output_tokens=30, temperature=0,
                                              stream=True))
        streamed = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
        assert streamed == want.reasoning
    finally:
        proc.stop()
