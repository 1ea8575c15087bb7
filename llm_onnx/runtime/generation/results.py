"""What generation gives back: a finished sequence's ``Result`` (text, tokens, finish reason,
timings, logprobs; a chat reply's reasoning and tool calls), and the ``TokenEvent`` each step
gives for each sequence as it streams. Plain data, shared by the generator, chat and the
server."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

# Why a sequence ended: an end-of-sequence token (or its constraint complete), a stop string, its
# token limit, it was cancelled (a scheduler request whose caller went away), or its constraint's
# matcher failed ("error": Result.error says why).
FINISH_REASONS = ("stop", "stop_string", "length", "cancelled", "error")


@dataclass
class Timings:
    """Seconds and token counts of one request."""

    ttft_s: float = 0.0  # request start to the first generated token
    prefill_s: float = 0.0
    prefill_tokens: int = 0
    decode_s: float = 0.0
    decode_tokens: int = 0

    @property
    def prefill_tok_s(self) -> float:
        return self.prefill_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tok_s(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else 0.0

    def to_dict(self) -> dict[str, float]:
        d = dataclasses.asdict(self)
        d.update(prefill_tok_s=self.prefill_tok_s, decode_tok_s=self.decode_tok_s)
        return d


@dataclass
class Result:
    """One generated sequence.

    ``token_ids`` are every generated token, including a final end-of-sequence token;
    ``finish_reason`` is "stop" (an end-of-sequence token), "stop_string", "length" or
    "cancelled"; ``logprobs`` (when asked for) holds one TokenLogprob per generated token.
    ``reasoning`` is the thinking of a reasoning model's chat reply (its ``<think>`` block; then
    ``text`` is the answer after it), None otherwise. ``tool_calls``: the calls a chat reply
    made (``Model.chat(..., tools=...)``; then ``text`` is the reply without their markup).
    ``error``: why a constrained sequence ended with finish_reason "error".
    ``stop_string``: the stop string that ended it (finish_reason "stop_string").
    ``prompt_logprobs`` (when asked for): one entry per prompt token, the logprob of each given
    the tokens before it; the first is None (nothing comes before it).
    """

    text: str
    token_ids: list[int]
    finish_reason: str
    prompt_tokens: int
    timings: Timings = field(default_factory=Timings)
    logprobs: list[TokenLogprob] | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCall] | None = None
    error: str | None = None
    stop_string: str | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"text": self.text, "token_ids": self.token_ids,
                             "finish_reason": self.finish_reason,
                             "prompt_tokens": self.prompt_tokens, "timings": self.timings.to_dict()}
        if self.reasoning is not None:
            d["reasoning"] = self.reasoning
        if self.logprobs is not None:
            d["logprobs"] = [dataclasses.asdict(lp) for lp in self.logprobs]
        if self.tool_calls is not None:
            d["tool_calls"] = [dataclasses.asdict(call) for call in self.tool_calls]
        if self.error is not None:
            d["error"] = self.error
        if self.stop_string is not None:
            d["stop_string"] = self.stop_string
        if self.prompt_logprobs is not None:
            d["prompt_logprobs"] = [None if lp is None else dataclasses.asdict(lp)
                                    for lp in self.prompt_logprobs]
        return d


@dataclass(frozen=True)
class ToolCall:
    """A function call a chat reply made: ``arguments`` is JSON text (an object), as OpenAI
    sends it."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class TokenLogprob:
    """log P(token) under the model's next-token distribution (log-softmax of its logits, with
    any logit_bias added and, for a constrained sequence, disallowed tokens removed; before
    penalties, temperature or truncation), and the ``top`` most likely alternatives as
    (token id, logprob), most likely first (alternatives of probability 0 are left out). A token
    the constraint forced has logprob 0."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class TokenEvent:
    """What one step produced for one sequence.

    ``text`` is the text that became final with this token: "" while a character is still
    incomplete or a stop string might be starting, and on the last event also whatever was held
    back. ``finish_reason`` is set on a sequence's last event only. A sequence asked to score
    its prompt has ``prompt_logprobs`` on its first event (as ``Result.prompt_logprobs``); with
    max_new_tokens 0 that event is its only one, with no token (``token_id`` -1).
    """

    row: int
    token_id: int
    text: str
    logprob: TokenLogprob | None = None
    finish_reason: str | None = None
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None
