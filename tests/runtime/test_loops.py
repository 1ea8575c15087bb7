"""find_loop: the repeated tail of a finished answer, found where a loop is and nowhere else."""

from __future__ import annotations

import random

import pytest

from llm_onnx.runtime.generation.loops import MIN_SPAN, Loop, find_loop

# "L'Étoile, la Marseur, la France, la France, ..." as SmolLM2-135M int8 answers the README's
# question (its token ids): a start, then ", la France" (3 tokens) to the 256-token limit
START = [60, 23, 39614, 1141, 552, 28, 2618, 2828, 313, 315]
PHRASE = [28, 2618, 4649]


def looping(start: list[int], phrase: list[int], total: int) -> list[int]:
    out = list(start)
    while len(out) < total:
        out += phrase
    return out[:total]


@pytest.mark.parametrize("ids, period", [
    (looping(START, PHRASE, 256), 3),  # the answer
    (looping(START, PHRASE, 255), 3),  # cut part-way through a copy
    ([13] * 256, 1),  # one token over and over (a run of newlines)
    (looping(list(range(100, 140)), list(range(200, 220)), 256), 20),  # a sentence, repeated
    (looping([], list(range(300, 364)), 200), 64),  # a paragraph, three copies and a part
    ([5, 6] * 16, 2),  # 32 tokens: the shortest span that counts
])
def test_loops_are_found(ids, period):
    loop = find_loop(ids)
    assert loop is not None and loop.period == period
    assert loop.start + loop.span == len(ids) and loop.repeats >= 3
    tail = ids[loop.start:]
    assert all(tail[i] == tail[i - period] for i in range(period, len(tail)))


def test_the_loop_starts_where_the_repeats_do():
    assert find_loop(looping(START, PHRASE, 256)) == Loop(period=3, span=246, start=10)


def counting(n: int) -> list[int]:
    """"1, 2, 3, ..." as ids: every number a new token, the comma between."""
    out = []
    for i in range(n):
        out += [1000 + i, 30]
    return out


@pytest.mark.parametrize("ids", [
    [],
    list(range(256)),  # no token twice
    random.Random(0).choices(range(49152), k=256),  # text-like: nothing periodic at the end
    counting(128),  # "1, 2, 3, ...": the comma recurs, the numbers do not
    list(range(300)) + [7, 8] * 8,  # "ha ha ha" at the end: 16 tokens, under the span
    [9] * (MIN_SPAN - 1),  # one token, but fewer than MIN_SPAN of them
    list(range(100)) + list(range(500, 540)) * 2,  # a 40-token passage twice: not 3 times
    looping([], PHRASE, 120) + list(range(600, 660)),  # a loop the answer left again
])
def test_no_loop_where_there_is_none(ids):
    assert find_loop(ids) is None


def test_the_thresholds_are_arguments():
    ids = list(range(50)) + [7, 8] * 8
    assert find_loop(ids) is None
    assert find_loop(ids, min_span=16) == Loop(period=2, span=16, start=50)
    assert find_loop(list(range(100)) + list(range(500, 540)) * 2, min_repeats=2).period == 40
    assert find_loop([5, 6] * 40, max_period=1) is None
