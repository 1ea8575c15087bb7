"""Chat templates rendered by the runtime (Jinja, no transformers) against transformers'
``apply_chat_template``: Qwen3's real template over many conversations, the helpers templates
call (raise_exception, strftime_now, tojson), template variables and tools.

tests/fixtures/chat_templates/qwen3.jinja is the ``chat_template`` of Qwen/Qwen3-8B's
tokenizer_config.json (the hub revision 895c8d171bc03c30e113cd7a28c02494b5e068b7 has it). No hub
is reachable here, so the text was taken byte for byte from the copy TRL keeps to recognise
Qwen3 tokenizers by string equality (github.com/huggingface/trl, trl/chat_templates/qwen3.jinja,
"Original Qwen3 chat template", commit f44cf20bd8c9), and checked against the ``chat_template``
of another Qwen3 tokenizer_config.json (Qwen3-4B-Thinking-2507: identical up to its generation
prompt, which always opens ``<think>``). No trailing newline, as in the JSON string.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest

from llm_onnx.errors import GenerationError
from llm_onnx.runtime.chat.render import render_chat, template_variables

QWEN3 = (Path(__file__).parents[1] / "fixtures" / "chat_templates" / "qwen3.jinja").read_text(
    encoding="utf-8")
# Qwen3's tokenizer_config.json: no BOS token, <|im_end|> ends turns, <|endoftext|> pads.
QWEN3_SPECIAL = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city (°C).",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "Local time.",
                                         "parameters": {"type": "object", "properties": {}}}}

USER = {"role": "user", "content": "What is the capital of France?"}
THOUGHT = {"role": "assistant",
           "content": "<think>\nThe user asks about France.\n</think>\n\nParis."}
CONVERSATIONS = {
    "user": [USER],
    "system": [{"role": "system", "content": "Be brief."}, USER],
    "multi-turn": [{"role": "system", "content": "Be brief."}, USER,
                   {"role": "assistant", "content": "Paris."},
                   {"role": "user", "content": "And of Germany? ¿Y España? 日本は？"}],
    # An earlier answer's think block is dropped from the history...
    "earlier think": [USER, THOUGHT, {"role": "user", "content": "And Germany?"}],
    "two earlier thinks": [USER, THOUGHT, {"role": "user", "content": "And Germany?"},
                           {"role": "assistant", "content": "<think>Easy.</think>Berlin."},
                           {"role": "user", "content": "Thanks"}],
    # ...but the last turn's is kept (rendering a finished conversation).
    "last think": [USER, THOUGHT],
    "reasoning_content": [USER, {"role": "assistant", "content": "Paris.",
                                 "reasoning_content": "\nFrance's capital.\n"}],
    "reasoning alias": [USER, {"role": "assistant", "content": "Paris.", "reasoning": "Known."}],
    "think without newlines": [USER, {"role": "assistant", "content": "<think>x</think>y"}],
    "system later": [USER, {"role": "system", "content": "Now answer in French."}],
    "tool round trip": [
        {"role": "system", "content": "You help with weather."},
        {"role": "user", "content": "Weather in Paris and the time?"},
        {"role": "assistant", "content": "<think>\nTwo tools.\n</think>\n\nLet me check.",
         "tool_calls": [
             {"id": "c1", "type": "function",
              "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
             {"id": "c2", "type": "function",
              "function": {"name": "get_time", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 21}"},
        {"role": "tool", "tool_call_id": "c2", "content": "14:05"},
    ],
    "tool call, content null": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "assistant", "content": "It is sunny."},
        {"role": "user", "content": "<tool_response>\nnot really a tool\n</tool_response>"},
    ],
}


@pytest.fixture(scope="module")
def hf_tokenizer():
    """A transformers tokenizer carrying Qwen3's template and special tokens (the vocabulary does
    not matter for rendering)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"x": 0}, unk_token="x")),
        chat_template=QWEN3, **QWEN3_SPECIAL)


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("generation_prompt", [True, False])
@pytest.mark.parametrize("variables", [{}, {"enable_thinking": False}, {"enable_thinking": True}],
                         ids=["default", "no-think", "think"])
@pytest.mark.parametrize("tools", [None, [WEATHER, TIME]], ids=["no-tools", "tools"])
def test_qwen3_renders_as_transformers(hf_tokenizer, name, generation_prompt, variables, tools):
    messages = CONVERSATIONS[name]
    ours = render_chat(QWEN3, messages, QWEN3_SPECIAL, generation_prompt, tools=tools,
                       **variables)
    theirs = hf_tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                              add_generation_prompt=generation_prompt,
                                              **variables)
    assert ours == theirs


def test_qwen3_drops_earlier_thinking_and_switches_it_off():
    """What the comparison above covers, spelled out once."""
    text = render_chat(QWEN3, CONVERSATIONS["earlier think"], QWEN3_SPECIAL)
    assert "<think>" not in text and "<|im_start|>assistant\nParis.<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
    off = render_chat(QWEN3, CONVERSATIONS["earlier think"], QWEN3_SPECIAL, enable_thinking=False)
    assert off == text + "<think>\n\n</think>\n\n"
    tools = render_chat(QWEN3, [USER], QWEN3_SPECIAL, tools=[WEATHER])
    assert '"description": "Current weather in a city (°C)."' in tools  # tojson keeps non-ASCII


def test_template_variables_of_qwen3():
    assert {"enable_thinking", "tools", "messages", "add_generation_prompt"} <= \
        template_variables(QWEN3)
    assert "raise_exception" not in template_variables("{{ raise_exception('x') }}")


# ------------------------------------------------------------------ helpers templates call

def _theirs(template: str, messages=(USER,)) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    return render_jinja_template([list(messages)], chat_template=template)[0][0]


def test_raise_exception_is_our_error_with_the_templates_message():
    template = "{% if messages[0].role != 'system' %}{{ raise_exception('Conversations must " \
               "start with a system message.') }}{% endif %}"
    with pytest.raises(GenerationError, match="Conversations must start with a system message."):
        render_chat(template, [USER], {})
    from jinja2.exceptions import TemplateError

    with pytest.raises(TemplateError, match="Conversations must start with a system message."):
        _theirs(template)


def test_strftime_now_is_todays_date_as_in_transformers():
    template = "Today: {{ strftime_now('%d %B %Y') }}"
    before = datetime.datetime.now().strftime("%d %B %Y")
    ours, theirs = render_chat(template, [USER], {}), _theirs(template)
    after = datetime.datetime.now().strftime("%d %B %Y")
    assert ours in (f"Today: {before}", f"Today: {after}")
    assert theirs in (f"Today: {before}", f"Today: {after}")


@pytest.mark.parametrize("expression", [
    "messages | tojson",
    "{'city': 'Zürich', 'note': '<b>&</b>', 'n': [1, 2.5, none, true]} | tojson",
    "{'b': 1, 'a': {'z': 'é'}} | tojson(indent=2)",
    "{'b': 1, 'a': 'ü'} | tojson(sort_keys=true)",
    "{'b': 1, 'a': 'ü'} | tojson(separators=(',', ':'))",
    "'日本' | tojson(ensure_ascii=true)",
])
def test_tojson_keeps_non_ascii_and_takes_jsons_options(expression):
    template = "{{ " + expression + " }}"
    messages = [{"role": "user", "content": "Grüß dich, 世界"}]
    ours = render_chat(template, messages, {})
    assert ours == _theirs(template, messages)
    if "ensure_ascii" not in expression:
        assert "\\u" not in ours  # Jinja's own tojson would escape and HTML-quote


# ------------------------------------------------------------------ variables and messages

@pytest.mark.parametrize("variables, fragment", [
    ({"messages": []}, "set by the renderer itself"),
    ({"add_generation_prompt": False}, "set by the renderer itself"),
    ({"enable-thinking": False}, "not a valid name"),
    ({1: True}, "not a valid name"),
])
def test_bad_template_variables_are_one_line_errors(variables, fragment):
    from llm_onnx.runtime.chat.render import check_template_vars

    with pytest.raises(GenerationError, match=fragment):
        check_template_vars(variables)


def test_variables_override_special_tokens_as_in_transformers(hf_tokenizer):
    template = "{{ eos_token }}|{{ flavour }}"
    ours = render_chat(template, [USER], QWEN3_SPECIAL, eos_token="<END>", flavour="mint")
    assert ours == "<END>|mint"
    assert hf_tokenizer.apply_chat_template([USER], chat_template=template, tokenize=False,
                                            eos_token="<END>", flavour="mint") == ours


def test_a_message_needs_content_unless_it_calls_tools():
    with pytest.raises(GenerationError, match="'role' and 'content'"):
        render_chat(QWEN3, [{"role": "user"}], QWEN3_SPECIAL)
    with pytest.raises(GenerationError, match="'role' and 'content'"):
        render_chat(QWEN3, [{"role": "user", "content": None}], QWEN3_SPECIAL)
    render_chat(QWEN3, CONVERSATIONS["tool call, content null"], QWEN3_SPECIAL)
