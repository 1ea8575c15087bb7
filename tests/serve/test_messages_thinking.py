"""The Messages API's ``thinking`` with a reasoning model and Qwen3's chat template, through a
real `llm-onnx serve` and the `anthropic` client: the tiny Qwen3 whose replies open
``<think> t20 </think>`` (tests/thinking_model.py) gives a ``thinking`` block before the text,
streamed as thinking_delta events; thinking off (or not asked for, Anthropic's default) renders
the template with enable_thinking=False; and the byte model with <think> tags under Qwen3's
template makes tool calls whose input validates, thinking or not."""

from __future__ import annotations

import signal

import anthropic
import jsonschema
import pytest

from llm_onnx.runtime import Model
from tests.serve.conftest import ServerProcess
from tests.thinking_model import QWEN3_TEMPLATE

NAME = "tiny-qwen3-thinking"
USER = [{"role": "user", "content": "t30 t31 t32"}]
ON, OFF = {"enable_thinking": True}, {"enable_thinking": False}
T0 = {"extra_body": {"temperature": 0}}
THINK = {"type": "enabled", "budget_tokens": 6}


@pytest.fixture(scope="module")
def server(thinking_model):
    proc = ServerProcess(thinking_model[1], "--max-batch", "2")
    yield proc
    assert proc.stop() in (0, -signal.SIGTERM), proc.output()


@pytest.fixture(scope="module")
def model(thinking_model):
    return Model.load(thinking_model[1], provider="cpu", threads=1)


@pytest.fixture
def client(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=60)


def blocks(message) -> list[tuple[str, str]]:
    return [(b.type, b.thinking if b.type == "thinking" else b.text) for b in message.content]


def test_thinking_is_a_thinking_block_before_the_text(client, model):
    ref = model.chat(USER, template_vars=ON, max_new_tokens=12, temperature=0)
    assert ref.reasoning.strip() == "t20"
    for thinking in (THINK, {"type": "adaptive"}):
        r = client.messages.create(model=NAME, max_tokens=12, thinking=thinking, messages=USER,
                                   **T0)
        assert blocks(r) == [("thinking", ref.reasoning), ("text", ref.text)]
        assert r.content[0].signature == ""
        assert r.usage.input_tokens == len(model.chat_prompt(USER, template_vars=ON))
        assert r.usage.output_tokens == len(ref.token_ids)


def test_thinking_off_or_not_asked_for_switches_the_template_off(client, model):
    ref = model.chat(USER, template_vars=OFF, max_new_tokens=8, temperature=0)
    assert ref.reasoning is None or not ref.reasoning.strip()
    for extra in ({}, {"thinking": {"type": "disabled"}}):
        r = client.messages.create(model=NAME, max_tokens=8, messages=USER, **extra, **T0)
        assert [b.type for b in r.content] == ["text"] and r.content[0].text == ref.text
        assert r.usage.input_tokens == len(model.chat_prompt(USER, template_vars=OFF))
    counted = [client.messages.count_tokens(model=NAME, messages=USER, **extra).input_tokens
               for extra in ({}, {"thinking": THINK})]
    assert counted == [len(model.chat_prompt(USER, template_vars=OFF)),
                       len(model.chat_prompt(USER, template_vars=ON))]


def test_streamed_thinking_then_text(client):
    kwargs = dict(model=NAME, max_tokens=12, thinking=THINK, messages=USER, **T0)
    whole = client.messages.create(**kwargs)
    events = []
    with client.messages.stream(**kwargs) as stream:
        for event in stream:
            events.append(event)
        final = stream.get_final_message()
    assert blocks(final) == blocks(whole)
    kinds = [(e.type, getattr(getattr(e, "content_block", None), "type", None) or
              getattr(getattr(e, "delta", None), "type", None))
             for e in events if e.type.startswith("content_block")]
    first_text = kinds.index(("content_block_start", "text"))
    assert kinds[0] == ("content_block_start", "thinking")
    assert set(kinds[1:first_text - 1]) == {("content_block_delta", "thinking_delta")}
    assert kinds[first_text - 1][0] == "content_block_stop"
    assert "".join(e.delta.thinking for e in events if e.type == "content_block_delta"
                   and e.delta.type == "thinking_delta") == whole.content[0].thinking


def test_omitted_thinking_comes_back_empty(client):
    r = client.messages.create(model=NAME, max_tokens=12, messages=USER, **T0,
                               thinking={**THINK, "display": "omitted"})
    assert blocks(r)[0] == ("thinking", "") and r.content[1].text


def test_an_earlier_turns_thinking_and_tool_use_reach_the_template(client, model):
    """Qwen3's template writes the thinking of an assistant turn after the last user query:
    the thinking block travels as the message's reasoning_content, the tool_use as its
    tool_calls, the tool_result as a tool message (no tools given: this word tokenizer cannot
    be constrained, and past calls render without them)."""
    conversation = [*USER, {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "t21 t22", "signature": ""},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "t50"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": [{"type": "text", "text": "t60 t61"}]}]}]
    openai = [*USER, {"role": "assistant", "content": "", "reasoning_content": "t21 t22",
                      "tool_calls": [{"id": "toolu_1", "type": "function", "function": {
                          "name": "get_weather", "arguments": '{"city": "t50"}'}}]},
              {"role": "tool", "tool_call_id": "toolu_1", "name": "get_weather",
               "content": "t60 t61"}]
    text = model.render_chat(openai, template_vars=ON)
    assert "<think>\nt21 t22\n</think>" in text and "<tool_response>\nt60 t61" in text
    ref = model.chat(openai, template_vars=ON, max_new_tokens=8, temperature=0)
    r = client.messages.create(model=NAME, max_tokens=8, thinking=THINK, messages=conversation,
                               **T0)
    assert r.usage.input_tokens == len(model.encode_chat(text))
    assert [t for k, t in blocks(r) if k == "text"] == ([ref.text] if ref.text else [])


ADD = {"name": "add", "input_schema": {"type": "object", "properties": {
    "a": {"type": "integer", "minimum": 0, "maximum": 9},
    "b": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["a", "b"], "additionalProperties": False}}


def test_tool_use_after_optional_thinking_with_the_byte_model(byte_think_model_folder):
    """The byte model with <think> tags and Qwen3's real template: a forced call whose input
    validates, with thinking on (the model may think first) and off (the prompt closes the
    think block)."""
    proc = ServerProcess(byte_think_model_folder, "--chat-template", str(QWEN3_TEMPLATE))
    try:
        client = anthropic.Anthropic(base_url=proc.url, api_key="unused", max_retries=0,
                                     timeout=60)
        model = Model.load(byte_think_model_folder, provider="cpu", threads=1,
                           chat_template=QWEN3_TEMPLATE)
        users = [{"role": "user", "content": "Add two and three."}]
        for thinking in ({"type": "enabled", "budget_tokens": 100}, {"type": "disabled"}):
            r = client.messages.create(model="tiny-bytes-think", max_tokens=300, tools=[ADD],
                                       tool_choice={"type": "any",
                                                    "disable_parallel_tool_use": True},
                                       thinking=thinking, messages=users,
                                       extra_body={"temperature": 1.0, "seed": 3})
            assert r.stop_reason == "tool_use", r
            uses = [b for b in r.content if b.type == "tool_use"]
            assert len(uses) == 1 and uses[0].name == "add"
            jsonschema.validate(uses[0].input, ADD["input_schema"])
            on = thinking["type"] == "enabled"
            tools = [{"type": "function", "function": {"name": "add",
                                                       "parameters": ADD["input_schema"]}}]
            assert r.usage.input_tokens == len(model.chat_prompt(
                users, tools=tools, template_vars=ON if on else OFF))
            assert on or not any(b.type == "thinking" for b in r.content)
    finally:
        proc.stop()
