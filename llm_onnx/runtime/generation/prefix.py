"""Which of a row's cached positions a new prompt keeps: the longest prefix it shares with the
tokens the row's cache holds, or with another free row's (copied over: a continued
conversation, a shared system prompt), never so long that the prompt's last run is one token."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Any

import numpy as np


class Prefixes:
    """The tokens each row of a generator's cache holds once its sequence is released, and the
    choice of how much of a new prompt a row keeps."""

    def __init__(self, batch: int) -> None:
        self.released: list[list[int]] = [[] for _ in range(batch)]

    def held(self, cache: Any, row: int, tokens: list[int] | None) -> list[int]:
        """The tokens whose keys and values row ``row`` of ``cache`` holds (``tokens``: the
        row's running sequence, None for a free row)."""
        if cache is None:
            return []
        held = tokens if tokens is not None else self.released[row]
        return held[:cache.length_of(row)]

    def reuse(self, cache: Any, row: int, prompt: list[int], free: list[int],
              running: list[int] | None, stats: Any) -> int:
        """How many leading tokens of ``prompt`` row ``row`` keeps in ``cache``. A new sequence
        (``running`` None: the row's own running tokens otherwise) may take a longer prefix from
        one of the ``free`` rows (copied into this row, far cheaper than running it again);
        every prompt's last run keeps two or more tokens."""
        limit = last_run_start(len(prompt))
        if cache is None:
            return 0
        # what each row can be cut back to exactly (a recurrent state: its checkpoints)
        here = cache.kept(row, min(common_prefix(self.held(cache, row, running), prompt), limit))
        if running is not None:
            return here
        best, source = here, row
        for other in free:
            if other != row:
                shared = cache.kept(other, min(common_prefix(self.held(cache, other, None),
                                                             prompt), limit))
                if shared > best:
                    best, source = shared, other
        if source != row and cache.copy_prefix(source, row, best):
            stats.copied_tokens += best
            return best
        return here


def last_run_start(prompt_length: int) -> int:
    """Where the last run of a prompt starts at the latest: two tokens before its end (a
    one-token prompt: at 0).

    A prompt's first token is picked from the logits of a prefill run of at least two tokens,
    never from a one-token (decode) run, however the prompt was chunked or reused. ONNX Runtime's
    8-bit MatMulNBits rounds a (B, 1, K) input differently from a (1, T >= 2, K) one (measured on
    SmolLM2 int8: up to 0.9 apart in the logits; fp32 agrees to 2e-5), so this keeps a request's
    tokens the same alone and in a batch, and a reused prefix costs at most one extra token."""
    return max(0, prompt_length - 2)


def common_prefix(a: Seq[int], b: Seq[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(differ[0]) if differ.shape[0] else n
