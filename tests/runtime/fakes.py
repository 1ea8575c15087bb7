"""A fake engine with scripted logits and a tiny word-piece tokenizer: the generation loop without
any ONNX file."""

from __future__ import annotations

import numpy as np
from tokenizers import Tokenizer, decoders, models

from llm_onnx.errors import GenerationError

VOCAB = ["<eos>", "Hel", "lo", " wor", "ld", "</s", "top>", "x", "é", "!"]
EOS = 0


def tokenizer() -> Tokenizer:
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(VOCAB)}, unk_token="x"))
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(["<eos>"])
    return tok


class FakeCache:
    def __init__(self, batch: int, length: int) -> None:
        self.batch, self.length = batch, length
        self.lengths = np.zeros(batch, dtype=np.int64)

    def grow(self, length: int) -> None:
        self.length = max(self.length, length)


class FakeEngine:
    """step() returns the next scripted (B, V) logits; a script row may be a token id (that token
    gets the top logit) or a logits vector."""

    vocab_size = len(VOCAB)

    def __init__(self, script: list, context_length: int = 64) -> None:
        self.script = script
        self.context_length = context_length
        self.calls: list[tuple[tuple[int, ...], list[int]]] = []

    def new_cache(self, batch: int, length: int) -> FakeCache:
        if length > self.context_length:
            raise GenerationError("too long")
        return FakeCache(batch, length)

    def step(self, cache: FakeCache, ids: np.ndarray, prompt_lengths=None) -> np.ndarray:
        b, t = ids.shape
        if not cache.lengths.any():
            cache.lengths = np.asarray(prompt_lengths if prompt_lengths is not None else [t] * b)
        else:
            cache.lengths = cache.lengths + t
        assert int(cache.lengths.max()) <= cache.length
        self.calls.append((ids.shape, ids[:, -1].tolist()))
        entry = self.script[min(len(self.calls) - 1, len(self.script) - 1)]
        out = np.zeros((b, self.vocab_size), np.float32)
        for row in range(b):
            item = entry[row] if isinstance(entry, list) else entry
            if isinstance(item, (int, np.integer)):
                out[row, item] = 10.0
            else:
                out[row] = item
        return out
