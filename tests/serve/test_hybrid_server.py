"""`llm-onnx serve` on a hybrid model (the tiny Qwen3.5 byte model: a linear-attention layer with
a recurrent state per row beside a full-attention layer), through the official ``openai``
client: plain and streamed chat, concurrent requests sharing a system prompt (rows joining and
leaving, prefixes reused from checkpoints), a tool call with its arguments valid under the
function's schema. Every greedy answer equals the in-process Model's."""

from __future__ import annotations

import concurrent.futures
import json

import jsonschema
import pytest

from llm_onnx.runtime import Model
from tests.byte_model import HERMES_TEMPLATE
from tests.serve.conftest import ServerProcess

NAME = "tiny-bytes-qwen3_5_tiny"
SYSTEM = {"role": "system", "content": "You answer in one short line, politely and clearly."}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                   "required": ["city"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def server(hybrid_byte_model_folder):
    proc = ServerProcess(hybrid_byte_model_folder, "--max-batch", "3", "--prefill-chunk", "16",
                         "--chat-template", str(HERMES_TEMPLATE))
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def model(hybrid_byte_model_folder):
    return Model.load(hybrid_byte_model_folder, provider="cpu", threads=1,
                      chat_template=str(HERMES_TEMPLATE), speculative="off")


@pytest.fixture
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_the_model_says_it_has_a_recurrent_state(client):
    assert [m.id for m in client.models.list().data] == [NAME]


def test_chat_plain_and_streamed_equal_the_in_process_model(client, model):
    messages = [SYSTEM, {"role": "user", "content": "Name a color."}]
    want = model.chat(messages, max_new_tokens=24, temperature=0)
    reply = client.chat.completions.create(model=NAME, messages=messages, max_tokens=24,
                                           temperature=0)
    assert reply.choices[0].message.content == want.text
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in
                       client.chat.completions.create(model=NAME, messages=messages,
                                                      max_tokens=24, temperature=0, stream=True)
                       if chunk.choices)
    assert streamed == want.text


def test_concurrent_requests_sharing_a_system_prompt(client, model, server):
    """Six requests on three rows at once, each answer the in-process model's, and prompt
    tokens taken from a free row's checkpoint rather than run again."""
    questions = [f"Question number {i}: what comes next?" for i in range(6)]
    cached = server.metric("llm_onnx_prompt_tokens_cached_total")

    def ask(q: str) -> str:
        r = client.chat.completions.create(model=NAME, messages=[SYSTEM, {"role": "user",
                                                                          "content": q}],
                                           max_tokens=16, temperature=0)
        return r.choices[0].message.content

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(ask, questions))
    for q, a in zip(questions, answers):
        assert a == model.chat([SYSTEM, {"role": "user", "content": q}], max_new_tokens=16,
                               temperature=0).text
    assert server.metric("llm_onnx_prompt_tokens_cached_total") > cached


def test_a_required_tool_call_comes_back_parsed(client):
    reply = client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "Weather in Oslo?"}],
        tools=[WEATHER], tool_choice="required", max_tokens=80, temperature=0)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments),
                        WEATHER["function"]["parameters"])
