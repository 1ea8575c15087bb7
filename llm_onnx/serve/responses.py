"""The answers: completions, chat messages (content, reasoning_content, tool_calls), streamed
chunks, logprobs and usage, in OpenAI's shapes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llm_onnx.runtime.model import Model
from llm_onnx.runtime.generation.sequence import Result, TokenLogprob, ToolCall
from llm_onnx.runtime.chat.dialects.base import ToolCallDelta
from llm_onnx.serve.protocol import CHAT, COMPLETION, Plan


def finish_reason(reason: str, tool_calls: bool = False) -> str:
    """Our finish reasons in OpenAI's words: "tool_calls" when a reply with tool calls ended
    where its grammar allowed (the calls are whole; "length" if they were cut short); "abort" for a request the server ended while shutting down ("cancelled") or
    whose constraint's matcher failed ("error")."""
    if tool_calls and reason == "stop":
        return "tool_calls"
    return {"stop": "stop", "stop_string": "stop", "length": "length"}.get(reason, "abort")


class TokenText:
    """Token strings and bytes for logprobs: a byte-level BPE token's own bytes (a character may
    span tokens), else the token decoded alone."""

    def __init__(self, model: Model) -> None:
        self.tokenizer = model.tokenizer
        self._byte_level = False
        if self.tokenizer is not None:
            import json

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


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def response(plan: Plan, results: Sequence[Result], text: TokenText) -> dict[str, Any]:
    """The whole (non-streamed) answer: one choice per result, prompt-major."""
    choices = []
    for index, r in enumerate(results):
        logprobs = None if plan.logprobs is None or r.logprobs is None else \
            chat_logprobs(r.logprobs, text) if plan.kind == CHAT else \
            completion_logprobs(r.logprobs, text)
        if plan.kind == CHAT:
            read = plan.chat.read(r) if plan.chat is not None else r
            calls = read.tool_calls or []
            message: dict[str, Any] = {"role": "assistant", "content": read.text, "refusal": None}
            if plan.thinking is not None:
                message["reasoning_content"] = read.reasoning
            if calls:
                message["content"] = read.text or None
                message["tool_calls"] = [tool_call(c) for c in calls]
            choice = {"index": index, "message": message, "logprobs": logprobs,
                      "finish_reason": finish_reason(r.finish_reason, bool(calls))}
        else:
            if plan.prompt_logprobs is not None and r.prompt_logprobs is not None:
                logprobs = echo_logprobs(plan.prompts[index // plan.n], r.prompt_logprobs,
                                         r.logprobs or [], text)
            prefix = plan.prompt_texts[index // plan.n] if plan.echo else ""
            choice = {"index": index, "text": prefix + r.text, "logprobs": logprobs,
                      "finish_reason": finish_reason(r.finish_reason)}
        choices.append(choice)
    return {"id": plan.id, "object": plan.kind, "created": plan.created, "model": plan.model,
            "choices": choices, "usage": usage(sum(len(p) for p in plan.prompts),
                                               sum(len(r.token_ids) for r in results))}


def tool_call(call: ToolCall) -> dict[str, Any]:
    """A message's tool call in OpenAI's shape (arguments as JSON text)."""
    return {"id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


def tool_call_delta(delta: ToolCallDelta) -> dict[str, Any]:
    """A streamed chunk's ``delta.tool_calls`` entry: the first of a call carries its id, type
    and name; every one may carry a piece of the arguments."""
    out: dict[str, Any] = {"index": delta.index}
    if delta.id is not None:
        out.update(id=delta.id, type="function",
                   function={"name": delta.name, "arguments": delta.arguments})
    else:
        out["function"] = {"arguments": delta.arguments}
    return out


def chunk(plan: Plan, choices: list[dict[str, Any]], usage_: dict[str, int] | None = None,
          ) -> dict[str, Any]:
    """One server-sent event's object (``chat.completion.chunk`` or ``text_completion``)."""
    out = {"id": plan.id, "object": "chat.completion.chunk" if plan.kind == CHAT else COMPLETION,
           "created": plan.created, "model": plan.model, "choices": choices}
    if plan.include_usage:
        out["usage"] = usage_
    return out
