"""Speculative decoding: drafted tokens checked in one run give exactly the tokens of plain
decoding (greedy and seeded sampling), in fewer runs when the drafts are right.

The references are plain decoding of the same model (scripted engines whose logits are a fixed
function of the cached tokens, so a wrong cache position changes the output) and numpy's own
softmax for the sampled distribution."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llm_onnx.errors import GenerationError
from llm_onnx.runtime import Model
from llm_onnx.runtime.generation.generator import Generator
from llm_onnx.runtime.generation.options import GenerationOptions
from llm_onnx.runtime.generation.speculative import SpeculativeOptions, Speculator, ngram_draft
from tests.runtime.fakes import HistoryEngine, MarkovEngine

ALWAYS = dict(adaptive=False, ngram_min=1)  # draft whenever any suffix recurs


def _run(model: Model, prompt: list[int], opts: GenerationOptions, speculative=None,
         batch: int = 1) -> tuple[list[int], Generator]:
    gen = Generator(model, opts, batch=batch, speculative=speculative)
    gen.append_tokens(prompt)
    for _ in gen.events():
        pass
    return gen.result().token_ids, gen


def _reference_ngram(tokens: list[int], k: int, longest: int, shortest: int) -> list[int]:
    for n in range(min(longest, len(tokens) - 1), shortest - 1, -1):
        suffix = tokens[len(tokens) - n:]
        for i in range(len(tokens) - n - 1, -1, -1):
            if tokens[i:i + n] == suffix:
                return tokens[i + n:i + n + k]
    return []


@given(st.lists(st.integers(0, 3), max_size=30), st.integers(1, 6), st.integers(1, 4),
       st.integers(1, 4))
def test_ngram_draft_is_the_continuation_of_the_latest_longest_match(tokens, k, a, b):
    longest, shortest = max(a, b), min(a, b)
    assert ngram_draft(tokens, k, longest, shortest) == \
        _reference_ngram(tokens, k, longest, shortest)


def _markov() -> Model:
    """Next-token logits from the last token only: greedy answers fall into cycles, which
    prompt lookup then drafts right."""
    return Model.from_parts(MarkovEngine(order=1), None)


def _prompt(seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    part = rng.integers(0, 40, 15).tolist()
    return part + rng.integers(0, 40, 5).tolist() + part[:6]  # the answer may repeat the prompt


@pytest.mark.parametrize("seed", range(4))
def test_greedy_with_speculation_equals_greedy_without_in_fewer_runs(seed):
    model = _markov()
    opts = GenerationOptions(max_new_tokens=80, ignore_eos=True)
    plain, g0 = _run(model, _prompt(seed), opts)
    fast, g1 = _run(model, _prompt(seed), opts, SpeculativeOptions(method="ngram", **ALWAYS))
    assert fast == plain
    assert g1.stats.verify_runs > 0 and g1.stats.accepted_tokens > 0
    runs = g1.stats.decode_runs + g1.stats.verify_runs
    assert runs == g0.stats.decode_runs - g1.stats.accepted_tokens  # each accepted token saves one
    adaptive, _ = _run(model, _prompt(seed), opts, "ngram")
    assert adaptive == plain


@pytest.mark.parametrize("seed", range(3))
def test_seeded_sampling_with_speculation_gives_the_same_tokens(seed):
    model = _markov()
    opts = GenerationOptions(max_new_tokens=60, temperature=0.7, top_p=0.95, seed=seed,
                             repetition_penalty=1.1, ignore_eos=True)
    plain, _ = _run(model, _prompt(seed), opts)
    fast, g = _run(model, _prompt(seed), opts, SpeculativeOptions(method="ngram", **ALWAYS))
    assert fast == plain and g.stats.accepted_tokens > 0
    again, _ = _run(model, _prompt(seed), opts, SpeculativeOptions(method="ngram", **ALWAYS))
    assert again == fast


class _Scripted(Speculator):
    """Drafts from a fixed function of the tokens (right or wrong on purpose)."""

    def __init__(self, propose, *args) -> None:
        super().__init__(*args)
        self.propose = propose

    def draft(self, row, tokens):
        return self.propose(list(tokens))


def _with_drafter(model: Model, opts: GenerationOptions, prompt: list[int], propose, k: int = 4):
    gen = Generator(model, opts)
    spec_opts = SpeculativeOptions(method="ngram", num_tokens=k, adaptive=False)
    gen.speculator = _Scripted(propose, spec_opts, model, 1, gen.stats)
    gen.append_tokens(prompt)
    for _ in gen.events():
        pass
    return gen.result().token_ids, gen


def test_a_drafter_that_is_always_wrong_changes_nothing():
    model = Model.from_parts(HistoryEngine(50, 256), None)
    opts = GenerationOptions(max_new_tokens=40, ignore_eos=True)
    prompt = [3, 1, 4, 1, 5]
    plain, g0 = _run(model, prompt, opts)
    # whatever the model would pick next, propose something else
    wrong, g = _with_drafter(model, opts, prompt, lambda t: [(t[-1] + 1) % 50] * 4)
    assert wrong == plain
    assert g.stats.verify_runs > 0
    assert g.stats.accepted_tokens <= g.stats.drafted_tokens // 4


def test_a_drafter_that_is_always_right_takes_one_run_per_k_plus_one_tokens():
    model = Model.from_parts(HistoryEngine(50, 256), None)
    opts = GenerationOptions(max_new_tokens=41, ignore_eos=True)
    prompt = [3, 1, 4, 1, 5]
    plain, g0 = _run(model, prompt, opts)
    full = prompt + plain

    def oracle(tokens):
        return full[len(tokens):len(tokens) + 4]

    right, g = _with_drafter(model, opts, prompt, oracle)
    assert right == plain
    assert g.stats.accepted_tokens == g.stats.drafted_tokens
    # 41 tokens: the first from the prompt's run, then 8 verify runs of 5 tokens each
    assert g.stats.verify_runs == 8 and g.stats.decode_runs == 0


def test_max_tokens_inside_an_accepted_run_and_stop_strings():
    from tests.runtime.fakes import tokenizer

    model = Model.from_parts(HistoryEngine(10, 256), tokenizer(), eos_token_ids=[0])
    prompt = [1, 2, 3, 4]
    for limit in (1, 2, 3, 6, 7, 11):
        opts = GenerationOptions(max_new_tokens=limit, ignore_eos=True)
        plain, _ = _run(model, prompt, opts)
        full = prompt + plain + [5] * 20
        right, _ = _with_drafter(model, opts, prompt,
                                 lambda t: full[len(t):len(t) + 6], k=6)
        assert right == plain and len(right) == limit
    opts = GenerationOptions(max_new_tokens=30, ignore_eos=True)
    plain, _ = _run(model, prompt, opts)
    text = model.tokenizer.decode(plain)
    stop = text[len(text) // 2:len(text) // 2 + 3]
    opts = dataclasses.replace(opts, stop=(stop,))
    expected = _run(model, prompt, opts)[1].result()
    full = prompt + plain
    got = _with_drafter(model, opts, prompt, lambda t: full[len(t):len(t) + 6], k=6)[1].result()
    assert (got.text, got.token_ids, got.finish_reason) == \
        (expected.text, expected.token_ids, expected.finish_reason)
    assert got.finish_reason == "stop_string"


def test_rewind_after_speculation_continues_like_plain():
    model = _markov()
    opts = GenerationOptions(max_new_tokens=50, ignore_eos=True)
    prompt = _prompt(1)
    for speculative in (None, SpeculativeOptions(method="ngram", **ALWAYS)):
        gen = Generator(model, opts, speculative=speculative)
        gen.append_tokens(prompt)
        for _ in range(20):
            gen.step()
        gen.rewind(7)
        for _ in gen.events():
            pass
        if speculative is None:
            reference = gen.tokens()
        else:
            assert gen.tokens() == reference


def test_ragged_rows_speculating_together_equal_each_alone():
    model = _markov()
    opts = GenerationOptions(max_new_tokens=40, ignore_eos=True)
    prompts = [_prompt(s) for s in range(3)]
    alone = [_run(model, p, opts)[0] for p in prompts]
    gen = Generator(model, opts, batch=3,
                    speculative=SpeculativeOptions(method="ngram", max_rows=3, **ALWAYS))
    gen.append_tokens(prompts[0], row=0)
    for _ in range(5):
        gen.step()
    gen.append_tokens(prompts[1], row=1)
    gen.step()
    gen.append_tokens(prompts[2], row=2)
    for _ in gen.events():
        pass
    assert [gen.result(r).token_ids for r in range(3)] == alone
    assert gen.stats.verify_runs > 0


def test_above_max_rows_rows_decode_together():
    model = _markov()
    opts = GenerationOptions(max_new_tokens=20, ignore_eos=True)
    gen = Generator(model, opts, batch=2,
                    speculative=SpeculativeOptions(method="ngram", max_rows=1, **ALWAYS))
    gen.append_tokens(_prompt(0), row=0)
    gen.append_tokens(_prompt(1), row=1)
    for _ in gen.events():
        pass
    assert gen.stats.verify_runs == 0


def test_first_sampled_token_after_a_draft_follows_the_models_distribution():
    """A verify run's first pick, over 3,000 seeds, against numpy's softmax of the same logits
    (chi-square, 1e-3 significance): accepting a draft only when the sample agrees with it
    leaves the distribution as it is."""
    model = Model.from_parts(MarkovEngine(vocab_size=8, scale=1.0), None)
    prompt = [1, 2, 3, 1, 2]
    opts = GenerationOptions(max_new_tokens=2, temperature=1.0, ignore_eos=True)
    first = _run(model, prompt, dataclasses.replace(opts, seed=0))[0][0]
    cache = model.engine.new_cache(1, 16)
    model.engine.prefill(cache, 0, prompt + [first])
    logits = model.engine.logits(cache, 0).astype(np.float64)
    p = np.exp(logits - logits.max())
    p /= p.sum()
    counts = np.zeros(8)
    n = 3000
    for seed in range(n):
        o = dataclasses.replace(opts, seed=seed)
        toks, g = _with_drafter(model, o, prompt, lambda t: [int(np.argmax(p))], k=1)
        if toks[0] == first:
            counts[toks[1]] += 1
    total = counts.sum()
    assert total > 200
    expected = p * total
    big = expected >= 5  # the rest pooled into one bin
    observed = np.append(counts[big], counts[~big].sum())
    expected = np.append(expected[big], expected[~big].sum())
    keep = expected > 0
    statistic = float((((observed - expected) ** 2)[keep] / expected[keep]).sum())
    critical = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32}
    assert statistic < critical[int(keep.sum()) - 1]  # chi-square, 1e-3 significance


def test_bad_speculative_options_are_one_line_errors():
    model = _markov()
    for bad, fragment in (("sometimes", "not one of"),
                          (SpeculativeOptions(method="ngram", num_tokens=0), "1 to 32"),
                          (SpeculativeOptions(method="draft"), "needs a draft model")):
        with pytest.raises(GenerationError, match=fragment):
            Generator(model, speculative=bad)


def test_a_folder_that_cannot_verify_is_refused_when_asked_and_decodes_plainly_by_default():
    engine = MarkovEngine()
    engine.verifies = False
    engine.cannot_verify = lambda: "old.onnx: re-export it"
    model = Model.from_parts(engine, None)
    with pytest.raises(GenerationError, match="re-export"):
        Generator(model, speculative="ngram")
    model.speculative = SpeculativeOptions(method="ngram")
    model.speculative_is_default = True
    assert Generator(model).speculator is None
