"""Tool calls in the runtime: each format parses its vendor's documented examples (written out
here as text), the format is read off chat templates, and on the tiny byte-level model with a
Hermes tools template (given as a file, as --chat-template gives it) "required", a named
function and "auto" produce calls whose arguments validate (jsonschema) whatever the weights;
streamed deltas put together equal the whole reply's calls. A reasoning model thinks freely
before its constrained answer."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from tokenizers import Tokenizer

from llm_onnx.runtime import Model
from llm_onnx.runtime.chat import dialects
from llm_onnx.runtime.chat.dialects import detect_tool_dialect, tool_dialect
from llm_onnx.runtime.chat.dialects.base import ChatPiece, ToolCallDelta
from llm_onnx.runtime.chat.request import collect_calls
from llm_onnx.runtime.structured.constraint import ConstraintError
from tests.byte_model import HERMES_TEMPLATE, save_byte_tokenizer
from tests.runtime.fakes import FakeEngine
from tests.thinking_model import QWEN3_TEMPLATE

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
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOL_CALL_TOKEN = 3  # <tool_call> in tests/byte_model.py


# ------------------------------------------------------------------ vendors' examples

VENDOR_EXAMPLES = [
    # Qwen's function-calling guide (Qwen2.5 / Qwen3, Hermes style), two parallel calls
    ("hermes", '<tool_call>\n{"name": "get_current_temperature", "arguments": {"location": '
               '"San Francisco, CA, USA"}}\n</tool_call>\n<tool_call>\n{"name": '
               '"get_temperature_date", "arguments": {"location": "San Francisco, CA, USA", '
               '"date": "2024-10-01"}}\n</tool_call>',
     "", [("get_current_temperature", {"location": "San Francisco, CA, USA"}),
          ("get_temperature_date", {"location": "San Francisco, CA, USA",
                                    "date": "2024-10-01"})]),
    # Hermes 2 Pro's model card: arguments before the name
    ("hermes", '<tool_call>\n{"arguments": {"symbol": "TSLA"}, "name": '
               '"get_stock_fundamentals"}\n</tool_call>',
     "", [("get_stock_fundamentals", {"symbol": "TSLA"})]),
    # text before a call
    ("hermes", 'Let me look that up.\n<tool_call>\n{"name": "get_weather", "arguments": '
               '{"city": "Paris"}}\n</tool_call>',
     "Let me look that up.", [("get_weather", {"city": "Paris"})]),
    # Llama 3.1's prompt-format page, JSON-based tool calling
    ("llama3_json", '{"name": "get_current_conditions", "parameters": {"location": '
                    '"San Francisco, CA", "unit": "Fahrenheit"}}',
     "", [("get_current_conditions", {"location": "San Francisco, CA", "unit": "Fahrenheit"})]),
    ("llama3_json", '<|python_tag|>{"name": "get_current_conditions", "parameters": '
                    '{"location": "Menlo Park, CA"}}; {"name": "get_time", "parameters": {}}',
     "", [("get_current_conditions", {"location": "Menlo Park, CA"}), ("get_time", {})]),
    ("llama3_json", "The capital of France is Paris.", "The capital of France is Paris.", []),
    # Mistral's function-calling docs (v3 tokenizer)
    ("mistral", '[TOOL_CALLS] [{"name": "get_current_weather", "arguments": {"location": '
                '"Paris, France", "format": "celsius"}}]',
     "", [("get_current_weather", {"location": "Paris, France", "format": "celsius"})]),
    # Phi-4-mini
    ("phi4_mini", '<|tool_call|>[{"name": "get_weather_updates", "arguments": {"city": '
                  '"London"}}]<|/tool_call|>',
     "", [("get_weather_updates", {"city": "London"})]),
]


@pytest.mark.parametrize("name, text, content, calls", VENDOR_EXAMPLES)
def test_vendor_examples_parse_whole_and_streamed(name, text, content, calls):
    check_whole_and_streamed(tool_dialect(name), text, content, calls)


def check_whole_and_streamed(fmt, text: str, content: str, calls: list) -> None:
    """``text`` parses into ``content`` and ``calls`` (name, arguments as JSON) whole, and
    streamed in pieces of any size into the same content and calls."""
    got_content, got, complete = fmt.parse(text)
    assert got_content == content and complete
    assert [(c.name, json.loads(c.arguments)) for c in got] == calls
    for size in (1, 3, 7):  # streamed in pieces of any size: the same content and calls
        stream = fmt.stream()
        items = []
        for i in range(0, len(text), size):
            items += stream.push(text[i:i + size])
        items += stream.finish()
        assert "".join(i for i in items if isinstance(i, str)) == content
        deltas = [i for i in items if isinstance(i, ToolCallDelta)]
        assert [(c.name, c.arguments) for c in collect_calls(deltas)] == \
            [(c.name, c.arguments) for c in got]


def test_mistral_call_ids_are_nine_alphanumerics():
    _, calls, _ = tool_dialect("mistral").parse(VENDOR_EXAMPLES[6][1])
    assert len(calls[0].id) == 9 and calls[0].id.isalnum()
    _, calls, _ = tool_dialect("hermes").parse(VENDOR_EXAMPLES[0][1])
    assert calls[0].id.startswith("call_") and calls[0].id != calls[1].id


@pytest.mark.parametrize("template, name", [
    (HERMES_TEMPLATE.read_text(), "hermes"),
    (QWEN3_TEMPLATE.read_text(), "hermes"),
    ("{{ bos_token }}{% for m in messages %}{% if m.tool_calls %}[TOOL_CALLS] "
     "{{ m.tool_calls | tojson }}{% endif %}{% endfor %}", "mistral"),
    ("{% for m in messages %}<|{{ m.role }}|>{% if tools %}<|tool|>{{ tools | tojson }}"
     "<|/tool|>{% endif %}{% endfor %}", "phi4_mini"),
    ("{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>{% if tools %}"
     "{\"name\": function name, \"parameters\": dictionary of argument name and its value}"
     "{% endif %}{% endfor %}", "llama3_json"),
    ("{% for m in messages %}{{ m.content }}{% endfor %}", None),
])
def test_the_format_is_read_off_the_template(template, name):
    assert detect_tool_dialect(template) == name


# ------------------------------------------------------------------ on a model

@pytest.fixture(scope="module")
def model(byte_model_folder):
    return Model.load(byte_model_folder, provider="cpu", threads=1, chat_template=HERMES_TEMPLATE)


def check_calls(calls, names=None):
    assert calls
    for call in calls:
        assert call.name in (names or SCHEMAS)
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])


@pytest.mark.parametrize("seed", range(4))
def test_required_calls_validate_at_temperature_one(model, seed):
    r = model.chat(USER, tools=TOOLS, tool_choice="required", temperature=1.0, seed=seed,
                   max_new_tokens=400)
    assert r.finish_reason == "stop" and r.text == ""
    check_calls(r.tool_calls)


def test_a_named_function_is_called_once(model):
    choice = {"type": "function", "function": {"name": "add"}}
    for seed in range(3):
        r = model.chat(USER, tools=TOOLS, tool_choice=choice, temperature=1.0, seed=seed,
                       max_new_tokens=300)
        assert r.finish_reason == "stop" and len(r.tool_calls) == 1
        check_calls(r.tool_calls, ["add"])


def test_auto_constrains_a_call_once_the_model_opens_one(model):
    # The model is pushed to open a call at once (logit_bias); from there the grammar holds.
    r = model.chat(USER, tools=TOOLS, logit_bias={TOOL_CALL_TOKEN: 50.0}, temperature=1.0,
                   seed=2, max_new_tokens=300, parallel_tool_calls=False)
    assert r.finish_reason == "stop" and len(r.tool_calls) == 1
    check_calls(r.tool_calls)
    # Banned from opening one, it answers in text
    r = model.chat(USER, tools=TOOLS, logit_bias={TOOL_CALL_TOKEN: -100.0}, max_new_tokens=20)
    assert r.tool_calls == [] and r.text and "<tool_call>" not in r.text


def test_streamed_deltas_equal_the_whole_reply(model):
    kwargs = dict(tools=TOOLS, tool_choice="required", temperature=0.0, max_new_tokens=400,
                  parallel_tool_calls=False)
    whole = model.chat(USER, **kwargs)
    assert whole.finish_reason == "stop"
    items = list(model.stream_chat(USER, **kwargs))
    assert "".join(i for i in items if isinstance(i, ChatPiece)) == whole.text
    streamed = collect_calls([i for i in items if isinstance(i, ToolCallDelta)])
    assert [(c.name, c.arguments) for c in streamed] == \
        [(c.name, c.arguments) for c in whole.tool_calls]


def test_a_call_cut_short_is_left_out_of_the_whole_reply(model):
    r = model.chat(USER, tools=TOOLS, tool_choice="required", max_new_tokens=30)
    assert r.finish_reason == "length" and r.tool_calls == []
    streamed = [i for i in model.stream_chat(USER, tools=TOOLS, tool_choice="required",
                                             max_new_tokens=30) if isinstance(i, ToolCallDelta)]
    assert streamed and streamed[0].name  # the stream had begun it: its deltas went out


def test_a_second_turn_after_a_tool_result(model):
    first = model.chat(USER, tools=TOOLS, tool_choice="required", max_new_tokens=400,
                       parallel_tool_calls=False)
    call = first.tool_calls[0]
    messages = USER + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "22 degrees"}]
    prompt = model.render_chat(messages, tools=TOOLS)
    assert f'"name": "{call.name}", "arguments": {json.dumps(json.loads(call.arguments), ensure_ascii=False)}' \
        in prompt and "<tool_response>\n22 degrees\n</tool_response>" in prompt
    second = model.chat(messages, tools=TOOLS, tool_choice="none", max_new_tokens=10)
    assert second.tool_calls is None and second.finish_reason in ("stop", "length")


def test_bad_tool_requests(model):
    with pytest.raises(ConstraintError, match="tools\\[0\\].function.parameters.uniqueItems"):
        model.chat(USER, tools=[{"type": "function", "function": {
            "name": "f", "parameters": {"type": "array", "uniqueItems": True,
                                        "minItems": 2}}}],
            tool_choice="required")
    with pytest.raises(ConstraintError, match="not in tools"):
        model.chat(USER, tools=TOOLS, tool_choice={"type": "function",
                                                   "function": {"name": "nope"}})
    with pytest.raises(ConstraintError, match="no tools are given"):
        model.chat(USER, tool_choice="required")
    with pytest.raises(ConstraintError, match="named twice"):
        model.chat(USER, tools=[WEATHER, WEATHER])


def test_the_worked_example_of_a_new_dialect_works(byte_model_folder, monkeypatch):
    """docs/chat.md's Acme dialect, run as the page writes it: one module, one registry line,
    and a template that writes <calls> gets its grammar, its reader and its name."""
    page = (Path(__file__).parents[2] / "docs" / "chat.md").read_text()
    [module] = [block for block in re.findall(r"```python\n(.*?)```", page, re.S)
                if "class Acme(TaggedCalls)" in block]
    scope: dict = {}
    exec(compile(module, "acme.py", "exec"), scope)
    registry = dict(dialects.TOOL_DIALECTS)
    order = [*list(registry)[:2], "acme", *list(registry)[2:]]  # before hermes, as the page says
    registry["acme"] = scope["Acme"]
    monkeypatch.setattr(dialects, "TOOL_DIALECTS", {name: registry[name] for name in order})
    template = HERMES_TEMPLATE.read_text().replace("tool_call>", "calls>")
    assert detect_tool_dialect(template) == "acme" and "acme" in dialects.choosable_tool_dialects()
    text = 'Sure.\n<calls>[{"name": "add", "arguments": {"a": 1, "b": 2}}]</calls>'
    check_whole_and_streamed(tool_dialect("acme"), text, "Sure.", [("add", {"a": 1, "b": 2})])
    acme = Model.load(byte_model_folder, provider="cpu", threads=1, chat_template=template)
    assert acme.tool_format == "acme"
    r = acme.chat(USER, tools=TOOLS, tool_choice="required", temperature=1.0, seed=0,
                  max_new_tokens=400)
    assert r.finish_reason == "stop" and r.text == ""
    check_calls(r.tool_calls)


# ------------------------------------------------------------------ a reasoning model

def test_a_reasoning_model_thinks_freely_then_answers_under_the_constraint(tmp_path):
    """Scripted logits: <think> h m </think>, then end-of-sequence forever. The think block
    stays free; the answer is held to the schema (the model's wish to stop waits for it)."""
    save_byte_tokenizer(tmp_path, think=True)
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    think, end = tok.token_to_id("<think>"), tok.token_to_id("</think>")
    h, m = tok.token_to_id("h"), tok.token_to_id("m")
    engine = FakeEngine([think, h, m, end, 2], context_length=512)
    engine.vocab_size = 272
    template = json.loads((tmp_path / "tokenizer_config.json").read_text())["chat_template"]
    model = Model.from_parts(engine, tok, (2,), template)
    assert model.splits_reasoning
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    r = model.chat(USER, json_schema=schema, max_new_tokens=500)
    assert r.reasoning == "hm" and r.finish_reason == "stop", r
    jsonschema.validate(json.loads(r.text), schema)
    assert np.array(r.token_ids[:4]).tolist() == [think, h, m, end]
