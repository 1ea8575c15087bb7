"""The server's chat with a reasoning model and a real chat template (tests/thinking_model.py:
a tiny Qwen3 with Qwen3's template whose replies open ``<think> t20 </think>``): the thinking
comes back as ``reasoning_content`` (vLLM's and DeepSeek's field) beside ``content``, streamed
and not; ``chat_template_kwargs`` (vLLM's extra field) and ``tools`` reach the template; bad
values are OpenAI-shaped 400s naming the field."""

from __future__ import annotations

import signal

import httpx
import pytest

from llm_onnx.runtime import Model
from tests.runtime.fakes import FakeEngine
from tests.runtime.fakes import tokenizer as fake_tokenizer
from tests.serve.browser import ChatPage
from tests.serve.conftest import ServerProcess

NAME = "tiny-qwen3-thinking"
USER = [{"role": "user", "content": "t30 t31 t32"}]
OFF = {"enable_thinking": False}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
TOOL_ROUND = [
    {"role": "user", "content": "t40 t41"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"t50\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "t60 t61"},
]


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
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_reasoning_content_beside_the_answer(client, model):
    ref = model.chat(USER, max_new_tokens=8, temperature=0)
    assert ref.reasoning.strip() == "t20"
    r = client.chat.completions.create(model=NAME, messages=USER, max_tokens=8, temperature=0)
    message = r.choices[0].message
    assert message.content == ref.text and message.reasoning_content == ref.reasoning
    assert r.usage.completion_tokens == len(ref.token_ids)

    chunks = list(client.chat.completions.create(model=NAME, messages=USER, max_tokens=8,
                                                 temperature=0, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == ref.text
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == ref.reasoning
    kinds = [bool(getattr(d, "reasoning_content", None)) for d in deltas if
             d.content or getattr(d, "reasoning_content", None)]
    assert kinds == sorted(kinds, reverse=True)  # thinking first, then the answer


def test_the_chat_page_shows_the_thinking_apart_and_folded(server, model, browser,
                                                          tmp_path):
    ref = model.chat(USER, max_new_tokens=8, temperature=0)
    chat = ChatPage(browser, server).open()
    chat.settings(temperature=0, max_tokens=8)
    answer = chat.ask(USER[0]["content"])
    thinking = answer.locator("details.reasoning")
    assert thinking.is_visible() and thinking.get_attribute("open") is None  # folded
    assert thinking.locator("summary").inner_text().startswith("Thought for ")
    assert answer.locator(".reasoning-text").text_content() == ref.reasoning
    assert chat.raw(answer) == ref.text and ref.text
    thinking.locator("summary").click()
    assert thinking.get_attribute("open") is not None and \
        answer.locator(".reasoning-text").is_visible()
    assert chat.errors == [] and chat.off_server() == []
    chat.screenshot("chat-page-thinking.png", tmp_path)
    chat.close()


def test_chat_template_kwargs_switch_thinking_off(client, model):
    ref = model.chat(USER, template_vars=OFF, max_new_tokens=8, temperature=0)
    r = client.chat.completions.create(model=NAME, messages=USER, max_tokens=8, temperature=0,
                                       extra_body={"chat_template_kwargs": OFF})
    assert r.usage.prompt_tokens == len(model.chat_prompt(USER, template_vars=OFF))
    assert r.choices[0].message.content == ref.text
    assert r.choices[0].message.reasoning_content is None
    # Names the template does not read are ignored, as vLLM and transformers ignore them.
    r = client.chat.completions.create(model=NAME, messages=USER, max_tokens=8, temperature=0,
                                       extra_body={"chat_template_kwargs": {**OFF, "x": 1}})
    assert r.choices[0].message.content == ref.text


def test_tool_calls_and_results_reach_the_template(client, model):
    """An earlier turn's tool call and the tool's result render through Qwen3's template (its
    arguments given as OpenAI's JSON string reach the template as an object)."""
    ref = model.chat(TOOL_ROUND, max_new_tokens=8, temperature=0)
    r = client.chat.completions.create(model=NAME, messages=TOOL_ROUND, max_tokens=8,
                                       temperature=0)
    text = model.render_chat(TOOL_ROUND)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "t50"}}\n</tool_call>' \
        in text and "<tool_response>" in text
    assert r.usage.prompt_tokens == len(model.chat_prompt(TOOL_ROUND))
    assert (r.choices[0].message.content, r.choices[0].message.reasoning_content) == \
        (ref.text, ref.reasoning)
    # tool_choice "none": the model is not shown the tools
    r = client.chat.completions.create(model=NAME, messages=USER, tools=[WEATHER],
                                       tool_choice="none", max_tokens=2, temperature=0)
    assert r.usage.prompt_tokens == len(model.chat_prompt(USER))


def test_tools_need_a_tokenizer_the_constraint_engine_reads(server):
    """This model's word tokenizer has no byte form: tool calls, which are always constrained,
    are refused with the reason rather than run loose (tests/serve/test_tool_calls.py runs them
    on a byte-level model)."""
    response = post(server, {"messages": USER, "tools": [WEATHER], "max_tokens": 4})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "tools" and "cannot read its tokenizer" in error["message"], error


def post(server, body):
    return httpx.post(server.url + "/v1/chat/completions", json={"model": NAME, **body},
                      timeout=30)


@pytest.mark.parametrize("body, param, fragment", [
    ({"messages": USER, "chat_template_kwargs": "enable_thinking=false"},
     "chat_template_kwargs", "must be an object"),
    ({"messages": USER, "chat_template_kwargs": {"messages": []}},
     "chat_template_kwargs", "set by the renderer itself"),
    ({"messages": USER, "chat_template_kwargs": {"enable thinking": False}},
     "chat_template_kwargs", "not a valid name"),
    ({"messages": USER, "tools": {"type": "function"}}, "tools", "must be a list"),
    ({"messages": USER, "tools": [{"function": {"name": "f"}}]}, "tools[0]", "\"function\""),
    ({"messages": USER, "tools": [{"type": "function", "function": {"description": "d"}}]},
     "tools[0].function.name", "non-empty string"),
    ({"messages": USER, "tools": [{"type": "function", "function": {"name": "f",
                                                                    "parameters": []}}]},
     "tools[0].function.parameters", "JSON Schema object"),
    ({"messages": USER, "tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice",
     "must be one of"),
    ({"messages": USER, "tools": [WEATHER], "tool_choice": {"type": "function", "function": {
        "name": "nope"}}}, "tool_choice.function.name", "not in tools"),
    ({"messages": [USER[0], {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"arguments": "{}"}}]}]},
     "messages[1].tool_calls[0]", "\"function\""),
    ({"messages": [{"role": "user", "content": "t1", "tool_calls": []}]},
     "messages[0].tool_calls", "only assistant messages"),
    ({"messages": [USER[0], {"role": "assistant", "content": "t2", "reasoning_content": 5}]},
     "messages[1].reasoning_content", "must be a string"),
])
def test_bad_template_fields_are_400s_naming_the_field(server, body, param, fragment):
    response = post(server, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and fragment in error["message"], error
    assert error["type"] == "invalid_request_error"


def test_earlier_reasoning_content_is_accepted_and_dropped_by_the_template(server, model):
    messages = USER + [{"role": "assistant", "content": "t70", "reasoning_content": "t71"},
                       {"role": "user", "content": "t72"}]
    response = post(server, {"messages": messages, "max_tokens": 4, "temperature": 0})
    assert response.status_code == 200
    assert response.json()["usage"]["prompt_tokens"] == len(model.chat_prompt(messages))


def test_a_model_without_think_tokens_answers_as_before():
    """No reasoning_content field at all, streamed or not (protocol level, no server)."""
    from llm_onnx.runtime.generation.results import Result
    from llm_onnx.serve import openai_chat
    from llm_onnx.serve.logprobs import TokenText

    model = Model.from_parts(FakeEngine([1]), fake_tokenizer(), (0,),
                             "{% for m in messages %}{{ m['content'] }}{% endfor %}")
    plan = openai_chat.chat_plan({"model": "m", "messages": [{"role": "user", "content": "Hel"}],
                                  "chat_template_kwargs": OFF}, model, "m", 64)
    assert plan.thinking is None
    body = openai_chat.response(plan, [Result("<think>x</think>y", [1], "stop", 1)],
                                TokenText(model))
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "<think>x</think>y",
                                             "refusal": None}
