"""GenerationOptions validation, filter_logits and the batched Sampler, against fixed logits."""

from __future__ import annotations

import collections
import math
import subprocess
import sys
import types

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm_onnx.errors import GenerationError
from llm_onnx.runtime.generation.options import GenerationOptions
from llm_onnx.runtime.generation.sampling import Sampler, filter_logits

V = 64


def fixed_logits(batch: int = 1, vocab: int = V, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.0, 2.0, size=(batch, vocab)).astype(np.float32)


def draw(options: GenerationOptions, logits: np.ndarray, steps: int, observe: bool = False) -> np.ndarray:
    sampler = Sampler(options, logits.shape[0], logits.shape[1], [[] for _ in range(logits.shape[0])])
    out = []
    for _ in range(steps):
        ids = sampler(logits)
        if observe:
            sampler.observe(ids)
        out.append(ids)
    return np.stack(out)


def kept(logits: np.ndarray, **options: object) -> set[int]:
    return set(np.flatnonzero(np.isfinite(filter_logits(logits, GenerationOptions(**options)))).tolist())


# ---------------------------------------------------------------------------------------------
# Determinism and greedy
# ---------------------------------------------------------------------------------------------


def test_same_seed_same_tokens_over_many_steps() -> None:
    logits = fixed_logits(batch=3)
    options = GenerationOptions(temperature=1.0, top_p=0.95, seed=1234)
    a = draw(options, logits, 300)
    b = draw(options, logits, 300)
    assert a.dtype == np.int64 and a.shape == (300, 3)
    np.testing.assert_array_equal(a, b)


def test_different_seeds_differ() -> None:
    logits = fixed_logits()
    a = draw(GenerationOptions(temperature=1.0, seed=1), logits, 100)
    b = draw(GenerationOptions(temperature=1.0, seed=2), logits, 100)
    assert not np.array_equal(a, b)


def test_temperature_zero_is_argmax_with_ties_to_lowest_id() -> None:
    logits = fixed_logits(batch=4)
    logits[2, [5, 9, 40]] = 100.0  # a tie: the lowest id wins
    ids = draw(GenerationOptions(temperature=0.0, top_k=3, top_p=0.5), logits, 1)[0]
    expected = [int(np.argmax(logits[0])), int(np.argmax(logits[1])), 5, int(np.argmax(logits[3]))]
    np.testing.assert_array_equal(ids, expected)


def test_caller_array_is_not_modified() -> None:
    logits = fixed_logits(batch=2)
    before = logits.copy()
    options = GenerationOptions(
        temperature=0.7,
        top_k=5,
        top_p=0.9,
        min_p=0.05,
        repetition_penalty=1.5,
        presence_penalty=1.0,
        frequency_penalty=0.5,
        seed=0,
    )
    sampler = Sampler(options, 2, V, [[1, 2, 3], [4]])
    for _ in range(5):
        sampler.observe(sampler(logits))
    np.testing.assert_array_equal(logits, before)


def test_greedy_skips_nan_and_falls_back_when_penalties_leave_nothing() -> None:
    logits = np.full((1, 4), -np.inf, dtype=np.float32)
    logits[0, 0] = np.nan
    logits[0, 2] = 1.0
    assert draw(GenerationOptions(), logits, 1)[0, 0] == 2
    # A huge repetition penalty drives the only finite logit to -inf; the raw argmax is used.
    huge = np.array([[-1e38, -np.inf]], dtype=np.float32)
    sampler = Sampler(GenerationOptions(repetition_penalty=1e10), 1, 2, [[0]])
    assert sampler(huge)[0] == 0


def test_all_minus_inf_row_is_a_generation_error() -> None:
    sampler = Sampler(GenerationOptions(temperature=1.0), 1, 3, [[]])
    with pytest.raises(GenerationError, match="row 0"):
        sampler(np.full((1, 3), -np.inf, dtype=np.float32))


# ---------------------------------------------------------------------------------------------
# top-k, top-p, min-p
# ---------------------------------------------------------------------------------------------


def test_top_k_keeps_exactly_the_k_largest() -> None:
    logits = fixed_logits()[0]
    top5 = set(np.argsort(-logits)[:5].tolist())
    assert kept(logits, temperature=1.0, top_k=5) == top5


def test_top_k_keeps_ties_with_the_kth() -> None:
    logits = np.array([3.0, 1.0, 2.0, 2.0, 0.0], dtype=np.float32)
    assert kept(logits, temperature=1.0, top_k=2) == {0, 2, 3}


def test_top_k_sampling_stays_in_the_top_k_and_reaches_all_of_them() -> None:
    logits = fixed_logits(vocab=1000)
    logits[0, [10, 200, 500, 999]] = [8.0, 8.2, 7.9, 8.1]  # comparable, far above the rest
    ids = draw(GenerationOptions(temperature=1.0, top_k=4, seed=7), logits, 2000)[:, 0]
    assert set(ids.tolist()) == {10, 200, 500, 999}


def test_top_k_larger_than_vocab_is_off() -> None:
    logits = fixed_logits()[0]
    assert kept(logits, temperature=1.0, top_k=V + 10) == set(range(V))


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x.astype(np.float64) - x.max())
    return e / e.sum()


def _nucleus(logits: np.ndarray, p: float) -> set[int]:
    """Reference: sort everything, take the shortest prefix whose mass reaches p."""
    probs = _softmax(logits)
    order = np.argsort(-probs)
    cumulative = np.cumsum(probs[order])
    size = int(np.searchsorted(cumulative, p)) + 1
    assert cumulative[size - 1] >= p and (size == 1 or cumulative[size - 2] < p)
    return set(order[:size].tolist())


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    logits = fixed_logits(vocab=500, seed=3)[0]
    for p in (0.05, 0.3, 0.5, 0.9, 0.99):
        assert kept(logits, temperature=1.0, top_p=p) == _nucleus(logits, p), p


def test_top_p_on_a_flat_distribution_sorts_past_the_first_guess() -> None:
    # Nearly flat (distinct values): the nucleus has thousands of tokens, more than the first guess.
    logits = np.random.default_rng(1).permutation(np.arange(20_000, dtype=np.float32) * -1e-4)
    for p in (0.3, 0.9):
        expected = _nucleus(logits, p)
        assert len(expected) > 2000
        assert kept(logits, temperature=1.0, top_p=p) == expected


def test_top_p_keeps_ties_with_the_last_token_kept() -> None:
    logits = np.zeros(4, dtype=np.float32)
    assert kept(logits, temperature=1.0, top_p=0.5) == {0, 1, 2, 3}


def test_top_p_applies_to_the_top_k_distribution_renormalised() -> None:
    logits = np.log(np.array([0.4, 0.3, 0.2, 0.1], dtype=np.float32))
    # Among the top 2 (0.4, 0.3), 0.4/0.7 = 0.57 < 0.6 so both are needed.
    assert kept(logits, temperature=1.0, top_k=2, top_p=0.6) == {0, 1}
    assert kept(logits, temperature=1.0, top_p=0.6) == {0, 1}
    assert kept(logits, temperature=1.0, top_k=2, top_p=0.55) == {0}


def test_top_p_uses_probabilities_after_temperature() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.2], dtype=np.float32))
    assert kept(logits, temperature=1.0, top_p=0.75) == {0, 1}
    assert kept(logits, temperature=0.1, top_p=0.75) == {0}  # sharper: 0.5 alone is ~0.99


def test_min_p_drops_tokens_below_min_p_times_p_max() -> None:
    logits = fixed_logits(vocab=300, seed=5)[0]
    probs = _softmax(logits)
    for min_p in (0.01, 0.1, 0.5, 0.9):
        expected = set(np.flatnonzero(probs >= min_p * probs.max()).tolist())
        assert kept(logits, temperature=1.0, min_p=min_p) == expected
    assert kept(logits, temperature=1.0, min_p=0.0) == set(range(300))


def test_filters_combine_and_sampling_respects_them() -> None:
    logits = fixed_logits(vocab=200, seed=9)
    options = GenerationOptions(temperature=0.8, top_k=20, top_p=0.8, min_p=0.05, seed=3)
    allowed = kept(logits[0], temperature=0.8, top_k=20, top_p=0.8, min_p=0.05)
    assert 1 < len(allowed) <= 20
    assert set(draw(options, logits, 500)[:, 0].tolist()) <= allowed


def test_filter_logits_values_and_shapes() -> None:
    logits = fixed_logits(batch=2)
    out = filter_logits(logits, GenerationOptions(temperature=0.5))
    assert out.shape == logits.shape and out.dtype == np.float32
    np.testing.assert_allclose(out, (logits - logits.max(axis=1, keepdims=True)) / 0.5, rtol=1e-6)
    greedy = filter_logits(logits[0], GenerationOptions())
    assert list(np.flatnonzero(np.isfinite(greedy))) == [int(np.argmax(logits[0]))]


def test_sampling_frequencies_follow_the_distribution() -> None:
    probs = np.array([0.5, 0.25, 0.125, 0.125])
    logits = np.log(probs).astype(np.float32)[None, :]
    ids = draw(GenerationOptions(temperature=1.0, seed=11), logits, 4000)[:, 0]
    np.testing.assert_allclose(np.bincount(ids, minlength=4) / 4000, probs, atol=0.03)


def test_large_vocab_uses_the_blocked_inverse_cdf() -> None:
    logits = np.full((1, 150_000), -np.inf, dtype=np.float32)
    logits[0, [3, 77_777, 149_999]] = 0.0
    ids = draw(GenerationOptions(temperature=1.0, seed=0), logits, 600)[:, 0]
    assert set(ids.tolist()) == {3, 77_777, 149_999}


# ---------------------------------------------------------------------------------------------
# Penalties
# ---------------------------------------------------------------------------------------------


class _Spy(Sampler):
    """Exposes the penalised logits (the greedy path returns argmax of them)."""

    def penalized(self, logits: np.ndarray) -> np.ndarray:
        return self._penalized(logits).copy()


def test_repetition_penalty_divides_positive_and_multiplies_negative_seen_logits() -> None:
    logits = np.array([[2.0, -2.0, 3.0, -1.0, 0.5]], dtype=np.float32)
    spy = _Spy(GenerationOptions(repetition_penalty=2.0), 1, 5, [[0, 1, 1]])
    spy.observe(np.array([4]))
    np.testing.assert_allclose(spy.penalized(logits), [[1.0, -4.0, 3.0, -1.0, 0.25]])


def test_repetition_penalty_changes_the_greedy_choice() -> None:
    logits = np.array([[2.0, 1.5]], dtype=np.float32)
    sampler = Sampler(GenerationOptions(repetition_penalty=2.0), 1, 2, [[0]])
    assert sampler(logits)[0] == 1


def test_presence_and_frequency_penalties_count_generated_tokens_only() -> None:
    logits = np.zeros((2, 5), dtype=np.float32)
    spy = _Spy(GenerationOptions(presence_penalty=0.5, frequency_penalty=0.25), 2, 5, [[0, 1, 2], [3]])
    for step in ([1, 4], [1, 4], [2, 4]):
        spy.observe(np.array(step))
    expected = [
        [0.0, -(0.5 + 0.25 * 2), -(0.5 + 0.25), 0.0, 0.0],
        [0.0, 0.0, 0.0, 0.0, -(0.5 + 0.25 * 3)],
    ]
    np.testing.assert_allclose(spy.penalized(logits), expected)


def test_penalties_stack_in_order() -> None:
    logits = np.array([[4.0, 4.0]], dtype=np.float32)
    spy = _Spy(GenerationOptions(repetition_penalty=2.0, presence_penalty=1.0), 1, 2, [[]])
    spy.observe(np.array([0]))
    np.testing.assert_allclose(spy.penalized(logits), [[4.0 / 2 - 1.0, 4.0]])


def test_out_of_vocabulary_prompt_id_is_a_generation_error() -> None:
    with pytest.raises(GenerationError, match="prompt token id 9"):
        Sampler(GenerationOptions(repetition_penalty=1.2), 1, 5, [[1, 9]])


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_new_tokens", -5),
        ("max_new_tokens", 2.0),
        ("max_new_tokens", True),
        ("temperature", -0.1),
        ("temperature", math.nan),
        ("temperature", math.inf),
        ("temperature", "0.7"),
        ("top_k", -1),
        ("top_k", 1.5),
        ("top_p", 0.0),
        ("top_p", 1.01),
        ("top_p", math.nan),
        ("min_p", -0.1),
        ("min_p", 1.0),
        ("repetition_penalty", 0.0),
        ("repetition_penalty", -1.0),
        ("repetition_penalty", math.inf),
        ("presence_penalty", math.nan),
        ("frequency_penalty", math.inf),
        ("seed", -1),
        ("seed", 1.5),
        ("stop", ("ok", "")),
        ("stop", [3]),
        ("stop", None),
        ("stop_token_ids", [1, -2]),
        ("stop_token_ids", ["2"]),
    ],
)
def test_bad_options_raise_generation_error_naming_the_option(field: str, value: object) -> None:
    with pytest.raises(GenerationError) as info:
        GenerationOptions(**{field: value}).validated()  # type: ignore[arg-type]
    message = str(info.value)
    assert field in message and "\n" not in message


def test_validated_normalises_lists_and_numpy_scalars() -> None:
    options = GenerationOptions(
        stop=["</s>", "END"], stop_token_ids=[np.int64(2), 7], temperature=np.float32(0.5), top_k=np.int32(4)
    ).validated()  # type: ignore[arg-type]
    assert options.stop == ("</s>", "END") and options.stop_token_ids == (2, 7)
    assert type(options.temperature) is float and type(options.top_k) is int
    assert GenerationOptions(stop="</s>").validated().stop == ("</s>",)  # type: ignore[arg-type]


def test_logit_bias_takes_any_mapping_or_pairs() -> None:
    """Any Mapping is taken as a dict is (a UserDict was refused: only a dict's items view was
    let through), and so is a list of pairs; a string is not."""
    want = ((3, -1.0), (5, 2.0))
    for bias in ({5: 2, "3": -1.0}, types.MappingProxyType({5: 2, 3: -1.0}),
                 collections.UserDict({5: 2.0, 3: -1}), [(5, 2.0), ["3", -1]]):
        assert GenerationOptions(logit_bias=bias).validated().logit_bias == want, bias
    with pytest.raises(GenerationError, match="logit_bias"):
        GenerationOptions(logit_bias="5").validated()  # type: ignore[arg-type]


def test_runtime_modules_do_not_import_torch() -> None:
    code = (
        "import sys, llm_onnx.runtime.generation.sampling, llm_onnx.runtime.generation.textstream; "
        "assert not {'torch', 'transformers'} & set(sys.modules), sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_sampler_validates_its_options() -> None:
    with pytest.raises(GenerationError, match="top_p"):
        Sampler(GenerationOptions(top_p=2.0), 1, V, [[]])


# ---------------------------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------------------------

_valid_options = st.builds(
    GenerationOptions,
    temperature=st.one_of(st.just(0.0), st.floats(1e-40, 1e40)),
    top_k=st.integers(0, 80),
    top_p=st.floats(1e-9, 1.0, exclude_min=False),
    min_p=st.floats(0.0, 1.0, exclude_max=True),
    repetition_penalty=st.floats(1e-30, 1e30),
    presence_penalty=st.floats(-1e30, 1e30),
    frequency_penalty=st.floats(-1e30, 1e30),
    seed=st.integers(0, 2**64),
)

_logit = st.one_of(
    st.floats(width=32, allow_nan=False, allow_infinity=False),
    st.just(-math.inf),
    st.just(math.inf),
    st.just(math.nan),
    st.just(0.0),
    st.floats(-3.0, 3.0, width=32),
)


@st.composite
def _logit_rows(draw_: st.DrawFn) -> np.ndarray:
    vocab = draw_(st.integers(1, 40))
    batch = draw_(st.integers(1, 3))
    rows = []
    for _ in range(batch):
        if draw_(st.booleans()):
            row = [draw_(st.floats(width=32, allow_nan=False, allow_infinity=False))] * vocab  # all equal
        else:
            row = draw_(st.lists(_logit, min_size=vocab, max_size=vocab))
        if not any(math.isfinite(v) for v in row):
            row[draw_(st.integers(0, vocab - 1))] = draw_(st.floats(width=32, allow_nan=False, allow_infinity=False))
        rows.append(row)
    return np.array(rows, dtype=np.float32)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(options=_valid_options, logits=_logit_rows(), history=st.lists(st.integers(0, 10**6), max_size=6))
def test_property_any_valid_options_pick_a_token_that_was_not_minus_inf_or_nan(
    options: GenerationOptions, logits: np.ndarray, history: list[int]
) -> None:
    batch, vocab = logits.shape
    prompt = [[h % vocab for h in history] for _ in range(batch)]
    sampler = Sampler(options, batch, vocab, prompt)
    for _ in range(3):
        ids = sampler(logits)
        assert ids.shape == (batch,) and ids.dtype == np.int64
        assert ((0 <= ids) & (ids < vocab)).all()
        chosen = logits[np.arange(batch), ids]
        assert (chosen != -np.inf).all() and not np.isnan(chosen).any()
        sampler.observe(ids)
    filtered = filter_logits(logits, options)
    assert np.isfinite(filtered).any(axis=-1).all()  # every row keeps at least one token
    assert not np.isfinite(filtered[(logits == -np.inf) | np.isnan(logits)]).any()


_anything = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=3),
    st.lists(st.one_of(st.integers(-3, 3), st.text(max_size=2)), max_size=3),
)


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from([f for f in GenerationOptions.__dataclass_fields__]), value=_anything)
def test_property_any_option_value_is_accepted_or_a_generation_error(field: str, value: object) -> None:
    try:
        options = GenerationOptions(**{field: value}).validated()  # type: ignore[arg-type]
    except GenerationError as error:
        assert field in str(error) or (field.startswith("stop") and "stop" in str(error))
        return
    # Accepted: it must then work.
    Sampler(options, 1, 8, [[1, 2]])(fixed_logits(vocab=8))


@settings(max_examples=200, deadline=None)
@given(
    field=st.sampled_from(["max_new_tokens", "temperature", "top_k", "top_p", "min_p", "repetition_penalty"]),
    data=st.data(),
)
def test_property_out_of_range_values_raise_generation_error(field: str, data: st.DataObject) -> None:
    bad = {
        "max_new_tokens": st.integers(max_value=-1),  # 0: score the prompt, generate nothing
        "temperature": st.one_of(st.floats(max_value=-1e-300), st.just(math.nan), st.just(math.inf)),
        "top_k": st.integers(max_value=-1),
        "top_p": st.one_of(st.floats(max_value=0.0), st.floats(min_value=1.0, exclude_min=True)),
        "min_p": st.one_of(st.floats(max_value=0.0, exclude_max=True), st.floats(min_value=1.0)),
        "repetition_penalty": st.floats(max_value=0.0),
    }[field]
    with pytest.raises(GenerationError, match=field):
        GenerationOptions(**{field: data.draw(bad)}).validated()  # type: ignore[arg-type]


@pytest.mark.parametrize("options", [
    GenerationOptions(temperature=0.0),
    GenerationOptions(temperature=0.0, repetition_penalty=1.3),
    GenerationOptions(temperature=0.0, presence_penalty=0.5),
    GenerationOptions(temperature=0.8, top_k=5, seed=3),
])
def test_pick_one_is_the_batched_call_for_one_row(options) -> None:
    """The one-row fast path (greedy without penalties) picks what __call__ picks, on ties,
    NaN, -inf, an all-unusable row and float16 logits; the other options take __call__."""
    rows = [fixed_logits(1, V, s)[0] for s in range(6)]
    tie = np.zeros(V, np.float32)
    tie[[7, 3, 40]] = 5.0  # lowest id wins
    nan = rows[0].copy()
    nan[[0, 9]] = np.nan
    nan_first = rows[1].copy()
    nan_first[int(nan_first.argmax())] = np.nan
    minus = np.full(V, -np.inf, np.float32)
    minus[11] = -3.0
    unusable = np.full(V, np.nan, np.float32)
    unusable[::2] = -np.inf
    cases = rows + [tie, nan, nan_first, minus, unusable, rows[2].astype(np.float16)]
    fast = Sampler(options, 1, V, [[1, 2, 3]], rng=np.random.default_rng(9))
    slow = Sampler(options, 1, V, [[1, 2, 3]], rng=np.random.default_rng(9))
    def outcome(pick):
        try:
            return pick()
        except GenerationError as e:  # a row with no usable logit: the same error either way
            return str(e)

    for step in range(3):
        for x in cases:
            got = outcome(lambda: fast.pick_one(x))
            want = outcome(lambda: int(slow(x[None])[0]))
            assert type(got) is type(want) and got == want, (step, x)
            if fast.observes and isinstance(got, int):
                fast.observe(np.array([got]))
                slow.observe(np.array([want]))
    assert fast.observes == (options.repetition_penalty != 1.0 or options.presence_penalty != 0.0)
