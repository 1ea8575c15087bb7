"""OpenAI's (legacy) Completions API: POST /v1/completions.

Parse: a prompt (text, token ids, or a list of either) and the sampling fields, read into a
Plan. Render: each choice's text (after the echoed prompt with ``echo``), with logprobs as the
Completions API writes them; streamed, a chunk per token.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import Response

from llm_onnx.errors import GenerationError
from llm_onnx.runtime.chat.dialects.base import ChatPiece
from llm_onnx.runtime.generation.results import Result, TokenEvent
from llm_onnx.runtime.model import Model
from llm_onnx.serve import pipeline
from llm_onnx.serve.errors import bad
from llm_onnx.serve.fields import (
    body_object,
    boolean,
    fit_length,
    integer,
    sampling,
    served_model,
    stream_fields,
)
from llm_onnx.serve.logprobs import TokenText, completion_logprobs, echo_logprobs
from llm_onnx.serve.names import ModelNames
from llm_onnx.serve.openai_choices import (
    COMMON_FIELDS,
    IGNORED_FIELDS,
    MAX_N,
    Choices,
    Piece,
    finish_reason,
    respond,
)
from llm_onnx.serve.plan import COMPLETION, Plan
from llm_onnx.serve.policy import Fields
from llm_onnx.serve.structured import answer_constraint

PATHS = ("/v1/completions",)
API = "completions"  # in the field policy's reports (policy.py)
FIELDS = COMMON_FIELDS | {"prompt", "echo", "best_of"}
TOLERATED_FIELDS: set[str] = set()
UNSUPPORTED_FIELDS = {"suffix": ""}  # (a value that asks for nothing)
DEFAULT_MAX_TOKENS = 16  # as OpenAI's legacy completions endpoint


def add_routes(app: FastAPI, service: Any, authorized: Any) -> None:
    @app.post("/v1/completions", dependencies=[Depends(authorized)])
    async def completions(request: Request) -> Response:
        plan = completion_plan(await pipeline.read_body(request), service.model, service.names,
                               service.generating().max_length, service.fields(request, API))
        await service.prepare(plan)
        return await respond(service, request, plan, TextChoices(plan, service.tokens))


# ---------------------------------------------------------------------------------------------
# Parse
# ---------------------------------------------------------------------------------------------

def completion_plan(body: Any, model: Model, served: str | ModelNames, context: int,
                    fields: Fields | None = None) -> Plan:
    """POST /v1/completions, checked (``fields``: the field policy, lenient by default)."""
    body = body_object(body)
    (fields or Fields(API)).check(body, FIELDS, IGNORED_FIELDS, TOLERATED_FIELDS,
                                  UNSUPPORTED_FIELDS)
    name = served_model(body, served)
    answer = answer_constraint(body)
    n = integer(body, "n", 1, MAX_N) or 1
    best_of = integer(body, "best_of", 1, MAX_N)
    if best_of is not None and best_of != n:
        raise bad("best_of", "'best_of' different from 'n' is not supported.")
    echo = bool(boolean(body, "echo"))
    logprobs = integer(body, "logprobs", 0, 5)
    scored = logprobs if echo else None  # the echoed prompt's logprobs too (vLLM's answer)
    if scored is not None and not getattr(model.engine, "verifies", False):
        raise bad("echo", "'echo' with 'logprobs' needs the logits of every prompt position, "
                          "which this model folder's prefill.onnx does not return; re-export it "
                          "with this version of llm-onnx.")
    stream, usage = stream_fields(body)
    texts, prompts = _prompts(body.get("prompt"), model)
    options = sampling(body, model.defaults, model.engine.vocab_size)
    fitted = [replace(options, max_new_tokens=fit_length(  # 0 with echo: the prompt only
        body, ("max_tokens",), p, context, DEFAULT_MAX_TOKENS, "prompt",
        low=0 if echo else 1)) for p in prompts]
    if len(prompts) * n > MAX_N:
        raise bad("n", f"{len(prompts)} prompts x n={n} is more than {MAX_N} choices.")
    return Plan(COMPLETION, name, prompts, fitted, n, stream, usage, logprobs, echo, texts,
                constraint=answer, prompt_logprobs=scored)


def _prompts(prompt: Any, model: Model) -> tuple[list[str], list[list[int]]]:
    """A string, a list of strings, a list of token ids or a list of those."""
    vocab = model.engine.vocab_size
    if prompt is None:
        raise bad("prompt", "you must provide a 'prompt'.")
    items = [prompt] if isinstance(prompt, str) or (
        isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)) else prompt
    if not isinstance(items, list) or not items:
        raise bad("prompt", "'prompt' must be a string, a list of strings, a list of token ids "
                            "or a list of lists of token ids, and not empty.")
    texts, ids = [], []
    for i, item in enumerate(items):
        if isinstance(item, str):
            if not item:
                raise bad("prompt", "a prompt must not be an empty string.")
            try:
                tokens = model.encode(item)
            except GenerationError as e:
                raise bad("prompt", str(e)) from None
            texts.append(item)
        elif isinstance(item, list) and item and all(
                isinstance(t, int) and not isinstance(t, bool) for t in item):
            outside = [t for t in item if not 0 <= t < vocab]
            if outside:
                raise bad("prompt", f"token id {outside[0]} in prompt {i} is outside the "
                                    f"vocabulary (0..{vocab - 1}).")
            tokens = list(item)
            texts.append(model.decode(tokens) if model.tokenizer is not None else "")
        else:
            raise bad("prompt", f"prompt {i} must be a non-empty string or list of token ids.")
        if not tokens:
            raise bad("prompt", f"prompt {i} has no tokens.")
        ids.append(tokens)
    return texts, ids


# ---------------------------------------------------------------------------------------------
# Render
# ---------------------------------------------------------------------------------------------

class TextChoices(Choices):
    """Choices as text: whole, or a chunk per token; the echoed prompt first with ``echo``."""

    chunk_object = COMPLETION

    def __init__(self, plan: Plan, tokens: TokenText) -> None:
        super().__init__(plan, tokens)
        self.offsets: dict[int, int] = {}  # each streamed choice's text so far (logprobs' offsets)

    def choice(self, index: int, result: Result) -> dict[str, Any]:
        plan = self.plan
        logprobs = None if plan.logprobs is None or result.logprobs is None else \
            completion_logprobs(result.logprobs, self.tokens)
        if plan.prompt_logprobs is not None and result.prompt_logprobs is not None:
            logprobs = echo_logprobs(plan.prompts[index // plan.n], result.prompt_logprobs,
                                     result.logprobs or [], self.tokens)
        prefix = plan.prompt_texts[index // plan.n] if plan.echo else ""
        return {"index": index, "text": prefix + result.text, "logprobs": logprobs,
                "finish_reason": finish_reason(result.finish_reason)}

    def first(self, i: int) -> dict[str, Any] | None:
        plan = self.plan
        if not plan.echo or plan.prompt_logprobs is not None:  # else with its logprobs: before
            return None
        text = plan.prompt_texts[i // plan.n]
        self.offsets[i] = len(text)
        return {"index": i, "text": text, "logprobs": None, "finish_reason": None}

    def before(self, i: int, event: TokenEvent) -> dict[str, Any] | None:
        """A streamed completion's echoed prompt with its logprobs (sent once they are known)."""
        plan = self.plan
        if event.prompt_logprobs is None or not plan.echo:
            return None
        logprobs = echo_logprobs(plan.prompts[i // plan.n], event.prompt_logprobs, [],
                                 self.tokens)
        self.offsets[i] = sum(len(t) for t in logprobs["tokens"])
        return {"index": i, "text": plan.prompt_texts[i // plan.n], "logprobs": logprobs,
                "finish_reason": None}

    def pieces(self, i: int, event: TokenEvent) -> list[Piece]:
        return [ChatPiece(event.text)] if event.text else []

    def delta(self, i: int, event: TokenEvent, pieces: list[Piece]) -> dict[str, Any]:
        reason = None if event.finish_reason is None else finish_reason(event.finish_reason)
        logprobs = None
        offset = self.offsets.get(i, 0)
        if self.plan.logprobs is not None and event.logprob is not None:
            logprobs = completion_logprobs([event.logprob], self.tokens, offset)
        self.offsets[i] = offset + len(event.text)
        return {"index": i, "text": event.text, "logprobs": logprobs, "finish_reason": reason}

    def cut_short(self, i: int) -> dict[str, Any]:
        return {"index": i, "text": ""}
