"""Token log-probabilities as OpenAI's APIs write them: a chat token's entry (text, bytes, top
alternatives), a completion's parallel lists (tokens, logprobs, top, text offsets), an echoed
prompt's; and ``TokenText``, the text and bytes of one token."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from llm_onnx.runtime.generation.results import TokenLogprob
from llm_onnx.runtime.model import Model


class TokenText:
    """Token strings and bytes for logprobs: a byte-level BPE token's own bytes (a character may
    span tokens), else the token decoded alone."""

    def __init__(self, model: Model) -> None:
        self.tokenizer = model.tokenizer
        self._byte_level = False
        if self.tokenizer is not None:
            decoder = json.loads(self.tokenizer.to_str()).get("decoder") or {}
            kinds = [decoder.get("type")] + [d.get("type") for d in decoder.get("decoders", [])]
            self._byte_level = "ByteLevel" in kinds
        self._unbyte = _unicode_to_bytes()

    def bytes(self, token_id: int) -> bytes:
        if self.tokenizer is None:
            return str(token_id).encode()
        if self._byte_level:
            piece = self.tokenizer.id_to_token(token_id) or ""
            if all(c in self._unbyte for c in piece):
                return bytes(self._unbyte[c] for c in piece)
        return self.tokenizer.decode([token_id], skip_special_tokens=False).encode("utf-8")

    def text(self, token_id: int) -> str:
        return self.bytes(token_id).decode("utf-8", errors="replace")


def _unicode_to_bytes() -> dict[str, int]:
    """The inverse of GPT-2's byte-to-printable-character table (ByteLevel pre-tokenizers)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def chat_logprobs(items: Sequence[TokenLogprob], text: TokenText) -> dict[str, Any]:
    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        raw = text.bytes(token_id)
        return {"token": raw.decode("utf-8", errors="replace"), "logprob": logprob,
                "bytes": list(raw)}

    return {"content": [dict(entry(lp.token_id, lp.logprob),
                             top_logprobs=[entry(t, v) for t, v in lp.top]) for lp in items],
            "refusal": None}


def completion_logprobs(items: Sequence[TokenLogprob], text: TokenText,
                        offset: int = 0) -> dict[str, Any]:
    tokens, offsets = [], []
    for lp in items:
        offsets.append(offset)
        tokens.append(text.text(lp.token_id))
        offset += len(tokens[-1])
    return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in items],
            "top_logprobs": [{text.text(t): v for t, v in lp.top} for lp in items],
            "text_offset": offsets}


def echo_logprobs(prompt: Sequence[int], scored: Sequence[TokenLogprob | None],
                  generated: Sequence[TokenLogprob], text: TokenText) -> dict[str, Any]:
    """An echoed prompt's logprobs, then its completion's, as vLLM answers them: one entry per
    prompt token (the first has null token_logprobs and top_logprobs: nothing precedes it),
    text offsets counted from the prompt's first token."""
    tokens = [text.text(t) for t in prompt]
    offsets = [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    tail = completion_logprobs(generated, text, sum(len(t) for t in tokens))
    return {"tokens": tokens + tail["tokens"],
            "token_logprobs": [None if lp is None else lp.logprob for lp in scored]
            + tail["token_logprobs"],
            "top_logprobs": [None if lp is None else {text.text(t): v for t, v in lp.top}
                             for lp in scored] + tail["top_logprobs"],
            "text_offset": offsets + tail["text_offset"]}
