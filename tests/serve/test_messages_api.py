"""Anthropic's Messages API through a real `llm-onnx serve`, with the official `anthropic`
client: a tiny random model with a byte-level tokenizer (tests/byte_model.py, it can write any
tool call) and the Hermes tools template. Replies equal the in-process Model's for the same
conversation at temperature 0; tool_use inputs validate under their input_schema; streamed
deltas add up to the whole reply; bad requests are Anthropic-shaped 400s naming the field, and
the server keeps serving."""

from __future__ import annotations

import json

import anthropic
import httpx
import jsonschema
import pytest

from llm_onnx.runtime import Model
from tests.byte_model import HERMES_TEMPLATE
from tests.serve.conftest import ServerProcess

NAME = "tiny-bytes"
KEY = "sk-messages-test"
USER = [{"role": "user", "content": "Describe the weather."}]
WEATHER = {"name": "get_weather", "description": "Current weather in a city.",
           "input_schema": {"type": "object", "properties": {
               "city": {"type": "string", "maxLength": 12},
               "unit": {"enum": ["celsius", "fahrenheit"]}},
               "required": ["city", "unit"], "additionalProperties": False}}
ADD = {"name": "add", "input_schema": {"type": "object", "properties": {
    "a": {"type": "integer", "minimum": -99, "maximum": 99},
    "b": {"type": "integer", "minimum": -99, "maximum": 99}},
    "required": ["a", "b"], "additionalProperties": False}}
TOOLS = [WEATHER, ADD]
SCHEMAS = {t["name"]: t["input_schema"] for t in TOOLS}
# The anthropic client no longer types the sampling fields; the API takes them.
T0 = {"extra_body": {"temperature": 0}}


def openai_tools(tools):
    return [{"type": "function", "function": {
        "name": t["name"], **({"description": t["description"]} if "description" in t else {}),
        "parameters": t["input_schema"]}} for t in tools]


@pytest.fixture(scope="module")
def server(byte_model_folder):
    proc = ServerProcess(byte_model_folder, "--max-batch", "4", "--chat-template",
                         str(HERMES_TEMPLATE), api_key=KEY)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def model(byte_model_folder):
    return Model.load(byte_model_folder, provider="cpu", threads=1, chat_template=HERMES_TEMPLATE)


@pytest.fixture
def client(server):
    """The anthropic client sends the key as X-API-Key."""
    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0, timeout=60)


def post(server, body, path="/v1/messages", headers=None):
    return httpx.post(server.url + path, json={"model": NAME, **body}, timeout=60,
                      headers={"x-api-key": KEY} if headers is None else headers)


def text_of(message) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


def stop_reason(result) -> str:
    return {"stop": "end_turn", "length": "max_tokens"}[result.finish_reason]


# ------------------------------------------------------------------ plain replies

def test_a_reply_equals_the_in_process_models(client, model):
    system = "You are terse."
    ref = model.chat([{"role": "system", "content": system}, *USER], max_new_tokens=12,
                     temperature=0)
    r = client.messages.create(model=NAME, max_tokens=12, **T0, system=system,
                               messages=USER, metadata={"user_id": "u1"})
    assert r.id.startswith("msg_") and r.type == "message" and r.role == "assistant"
    assert r.model == NAME and text_of(r) == ref.text
    assert r.stop_reason == stop_reason(ref) and r.stop_sequence is None
    assert r.usage.input_tokens == len(model.chat_prompt(
        [{"role": "system", "content": system}, *USER]))
    assert r.usage.output_tokens == len(ref.token_ids)
    # the system prompt as text blocks: the same conversation
    again = client.messages.create(model=NAME, max_tokens=12, **T0, messages=USER,
                                   system=[{"type": "text", "text": system}])
    assert text_of(again) == ref.text


def test_streamed_text_deltas_add_up_to_the_reply(client, server):
    kwargs = dict(model=NAME, max_tokens=16, **T0, messages=USER)
    whole = client.messages.create(**kwargs)
    with client.messages.stream(**kwargs) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(pieces) == text_of(final) == text_of(whole) and len(pieces) > 1
    assert (final.stop_reason, final.usage.output_tokens, final.usage.input_tokens) == \
        (whole.stop_reason, whole.usage.output_tokens, whole.usage.input_tokens)
    # the events as Anthropic sends them
    raw = {"model": NAME, "max_tokens": 16, "temperature": 0, "messages": USER, "stream": True}
    with httpx.stream("POST", server.url + "/v1/messages", json=raw,
                      headers={"x-api-key": KEY}, timeout=60) as r:
        lines = [line for line in r.iter_lines() if line]
    names = [line.split(": ", 1)[1] for line in lines if line.startswith("event: ")]
    data = [json.loads(line.split(": ", 1)[1]) for line in lines if line.startswith("data: ")]
    assert [d["type"] for d in data] == names
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    assert data[0]["message"]["usage"] == {"input_tokens": whole.usage.input_tokens,
                                           "output_tokens": 0}


def test_stop_sequences(client, model):
    ref = model.chat(USER, max_new_tokens=24, temperature=0)
    stop = next(ref.text[i:i + 2] for i in range(3, len(ref.text) - 2)
                if ref.text[i:i + 2].strip() and ref.text.find(ref.text[i:i + 2]) == i)
    kwargs = dict(model=NAME, max_tokens=24, **T0, messages=USER,
                  stop_sequences=["\x00never", stop])
    r = client.messages.create(**kwargs)
    assert (r.stop_reason, r.stop_sequence) == ("stop_sequence", stop)
    assert text_of(r) == ref.text[:ref.text.find(stop)]
    with client.messages.stream(**kwargs) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence, text_of(final)) == \
        ("stop_sequence", stop, text_of(r))


def test_max_tokens_0_and_a_prefill(client, model):
    r = client.messages.create(model=NAME, max_tokens=0, messages=USER)
    assert (r.content, r.stop_reason, r.usage.output_tokens) == ([], "max_tokens", 0)
    # an empty final assistant message is no prefill
    empty = client.messages.create(model=NAME, max_tokens=0, messages=[
        *USER, {"role": "assistant", "content": []}])
    assert empty.usage.input_tokens == r.usage.input_tokens
    # a final assistant message: the reply continues its text
    conversation = [*USER, {"role": "assistant", "content": "It is"}]
    prompt = model.render_chat(conversation, continue_final_message=True)
    assert prompt.endswith("<|im_start|>assistant\nIt is")
    ref = model.generate(model.encode_chat(prompt), max_new_tokens=8, temperature=0)
    r = client.messages.create(model=NAME, max_tokens=8, **T0, messages=conversation)
    assert text_of(r) == ref.text and r.usage.input_tokens == len(model.encode_chat(prompt))


def test_consecutive_turns_of_one_role_are_one_turn(client, model):
    """As Anthropic combines them: two user messages are one user turn (their texts joined by
    a blank line)."""
    split = [{"role": "user", "content": "Describe"},
             {"role": "user", "content": [{"type": "text", "text": "the weather."}]}]
    ref = model.chat([{"role": "user", "content": "Describe\n\nthe weather."}],
                     max_new_tokens=8, temperature=0)
    r = client.messages.create(model=NAME, max_tokens=8, **T0, messages=split)
    assert text_of(r) == ref.text


def test_structured_output_with_output_config(client):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                               "warm": {"type": "boolean"}},
              "required": ["city", "warm"], "additionalProperties": False}
    r = client.messages.create(model=NAME, max_tokens=200, **T0, messages=USER,
                               output_config={"format": {"type": "json_schema",
                                                         "schema": schema}})
    assert r.stop_reason == "end_turn"
    jsonschema.validate(json.loads(text_of(r)), schema)


# ------------------------------------------------------------------ tools

def test_a_forced_tool_use_then_its_result(client, model):
    r = client.messages.create(model=NAME, max_tokens=300, **T0, messages=USER,
                               tools=TOOLS, tool_choice={"type": "any",
                                                         "disable_parallel_tool_use": True})
    assert r.stop_reason == "tool_use"
    uses = [b for b in r.content if b.type == "tool_use"]
    assert uses and all(u.id.startswith("toolu_") for u in uses)
    for use in uses:
        jsonschema.validate(use.input, SCHEMAS[use.name])
    # the same function in-process (a random model's string arguments meet near-ties that
    # the server's longer cache can break the other way, so only the name is compared)
    ref = model.chat(USER, tools=openai_tools(TOOLS), tool_choice="required",
                     parallel_tool_calls=False, max_new_tokens=300, temperature=0)
    assert [c.name for c in ref.tool_calls] == [u.name for u in uses]
    # the round trip: the reply as the assistant's turn, the tool's result in the user's
    results = [{"type": "tool_result", "tool_use_id": u.id, "content": "sunny, 21 C"}
               for u in uses]
    conversation = [*USER, {"role": "assistant", "content": [b.model_dump() for b in r.content]},
                    {"role": "user", "content": results}]
    after = client.messages.create(model=NAME, max_tokens=10, **T0, tools=TOOLS,
                                   messages=conversation, tool_choice={"type": "none"})
    openai = [*USER, {"role": "assistant", "content": text_of(r), "tool_calls": [
        {"id": u.id, "type": "function",
         "function": {"name": u.name, "arguments": json.dumps(u.input)}} for u in uses]},
        *[{"role": "tool", "tool_call_id": u.id, "name": u.name, "content": "sunny, 21 C"}
          for u in uses]]
    ref = model.chat(openai, max_new_tokens=10, temperature=0)
    assert text_of(after) == ref.text
    assert after.usage.input_tokens == len(model.chat_prompt(openai))
    rendered = model.render_chat(openai)
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in rendered


def test_a_named_tool_streamed_equals_whole(client):
    kwargs = dict(model=NAME, max_tokens=300, **T0, messages=USER, tools=TOOLS,
                  tool_choice={"type": "tool", "name": "add",
                               "disable_parallel_tool_use": True})
    whole = client.messages.create(**kwargs)
    uses = [b for b in whole.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "add" and whole.stop_reason == "tool_use"
    jsonschema.validate(uses[0].input, ADD["input_schema"])
    partial = []
    with client.messages.stream(**kwargs) as stream:
        for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                partial.append(event.delta.partial_json)
        final = stream.get_final_message()
    streamed = [b for b in final.content if b.type == "tool_use"]
    assert json.loads("".join(partial)) == streamed[0].input == uses[0].input
    assert final.stop_reason == "tool_use" and streamed[0].id.startswith("toolu_")


def test_count_tokens(client, model):
    system = "Be brief."
    n = client.messages.count_tokens(model=NAME, system=system, messages=USER, tools=TOOLS)
    chat = [{"role": "system", "content": system}, *USER]
    assert n.input_tokens == len(model.chat_prompt(chat, tools=openai_tools(TOOLS)))
    r = client.messages.create(model=NAME, max_tokens=1, system=system, messages=USER,
                               tools=TOOLS)
    assert r.usage.input_tokens == n.input_tokens
    assert client.messages.count_tokens(model=NAME, messages=USER).input_tokens == \
        len(model.chat_prompt(USER))


# ------------------------------------------------------------------ keys and bad requests

def test_the_key_as_x_api_key_or_bearer(server):
    body = {"max_tokens": 1, "messages": USER}
    assert post(server, body).status_code == 200
    assert post(server, body, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    with pytest.raises(anthropic.AuthenticationError) as info:
        anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0).messages.create(
            model=NAME, max_tokens=1, messages=USER)
    assert info.value.type == "authentication_error"
    r = post(server, body, headers={})
    assert r.status_code == 401 and r.json()["type"] == "error"


BAD = [
    ({"max_tokens": 4, "messages": [{"role": "assistant", "content": "Hi"}, *USER]},
     "messages.0.role", "the first message must use the 'user' role"),
    ({"max_tokens": 4, "messages": [*USER, {"role": "tool", "content": "x"}]},
     "messages.1.role", "must be 'user', 'assistant' or 'system'"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": "iVBORw0KGgo="}}]}]},
     "messages.0.content.1",
     "is an image block: this model folder takes text only; export it from the multimodal "
     "checkpoint."),
    ({"max_tokens": 4, "messages": [*USER, {"role": "assistant", "content": "Hm."},
                                    {"role": "user", "content": [
                                        {"type": "tool_result", "tool_use_id": "toolu_nope",
                                         "content": "42"}]}]},
     "messages.2.content.0.tool_use_id", "unexpected tool_use_id 'toolu_nope'"),
    ({"max_tokens": 4, "messages": [*USER, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 1, "b": 2}}]},
        {"role": "user", "content": "and?"}], "tools": TOOLS},
     "messages.2", "tool_use ids were found without tool_result blocks"),
    ({"messages": USER}, "max_tokens", "Field required"),
    ({"max_tokens": 4, "messages": USER, "temperature": 1.5}, "temperature", "[0, 1]"),
    ({"max_tokens": 4, "messages": USER, "tools": [{"name": "f", "input_schema": {
        "type": "array"}}]}, "tools.0.input_schema", "\"type\": \"object\""),
    ({"max_tokens": 4, "messages": USER, "tools": [{"name": "f", "input_schema": {
        "type": "object", "properties": {"x": {"not": {"type": "string"}}},
        "required": ["x"]}}], "tool_choice": {"type": "any"}},
     "tools.0.input_schema.properties.x.not", "cannot be enforced"),
    ({"max_tokens": 4, "messages": USER, "output_config": {"format": {
        "type": "json_schema", "schema": {"type": "object", "properties": {
            "age": {"type": "int"}}}}}},
     "output_config.format.schema.properties.age.type", "'type' must be one of"),
    ({"max_tokens": 4, "messages": USER, "tool_choice": {"type": "tool", "name": "nope"},
      "tools": TOOLS}, "tool_choice.name", "'nope'"),
    ({"max_tokens": 8, "messages": USER, "thinking": {"type": "enabled",
                                                      "budget_tokens": 8}},
     "thinking.budget_tokens", "less than max_tokens"),
    ({"max_tokens": 4, "messages": [*USER, {"role": "assistant", "content": "trailing "}]},
     "messages.1.content", "trailing whitespace"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": ""}]},
     "messages.0.content.text", "non-empty"),
    ({"max_tokens": 4, "messages": [*USER, {"role": "assistant", "content": []},
                                    {"role": "user", "content": "Hm?"}]},
     "messages.1.content", "must not be empty"),
]


@pytest.mark.parametrize(("body", "field", "words"), BAD, ids=[b[1] for b in BAD])
def test_bad_requests_are_anthropic_shaped_400s_naming_the_field(server, client, body, field,
                                                                  words):
    r = post(server, body)
    assert r.status_code == 400, r.text
    error = r.json()
    assert set(error) == {"type", "error"} and error["type"] == "error"
    assert error["error"]["type"] == "invalid_request_error"
    assert error["error"]["message"].startswith(field + ": ") and words in \
        error["error"]["message"], error
    with pytest.raises(anthropic.BadRequestError) as info:
        client.post("/v1/messages", cast_to=anthropic.types.Message, body={"model": NAME, **body})
    assert info.value.type == "invalid_request_error" and words in info.value.api_message


def test_other_errors_and_the_server_keeps_serving(server, client):
    with pytest.raises(anthropic.NotFoundError) as info:
        client.messages.create(model="claude-none", max_tokens=4, messages=USER)
    assert info.value.type == "not_found_error" and "tiny-bytes" in info.value.api_message
    r = httpx.post(server.url + "/v1/messages", content=b"{not json", timeout=30,
                   headers={"x-api-key": KEY, "content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(server.url + "/v1/messages", timeout=30, headers={
        "x-api-key": KEY, "content-type": "application/json"},
        content=b'{"model": "tiny-bytes", "max_tokens": 1, "messages": [{"role": "\\ud800", '
                b'"content": "x"}]}')
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("messages.0.role:")
    assert "\\ud800" in r.json()["error"]["message"]  # a lone surrogate, written escaped
    r = httpx.get(server.url + "/v1/messages/nope", headers={"x-api-key": KEY})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    assert client.messages.create(model=NAME, max_tokens=2, messages=USER).usage.output_tokens
    assert server.metric('llm_onnx_requests_total{endpoint="/v1/messages",status="500"}') == 0
    assert server.metric('llm_onnx_requests_total{endpoint="/v1/messages",status="400"}') > 0
    assert server.metric('llm_onnx_requests_total{endpoint="/v1/messages",status="200"}') > 0
    assert server.metric(
        'llm_onnx_requests_total{endpoint="/v1/messages/count_tokens",status="200"}') >= 0


def random_body(rng) -> dict:
    """A Messages request, most often well formed, with wrong types, roles, blocks and fields
    mixed in."""
    def block():
        return rng.choice([
            {"type": "text", "text": rng.choice(["hi", "", 3])},
            {"type": "tool_use", "id": rng.choice(["a", 3]), "name": rng.choice(["add", ""]),
             "input": rng.choice([{"a": 1, "b": 2}, "s"])},
            {"type": "tool_result", "tool_use_id": rng.choice(["a", "b", 5]),
             "content": rng.choice(["r", [], [{"type": "text", "text": "z"}],
                                    [{"type": "image"}], 3]),
             "is_error": rng.choice([None, True, "y"])},
            {"type": "thinking", "thinking": rng.choice(["th", 3])},
            {"type": "redacted_thinking", "data": "x"}, {"type": "image"}, {"type": "x"}, 7])

    def message(i):
        role = ("user", "assistant")[i % 2] if rng.random() < 0.85 else \
            rng.choice(["user", "system", None])
        content = "hello" if rng.random() < 0.6 else \
            rng.choice([[block() for _ in range(rng.randrange(4))], "", 3, None])
        return {"role": role, "content": content, **({"x": 1} if rng.random() < 0.03 else {})}

    body = {"model": NAME if rng.random() < 0.95 else rng.choice(["other", None]),
            "messages": [message(i) for i in range(rng.randrange(1, 6))]
            if rng.random() < 0.95 else rng.choice([[], "x"]),
            "max_tokens": rng.choice([1, 2, 0]) if rng.random() < 0.9 else
            rng.choice([-1, "3", 2.0, 10**6])}
    for name, values in {
            "system": ["s", "", [{"type": "text", "text": "s"}], [{"type": "image"}], 3],
            "tools": [TOOLS, [{"name": "bad name", "input_schema": {}}], "x",
                      [{"type": "bash_20250124", "name": "bash"}]],
            "tool_choice": [{"type": "auto"}, {"type": "any"}, {"type": "tool", "name": "add"},
                            {"type": "none"}, "auto", {"type": "tool"}],
            "thinking": [{"type": "enabled", "budget_tokens": 1}, {"type": "disabled"},
                         {"type": "enabled"}, "on"],
            "stop_sequences": [["a"], [""], "a"], "temperature": [0, 1, 2, "x"],
            "top_k": [0, -1, 3], "stream": [True, False, "y"], "metadata": [{"user_id": "u"}],
            "output_config": [{"format": {"type": "json_schema", "schema": {"type": "object"}}},
                              {"format": 1}], "container": ["c"], "bogus": [1]}.items():
        if rng.random() < 0.12:
            body[name] = rng.choice(values)
    return body


def test_random_requests_never_get_a_5xx(server):
    """300 seeded random requests, most of them bad somewhere: every answer is a 200 (a whole
    event stream when streamed) or an Anthropic-shaped 4xx."""
    import random

    rng, answered = random.Random(7), 0
    with httpx.Client(base_url=server.url, headers={"x-api-key": KEY}, timeout=60) as http:
        for _ in range(300):
            body = random_body(rng)
            if rng.random() < 0.3:
                path = "/v1/messages/count_tokens"
                for name in ("max_tokens", "stream", "stop_sequences", "temperature", "top_k"):
                    body.pop(name, None)
            else:
                path = "/v1/messages"
            r = http.post(path, json=body)
            assert r.status_code < 500, (body, r.text)
            if r.status_code >= 400:
                error = r.json()
                assert error["type"] == "error" and set(error["error"]) == {"type", "message"}
            elif body.get("stream") is True and path == "/v1/messages":
                assert r.text.rstrip().endswith('data: {"type": "message_stop"}'), r.text[-200:]
            answered += r.status_code == 200
    assert answered >= 10


def test_a_full_queue_and_a_shutdown_in_anthropic_shapes(byte_model_folder):
    """On a held server (nothing finishes but through the test): one request streams, one
    waits, a third gets a 429 the client raises as RateLimitError; SIGTERM ends the stream with
    an ``error`` event and the waiting request with a 503, both overloaded_error."""
    import signal
    import threading

    from tests.serve.conftest import wait_until

    server = ServerProcess(byte_model_folder, "--max-batch", "1", "--max-queue", "1",
                           "--drain-timeout", "0.3", "--no-web-ui", held=0)
    body = {"model": NAME, "max_tokens": 2000, "messages": USER}
    results = {}

    def streamed():
        with httpx.stream("POST", server.url + "/v1/messages", json={**body, "stream": True},
                          timeout=60) as r:
            results["stream"] = [line for line in r.iter_lines() if line]

    def waiting():
        results["waiting"] = httpx.post(server.url + "/v1/messages", json=body, timeout=60)

    threads = [threading.Thread(target=streamed), threading.Thread(target=waiting)]
    try:
        threads[0].start()
        wait_until(lambda: server.metric("llm_onnx_running_requests") == 1)
        threads[1].start()
        wait_until(lambda: server.metric("llm_onnx_queue_depth") == 1)
        client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
        with pytest.raises(anthropic.RateLimitError) as info:
            client.messages.create(model=NAME, max_tokens=4, messages=USER)
        assert info.value.type == "rate_limit_error" and "queue is full" in \
            info.value.api_message
        server.signal(signal.SIGTERM)
        for t in threads:
            t.join(60)
    finally:
        server.stop()
    lines = results["stream"]
    assert lines[0] == "event: message_start" and lines[-2] == "event: error"
    assert json.loads(lines[-1][len("data: "):])["error"]["type"] == "overloaded_error"
    assert "message_stop" not in "".join(lines)
    r = results["waiting"]
    assert r.status_code == 503 and r.json()["error"]["type"] == "overloaded_error"
