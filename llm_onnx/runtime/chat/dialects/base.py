"""What a chat dialect is: how a family of models writes its replies (its thinking, its tool
calls, its answer) and how such a reply is constrained and read back.

Two kinds of dialect are registered by name (``llm_onnx.runtime.chat.dialects``), as vLLM keeps
tool parsers and reasoning parsers apart:

    ToolDialect        how replies write tool calls (hermes, mistral, gemma4, harmony, ...),
                       detected from the chat template
    ReasoningDialect   how replies write their thinking (a ``<think>`` block, Gemma 4's thought
                       channel), detected from the tokenizer's tokens

A model's ``ChatDialect`` is what a ``ChatRequest`` holds and asks everything of: the
constraint of a reply, its streaming reader (thinking, content and tool calls), the whole reply
read back, and the prompt's rendering. ``ToolDialect.chat`` makes it: a tagged format composes
itself with the model's reasoning dialect (``TaggedDialect``), harmony is a whole dialect of its
own (its channels carry the thinking). Nothing here knows a dialect by name.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import tokenizers

from llm_onnx.runtime.chat.render import Message, render_chat
from llm_onnx.runtime.generation.results import ToolCall
from llm_onnx.runtime.structured.constraint import Constraint, ConstraintError

ToolChoice = str | dict  # "none" | "auto" | "required" | {"type": "function", "function": {"name"}}
SpecialId = Callable[[str], "int | None"]  # a marker's token id (None: written as text)


class ChatPiece(str):
    """A piece of a streamed chat reply: a ``str``, and ``reasoning`` is True for thinking text
    (always False for a model without think tokens)."""

    reasoning: bool

    def __new__(cls, text: str, reasoning: bool = False) -> ChatPiece:
        piece = super().__new__(cls, text)
        piece.reasoning = reasoning
        return piece


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of a streamed call: its first piece has ``id`` and ``name``; every piece may add
    to the arguments' text."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None


def new_call_id() -> str:
    """OpenAI's ``call_...`` ids."""
    return f"call_{uuid.uuid4().hex[:24]}"


def chosen_tools(tools: Sequence[dict], choice: ToolChoice) -> list[dict]:
    """The tools a call may name under ``choice`` (all of them, or the named one)."""
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        picked = [t for t in tools if t["function"]["name"] == name]
        if not picked:
            raise ConstraintError(f"tool_choice names the function {name!r}, which is not in "
                                  f"tools ({', '.join(t['function']['name'] for t in tools)}).",
                                  "tool_choice")
        return picked
    return list(tools)


def call_schema(tool: dict, key: str = "arguments") -> dict[str, Any]:
    """The JSON schema of one call of ``tool`` as a JSON object: its name, then its arguments
    under ``key``."""
    function = tool["function"]
    parameters = function.get("parameters") or {"type": "object", "properties": {},
                                                "additionalProperties": False}
    return {"type": "object", "properties": {"name": {"const": function["name"]},
                                             key: parameters},
            "required": ["name", key], "additionalProperties": False}


class Reply(Protocol):
    """What a dialect reads of the reply it serves (``ChatRequest`` is one)."""

    prompt: str  # the rendered prompt the reply continues
    answer: Constraint | None  # what a reply that calls no tool must match (None: any text)
    tool_choice: ToolChoice
    parallel: bool

    @property
    def calls_tools(self) -> bool: ...  # tools are given and tool_choice is not "none"

    def checked_tools(self) -> list[dict]: ...  # the tools, schemas as the engine takes them

    def special_id(self, marker: str) -> int | None: ...


class ReplyReader(Protocol):
    """A reply's text as it streams, in: ChatPieces (thinking or content) and ToolCallDeltas,
    out. ``push(text, last=True)`` ends it."""

    def push(self, text: str, last: bool = False) -> list[ChatPiece | ToolCallDelta]: ...

    @property
    def tool_calls(self) -> int: ...  # calls begun so far

    @property
    def complete(self) -> bool: ...  # every call begun was finished


class ThinkingReader(Protocol):
    """A reply's thinking apart from its answer (no tool calls), as it streams."""

    @property
    def reasoning(self) -> str | None: ...

    @property
    def answer(self) -> str: ...

    def push(self, text: str) -> list[Any]: ...

    def flush(self) -> list[Any]: ...


class ChatDialect(ABC):
    """A model's replies as a ChatRequest constrains and reads them (see the module docstring).

    Attributes:
        tool_format: the name of the tool dialect (None: the template writes no tool calls).
        reasons: replies may carry thinking, returned apart from the answer.
        keep_special: special tokens whose text the reply keeps for the reader.
        free_form: a call can carry a custom tool's free text (a tool with an
            ``input_grammar``: tagged_calls.py).
    """

    tool_format: str | None = None
    reasons: bool = False
    keep_special: tuple[str, ...] = ()
    free_form: bool = False

    @abstractmethod
    def thinking(self, prompt: str) -> bool | None:
        """True if a reply to ``prompt`` starts inside its thinking; None: no reasoning split."""

    @abstractmethod
    def splitter(self, prompt: str) -> ThinkingReader | None:
        """A reader of a reply's thinking and answer (no tools); None: all of it is answer."""

    @abstractmethod
    def constraint(self, reply: Reply) -> Constraint | None:
        """The reply's constraint: its tool choice's grammar, or its answer's, around any
        thinking. None: the reply is free."""

    @abstractmethod
    def reader(self, reply: Reply) -> ReplyReader:
        """The reply's streaming reader."""

    @abstractmethod
    def read(self, reply: Reply, text: str) -> tuple[str, str | None, list[ToolCall] | None]:
        """(answer, thinking or None, tool calls or None without tools) of a whole reply."""

    def render(self, template: str, messages: Sequence[Message], special_tokens: dict[str, str],
               add_generation_prompt: bool = True, *, tools: Sequence[dict] | None = None,
               **variables: Any) -> str:
        """The prompt text of ``messages``: the model's own chat template, rendered as
        transformers renders it (a dialect whose template needs its messages prepared
        differently, content parts beyond text included, overrides this)."""
        return render_chat(template, messages, special_tokens, add_generation_prompt,
                           tools=tools, **variables)


class ToolDialect(ABC):
    """A registered way of writing tool calls: its name, how a chat template shows it, and the
    model's ChatDialect it makes.

    Attributes:
        name: the name it is registered and chosen by (``--tool-call-format NAME``).
        choosable: it may be named for any template (False: only its own templates write it).
    """

    name: ClassVar[str]
    choosable: ClassVar[bool] = True

    @classmethod
    @abstractmethod
    def detect(cls, template: str) -> bool:
        """True if ``template`` writes tool calls this way."""

    @abstractmethod
    def chat(self, reasoning: ReasoningDialect | None) -> ChatDialect:
        """The model's dialect when its replies call tools this way and think as
        ``reasoning`` reads them (None: they do not think)."""


class ReasoningDialect(ABC):
    """A registered way of writing thinking before the answer: its name, how a tokenizer shows
    it, its reader, and the constraint that leaves it free."""

    name: ClassVar[str]

    @classmethod
    @abstractmethod
    def detect(cls, tokenizer: tokenizers.Tokenizer | None) -> bool:
        """True if the tokenizer's model writes its thinking this way."""

    @abstractmethod
    def thinking(self, prompt: str) -> bool:
        """True if a reply to ``prompt`` starts inside its thinking (the prompt opened it)."""

    @abstractmethod
    def splitter(self, prompt: str) -> ThinkingReader:
        """The reader of a reply to ``prompt``: thinking apart from the answer."""

    @abstractmethod
    def constraint(self, constraint: Constraint, prompt: str,
                   special_id: SpecialId) -> Constraint:
        """``constraint`` on the answer after the reply's free thinking."""
