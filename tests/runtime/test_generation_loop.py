"""The generation loop against a fake engine with fixed logits (no ONNX file): stopping rules,
determinism, batching, errors."""

from __future__ import annotations

import numpy as np
import pytest

from llm_onnx.errors import GenerationError
from llm_onnx.runtime import GenerationOptions, Model
from tests.runtime.fakes import EOS, FakeEngine, tokenizer


def model(script, context=64, eos=(EOS,)):
    return Model.from_parts(FakeEngine(script, context), tokenizer(), eos_token_ids=eos)


def test_max_new_tokens_is_respected():
    r = model([7]).generate([1, 2], max_new_tokens=5)
    assert r.token_ids == [7] * 5 and r.finish_reason == "length" and r.text == "xxxxx"


def test_eos_stops_and_is_not_printed():
    r = model([1, 2, EOS, 7]).generate([1], max_new_tokens=10)
    assert r.token_ids == [1, 2, EOS] and r.text == "Hello" and r.finish_reason == "stop"


def test_stop_token_ids_option():
    r = model([1, 2, 9, 7]).generate([1], max_new_tokens=10, stop_token_ids=[9])
    assert r.token_ids == [1, 2, 9] and r.finish_reason == "stop" and r.text == "Hello"


def test_stop_string_split_across_tokens():
    r = model([1, 2, 5, 6, 7]).generate([1], max_new_tokens=10, stop=["</stop>"])
    assert r.text == "Hello" and r.finish_reason == "stop_string"
    assert r.token_ids == [1, 2, 5, 6]


def test_partial_stop_string_is_released():
    r = model([5, 3, 4]).generate([1], max_new_tokens=3, stop=["</stop>"])
    assert r.text == "</s world" and r.finish_reason == "length"


def test_streaming_concatenates_to_the_text():
    m = model([1, 2, 3, 4, EOS])
    pieces = list(m.stream([1], max_new_tokens=10))
    assert "".join(pieces) == "Hello world" and all(pieces)


def test_temperature_zero_is_argmax():
    rng = np.random.default_rng(0)
    script = [rng.standard_normal(10).astype(np.float32) for _ in range(8)]
    for s in script:
        s[EOS] = -100
    r = model(script).generate([1], max_new_tokens=8, temperature=0)
    assert r.token_ids == [int(np.argmax(s)) for s in script]


def test_same_seed_same_output_and_seeds_differ():
    flat = np.zeros(10, np.float32)
    flat[EOS] = -100
    a = model([flat]).generate([1], max_new_tokens=30, temperature=1.0, seed=3)
    b = model([flat]).generate([1], max_new_tokens=30, temperature=1.0, seed=3)
    c = model([flat]).generate([1], max_new_tokens=30, temperature=1.0, seed=4)
    assert a.token_ids == b.token_ids and a.token_ids != c.token_ids


def test_batch_rows_finish_independently():
    m = model([[1, 7], [EOS, 7], [2, 7]])
    a, b = m.generate([[1, 2, 3], [4]], max_new_tokens=3)
    assert a.token_ids == [1] + [EOS] and a.finish_reason == "stop"
    assert b.token_ids == [7, 7, 7] and b.finish_reason == "length"
    assert a.prompt_tokens == 3 and b.prompt_tokens == 1


def test_prefill_then_one_token_per_step():
    """A prompt of several tokens runs alone over its row; a one-token prompt joins the batched
    decode at once; from then on one run per step decodes every row."""
    engine = FakeEngine([7])
    Model.from_parts(engine, tokenizer()).generate([[1, 2, 3], [4]], max_new_tokens=4)
    assert engine.calls == [("prefill", 0, [1, 2, 3]),
                            ("decode", 2, [0, 1]), ("decode", 2, [0, 1]), ("decode", 2, [0, 1]),
                            ("decode", 1, [1])]  # row 0 has finished: row 1 runs alone


def test_prompt_longer_than_context_names_the_limit():
    with pytest.raises(GenerationError, match="the prompt has 70 tokens but the model's context is 64"):
        model([7]).generate([1] * 70)


def test_answer_is_cut_at_the_context():
    r = model([7], context=10).generate([1] * 8, max_new_tokens=50)
    assert len(r.token_ids) == 2 and r.finish_reason == "length"


@pytest.mark.parametrize("kwargs, fragment", [
    ({"max_new_tokens": -1}, "max_new_tokens"),
    ({"temperature": -1}, "temperature"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -1}, "top_k"),
    ({"min_p": 1.0}, "min_p"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"no_such_option": 1}, "unknown generation option"),
])
def test_bad_options_are_one_line_errors(kwargs, fragment):
    with pytest.raises(GenerationError) as e:
        model([7]).generate([1], **kwargs)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_max_new_tokens_0_generates_nothing():
    r = model([7]).generate([1, 2], max_new_tokens=0)
    assert (r.token_ids, r.text, r.finish_reason, r.prompt_tokens) == ([], "", "length", 2)


@pytest.mark.parametrize("prompt", ["", [], [99]])
def test_bad_prompts(prompt):
    with pytest.raises(GenerationError):
        model([7]).generate(prompt)


def test_a_lone_surrogate_in_a_prompt_is_a_one_line_error():
    """Python strings may hold lone surrogates (e.g. from surrogateescape); the tokenizer raised
    a TypeError on them (found by the hypothesis test in tests/security)."""
    with pytest.raises(GenerationError, match=r"character 2 is a lone surrogate") as e:
        model([7]).generate("ab\ud800c")
    assert "\n" not in str(e.value)


def test_options_object_and_overrides():
    opts = GenerationOptions(max_new_tokens=2)
    assert len(model([7]).generate([1], opts).token_ids) == 2
    assert len(model([7]).generate([1], opts, max_new_tokens=3).token_ids) == 3
