"""A multi-turn conversation over a Model that keeps its earlier turns in the KV cache."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from llm_onnx.errors import GenerationError
from llm_onnx.runtime.chat.dialects.base import ChatPiece, ThinkingReader
from llm_onnx.runtime.chat.image_parts import split_images
from llm_onnx.runtime.chat.render import Message, check_template_vars
from llm_onnx.runtime.chat.request import ChatModel, ChatRequest
from llm_onnx.runtime.generation.generator import Generator
from llm_onnx.runtime.generation.options import GenerationOptions
from llm_onnx.runtime.generation.results import Result

Tools = Sequence[dict[str, Any]]


class SessionModel(ChatModel, Protocol):
    """What a ChatSession needs of its model (llm_onnx.runtime.Model is one)."""

    def generator(self, options: GenerationOptions | None = None, **kwargs: Any) -> Generator: ...

    def options(self, options: GenerationOptions | None = None,
                overrides: dict[str, Any] | None = None, **fields: Any) -> GenerationOptions: ...

    def render_chat(self, messages: Sequence[Message], add_generation_prompt: bool = True, *,
                    tools: Tools | None = None,
                    template_vars: dict[str, Any] | None = None) -> str: ...

    def prompt_ids(self, prompt: str | Sequence[int]) -> list[int]: ...

    def encode_chat(self, prompt: str) -> list[int]: ...

    def reasoning_splitter(self, prompt: str) -> ThinkingReader | None: ...

    def reuse_points(self, messages: Sequence[Message], prompt: Sequence[int], *,
                     tools: Tools | None = None,
                     template_vars: dict[str, Any] | None = None) -> list[int]: ...


class ChatSession:
    """A conversation whose earlier turns stay in the KV cache: each turn's prompt is the whole
    conversation, and the generator runs only the tokens after the longest prefix its cache
    already holds. That prefix is all of the cache when the template renders earlier turns as
    they were generated; when it rewrites them (Qwen3 drops an earlier answer's ``<think>``
    block), the cache is cut back to the tokens the new prompt still starts with and the rest
    runs again. ``last.timings.prefill_tokens`` counts the tokens run.

    Args:
        model: the loaded Model.
        system: a system message opening the conversation.
        tools, template_vars: passed to the chat template on every turn (see Model.chat).
    """

    def __init__(self, model: SessionModel, system: str | None = None, *, tools: Tools | None = None,
                 template_vars: dict[str, Any] | None = None) -> None:
        self.model = model
        self.system = system
        self.tools = tools
        self.template_vars = check_template_vars(template_vars)
        self._generator = model.generator()
        self.reset()

    def reset(self) -> None:
        self.messages: list[Message] = ([{"role": "system", "content": self.system}]
                                        if self.system else [])
        self._generator.clear()
        self.last: Result | None = None

    def stream(self, text: str | list[dict], options: GenerationOptions | None = None, *,
               images: Sequence[Any] = (), **overrides: Any) -> Iterator[ChatPiece]:
        """The answer to ``text`` (or a list of content parts, image parts among them) as
        streamed pieces; ``images`` go before the text (a folder that takes images). The turn
        is recorded when the stream ends (the answer as the assistant's content, any thinking
        as its ``reasoning_content``). Stopped early (Ctrl-C while it streams, or the stream
        closed), the turn is recorded as far as it was streamed, and ``last`` is None. Earlier
        turns' images stay in the conversation, and in the cache: they are not encoded again."""
        model = self.model
        opts = model.options(options, overrides)
        content: Any = text
        if isinstance(text, str) and not text.strip() or isinstance(text, list) and not text:
            raise GenerationError("the message is empty.")
        if images:
            content = [{"type": "image", "image": image} for image in images] + (
                [{"type": "text", "text": text}] if isinstance(text, str) else list(text))
        elif not isinstance(text, (str, list)):
            raise GenerationError("the message must be text or a list of content parts.")
        messages = self.messages + [{"role": "user", "content": content}]
        shown_messages, sources = split_images(messages, getattr(
            getattr(model, "engine", None), "manifest", None))
        prompt = model.render_chat(shown_messages, tools=self.tools,
                                   template_vars=self.template_vars)
        ids = model.prompt_ids(model.encode_chat(prompt))
        row = model.image_row(ids, sources, prompt) if sources else None  # type: ignore
        opts = ChatRequest(model, prompt, opts.constraint).options_for(opts)
        gen = self._generator
        gen.release()  # the previous turn's keys and values stay: the new prompt starts with them
        points = [] if sources else model.reuse_points(
            messages, ids, tools=self.tools, template_vars=self.template_vars)
        gen.append_tokens(row.ids if row is not None else ids, options=opts,
                          reuse_points=points, images=row)
        splitter = model.reasoning_splitter(prompt)
        shown: list[ChatPiece] = []
        try:
            for piece in _chat_pieces(gen.texts(), splitter):
                shown.append(piece)
                yield piece
        except (KeyboardInterrupt, GeneratorExit):  # Ctrl-C, or the caller stopped reading
            self._interrupted(messages, shown)
            raise
        except BaseException:
            self._generator.clear()  # the turn is not recorded; nothing half-run is reused
            raise
        result = gen.result()
        reply: Message = {"role": "assistant", "content": result.text}
        if splitter is not None:
            result = dataclasses.replace(result, text=splitter.answer, reasoning=splitter.reasoning)
            reply = {"role": "assistant", "content": result.text}
            if result.reasoning:
                reply["reasoning_content"] = result.reasoning
        self.messages = messages + [reply]
        self.last = result

    def _interrupted(self, messages: list[Message], shown: list[ChatPiece]) -> None:
        """A turn stopped part-way: the conversation keeps it as far as it was shown (what the
        user saw is what the model is told it said), and the cache is dropped, since a run
        interrupted inside the model may have written a position (or advanced a recurrent
        state) that was never recorded; the next turn runs the whole conversation again."""
        reply: Message = {"role": "assistant",
                          "content": "".join(p for p in shown if not p.reasoning)}
        reasoning = "".join(p for p in shown if p.reasoning)
        if reasoning:
            reply["reasoning_content"] = reasoning
        self.messages = messages + [reply]
        self.last = None
        self._generator.clear()

    def send(self, text: str | list[dict], options: GenerationOptions | None = None, *,
             images: Sequence[Any] = (), **overrides: Any) -> Result:
        for _ in self.stream(text, options, images=images, **overrides):
            pass
        assert self.last is not None
        return self.last


def _chat_pieces(pieces: Iterator[str], splitter: ThinkingReader | None) -> Iterator[ChatPiece]:
    """Text pieces of a chat reply as ChatPieces, split into thinking and answer if ``splitter``."""
    if splitter is None:
        for piece in pieces:
            yield ChatPiece(piece)
        return
    for piece in pieces:  # (a harmony reader's tool-call deltas are not a session's)
        yield from (p for p in splitter.push(piece) if isinstance(p, ChatPiece))
    yield from (p for p in splitter.flush() if isinstance(p, ChatPiece))


def reuse_points(model: Any, messages: Sequence[Message], prompt: Sequence[int],
                 tools: Tools | None = None,
                 template_vars: dict[str, Any] | None = None) -> list[int]:
    """Where a later conversation's prompt may part from ``prompt`` (``messages`` rendered by
    ``model``): the lengths of the renderings of its first message and of all but its last,
    where each is a token prefix of ``prompt``. A model with a recurrent state keeps checkpoints
    there (what requests sharing a system prompt, or a conversation's next turn, reuse); for any
    other model there is nothing to keep, and none are computed."""
    if getattr(model.engine, "state_layout", None) is None or len(messages) < 2:
        return []
    points = []
    for k in sorted({1, len(messages) - 1}):
        try:
            ids = model.encode_chat(model.render_chat(messages[:k], add_generation_prompt=False,
                                                      tools=tools, template_vars=template_vars))
        except GenerationError:  # a template that renders no such prefix (a lone system)
            continue
        if 0 < len(ids) < len(prompt) and list(prompt[:len(ids)]) == ids:
            points.append(len(ids))
    return points
