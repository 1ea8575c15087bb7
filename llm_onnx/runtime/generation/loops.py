"""Whether a finished answer ended in a repetition loop: its last tokens one phrase over and over,
as greedy decoding does once a small or quantized model starts repeating itself (the context
then favours the repeat more with each copy, so greedy never leaves it). The CLI says so when an
answer that ran to the token limit ends like this (docs/generate.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Loop", "find_loop", "MIN_REPEATS", "MIN_SPAN"]

MIN_REPEATS = 3  # copies of the phrase, at least
MIN_SPAN = 32  # tokens the repeated tail covers, at least
MAX_PERIOD = 256  # longest phrase looked for (tokens)


@dataclass(frozen=True)
class Loop:
    """The repeated tail of an answer: ``period`` tokens (the phrase) repeated over the last
    ``span`` tokens, which start at ``start``."""

    period: int
    span: int
    start: int

    @property
    def repeats(self) -> float:
        return self.span / self.period


def find_loop(token_ids: Sequence[int], *, min_repeats: int = MIN_REPEATS,
              min_span: int = MIN_SPAN, max_period: int = MAX_PERIOD) -> Loop | None:
    """The shortest phrase whose copies make up the end of ``token_ids`` at least
    ``min_repeats`` times over at least ``min_span`` tokens (None when there is none).

    The tail is periodic with period p where ``t[i] == t[i - p]`` for each of its positions
    after the first p; the first such p found (smallest first) is the phrase itself, not a
    multiple of it. A last copy may be cut part-way (the token limit falls anywhere in it).
    """
    ids = list(token_ids)
    n = len(ids)
    if n < min_span:
        return None
    for p in range(1, min(max_period, n // min_repeats) + 1):
        i = n - 1
        while i >= p and ids[i] == ids[i - p]:
            i -= 1
        span = n - 1 - i + p  # the matched positions and the phrase before them
        if span >= min_span and span >= min_repeats * p:
            return Loop(period=p, span=span, start=n - span)
    return None
