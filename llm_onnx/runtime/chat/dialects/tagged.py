"""The chat dialect of a reply written as plain text: any thinking first (as a reasoning dialect
writes it), then the answer, with tool calls between markers (as a ``TaggedCalls`` dialect
writes them) or, for a JSON answer, perhaps inside a ```json fence (stripped when read).

    <think>reasoning</think> the answer <tool_call>{"name": "f", "arguments": {...}}</tool_call>
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from llm_onnx.runtime.chat.dialects.base import (
    ChatDialect,
    ChatPiece,
    ReasoningDialect,
    Reply,
    SpecialId,
    ThinkingReader,
    ToolCallDelta,
    ToolChoice,
)
from llm_onnx.runtime.generation.results import ToolCall
from llm_onnx.runtime.structured.constraint import Constraint


class CallStream(Protocol):
    """Reply text in, content pieces (str) and ToolCallDeltas out (tagged_calls.ToolCallStream)."""

    complete: bool

    def push(self, piece: str) -> list[str | ToolCallDelta]: ...

    def finish(self) -> list[str | ToolCallDelta]: ...

    @property
    def calls(self) -> int: ...


class CallFormat(Protocol):
    """How the calls are written (tagged_calls.TaggedCalls)."""

    @property
    def name(self) -> str: ...

    @property
    def free_form(self) -> bool:
        """A call can carry a custom tool's free text (tagged_calls.py)."""
        ...

    def grammar(self, tools: Sequence[dict], choice: ToolChoice, parallel: bool,
                special_id: SpecialId, answer: Constraint | None = None) -> Constraint: ...

    def parse(self, text: str) -> tuple[str, list[ToolCall], bool]: ...

    def stream(self) -> CallStream: ...


class TaggedDialect(ChatDialect):
    """Thinking as ``reasoning`` reads it (None: no split), calls as ``tools`` writes them
    (None: the template writes no tool calls)."""

    def __init__(self, tools: CallFormat | None, reasoning: ReasoningDialect | None) -> None:
        self.tools = tools
        self.reasoning = reasoning
        self.tool_format = tools.name if tools is not None else None
        self.reasons = reasoning is not None
        self.free_form = tools is not None and tools.free_form

    def thinking(self, prompt: str) -> bool | None:
        return self.reasoning.thinking(prompt) if self.reasoning is not None else None

    def splitter(self, prompt: str) -> ThinkingReader | None:
        return self.reasoning.splitter(prompt) if self.reasoning is not None else None

    def constraint(self, reply: Reply) -> Constraint | None:
        constraint = reply.answer
        if reply.calls_tools:
            assert self.tools is not None  # (a ChatRequest refuses tools otherwise)
            constraint = self.tools.grammar(reply.checked_tools(), reply.tool_choice,
                                            reply.parallel, reply.special_id, reply.answer)
        elif constraint is not None:
            constraint = constraint.fenced()
        if constraint is not None and self.reasoning is not None:
            constraint = self.reasoning.constraint(constraint, reply.prompt, reply.special_id)
        return constraint

    def fenced(self, reply: Reply) -> bool:
        """The answer is JSON that may come in a ```json fence (stripped when read)."""
        return not reply.calls_tools and reply.answer is not None and \
            reply.answer.fenced().fence

    def reader(self, reply: Reply) -> TaggedReader:
        return TaggedReader(self.splitter(reply.prompt),
                            self.tools.stream() if reply.calls_tools and self.tools else None,
                            FenceStripper() if self.fenced(reply) else None)

    def read(self, reply: Reply, text: str) -> tuple[str, str | None, list[ToolCall] | None]:
        reasoning, answer = None, text
        splitter = self.splitter(reply.prompt)
        if splitter is not None:
            splitter.push(text)
            splitter.flush()
            reasoning, answer = splitter.reasoning, splitter.answer
        calls = None
        if reply.calls_tools and self.tools is not None:
            answer, calls, _complete = self.tools.parse(answer)
        if self.fenced(reply):
            fence = FenceStripper()
            answer = fence.push(answer) + fence.finish()
        return answer, reasoning, calls


class TaggedReader:
    """A tagged reply as it streams: the thinking split off first, then the answer's fence
    stripped or its tool calls read."""

    def __init__(self, splitter: ThinkingReader | None, calls: CallStream | None,
                 fence: FenceStripper | None) -> None:
        self.splitter = splitter
        self.calls = calls
        self.fence = fence

    def push(self, text: str, last: bool = False) -> list[ChatPiece | ToolCallDelta]:
        pieces = [ChatPiece(text)] if self.splitter is None else self.splitter.push(text)
        if last and self.splitter is not None:
            pieces += self.splitter.flush()
        if self.fence is not None:  # the answer's JSON without its fence
            pieces = [p if p.reasoning else ChatPiece(self.fence.push(p)) for p in pieces]
            if last:
                pieces.append(ChatPiece(self.fence.finish()))
        out: list[ChatPiece | ToolCallDelta] = []
        for piece in pieces:
            if piece.reasoning or self.calls is None:
                if piece:
                    out.append(piece)
            else:
                out += [ChatPiece(p) if isinstance(p, str) else p for p in self.calls.push(piece)]
        if last and self.calls is not None:
            out += [ChatPiece(p) if isinstance(p, str) else p for p in self.calls.finish()]
        return out

    @property
    def tool_calls(self) -> int:
        return self.calls.calls if self.calls is not None else 0

    @property
    def complete(self) -> bool:
        return self.calls.complete if self.calls is not None else True


class FenceStripper:
    """A JSON answer's text without the ```json fence a model may put around it (and the
    whitespace around the document), as it streams: what could still be the fence or trailing
    whitespace is held back until the next piece shows it is not. A fence left incomplete at
    the end (the reply ran out of tokens) stays."""

    OPEN, CLOSE = "```json", "```"

    def __init__(self) -> None:
        self._head: str | None = ""  # text before the document, until decided (None: decided)
        self._held = ""
        self._fenced = False

    def push(self, text: str) -> str:
        if self._head is not None:
            self._head += text
            start = self._head.lstrip(" \t\n")
            if self.OPEN.startswith(start) and len(start) < len(self.OPEN):
                return ""  # "", "`", "```js": not decided yet
            if start.startswith(self.OPEN):
                rest = start[len(self.OPEN):].lstrip(" \t\n")
                if not rest:
                    return ""
                self._fenced = True
            else:
                rest = start
            self._head, text = None, rest
        self._held += text
        keep = self._tail(self._held)
        out, self._held = self._held[:len(self._held) - keep], self._held[len(self._held) - keep:]
        return out

    def finish(self) -> str:
        if self._head is not None:  # the document never began
            head, self._head = self._head, None
            return head
        tail, self._held = self._held, ""
        stripped = tail.rstrip(" \t\n")
        if self._fenced and stripped.endswith(self.CLOSE):
            stripped = stripped[:-len(self.CLOSE)].rstrip(" \t\n")
        return stripped  # whitespace and backticks only: a closing fence cut short, if any

    def _tail(self, text: str) -> int:
        """How much of the end of ``text`` could be trailing whitespace and the closing fence."""
        body = text.rstrip(" \t\n`")
        tail = text[len(body):]
        if not self._fenced and "`" in tail:
            tail = tail[tail.rindex("`") + 1:]
        return len(tail)
