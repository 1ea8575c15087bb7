"""SmolLM3's chat template through the runtime: rendered as transformers renders it, its
``/think`` and ``/no_think`` switches, its tools (Hermes' ``<tool_call>`` blocks), a reply's
thinking and tool calls read back, and a chat session and the batching scheduler on the
exported smollm3_tiny.

tests/fixtures/chat_templates/smollm3.jinja is the chat template of HuggingFaceTB/SmolLM3-3B
(Apache-2.0), the revision whose tools block also reads ``tools`` (HF's chat_template.jinja,
"Update chat_template.jinja", a169fa4). No hub is reachable here, so the text is the copy
Hugging Face's swift-jinja keeps in its integration tests (github.com/huggingface/swift-jinja,
Apache-2.0, Tests/JinjaTests/IntegrationTests.swift, commit c1ef596 "Support SmolLM3 chat
templates"), with the Swift string's escapes and indentation undone; the copy starts at its
second line (the ``{# defaults #}`` comment of the hub file is not in it, which renders
nothing). Compared by hand with mistral.rs' copy (chat_templates/smollm3.jinja, the first
release: tools only from ``xml_tools``, no ``{% generation %}``) and with the first lines of the
hub file: the same text up to indentation and those differences. The first release's tools
block is rebuilt from it below (``FIRST_RELEASE``) to test the ``xml_tools`` rule.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from tokenizers import Tokenizer

from llm_onnx.runtime import Model
from llm_onnx.runtime.chat.dialects import detect_tool_dialect, tool_dialect
from llm_onnx.runtime.chat.dialects.think import split_reasoning, thinking_mode
from llm_onnx.runtime.chat.render import render_chat
from tests.byte_model import EOS, save_byte_tokenizer
from tests.runtime.fakes import FakeEngine

TEMPLATE_FILE = Path(__file__).parents[1] / "fixtures" / "chat_templates" / "smollm3.jinja"
SMOLLM3 = TEMPLATE_FILE.read_text(encoding="utf-8")
# SmolLM3's tokenizer_config.json: <|im_end|> ends turns (eos); no BOS in the template
SPECIAL = {"eos_token": "<|im_end|>", "pad_token": "<|finetune_right_pad_id|>"}
# The first release's tools block: tools only from xml_tools (model card: xml_tools=...)
FIRST_RELEASE = SMOLLM3.replace(
    "{%- if xml_tools or python_tools or tools -%}", "{%- if xml_tools or python_tools -%}"
).replace("{%- if xml_tools or tools -%}\n{%- if tools -%}\n{%- set xml_tools = tools -%}\n"
          "{%- endif -%}", "{%- if xml_tools -%}")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city (°C).",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"], "additionalProperties": False}}}
USER = {"role": "user", "content": "What is the weather in Paris?"}
CONVERSATIONS = {
    "user": [USER],
    "system": [{"role": "system", "content": "Be brief."}, USER],
    "system think": [{"role": "system", "content": "Be brief. /think"}, USER],
    "system no_think": [{"role": "system", "content": "/no_think Be brief."}, USER],
    "override": [{"role": "system", "content": "Only this. /system_override"}, USER],
    "multi-turn": [USER, {"role": "assistant", "content": "\n<think>\nHm.\n</think>\nSunny."},
                   {"role": "user", "content": "And in Zürich? 日本は？"}],
    "tool round trip": [
        USER, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 21}"}],
}


@pytest.fixture(scope="module")
def hf_tokenizer():
    """transformers' tokenizer carrying SmolLM3's template (the vocabulary does not matter)."""
    from tokenizers import models
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"x": 0}, unk_token="x")),
        chat_template=SMOLLM3, **SPECIAL)


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("generation_prompt", [True, False])
@pytest.mark.parametrize("variables", [{}, {"enable_thinking": False}, {"enable_thinking": True}],
                         ids=["default", "no-think", "think"])
@pytest.mark.parametrize("tools", [None, [WEATHER]], ids=["no-tools", "tools"])
def test_smollm3_renders_as_transformers(hf_tokenizer, name, generation_prompt, variables, tools):
    messages = CONVERSATIONS[name]
    ours = render_chat(SMOLLM3, messages, SPECIAL, generation_prompt, tools=tools, **variables)
    theirs = hf_tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                              add_generation_prompt=generation_prompt,
                                              **variables)
    assert ours == theirs


def test_the_think_switches():
    """enable_thinking sets the mode; /think or /no_think in the system message overrides it
    and is taken out of the instructions. Without thinking the prompt closes an empty block."""
    def prompt(messages, **variables):
        text = render_chat(SMOLLM3, messages, SPECIAL, **variables)
        return text, thinking_mode(text)

    text, mode = prompt([USER])
    assert "Reasoning Mode: /think\n" in text and text.endswith("<|im_start|>assistant\n")
    assert mode == "optional"  # the reply may open <think> itself
    text, mode = prompt([USER], enable_thinking=False)
    assert "Reasoning Mode: /no_think\n" in text and mode == "none"
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n")
    text, mode = prompt(CONVERSATIONS["system no_think"], enable_thinking=True)
    assert mode == "none" and "Reasoning Mode: /no_think\n" in text
    assert "Be brief.\n\n" in text and "/no_think Be" not in text
    text, mode = prompt(CONVERSATIONS["system think"], enable_thinking=False)
    assert mode == "optional" and "Reasoning Mode: /think\n" in text
    assert "\n\nBe brief.\n\n" in text and "Be brief. /think" not in text


def test_tools_are_listed_and_the_format_is_hermes():
    assert detect_tool_dialect(SMOLLM3) == detect_tool_dialect(FIRST_RELEASE) == "hermes"
    text = render_chat(SMOLLM3, [USER], SPECIAL, tools=[WEATHER])
    assert f"<tools>\n{WEATHER}\n</tools>" in text  # as the template writes them: Python's str
    assert '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n' \
           '</tool_call>\n\n<|im_end|>' in text


def test_the_first_release_gets_tools_as_xml_tools(hf_tokenizer):
    """Its template reads xml_tools only: OpenAI-style tools are passed under that name (what
    its model card does by hand), which renders as transformers renders xml_tools=..."""
    ours = render_chat(FIRST_RELEASE, [USER], SPECIAL, tools=[WEATHER])
    theirs = hf_tokenizer.apply_chat_template([USER], chat_template=FIRST_RELEASE, tokenize=False,
                                              add_generation_prompt=True, xml_tools=[WEATHER])
    assert ours == theirs == render_chat(SMOLLM3, [USER], SPECIAL, tools=[WEATHER])
    assert str(WEATHER) not in render_chat(FIRST_RELEASE, [USER], SPECIAL)
    # a caller's own xml_tools win
    assert "get_time" in render_chat(FIRST_RELEASE, [USER], SPECIAL, tools=[WEATHER],
                                     xml_tools=[{"name": "get_time"}])


REPLY = ("<think>\nThe user wants Paris.\n</think>\n"
         "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
         "</tool_call>")


def test_a_reply_reads_back_into_thinking_and_a_call():
    reasoning, answer = split_reasoning(REPLY, thinking=False)
    assert reasoning == "The user wants Paris."
    content, calls, complete = tool_dialect("hermes").parse(answer)
    assert content == "" and complete
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather",
                                                                   {"city": "Paris"})]
    stream = tool_dialect("hermes").stream()
    deltas = [d for i in range(0, len(answer), 5) for d in stream.push(answer[i:i + 5])]
    deltas += stream.finish()
    assert "".join(d.arguments for d in deltas if not isinstance(d, str)) == calls[0].arguments


class ChainEngine(FakeEngine):
    """Logits that follow the row's last token: ``chain[last]`` gets the top logit; otherwise
    (and where the constraint forbids it) the end of turn is best, then a closing quote, and
    whitespace is worst, so a forced JSON call closes rather than pads (a logit tie picks the
    lowest id, which would be whitespace)."""

    def __init__(self, chain: dict[int, int]) -> None:
        super().__init__([0], context_length=2048)
        self.vocab_size, self.chain = 272, chain
        self.base = np.zeros(272, np.float32)
        self.base[EOS], self.base[BYTE + ord('"')] = 10.0, 1.0
        self.base[[BYTE + ord(c) for c in " \t\n\r"]] = -5.0

    def logits(self, cache, row: int) -> np.ndarray:
        out = self.base.copy()
        last = cache.held(row)[-1]
        if last in self.chain:
            out[self.chain[last]] = 20.0
        return out


BYTE = 9  # the byte tokenizer's id of byte 0 (after its 9 added tokens)


@pytest.mark.parametrize("thinking", [True, False], ids=["think", "no-think"])
def test_chat_thinks_then_calls_a_tool(tmp_path, thinking):
    """After the prompt the model wants <think> h m </think>, then to stop: tool_choice
    "required" holds it to a call of get_weather with valid arguments, read back apart from the
    thinking. With thinking off the prompt has closed the block, so none is allowed and the
    call comes at once."""
    save_byte_tokenizer(tmp_path, think=True)
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    think, end, h, m = (tok.token_to_id(t) for t in ("<think>", "</think>", "h", "m"))
    newline = BYTE + ord("\n")  # both prompts end with a newline
    engine = ChainEngine({newline: think, think: h, h: m, m: end})
    model = Model.from_parts(engine, tok, (EOS,), SMOLLM3, SPECIAL)
    assert model.splits_reasoning and model.tool_format == "hermes"
    r = model.chat([USER], tools=[WEATHER], tool_choice="required", max_new_tokens=300,
                   template_vars={"enable_thinking": thinking})
    assert r.finish_reason == "stop" and len(r.tool_calls) == 1, r
    assert r.tool_calls[0].name == "get_weather"
    jsonschema.validate(json.loads(r.tool_calls[0].arguments),
                        WEATHER["function"]["parameters"])
    if thinking:
        assert r.reasoning == "hm" and r.token_ids[:4] == [think, h, m, end]
    else:
        assert r.reasoning is None and think not in r.token_ids


# ------------------------------------------------------------------ on the exported model

def test_a_session_on_smollm3_equals_fresh_chats(tiny_export):
    """Two turns over smollm3_tiny (word tokenizer) with SmolLM3's template, thinking off: the
    second turn runs only what its cache lacks and answers as a fresh chat of the whole
    conversation does."""
    model = Model.load(tiny_export("smollm3_tiny", "fp32"), provider="cpu", threads=1,
                       chat_template=TEMPLATE_FILE)
    off = {"enable_thinking": False}
    session = model.chat_session(system="t40 t41", template_vars=off)
    session.send("t30 t31 t32", max_new_tokens=6, temperature=0)
    second = session.send("t50 t51", max_new_tokens=6, temperature=0)
    assert second.timings.prefill_tokens < second.prompt_tokens
    fresh = model.chat(session.messages[:-1], template_vars=off, max_new_tokens=6, temperature=0)
    assert second.token_ids == fresh.token_ids


def test_the_scheduler_on_smollm3_equals_transformers(tiny_hf, tiny_export):
    """Requests joining a running batch at different steps (rows at different positions, the
    NoPE layer among them) each give transformers' greedy tokens."""
    from llm_onnx.runtime import GenerationOptions
    from llm_onnx.runtime.generation.scheduler import Scheduler
    from tests.runtime.test_runtime_models import hf_greedy_run

    hf, _ = tiny_hf("smollm3_tiny")
    model = Model.load(tiny_export("smollm3_tiny", "fp32"), provider="cpu", threads=1)
    rng = np.random.default_rng(8)
    prompts = [rng.integers(0, 256, n).tolist() for n in (9, 3, 6)]
    opts = GenerationOptions(max_new_tokens=6, temperature=0.0).validated()
    scheduler = Scheduler(model, max_batch=3, max_length=64)
    requests = []
    for prompt in prompts:
        requests.append(scheduler.submit(prompt, opts))
        scheduler.step()
        scheduler.step()
    while scheduler.step():
        pass
    for prompt, request in zip(prompts, requests):
        result = request.result()
        assert (result.token_ids, result.finish_reason) == hf_greedy_run(
            hf, prompt, 6, model.eos_token_ids)
