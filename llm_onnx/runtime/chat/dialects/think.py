"""The reasoning dialect ``think``: the ``<think>...</think>`` block of a reasoning model's reply,
apart from its answer.

Qwen3, QwQ and the DeepSeek-R1 distills write their reasoning first, between ``<think>`` and
``</think>`` (tokens of their own in the tokenizer), then the answer. Their chat templates either
let the model open the block itself (Qwen3), open it in the prompt (DeepSeek-R1: the prompt ends
with ``<think>\\n``), or close an empty one in the prompt when thinking is off (Qwen3 with
``enable_thinking=False``). So where a reply starts is read off the prompt (``opens_thought``),
and the reply is then split as it streams:

    prompt leaves a block open:  reasoning ... </think> answer
    otherwise:                   <think> reasoning </think> answer   (whitespace before <think> ok)
                                 answer                              (no block: all answer, as is)

Newlines around the reasoning and before the answer are dropped, as the Qwen3 template itself
drops them when it renders an earlier turn. A block still open at the end (the reply ran out of
tokens) is all reasoning. Text split into any pieces gives the same two strings.

``ThinkBlock`` is the dialect: detected when ``<think>`` and ``</think>`` are tokens of the
tokenizer that decode as text; a dialect that writes the same block with other tags subclasses
it with its own ``tags`` (Gemma 4's thought channel, ``dialects/gemma4.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import tokenizers

from llm_onnx.runtime.chat.dialects.base import ChatPiece, ReasoningDialect, SpecialId
from llm_onnx.runtime.structured.constraint import Constraint


@dataclass(frozen=True)
class ThinkTags:
    """The text that opens and closes a think block; ``opener`` is the token that starts
    ``start`` (``start`` itself unless the tag is a token followed by text)."""

    start: str
    end: str
    opener: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "opener", self.opener or self.start)


THINK = ThinkTags("<think>", "</think>")

_OPENING, _THINKING, _AFTER, _ANSWER = range(4)


def has_think_tokens(tokenizer: tokenizers.Tokenizer | None, tags: ThinkTags = THINK) -> bool:
    """True if the tags' tokens (``<think>`` and ``</think>``) are tokens of their own that
    decode as text (added tokens not marked special, as in Qwen3 and the DeepSeek-R1 distills,
    and Gemma 4's ``<|channel>`` and ``<channel|>``)."""
    if tokenizer is None:
        return False
    ids = [tokenizer.token_to_id(tag) for tag in (tags.opener, tags.end)]
    if any(i is None for i in ids):
        return False
    added = tokenizer.get_added_tokens_decoder()
    return not any(i in added and added[i].special for i in ids)


def opens_thought(prompt: str, tags: ThinkTags = THINK) -> bool:
    """True if the prompt text ends inside a think block (the reply starts with reasoning)."""
    return prompt.rfind(tags.start) > prompt.rfind(tags.end)


def thinking_mode(prompt: str, tags: ThinkTags = THINK) -> str:
    """How a reply to ``prompt`` starts: inside a think block the prompt opened ("open"), after
    one it closed (thinking off: "none"), or free to open one ("optional")."""
    if opens_thought(prompt, tags):
        return "open"
    return "none" if prompt.rstrip().endswith(tags.end) else "optional"


class ReasoningSplitter:
    """Splits streamed reply text into reasoning and answer pieces (see the module docstring).

    Args:
        thinking: the prompt left a think block open (``opens_thought``).
        tags: the block's tags (``THINK``, or another dialect's).
    """

    def __init__(self, thinking: bool = False, tags: ThinkTags = THINK) -> None:
        self._tags = tags
        self._state = _THINKING if thinking else _OPENING
        self._held = ""
        self.saw_block = thinking  # a think block was opened, by the prompt or the reply
        self._reasoning: list[str] = []
        self._answer: list[str] = []

    @property
    def reasoning(self) -> str | None:
        """The reasoning so far; None if no think block was opened."""
        return "".join(self._reasoning) if self.saw_block else None

    @property
    def answer(self) -> str:
        return "".join(self._answer)

    def push(self, text: str) -> list[ChatPiece]:
        """Add reply text; the pieces that became final (reasoning first)."""
        self._held += text
        out: list[ChatPiece] = []
        while self._held:
            if self._state == _OPENING:
                rest = self._held.lstrip()
                if rest.startswith(self._tags.start):
                    self._held = rest[len(self._tags.start):]
                    self._state, self.saw_block = _THINKING, True
                elif self._tags.start.startswith(rest):  # "", "<", "<th", ...: not decided yet
                    break
                else:
                    self._state = _ANSWER
            elif self._state == _THINKING:
                if not self._reasoning:  # newlines after <think>
                    self._held = self._held.lstrip("\n")
                    if not self._held:
                        break
                end = self._held.find(self._tags.end)
                if end >= 0:
                    self._emit(out, self._held[:end].rstrip("\n"), True)
                    self._held = self._held[end + len(self._tags.end):]
                    self._state = _AFTER
                    continue
                # Hold back what may still turn out to be the end: a tail that starts the closing
                # tag, and the newlines before it.
                keep = _tag_prefix_tail(self._held, self._tags.end)
                head = self._held[:len(self._held) - keep]
                final = head.rstrip("\n")
                self._emit(out, final, True)
                self._held = self._held[len(final):]
                break
            elif self._state == _AFTER:
                self._held = self._held.lstrip("\n")
                if self._held:
                    self._state = _ANSWER
            else:
                self._emit(out, self._held, False)
                self._held = ""
        return out

    def flush(self) -> list[ChatPiece]:
        """The end of the reply: whatever was held back."""
        out: list[ChatPiece] = []
        held, self._held = self._held, ""
        if self._state == _THINKING:  # the block never closed: all reasoning
            text = held if self._reasoning else held.lstrip("\n")
            self._emit(out, text.rstrip("\n"), True)
        elif self._state != _AFTER:
            self._emit(out, held, False)
        return out

    def _emit(self, out: list[ChatPiece], text: str, reasoning: bool) -> None:
        if text:
            out.append(ChatPiece(text, reasoning))
            (self._reasoning if reasoning else self._answer).append(text)


def split_reasoning(text: str, thinking: bool = False,
                    tags: ThinkTags = THINK) -> tuple[str | None, str]:
    """(reasoning or None, answer) of a whole reply."""
    splitter = ReasoningSplitter(thinking, tags)
    splitter.push(text)
    splitter.flush()
    return splitter.reasoning, splitter.answer


def _tag_prefix_tail(text: str, tag: str) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of ``tag``."""
    for size in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[len(text) - size:]):
            return size
    return 0


class ThinkBlock(ReasoningDialect):
    """Thinking in a block between ``tags`` before the answer (Qwen3, QwQ, the DeepSeek-R1
    distills, SmolLM3), detected from the tokenizer: both tags are tokens of their own that
    decode as text."""

    name = "think"
    tags: ThinkTags = THINK

    @classmethod
    def detect(cls, tokenizer: tokenizers.Tokenizer | None) -> bool:
        return has_think_tokens(tokenizer, cls.tags)

    def thinking(self, prompt: str) -> bool:
        return opens_thought(prompt, self.tags)

    def splitter(self, prompt: str) -> ReasoningSplitter:
        return ReasoningSplitter(self.thinking(prompt), self.tags)

    def constraint(self, constraint: Constraint, prompt: str,
                   special_id: SpecialId) -> Constraint:
        """The block stays free (opened by the reply, or by the prompt, or closed empty by a
        prompt that turned thinking off); the tags are tokens in the grammar where they are
        special tokens of the tokenizer."""
        tags = (special_id(self.tags.opener), special_id(self.tags.end))
        return constraint.after_thinking(thinking_mode(prompt, self.tags),
                                         None if None in tags else tags)  # type: ignore[arg-type]
