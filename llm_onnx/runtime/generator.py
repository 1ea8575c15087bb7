"""The embeddable API: load a model folder once, then generate, stream and chat.

    from llm_onnx.runtime import Model
    model = Model.load("models/smollm2-int8")
    print(model.chat([{"role": "user", "content": "What is the capital of France?"}]).text)
    for piece in model.stream("Once upon a time", max_new_tokens=64, temperature=0.8, seed=1):
        print(piece, end="", flush=True)

A Model is safe to share between threads: sessions are shared, every request has its own KV cache,
sampler and detokenizer.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tokenizers

from llm_onnx.errors import GenerationError
from llm_onnx.runtime.chat import Message, render_chat
from llm_onnx.runtime.sampling import GenerationOptions, Sampler
from llm_onnx.runtime.session import Engine, KVCache, RuntimeOptions
from llm_onnx.runtime.textstream import StopMatcher, StreamDecoder

Prompt = str | Sequence[int]


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
    ``finish_reason`` is "stop" (an end-of-sequence token), "stop_string" or "length".
    """

    text: str
    token_ids: list[int]
    finish_reason: str
    prompt_tokens: int
    timings: Timings = field(default_factory=Timings)

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "token_ids": self.token_ids, "finish_reason": self.finish_reason,
                "prompt_tokens": self.prompt_tokens, "timings": self.timings.to_dict()}


@dataclass
class _Row:
    decoder: StreamDecoder | None  # None: a model without a tokenizer yields ids only
    stops: StopMatcher
    prompt_tokens: int
    tokens: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    finish_reason: str | None = None


class Model:
    """A loaded model folder.

    Args:
        folder: a model folder written by ``llm-onnx export``.
        runtime: provider, threads, optimization level (see RuntimeOptions).
    """

    def __init__(self, folder: Path | str, runtime: RuntimeOptions | None = None) -> None:
        start = time.perf_counter()
        engine = Engine(folder, runtime)
        m = engine.manifest
        tok_file = m.folder / "tokenizer.json"
        tokenizer = tokenizers.Tokenizer.from_file(str(tok_file)) if tok_file.is_file() else None
        self._setup(engine, tokenizer,
                    m.tokenizer.get("eos_token_ids") or (), m.tokenizer.get("chat_template"),
                    _special_tokens(m.folder / "tokenizer_config.json"), m.data.get("generation", {}))
        self.load_s = time.perf_counter() - start

    @classmethod
    def load(cls, folder: Path | str, **runtime: Any) -> Model:
        """``Model.load(folder, provider="cpu", threads=2)``; keywords are RuntimeOptions fields."""
        return cls(folder, RuntimeOptions(**runtime))

    @classmethod
    def from_parts(cls, engine: Any, tokenizer: tokenizers.Tokenizer | None, eos_token_ids: Sequence[int] = (),
                   chat_template: str | None = None, special_tokens: dict[str, str] | None = None,
                   ) -> Model:
        """A Model over any engine with Engine's interface (``step``, ``new_cache``,
        ``vocab_size``, ``context_length``): how tests drive the loop with fixed logits."""
        model = cls.__new__(cls)
        model._setup(engine, tokenizer, eos_token_ids, chat_template, special_tokens or {}, {})
        model.load_s = 0.0
        return model

    def _setup(self, engine: Any, tokenizer: tokenizers.Tokenizer | None, eos: Sequence[int],
               chat_template: str | None, special_tokens: dict[str, str],
               generation: dict[str, Any]) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.eos_token_ids = tuple(int(i) for i in eos)
        self.chat_template = chat_template
        self.special_tokens = special_tokens
        sampling = generation.get("do_sample", True)
        self.defaults = GenerationOptions(**{k: v for k, v in generation.items() if sampling and k in (
            "temperature", "top_p", "top_k", "repetition_penalty")})

    @property
    def context_length(self) -> int:
        return self.engine.context_length

    # ------------------------------------------------------------------ text <-> ids

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if self.tokenizer is None:
            raise GenerationError("this model folder has no tokenizer.json: give token ids.")
        if not isinstance(text, str):
            raise GenerationError(f"a prompt must be a string or a list of token ids, got "
                                  f"{type(text).__name__}.")
        try:
            text.encode("utf-8")  # the tokenizer takes only encodable text (TypeError otherwise)
        except UnicodeEncodeError as e:
            raise GenerationError(f"the prompt is not valid Unicode: {text[e.start]!r} at "
                                  f"character {e.start} is a lone surrogate.") from None
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        if self.tokenizer is None:
            raise GenerationError("this model folder has no tokenizer.json.")
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def render_chat(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        if not self.chat_template:
            raise GenerationError("this model has no chat template; use generate() with a raw prompt.")
        return render_chat(self.chat_template, messages, self.special_tokens, add_generation_prompt)

    def _prompt_ids(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise GenerationError("the prompt is empty.")
            ids = self.encode(prompt)
        else:
            ids = [int(i) for i in prompt]
            bad = [i for i in ids if not 0 <= i < self.engine.vocab_size]
            if bad:
                raise GenerationError(f"token id {bad[0]} is outside the vocabulary "
                                      f"(0..{self.engine.vocab_size - 1}).")
        if not ids:
            raise GenerationError("the prompt has no tokens.")
        if len(ids) >= self.context_length:
            raise GenerationError(f"the prompt has {len(ids)} tokens but the model's context is "
                                  f"{self.context_length} tokens (prompt and answer together).")
        return ids

    def options(self, options: GenerationOptions | None = None, overrides: dict[str, Any] | None = None,
                ) -> GenerationOptions:
        """``options`` (or the model's defaults) with ``overrides`` applied, validated."""
        base = options or self.defaults
        try:
            return dataclasses.replace(base, **(overrides or {})).validated()
        except TypeError as e:
            raise GenerationError(f"unknown generation option: {e}") from e

    # ------------------------------------------------------------------ public API

    def generate(self, prompt: Prompt | Sequence[Prompt], options: GenerationOptions | None = None,
                 **overrides: Any) -> Result | list[Result]:
        """Generate for one prompt (text or token ids) or a batch of them (a list of prompts,
        any lengths, run together). Keywords override fields of ``options``."""
        opts = self.options(options, overrides)
        batch = _is_batch(prompt)
        prompts = [self._prompt_ids(p) for p in (prompt if batch else [prompt])]  # type: ignore[union-attr]
        results = _drain(self._run(prompts, opts))
        return results if batch else results[0]

    def stream(self, prompt: Prompt, options: GenerationOptions | None = None,
               **overrides: Any) -> Iterator[str]:
        """Text pieces of one prompt's answer as they become valid UTF-8."""
        opts = self.options(options, overrides)
        ids = self._prompt_ids(prompt)
        for event in self._run([ids], opts):
            if isinstance(event, str):
                yield event

    def chat(self, messages: Sequence[Message], options: GenerationOptions | None = None,
             **overrides: Any) -> Result:
        """One answer to a conversation, with the model's own chat template."""
        opts = self.options(options, overrides)
        ids = self.encode(self.render_chat(messages), add_special_tokens=False)
        return _drain(self._run([self._prompt_ids(ids)], opts))[0]

    def chat_session(self, system: str | None = None) -> ChatSession:
        """A multi-turn conversation that keeps earlier turns in the KV cache."""
        return ChatSession(self, system)

    # ------------------------------------------------------------------ the loop

    def _run(self, prompts: list[list[int]], opts: GenerationOptions, cache: KVCache | None = None,
             reused: int = 0) -> Iterator[str | list[Result]]:
        """Yields text pieces of row 0 (for streaming), then the list of Results.

        With ``cache`` (batch 1), its first ``reused`` positions already hold prompts[0][:reused]."""
        start = time.perf_counter()
        b = len(prompts)
        lengths = np.array([len(p) for p in prompts], dtype=np.int64)
        room = self.context_length - int(lengths.max())
        max_new = min(opts.max_new_tokens, room)
        if cache is None:
            cache = self.engine.new_cache(b, int(lengths.max()) + max_new)
        else:
            cache.grow(int(lengths.max()) + max_new)
        eos = set() if opts.ignore_eos else set(self.eos_token_ids) | set(opts.stop_token_ids)
        rows = [_Row(StreamDecoder(self.tokenizer, p) if self.tokenizer else None,
                     StopMatcher(opts.stop), len(p)) for p in prompts]
        sampler = Sampler(opts, b, self.engine.vocab_size, prompts)
        timings = [Timings() for _ in range(b)]

        if reused:
            logits = self.engine.step(cache, np.array([prompts[0][reused:]], dtype=np.int64))
        else:
            ids = np.zeros((b, int(lengths.max())), dtype=np.int64)
            for i, p in enumerate(prompts):
                ids[i, :len(p)] = p
            logits = self.engine.step(cache, ids, lengths)
        prefill_end = time.perf_counter()
        decode_steps = 0
        for step in range(max_new):
            tokens = sampler(logits)
            now = time.perf_counter()
            for i, row in enumerate(rows):
                if row.finish_reason is not None:
                    continue
                if step == 0:
                    timings[i].ttft_s = now - start
                token = int(tokens[i])
                row.tokens.append(token)
                if token in eos:
                    row.finish_reason = "stop"
                    continue
                if row.decoder is None:
                    continue
                piece, stopped = row.stops.push(row.decoder.push(token))
                if piece:
                    row.text.append(piece)
                    if i == 0:
                        yield piece
                if stopped:
                    row.finish_reason = "stop_string"
            if all(r.finish_reason is not None for r in rows) or step == max_new - 1:
                break
            sampler.observe(tokens)
            logits = self.engine.step(cache, tokens[:, None].astype(np.int64))
            decode_steps += 1
        end = time.perf_counter()
        results = []
        for i, row in enumerate(rows):
            if row.finish_reason != "stop_string" and row.decoder is not None:
                tail = row.stops.push(row.decoder.flush())[0] + row.stops.flush()
                if tail:
                    row.text.append(tail)
                    if i == 0:
                        yield tail
            t = timings[i]
            t.prefill_s, t.prefill_tokens = prefill_end - start, int(lengths[i]) - reused
            t.decode_s, t.decode_tokens = end - prefill_end, decode_steps
            results.append(Result("".join(row.text), row.tokens, row.finish_reason or "length",
                                  int(lengths[i]), t))
        yield results


class ChatSession:
    """A conversation whose earlier turns stay in the KV cache: each turn prefills only the tokens
    the previous turns did not already put there."""

    def __init__(self, model: Model, system: str | None = None) -> None:
        self.model = model
        self.system = system
        self.reset()

    def reset(self) -> None:
        self.messages: list[Message] = ([{"role": "system", "content": self.system}]
                                        if self.system else [])
        self._cache: KVCache | None = None
        self._cached: list[int] = []  # tokens whose keys/values are in the cache
        self.last: Result | None = None

    def stream(self, text: str, options: GenerationOptions | None = None,
               **overrides: Any) -> Iterator[str]:
        """The answer to ``text`` as streamed pieces; the turn is recorded when the stream ends."""
        model = self.model
        opts = model.options(options, overrides)
        if not isinstance(text, str) or not text.strip():
            raise GenerationError("the message is empty.")
        messages = self.messages + [{"role": "user", "content": text}]
        ids = model._prompt_ids(model.encode(model.render_chat(messages), add_special_tokens=False))
        reused = _common_prefix(self._cached, ids)
        reused = min(reused, len(ids) - 1)  # at least one new token yields the next logits
        if self._cache is None:
            self._cache = model.engine.new_cache(1, min(model.context_length,
                                                        len(ids) + opts.max_new_tokens))
        self._cache.lengths[:] = reused  # positions past it are stale and will be overwritten
        result: Result | None = None
        for event in model._run([ids], opts, self._cache, reused):
            if isinstance(event, str):
                yield event
            else:
                result = event[0]
        assert result is not None
        fed = result.token_ids[:-1]  # the last sampled token was never run through the model
        self._cached = ids + fed
        self.messages = messages + [{"role": "assistant", "content": result.text}]
        self.last = result

    def send(self, text: str, options: GenerationOptions | None = None, **overrides: Any) -> Result:
        for _ in self.stream(text, options, **overrides):
            pass
        assert self.last is not None
        return self.last


def _special_tokens(tokenizer_config: Path) -> dict[str, str]:
    """bos_token, eos_token, ... as strings, for chat templates."""
    out: dict[str, str] = {}
    if tokenizer_config.is_file():
        cfg = json.loads(tokenizer_config.read_text(encoding="utf-8"))
        for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
            value = cfg.get(key)
            if isinstance(value, dict):
                value = value.get("content")
            if isinstance(value, str):
                out[key] = value
    return out


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _is_batch(prompt: Any) -> bool:
    if isinstance(prompt, str):
        return False
    items = list(prompt)
    return bool(items) and all(isinstance(p, str) or not isinstance(p, (int, np.integer))
                               for p in items)


def _drain(events: Iterator[str | list[Result]]) -> list[Result]:
    results: list[Result] = []
    for event in events:
        if not isinstance(event, str):
            results = event
    return results
