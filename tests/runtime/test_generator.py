"""The public step-wise Generator: append_tokens / generate_next_token / is_done / rewind,
continuing a sequence, logprobs; then rows of real tiny models decoding together give the tokens
(and logits) of solo runs."""

from __future__ import annotations

import numpy as np
import pytest

from llm_onnx.errors import GenerationError
from llm_onnx.runtime import Engine, GenerationOptions, Generator, Model
from tests.conftest import FAMILY_ARCHS, TINY_ARCHS
from tests.runtime.batching import together_and_alone
from tests.runtime.fakes import EOS, FakeEngine, HistoryEngine, tokenizer


def history_model() -> Model:
    return Model.from_parts(HistoryEngine(50, 128), None)


def greedy(n: int) -> GenerationOptions:
    return GenerationOptions(max_new_tokens=n, temperature=0.0)


def test_engines_and_caches_implement_the_protocols(tiny_export):
    from llm_onnx.runtime.core.engine_protocol import EngineProtocol
    from llm_onnx.runtime.core.state import CacheProtocol

    for engine in (Engine(tiny_export("llama_tiny", "fp32")), FakeEngine([1]), HistoryEngine()):
        assert isinstance(engine, EngineProtocol)
        assert isinstance(engine.new_cache(2, 8), CacheProtocol)


def test_step_by_step_equals_generate():
    model = Model.from_parts(FakeEngine([1, 2, 3, 4, EOS]), tokenizer(), eos_token_ids=[EOS])
    gen = Generator(model, greedy(10))
    gen.append_tokens([7, 7])
    pieces, ids = [], []
    while not gen.is_done():
        event = gen.generate_next_token()
        pieces.append(event.text)
        ids.append(event.token_id)
    assert ids == [1, 2, 3, 4, EOS] and "".join(pieces) == "Hello world"
    assert event.finish_reason == "stop"
    again = Model.from_parts(FakeEngine([1, 2, 3, 4, EOS]), tokenizer(), eos_token_ids=[EOS])
    assert again.generate([7, 7], max_new_tokens=10).token_ids == ids


def test_rewind_then_continue_regenerates_the_same_greedy_tokens():
    model = history_model()
    gen = model.generator(greedy(8))
    gen.append_tokens([3, 4, 5])
    first = [gen.generate_next_token().token_id for _ in range(8)]
    assert gen.is_done()
    gen.rewind(3)
    assert gen.tokens() == [3, 4, 5] + first[:5] and not gen.is_done()
    cache = model.engine.caches[0]
    assert cache.length_of(0) == 7  # the last kept token runs again: its logits were dropped
    again = [gen.generate_next_token().token_id for _ in range(3)]
    assert again == first[5:] and gen.is_done()


def test_rewind_into_the_prompt_and_branch():
    model = history_model()
    gen = model.generator(greedy(4))
    gen.append_tokens([3, 4, 5, 6])
    while not gen.is_done():
        gen.generate_next_token()
    gen.rewind(4 + 1)  # every generated token and one prompt token
    assert gen.tokens() == [3, 4, 5]
    gen.append_tokens([9, 9])
    while not gen.is_done():
        gen.generate_next_token()
    prefills = [c for c in model.engine.calls if c[0] == "prefill"]
    assert prefills[-1] == ("prefill", 0, [4, 5, 9, 9])  # 3 was kept in the cache
    assert gen.tokens()[5:] == model.generate([3, 4, 5, 9, 9], greedy(4)).token_ids


def test_appending_continues_the_sequence():
    model = history_model()
    gen = model.generator(greedy(3))
    gen.append_tokens([1, 2, 3])
    while not gen.is_done():
        gen.generate_next_token()
    answer = gen.tokens()[3:]
    gen.append_tokens([20, 21])
    while not gen.is_done():
        gen.generate_next_token()
    assert gen.tokens() == [1, 2, 3] + answer + [20, 21] + gen.result().token_ids
    assert gen.result().token_ids == model.generate([1, 2, 3] + answer + [20, 21],
                                                    greedy(3)).token_ids
    assert gen.result().timings.prefill_tokens == 3  # the last answer token and the new two


@pytest.mark.parametrize("call, fragment", [
    (lambda g: g.generate_next_token(), "append_tokens first"),
    (lambda g: g.append_tokens([]), "at least one token"),
    (lambda g: g.append_tokens([1, 50]), "outside the vocabulary"),
    (lambda g: g.append_tokens([1] * 128), "context is 128"),
    (lambda g: g.rewind(1), "append_tokens first"),
    (lambda g: g.append_tokens([1], row=3), "outside this generator's 1 rows"),
])
def test_misuse_is_a_one_line_error(call, fragment):
    with pytest.raises(GenerationError, match=fragment) as e:
        call(history_model().generator(greedy(3)))
    assert "\n" not in str(e.value)


def test_a_finished_sequence_says_so():
    gen = history_model().generator(greedy(1))
    gen.append_tokens([1])
    gen.generate_next_token()
    with pytest.raises(GenerationError, match=r"finished \(length\)"):
        gen.generate_next_token()
    with pytest.raises(GenerationError, match="cannot rewind 5 tokens of a sequence of 2"):
        gen.rewind(5)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return x - (x.max() + np.log(np.exp(x - x.max()).sum()))


def test_logprobs_are_the_log_softmax_of_the_models_logits(tiny_export):
    """Every generated token's logprob and top alternatives against logits the engine computes
    for the same tokens from scratch (a fresh cache and one prefill per position)."""
    model = Model.load(tiny_export("qwen3_tiny", "fp32"), provider="cpu")
    prompt = [5, 17, 99, 3]
    gen = model.generator(GenerationOptions(max_new_tokens=6, temperature=1.0, seed=3))
    gen.append_tokens(prompt, logprobs=5)
    events = []
    while not gen.is_done():
        events.append(gen.generate_next_token())
    engine = model.engine
    tokens = gen.tokens()
    for i, event in enumerate(events):
        cache = engine.new_cache(1, len(tokens))
        ref = _log_softmax(engine.prefill(cache, 0, tokens[:len(prompt) + i]))
        lp = event.logprob
        assert lp.token_id == event.token_id == tokens[len(prompt) + i]
        assert lp.logprob == pytest.approx(ref[lp.token_id], abs=1e-4)
        order = np.argsort(-ref, kind="stable")[:5]
        assert [t for t, _ in lp.top] == order.tolist()
        assert [v for _, v in lp.top] == pytest.approx(ref[order].tolist(), abs=1e-4)
    assert gen.result().logprobs == [e.logprob for e in events]


@pytest.mark.parametrize("arch", TINY_ARCHS + FAMILY_ARCHS)
def test_rows_decoding_together_equal_solo_runs(arch, tiny_export):
    """8 prompts of 1 to 20 tokens through a 3-row scheduler with 6-token chunks (rows join and
    leave between steps, prompts are cut into chunks, idle rows ride along): every answer's
    tokens equal its solo run, and every token's logprob (the model's logits) agrees within
    fp32 tolerance. Covers RoPE, ALiBi (bloom), learned positions (gpt2), sliding windows
    (mistral) and MoE."""
    model = Model.load(tiny_export(arch, "fp32"), provider="cpu")
    vocab = model.engine.vocab_size
    rng = np.random.default_rng(11)
    prompts = [rng.integers(0, vocab, int(n)).tolist() for n in (1, 20, 5, 13, 2, 9, 17, 4)]
    lengths = [int(n) for n in rng.integers(3, 16, len(prompts))]
    options = [GenerationOptions(max_new_tokens=n, temperature=0.0, ignore_eos=True).validated()
               for n in lengths]
    for together, alone in together_and_alone(model, prompts, options, max_batch=3,
                                              max_length=48, prefill_chunk=6):
        assert together.token_ids == alone.token_ids
        assert [lp.logprob for lp in together.logprobs] == pytest.approx(
            [lp.logprob for lp in alone.logprobs], abs=1e-4)


def test_device_pointer_binding_of_a_middle_row(tiny_export):
    """A row in the middle of the batched buffer, prefilled alone through its pointer and then
    decoded with its neighbours, leaves the neighbours' positions untouched."""
    engine = Engine(tiny_export("llama_tiny", "fp32"))
    cache = engine.new_cache(3, 16)
    engine.prefill(cache, 0, [1, 2, 3])
    before = [cache.host_view(i)[0].copy() for i in range(2)]
    engine.prefill(cache, 1, [4, 5])
    after = [cache.host_view(i)[0] for i in range(2)]
    assert all(np.array_equal(a, b) for a, b in zip(before, after))
    assert not cache.host_view(0)[2].any()  # row 2 never written
    logits = engine.decode(cache, np.array([7, 8, 0]), np.array([True, True, False]))
    assert logits.shape == (3, engine.vocab_size)
    assert cache.lengths.tolist() == [4, 3, 0]
    single = engine.new_cache(1, 16)
    engine.prefill(single, 0, [4, 5])
    alone = engine.decode(single, np.array([8]))
    np.testing.assert_allclose(logits[1], alone[0], atol=1e-5)


def test_a_step_of_every_row_equals_the_masked_step_and_refuses_a_full_cache(tiny_export):
    """Engine.decode's path for a range whose rows all run (no masks) gives what the masked path
    gives for the same rows (a third, inactive row in the range forces that one), and refuses a
    row with no room left as the masked path does."""
    engine = Engine(tiny_export("llama_tiny", "fp32"))
    fast, masked = engine.new_cache(3, 8), engine.new_cache(3, 8)
    for cache in (fast, masked):
        engine.prefill(cache, 0, [1, 2, 3])
        engine.prefill(cache, 1, [4, 5])
    for step in range(4):
        a = engine.decode(fast, np.array([6 + step, 9 + step]))
        b = engine.decode(masked, np.array([6 + step, 9 + step, 0]), np.array([True, True, False]))
        np.testing.assert_allclose(a, b[:2], rtol=1e-5, atol=1e-5)
        assert list(fast.lengths[:2]) == list(masked.lengths[:2]) == [4 + step, 3 + step]
    engine.decode(fast, np.array([1, 1]))  # row 0 now holds all 8 positions
    errors = []
    for cache, active in ((fast, None), (masked, np.array([True, True, False]))):
        tokens = np.array([1, 1]) if active is None else np.array([1, 1, 0])
        if active is not None:
            engine.decode(cache, np.array([1, 1, 0]), active)
        with pytest.raises(GenerationError, match="holds 8 positions but 9 are needed") as e:
            engine.decode(cache, tokens, active)
        errors.append(str(e.value))
    assert errors[0] == errors[1]
    assert list(fast.lengths[:2]) == [8, 7]


def test_the_engine_counts_the_host_time_between_decode_runs(tiny_export):
    """decode_gap_s is the time between consecutive decode runs (here a known sleep of the host
    each step), decode_run_s the runs themselves; a prefill between two steps is not a gap."""
    import time

    engine = Engine(tiny_export("llama_tiny", "fp32"))
    cache = engine.new_cache(1, 32)
    engine.prefill(cache, 0, [1, 2, 3])
    began = time.perf_counter()
    for i in range(5):
        engine.decode(cache, np.array([4 + i]))
        if i < 4:
            time.sleep(0.005)
    wall = time.perf_counter() - began
    assert engine.decode_gaps == 4
    assert 4 * 0.005 <= engine.decode_gap_s < wall - engine.decode_run_s + 1e-6
    assert 0 < engine.decode_run_s < wall
    engine.prefill(cache, 0, [9, 9])  # a run between: the next step starts a new series
    engine.decode(cache, np.array([1]))
    assert engine.decode_gaps == 4
    engine.decode(cache, np.array([2]))
    assert engine.decode_gaps == 5
