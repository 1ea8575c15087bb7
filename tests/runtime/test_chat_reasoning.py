"""A reasoning model's reply, thinking apart from the answer, and a chat session whose template
rewrites earlier turns (Qwen3 drops an earlier answer's <think> block).

The model is tests/thinking_model.py: a tiny Qwen3 with Qwen3's real chat template whose every
reply opens with ``<think> t20 </think>``; after that the random model answers on its own.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm_onnx.errors import GenerationError
from llm_onnx.runtime import ChatPiece, Model
from llm_onnx.runtime.chat.dialects.think import (
    ReasoningSplitter,
    has_think_tokens,
    opens_thought,
    split_reasoning,
)
from tests.runtime.fakes import FakeEngine
from tests.runtime.fakes import tokenizer as fake_tokenizer
from tests.runtime.test_runtime_models import hf_greedy_run
from tests.thinking_model import END_THINK, FIRST_THOUGHT, THINK

USER = [{"role": "user", "content": "t30 t31 t32"}]
NEW = 8


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


# ------------------------------------------------------------------ splitting text

def reference(text: str, thinking: bool) -> tuple[str | None, str]:
    """The split of a whole reply, written plainly (see llm_onnx/runtime/chat/dialects/think.py)."""
    if not thinking:
        rest = text.lstrip()
        if not rest.startswith("<think>"):
            return None, text
        text = rest[len("<think>"):]
    reasoning, closed, answer = text.partition("</think>")
    return reasoning.strip("\n"), answer.lstrip("\n") if closed else ""


@pytest.mark.parametrize("text, thinking, expected", [
    ("<think>\nLet me see.\n</think>\n\nParis.", False, ("Let me see.", "Paris.")),
    ("  \n<think>x</think>y", False, ("x", "y")),
    ("Paris.", False, (None, "Paris.")),
    ("Paris. <think>no</think>", False, (None, "Paris. <think>no</think>")),  # not at the start
    ("\n\nParis.", False, (None, "\n\nParis.")),  # no block: the answer as it came
    ("Let me see.\n</think>\n\nParis.", True, ("Let me see.", "Paris.")),  # DeepSeek-R1's prompt
    ("<think>\nStill thinking when the tokens ran out", False,
     ("Still thinking when the tokens ran out", "")),
    ("<think>\n\n</think>\n\nParis.", False, ("", "Paris.")),
    ("<think>a</think>b</think>c", False, ("a", "b</think>c")),
    ("", False, (None, "")),
    ("", True, ("", "")),
])
def test_split_reasoning(text, thinking, expected):
    assert split_reasoning(text, thinking) == expected == reference(text, thinking)


PARTS = st.sampled_from(["<think>", "</think>", "<thi", "nk>", "</th", "\n", "\n\n", " ", "a",
                         "b c", "<", "é", "</think >"])


@settings(max_examples=400, deadline=None)
@given(st.lists(PARTS, max_size=10), st.booleans(), st.randoms(use_true_random=False))
def test_any_split_of_the_stream_gives_the_same_reasoning_and_answer(parts, thinking, rng):
    text = "".join(parts)
    cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(0, 5))))
    splitter, pieces, start = ReasoningSplitter(thinking), [], 0
    for cut in cuts + [len(text)]:
        pieces += splitter.push(text[start:cut])
        start = cut
    pieces += splitter.flush()
    reasoning, answer = reference(text, thinking)
    assert (splitter.reasoning, splitter.answer) == (reasoning, answer)
    assert "".join(p for p in pieces if p.reasoning) == (reasoning or "")
    assert "".join(p for p in pieces if not p.reasoning) == answer
    assert all(isinstance(p, ChatPiece) and p for p in pieces)


def test_where_a_reply_starts_is_read_off_the_prompt():
    assert not opens_thought("<|im_start|>assistant\n")
    assert opens_thought("<｜Assistant｜><think>\n")  # DeepSeek-R1
    assert not opens_thought("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # thinking off
    assert not opens_thought("...<think>a</think>...<|im_start|>assistant\n")


def test_think_tokens_must_be_tokens_that_decode_as_text(thinking_model):
    assert has_think_tokens(Model.load(thinking_model[1]).tokenizer)
    assert not has_think_tokens(fake_tokenizer()) and not has_think_tokens(None)
    special = fake_tokenizer()
    special.add_special_tokens(["<think>", "</think>"])  # skipped when decoding: cannot split
    assert not has_think_tokens(special)


# ------------------------------------------------------------------ a model without think tokens

def test_a_model_without_think_tokens_chats_as_before():
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    model = Model.from_parts(FakeEngine([1, 2, 3, 4, 0]), fake_tokenizer(), eos_token_ids=(0,),
                             chat_template=template)
    messages = [{"role": "user", "content": "Hel"}]
    assert not model.splits_reasoning
    result = model.chat(messages)
    plain = model.generate(model.chat_prompt(messages))
    assert (result.text, result.token_ids, result.reasoning) == (plain.text, plain.token_ids, None)
    assert "reasoning" not in result.to_dict()
    pieces = list(model.stream_chat(messages))
    assert pieces == list(model.stream(model.chat_prompt(messages)))
    assert not any(p.reasoning for p in pieces) and "".join(pieces) == "Hello world"


# ------------------------------------------------------------------ the thinking model

@pytest.fixture(scope="module")
def model(thinking_model):
    return Model.load(thinking_model[1], provider="cpu", threads=1)


def test_chat_returns_the_thinking_apart_from_the_answer(model, thinking_model):
    hf = thinking_model[0]
    result = model.chat(USER, max_new_tokens=NEW, temperature=0)
    tokens, reason = hf_greedy_run(hf, model.chat_prompt(USER), NEW, model.eos_token_ids)
    assert (result.token_ids, result.finish_reason) == (tokens, reason)
    assert result.token_ids[:3] == [THINK, FIRST_THOUGHT, END_THINK]
    raw = model.generate(model.chat_prompt(USER), max_new_tokens=NEW, temperature=0).text
    assert raw.startswith(" <think> t20 </think>")  # the word decoder's space before a word
    assert (result.reasoning, result.text) == split_reasoning(raw)
    assert result.reasoning.strip() == "t20" and "think>" not in result.text and result.text
    assert result.to_dict()["reasoning"] == result.reasoning


def test_stream_chat_marks_the_thinking_pieces(model):
    result = model.chat(USER, max_new_tokens=NEW, temperature=0)
    pieces = list(model.stream_chat(USER, max_new_tokens=NEW, temperature=0))
    assert all(isinstance(p, ChatPiece) for p in pieces)
    assert "".join(p for p in pieces if p.reasoning) == result.reasoning
    assert "".join(p for p in pieces if not p.reasoning) == result.text
    kinds = [p.reasoning for p in pieces]
    assert kinds == sorted(kinds, reverse=True)  # thinking first, then the answer


def test_enable_thinking_false_reaches_the_template(model, thinking_model):
    off = {"enable_thinking": False}
    prompt = model.chat_prompt(USER, template_vars=off)
    assert prompt[-2:] == [THINK, END_THINK] and prompt[:-2] == model.chat_prompt(USER)
    result = model.chat(USER, template_vars=off, max_new_tokens=NEW, temperature=0)
    tokens, _ = hf_greedy_run(thinking_model[0], prompt, NEW, model.eos_token_ids)
    assert result.token_ids == tokens and THINK not in tokens
    plain = model.generate(prompt, max_new_tokens=NEW, temperature=0)
    assert result.reasoning is None and result.text == plain.text
    pieces = list(model.stream_chat(USER, template_vars=off, max_new_tokens=NEW, temperature=0))
    assert "".join(pieces) == result.text and not any(p.reasoning for p in pieces)


def test_a_prompt_that_opens_the_block_makes_the_reply_reasoning_first(model):
    """DeepSeek-R1's way: the template opens <think>, the reply closes it."""
    model = Model.from_parts(model.engine, model.tokenizer, model.eos_token_ids,
                             "{{ messages[0]['content'] }} <think>", model.special_tokens)
    messages = [{"role": "user", "content": "t40 t41"}]
    result = model.chat(messages, max_new_tokens=NEW, temperature=0)
    raw = model.generate(model.chat_prompt(messages), max_new_tokens=NEW, temperature=0).text
    assert (result.reasoning, result.text) == split_reasoning(raw, thinking=True)
    assert result.reasoning == raw.partition("</think>")[0].strip("\n")


@pytest.mark.parametrize("template_vars, bad", [
    ({"messages": []}, "set by the renderer itself"),
    ("enable_thinking=false", "must be a dict"),
    ({"enable thinking": False}, "not a valid name"),
])
def test_bad_template_vars_are_one_line_errors(model, template_vars, bad):
    with pytest.raises(GenerationError, match=bad):
        model.chat(USER, template_vars=template_vars, max_new_tokens=2)
    with pytest.raises(GenerationError, match=bad):
        model.chat_session(template_vars=template_vars)


def test_tools_reach_the_template(model):
    tool = {"type": "function", "function": {"name": "t99", "parameters": {}}}
    text = model.render_chat(USER, tools=[tool])
    assert '{"type": "function", "function": {"name": "t99", "parameters": {}}}' in text
    assert model.chat_prompt(USER, tools=[tool]) != model.chat_prompt(USER)
    with pytest.raises(GenerationError, match="'tools' must be a list"):
        model.chat(USER, tools=tool)


# ------------------------------------------------------------------ the session's cache

def test_a_session_reuses_only_the_prefix_the_rewritten_history_keeps(model):
    """Turn 1's cache holds prompt 1 + <think> t20 </think> + the answer. Qwen3 renders that
    answer without its think block in turn 2's prompt, so the cache is cut back to prompt 1 (the
    true common prefix) and only the rest runs; the answer equals a fresh chat of the whole
    conversation."""
    session = model.chat_session()
    first = session.send("t30 t31 t32", max_new_tokens=NEW, temperature=0)
    prompt1 = model.chat_prompt(USER)
    assert first.token_ids[:3] == [THINK, FIRST_THOUGHT, END_THINK]
    assert first.reasoning.strip() == "t20" and "think>" not in first.text
    assert session.messages[-1] == {"role": "assistant", "content": first.text,
                                    "reasoning_content": first.reasoning}
    cached = prompt1 + first.token_ids[:-1]  # the last token picked was never run

    second = session.send("t40 t41", max_new_tokens=NEW, temperature=0)
    prompt2 = model.chat_prompt(session.messages[:-1])
    assert THINK not in prompt2  # the earlier think block is gone from the history
    reused = common_prefix(cached, prompt2)
    assert reused == len(prompt1)  # it diverges right at the earlier <think>
    assert second.prompt_tokens == len(prompt2)
    assert second.timings.prefill_tokens == len(prompt2) - reused
    fresh = model.chat(session.messages[:-1], max_new_tokens=NEW, temperature=0)
    assert (second.token_ids, second.text, second.reasoning) == \
        (fresh.token_ids, fresh.text, fresh.reasoning)

    third = session.send("t50", max_new_tokens=NEW, temperature=0)
    prompt3 = model.chat_prompt(session.messages[:-1])
    cached = prompt2 + second.token_ids[:-1]
    assert third.timings.prefill_tokens == len(prompt3) - common_prefix(cached, prompt3)
    assert third.token_ids == model.chat(session.messages[:-1], max_new_tokens=NEW,
                                         temperature=0).token_ids


def test_a_session_without_thinking_cuts_the_empty_block_of_the_prompt(model):
    """enable_thinking=False: turn 1's prompt ends with an empty <think></think> that turn 2's
    history does not repeat; the cache is cut back to just before it."""
    off = {"enable_thinking": False}
    session = model.chat_session(template_vars=off)
    first = session.send("t30 t31 t32", max_new_tokens=NEW, temperature=0)
    assert first.reasoning is None and session.messages[-1] == {"role": "assistant",
                                                                 "content": first.text}
    prompt1 = model.chat_prompt(USER, template_vars=off)
    second = session.send("t40 t41", max_new_tokens=NEW, temperature=0)
    prompt2 = model.chat_prompt(session.messages[:-1], template_vars=off)
    assert second.timings.prefill_tokens == len(prompt2) - (len(prompt1) - 2)
    fresh = model.chat(session.messages[:-1], template_vars=off, max_new_tokens=NEW,
                       temperature=0)
    assert second.token_ids == fresh.token_ids


def test_session_streams_mark_thinking_and_reset_forgets(model):
    session = model.chat_session(system="t60")
    pieces = list(session.stream("t30 t31 t32", max_new_tokens=NEW, temperature=0))
    assert "".join(p for p in pieces if p.reasoning) == session.last.reasoning
    assert "".join(p for p in pieces if not p.reasoning) == session.last.text
    session.reset()
    assert session.messages == [{"role": "system", "content": "t60"}]
    again = session.send("t30 t31 t32", max_new_tokens=NEW, temperature=0)
    assert again.timings.prefill_tokens == again.prompt_tokens  # nothing reused after reset
