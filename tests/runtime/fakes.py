"""Fake engines (EngineProtocol without any ONNX file) and a tiny word-piece tokenizer.

- ``FakeEngine``: scripted logits, the k-th of each row from script entry k.
- ``HistoryEngine``: logits that are a fixed function of every token in a row's cache, so any
  mistake in what a row holds (a wrong reused prefix, a ride-along token counted as valid, a
  truncation that lost a position) changes the tokens picked.
Both keep the tokens of each cache position, like a real cache keeps their keys and values.
"""

from __future__ import annotations

import zlib

import numpy as np
from tokenizers import Tokenizer, decoders, models

from llm_onnx.errors import GenerationError

VOCAB = ["<eos>", "Hel", "lo", " wor", "ld", "</s", "top>", "x", "é", "!"]
EOS = 0
RIDE_ALONG = -1  # what a decode step writes into rows that are not decoding


def tokenizer() -> Tokenizer:
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(VOCAB)}, unk_token="x"))
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(["<eos>"])
    return tok


class FakeCache:
    """Rows of token ids standing in for keys and values (CacheProtocol)."""

    def __init__(self, batch: int, length: int) -> None:
        self.batch, self.length = batch, length
        self.positions = np.full((batch, length), -2, dtype=np.int64)  # -2: never written
        self.lengths = np.zeros(batch, dtype=np.int64)
        self.copies: list[tuple[int, int, int]] = []

    def length_of(self, row: int) -> int:
        return int(self.lengths[row])

    def truncate(self, row: int, length: int) -> None:
        self.lengths[row] = min(self.lengths[row], length)

    def grow(self, length: int) -> None:
        if length > self.length:
            spare = getattr(self, "spare", 0)
            grown = np.full((self.batch, length + spare), -2, dtype=np.int64)
            grown[:, :self.length] = self.positions[:, :self.length]
            self.positions, self.length = grown, length

    def copy_prefix(self, src: int, dst: int, length: int) -> bool:
        length = min(length, int(self.lengths[src]))
        self.positions[dst, :length] = self.positions[src, :length]
        self.lengths[dst] = length
        self.copies.append((src, dst, length))
        return True

    def held(self, row: int) -> list[int]:
        return self.positions[row, :self.lengths[row]].tolist()

    def kept(self, row: int, length: int) -> int:
        return min(length, self.length_of(row))

    def checkpoint(self, row: int, transient: bool = False) -> None:
        pass

    def checkpoint_at(self, start: int, stop: int, prompt_length: int,
                      reuse_points: tuple[int, ...] = ()) -> int | None:
        return None


class FakeRecurrentCache(FakeCache):
    """A cache whose rows cannot be cut back anywhere, as a recurrent state (HybridCache): only
    to a checkpoint (at most ``limit``, the oldest dropped; one transient copy) or to 0."""

    spare = 1  # as HybridCache: a full row riding along writes past its length

    def __init__(self, batch: int, length: int, limit: int = 2, margin: int = 3) -> None:
        super().__init__(batch, length)
        self.positions = np.full((batch, length + 1), -2, dtype=np.int64)
        self.limit, self.margin = limit, margin
        self.saved: list[list[int]] = [[] for _ in range(batch)]
        self.transient: list[int | None] = [None] * batch
        self.taken: list[tuple[int, int, bool]] = []  # (row, length, transient)

    def kept(self, row: int, length: int) -> int:
        if length >= self.length_of(row):
            return self.length_of(row)
        marks = self.saved[row] + ([self.transient[row]] if self.transient[row] else [])
        return max((p for p in marks if p <= length), default=0)

    def truncate(self, row: int, length: int) -> None:
        target = self.kept(row, length)
        self.lengths[row] = target
        self.saved[row] = [p for p in self.saved[row] if p <= target]
        if self.transient[row] is not None and self.transient[row] > target:
            self.transient[row] = None

    def checkpoint(self, row: int, transient: bool = False) -> None:
        length = self.length_of(row)
        self.taken.append((row, length, transient))
        if transient:
            self.transient[row] = length
        elif length not in self.saved[row]:
            self.saved[row] = (self.saved[row] + [length])[-self.limit:]

    def checkpoint_at(self, start: int, stop: int, prompt_length: int,
                      reuse_points: tuple[int, ...] = ()) -> int | None:
        wanted = [*reuse_points, prompt_length - self.margin]
        return min((p for p in wanted if start < p < stop and p < prompt_length - 1),
                   default=None)

    def copy_prefix(self, src: int, dst: int, length: int) -> bool:
        if self.kept(src, length) != min(length, self.length_of(src)):
            return False
        ok = super().copy_prefix(src, dst, length)
        self.saved[dst] = [p for p in self.saved[src] if p <= length]
        return ok


class _Engine:
    vocab_size = len(VOCAB)
    recurrent = False  # True: its caches are FakeRecurrentCache (cut back to checkpoints only)

    def __init__(self, context_length: int = 64) -> None:
        self.context_length = context_length
        self.calls: list[tuple] = []  # ("prefill", row, ids) or ("decode", rows, active rows)
        self.caches: list[FakeCache] = []

    def new_cache(self, batch: int, length: int) -> FakeCache:
        if length > self.context_length:
            raise GenerationError("too long")
        cache = FakeRecurrentCache(batch, length) if self.recurrent else FakeCache(batch, length)
        self.caches.append(cache)
        return cache

    def prefill(self, cache: FakeCache, row: int, ids) -> np.ndarray:
        ids = [int(i) for i in ids]
        start = cache.length_of(row)
        assert ids and start + len(ids) <= cache.length
        cache.positions[row, start:start + len(ids)] = ids
        cache.lengths[row] += len(ids)
        self.calls.append(("prefill", row, ids))
        return self.logits(cache, row)

    def decode(self, cache: FakeCache, tokens, active=None, first_row: int = 0) -> np.ndarray:
        tokens = np.asarray(tokens, dtype=np.int64)
        n = tokens.shape[0]
        active = np.ones(n, bool) if active is None else np.asarray(active, bool)
        assert 1 <= n and first_row + n <= cache.batch
        out = np.zeros((n, self.vocab_size), np.float32)
        spare = getattr(cache, "spare", 0)  # positions past the length (FakeRecurrentCache)
        for i in range(n):
            row = first_row + i
            if active[i]:
                assert cache.length_of(row) < cache.length
                cache.positions[row, cache.length_of(row)] = tokens[i]
                cache.lengths[row] += 1
                out[i] = self.logits(cache, row)
            else:  # written past the valid length, like the real engine's ride-along rows
                if cache.length_of(row) >= cache.length + spare:
                    cache.truncate(row, cache.length - 1)
                cache.positions[row, cache.length_of(row)] = RIDE_ALONG
        self.calls.append(("decode", n, (first_row + np.flatnonzero(active)).tolist()))
        return out

    verifies = True  # speculative decoding's verify step

    def verify(self, cache: FakeCache, row: int, ids) -> np.ndarray:
        """Like prefill, with the logits after each of ``ids``."""
        ids = [int(i) for i in ids]
        start = cache.length_of(row)
        assert ids and start + len(ids) <= cache.length
        out = []
        for i, t in enumerate(ids):
            cache.positions[row, start + i] = t
            cache.lengths[row] = start + i + 1
            out.append(self.logits(cache, row))
        self.calls.append(("verify", row, ids))
        return np.stack(out)

    def logits(self, cache: FakeCache, row: int) -> np.ndarray:
        raise NotImplementedError


class FakeEngine(_Engine):
    """The k-th logits of a row come from script entry k (the last entry repeats). An entry is a
    token id (that token gets the top logit), a logits vector, or a list of those, one per row."""

    def __init__(self, script: list, context_length: int = 64) -> None:
        super().__init__(context_length)
        self.script = script
        self._served: dict[tuple[int, int], int] = {}

    def logits(self, cache: FakeCache, row: int) -> np.ndarray:
        key = (id(cache), row)
        k = self._served.get(key, 0)
        self._served[key] = k + 1
        entry = self.script[min(k, len(self.script) - 1)]
        item = entry[row] if isinstance(entry, list) else entry
        out = np.zeros(self.vocab_size, np.float32)
        if isinstance(item, (int, np.integer)):
            out[item] = 10.0
        else:
            out[:] = item
        return out


class MarkovEngine(_Engine):
    """Logits that depend on the row's last ``order`` tokens only: a context that recurs gives
    the same next token, so prompt lookup drafts it right (speculative decoding's tests)."""

    def __init__(self, vocab_size: int = 40, order: int = 2, context_length: int = 256,
                 scale: float = 3.0) -> None:
        super().__init__(context_length)
        self.vocab_size, self.order, self.scale = vocab_size, order, scale

    def logits(self, cache: FakeCache, row: int) -> np.ndarray:
        held = cache.held(row)
        assert RIDE_ALONG not in held and -2 not in held, f"row {row} reads an invalid position"
        seed = zlib.crc32(np.asarray(held[-self.order:], dtype=np.int64).tobytes())
        return (np.random.default_rng(seed).standard_normal(self.vocab_size)
                * self.scale).astype(np.float32)


class HistoryEngine(_Engine):
    """Logits drawn from a generator seeded by every token the row's cache holds."""

    def __init__(self, vocab_size: int = 50, context_length: int = 128) -> None:
        super().__init__(context_length)
        self.vocab_size = vocab_size

    def logits(self, cache: FakeCache, row: int) -> np.ndarray:
        held = cache.held(row)
        assert RIDE_ALONG not in held and -2 not in held, f"row {row} reads an invalid position"
        seed = zlib.crc32(np.asarray(held, dtype=np.int64).tobytes())
        return np.random.default_rng(seed).standard_normal(self.vocab_size).astype(np.float32) * 3
