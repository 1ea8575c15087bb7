"""The embeddable API: load a model folder once, then generate, stream and chat (or, for an
embedding model's folder, embed).

    from llm_onnx.runtime import Model
    model = Model.load("models/smollm2-int8")
    print(model.chat([{"role": "user", "content": "What is the capital of France?"}]).text)
    model.chat(messages, template_vars={"enable_thinking": False})  # the template's switches
    for piece in model.stream("Once upon a time", max_new_tokens=64, temperature=0.8, seed=1):
        print(piece, end="", flush=True)
    Model.load("models/qwen3-embedding-fp32").embed(["a text", "another"])  # (2, E) float32

Every method is a short loop over a Generator (``model.generator()`` for step-by-step control).
A Model is safe to share between threads: sessions are shared, every call has its own KV cache,
samplers and detokenizers.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Generator as PyGenerator
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tokenizers

from llm_onnx.errors import GenerationError
from llm_onnx.model_folder import GenerationDefaults
from llm_onnx.runtime.chat.dialects import chat_dialect
from llm_onnx.runtime.chat.dialects.base import ChatPiece, ThinkingReader, ToolCallDelta, ToolChoice
from llm_onnx.runtime.chat.image_parts import split_images, text_only_error
from llm_onnx.runtime.chat.render import Message, check_template_vars, continue_final
from llm_onnx.runtime.chat.request import (
    ChatRequest,
    check_tool_choice,
    check_tools,
    read_chat_template,
)
from llm_onnx.runtime.chat_session import ChatSession, reuse_points
from llm_onnx.runtime.core.embedder import EmbeddingEngine, embedding_rows
from llm_onnx.runtime.core.engine import RuntimeOptions, not_generating
from llm_onnx.runtime.core.engines import open_engine
from llm_onnx.runtime.generation.generator import Generator
from llm_onnx.runtime.generation.images import ImageInputs, RowImages
from llm_onnx.runtime.generation.options import GenerationOptions, is_batch, row_options
from llm_onnx.runtime.generation.results import Result, TokenLogprob
from llm_onnx.runtime.generation.speculative import (
    SpeculativeOptions,
    check_same_tokenizer,
    speculative_options,
)
from llm_onnx.runtime.structured.constraint import constraint_shorthand
from llm_onnx.runtime.structured.matcher import Constraints

Prompt = str | Sequence[int]
# Speculation when a caller says nothing (docs/speculative-decoding.md has the figures): prompt
# lookup for fp32 folders, whose verify runs give single steps' logits (greedy output is the
# same); quantized kernels round a chunk differently from a step, so there it is asked for.
DEFAULT_SPECULATIVE = {"fp32": "ngram"}
Tools = Sequence[dict[str, Any]]


class Model:
    """A loaded model folder.

    Args:
        folder: a model folder written by ``llm-onnx export``.
        runtime: provider, threads, optimization level (see RuntimeOptions).
        chat_template: a chat template used instead of the folder's: a Jinja file (or a
            tokenizer_config.json), or the template's text; checked first (it must render a
            two-message conversation); the folder is not modified.
        tool_call_format: how replies write tool calls, a tool dialect's name
            (llm_onnx.runtime.chat.dialects: hermes, mistral, ...); default: read off the template.
        speculative: "off", "ngram" (prompt lookup), "draft" or SpeculativeOptions
            (llm_onnx.runtime.generation.speculative): several tokens per model run, the same output;
            None: the default (``DEFAULT_SPECULATIVE``: "ngram" for fp32 folders, else off;
            off where the folder cannot verify).
        num_speculative_tokens: most tokens drafted per step.
        draft_model: a model folder (or a loaded Model) with the same tokenizer that drafts
            for this one (implies speculative "draft").
    """

    draft_model: Model | None  # the loaded draft model (speculative "draft"), else None
    image_inputs: ImageInputs | None  # a folder that takes images: its way in

    def __init__(self, folder: Path | str, runtime: RuntimeOptions | None = None, *,
                 chat_template: Path | str | None = None,
                 tool_call_format: str | None = None,
                 speculative: SpeculativeOptions | str | None = None,
                 num_speculative_tokens: int | None = None,
                 draft_model: Path | str | Model | None = None) -> None:
        start = time.perf_counter()
        engine = open_engine(folder, runtime)
        m = engine.manifest
        assert m.folder is not None  # a manifest read from a folder knows it
        tok_file = m.folder / "tokenizer.json"
        tokenizer = tokenizers.Tokenizer.from_file(str(tok_file)) if tok_file.is_file() else None
        embeds = isinstance(engine, EmbeddingEngine)
        template = None if embeds else m.tokenizer.chat_template if chat_template is None else \
            read_chat_template(chat_template, m.tokenizer.special_tokens)
        self._setup(engine, tokenizer, m.tokenizer.eos_token_ids, template,
                    m.tokenizer.special_tokens, m.generation, tool_call_format)
        if embeds and (chat_template or tool_call_format or draft_model
                       or speculative not in (None, "off")):
            raise GenerationError(f"{m.folder} is an embedding model: chat templates, tool "
                                  "calls and speculative decoding are for generation models.")
        if embeds:  # nothing to speculate
            self.speculative, self.speculative_is_default, self.draft_model = \
                SpeculativeOptions(), True, None
        else:
            self.set_speculative(speculative, num_speculative_tokens=num_speculative_tokens,
                                 draft_model=draft_model)
        vision = getattr(engine, "vision", None)
        self.image_inputs = ImageInputs(m, vision, lambda text: self.encode(
            text, add_special_tokens=False)) if vision is not None else None
        self.load_s = time.perf_counter() - start

    @classmethod
    def load(cls, folder: Path | str, *, chat_template: Path | str | None = None,
             tool_call_format: str | None = None,
             speculative: SpeculativeOptions | str | None = None,
             num_speculative_tokens: int | None = None,
             draft_model: Path | str | Model | None = None, **runtime: Any) -> Model:
        """``Model.load(folder, provider="cpu", threads=2)``; keywords are RuntimeOptions fields
        (and ``chat_template``, ``tool_call_format``, ``speculative``,
        ``num_speculative_tokens``, ``draft_model``: see the class)."""
        return cls(folder, RuntimeOptions(**runtime), chat_template=chat_template,
                   tool_call_format=tool_call_format, speculative=speculative,
                   num_speculative_tokens=num_speculative_tokens, draft_model=draft_model)

    def set_speculative(self, speculative: SpeculativeOptions | str | None = None, *,
                        num_speculative_tokens: int | None = None,
                        draft_model: Path | str | Model | None = None) -> None:
        """How this model's generators speculate from now on (see the class's arguments); a
        draft model folder is loaded here, once."""
        self.speculative_is_default = speculative is None and draft_model is None
        if speculative is None and draft_model is None:
            manifest = getattr(self.engine, "manifest", None)
            speculative = "off" if manifest is None else \
                DEFAULT_SPECULATIVE.get(manifest.precision.precision, "off")
        opts = speculative_options(speculative, num_tokens=num_speculative_tokens,
                                   draft_model=draft_model)
        self.draft_model = None
        if opts.method == "draft":
            self.draft_model = self.load_draft_model(opts.draft_model)
            self.draft_model.require_generation()
            check_same_tokenizer(self.draft_model, self)
            opts = dataclasses.replace(opts, draft_model=self.draft_model)
        self.speculative = opts

    def load_draft_model(self, draft: Path | str | Model) -> Model:
        """A draft model: a folder loaded with this model's runtime options, or a Model as is."""
        if isinstance(draft, (str, Path)):
            return Model(draft, getattr(self.engine, "options", None))
        return draft

    @classmethod
    def from_parts(cls, engine: Any, tokenizer: tokenizers.Tokenizer | None, eos_token_ids: Sequence[int] = (),
                   chat_template: str | None = None, special_tokens: dict[str, str] | None = None,
                   tool_call_format: str | None = None) -> Model:
        """A Model over any engine implementing ``EngineProtocol`` (llm_onnx.runtime.core.engine):
        how tests drive the generator with scripted logits."""
        model = cls.__new__(cls)
        model._setup(engine, tokenizer, eos_token_ids, chat_template, special_tokens or {},
                     GenerationDefaults(), tool_call_format)
        model.speculative = SpeculativeOptions()
        model.speculative_is_default, model.draft_model = True, None
        model.load_s = 0.0
        return model

    def _setup(self, engine: Any, tokenizer: tokenizers.Tokenizer | None, eos: Sequence[int],
               chat_template: str | None, special_tokens: dict[str, str],
               generation: GenerationDefaults, tool_call_format: str | None = None) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.image_inputs = None
        self.eos_token_ids = tuple(int(i) for i in eos)
        self._constraints: Constraints | None = None
        self._constraints_lock = threading.Lock()
        self.chat_template = chat_template
        self.special_tokens = dict(special_tokens)
        # How replies write their thinking (returned apart: Result.reasoning, ChatPiece) and
        # their tool calls (llm_onnx.runtime.chat.dialects), read off the template and tokenizer
        self.dialect = chat_dialect(chat_template, tokenizer, tool_call_format)
        # The checkpoint's sampling defaults, unless it says not to sample.
        self.defaults = GenerationOptions()
        if generation.do_sample is not False:
            self.defaults = GenerationOptions(**{
                k: getattr(generation, k) for k in ("temperature", "top_p", "top_k",
                                                    "repetition_penalty")
                if getattr(generation, k) is not None})

    @property
    def context_length(self) -> int:
        return self.engine.context_length

    @property
    def tool_format(self) -> str | None:
        """How replies write tool calls (a tool dialect's name); None: the template has none."""
        return self.dialect.tool_format

    @property
    def splits_reasoning(self) -> bool:
        """Replies may think; their thinking comes back apart from the answer."""
        return self.dialect.reasons

    @property
    def task(self) -> str:
        """"generate", or "embed" for an embedding model's folder (``embed``)."""
        return "embed" if isinstance(self.engine, EmbeddingEngine) else "generate"

    def require_generation(self) -> None:
        """GenerationError for an embedding model's folder, saying what it does instead."""
        if isinstance(self.engine, EmbeddingEngine):
            raise GenerationError(not_generating(self.engine.manifest))

    @property
    def constraints(self) -> Constraints:
        """The constraint engine of this model (llguidance over its tokenizer, made on first use;
        compiled grammars are cached in it)."""
        with self._constraints_lock:
            if self._constraints is None:
                if self.tokenizer is None:
                    raise GenerationError("constrained decoding needs the model folder's "
                                          "tokenizer.json, and this folder has none.")
                self._constraints = Constraints(self.tokenizer.to_str(), self.engine.vocab_size,
                                                self.eos_token_ids)
            return self._constraints

    # ------------------------------------------------------------------ text <-> ids

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if self.tokenizer is None:
            raise GenerationError("this model folder has no tokenizer.json: give token ids (the "
                                  "CLI: `llm-onnx generate --prompt-ids 1,2,3`).")
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

    def render_chat(self, messages: Sequence[Message], add_generation_prompt: bool = True, *,
                    tools: Tools | None = None, template_vars: dict[str, Any] | None = None,
                    continue_final_message: bool = False) -> str:
        """The prompt text of ``messages`` with the model's chat template; ``tools`` (OpenAI's
        function schemas) and ``template_vars`` (``{"enable_thinking": False}``, ...) are passed
        to the template as transformers' ``apply_chat_template`` passes them.
        ``continue_final_message``: the reply continues the final message (an assistant's
        partial answer) instead of opening a turn of its own."""
        if not self.chat_template:
            raise GenerationError("this model has no chat template; use generate() with a raw prompt.")
        if tools is not None and (isinstance(tools, (str, bytes, dict)) or not all(
                isinstance(t, dict) for t in tools)):
            raise GenerationError("tools must be a list of dicts (OpenAI's {'type': 'function', "
                                  "'function': {...}} schemas).")
        text = self.dialect.render(self.chat_template, messages, self.special_tokens,
                                   add_generation_prompt and not continue_final_message,
                                   tools=tools, **check_template_vars(template_vars))
        return continue_final(text, messages) if continue_final_message else text

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        """A prompt (text, encoded with special tokens, or token ids) as checked token ids."""
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

    def options(self, options: GenerationOptions | None = None,
                overrides: dict[str, Any] | None = None, **fields: Any) -> GenerationOptions:
        """``options`` (or the model's defaults) with ``overrides`` and keyword fields applied,
        validated: ``model.options(max_new_tokens=64, temperature=0.7)``. A constraint may be
        given as one of ``json_schema=``, ``json_object=True``, ``regex=``, ``grammar=``,
        ``choice=`` instead of ``constraint=Constraint...``."""
        base = options or self.defaults
        fields = {**(overrides or {}), **fields}
        shorthand = constraint_shorthand(fields)
        if shorthand is not None:
            fields["constraint"] = shorthand
        try:
            return dataclasses.replace(base, **fields).validated()
        except TypeError as e:
            raise GenerationError(f"unknown generation option: {e}") from e

    # ------------------------------------------------------------------ public API

    def generator(self, options: GenerationOptions | None = None, *, batch: int = 1,
                  max_length: int | None = None, prefill_chunk: int | None = None,
                  speculative: SpeculativeOptions | str | None = None,
                  **overrides: Any) -> Generator:
        """A step-wise Generator over this model (see llm_onnx.runtime.generation.generator)."""
        self.require_generation()
        return Generator(self, options, batch=batch, max_length=max_length,
                         prefill_chunk=prefill_chunk, speculative=speculative, **overrides)

    def generate(self, prompt: Prompt | Sequence[Prompt], options: GenerationOptions | None = None,
                 *, images: Sequence[Any] | None = None, **overrides: Any) -> Result | list[Result]:
        """Generate for one prompt (text or token ids) or a batch of them (a list of prompts,
        any lengths, decoded together). Keywords override fields of ``options``. Row i of a batch
        samples with ``seed + i``. ``images`` (one prompt, a folder that takes images): paths,
        bytes, data: URLs, PIL images or arrays, one per image placeholder of the prompt (with
        none, each image's block goes before the text)."""
        self.require_generation()
        opts = self.options(options, overrides)
        batch = is_batch(prompt)
        if images and batch:
            raise GenerationError("images go with one prompt; generate a batch without them.")
        # a batch is a list of prompts (is_batch), which the type of `prompt` cannot say
        prompts = [self.prompt_ids(p) for p in (prompt if batch else [prompt])]  # type: ignore[arg-type]
        rows = [self.image_row(prompts[0], [(src, f"images[{k}]") for k, src in
                                            enumerate(images)])] if images else None
        gen = self._start([r.ids for r in rows] if rows else prompts, opts, rows)
        for _ in gen.events():
            pass
        results = [gen.result(row) for row in range(len(prompts))]
        return results if batch else results[0]

    def prompt_logprobs(self, prompt: Prompt, top: int = 0) -> list[TokenLogprob | None]:
        """log P(token | the tokens before it) of every token of ``prompt`` (text, encoded with
        special tokens, or token ids), None for the first, with the ``top`` most likely
        alternatives at each position: one run of the prompt (in chunks if long), nothing
        generated. Their sum is the prompt's log-likelihood under the model."""
        gen = self.generator(self.options(max_new_tokens=0))
        gen.append_tokens(self.prompt_ids(prompt), prompt_logprobs=top)
        for _ in gen.events():
            pass
        scored = gen.result().prompt_logprobs
        assert scored is not None
        return scored

    def stream(self, prompt: Prompt, options: GenerationOptions | None = None,
               **overrides: Any) -> Iterator[str]:
        """Text pieces of one prompt's answer as they become valid UTF-8; the iterator's return
        value (``StopIteration.value``, or ``yield from``'s) is the finished Result."""
        self.require_generation()
        opts = self.options(options, overrides)
        gen = self._start([self.prompt_ids(prompt)], opts)

        def pieces() -> PyGenerator[str, None, Result]:
            yield from gen.texts()
            return gen.result()

        return pieces()

    def chat(self, messages: Sequence[Message], options: GenerationOptions | None = None, *,
             tools: Tools | None = None, tool_choice: ToolChoice | None = None,
             parallel_tool_calls: bool = True, template_vars: dict[str, Any] | None = None,
             **overrides: Any) -> Result:
        """One answer to a conversation, with the model's own chat template (``tools`` and
        ``template_vars`` go to the template). (Not for an embedding model's folder.) A reasoning
        model's ``<think>`` block comes back apart: ``result.reasoning`` is the thinking,
        ``result.text`` the answer after it.

        With ``tools``, ``result.tool_calls`` holds the calls the reply made (``text`` is the
        rest). ``tool_choice``: "auto" (the default with tools: the model decides; a call it
        opens is constrained to the function's schema), "required" (at least one call),
        ``{"type": "function", "function": {"name": ...}}`` (that function, once) or "none".
        A constraint (``json_schema=``, ...) applies to the answer after any thinking."""
        request, opts = self._chat_request(messages, options, overrides, tools, tool_choice,
                                           parallel_tool_calls, template_vars)
        ids = self.prompt_ids(self.encode_chat(request.prompt))
        rows = [self.image_row(ids, request.images, request.prompt)] if request.images else None
        gen = self._start([rows[0].ids] if rows else [ids], opts, rows)
        for _ in gen.events():
            pass
        return request.read(gen.result())

    def stream_chat(self, messages: Sequence[Message], options: GenerationOptions | None = None, *,
                    tools: Tools | None = None, tool_choice: ToolChoice | None = None,
                    parallel_tool_calls: bool = True, template_vars: dict[str, Any] | None = None,
                    **overrides: Any) -> Iterator[ChatPiece | ToolCallDelta]:
        """``chat``, streamed: text pieces as they become valid UTF-8, each a ``ChatPiece`` (a
        str whose ``reasoning`` says whether it is thinking or answer); with tools, tool calls
        as ``ToolCallDelta`` items (index, then id and name, then pieces of the arguments). The
        iterator's return value (``StopIteration.value``) is the finished Result, as ``chat``
        returns it."""
        request, opts = self._chat_request(messages, options, overrides, tools, tool_choice,
                                           parallel_tool_calls, template_vars)
        reply = request.stream()
        ids = self.prompt_ids(self.encode_chat(request.prompt))
        rows = [self.image_row(ids, request.images, request.prompt)] if request.images else None
        gen = self._start([rows[0].ids] if rows else [ids], opts, rows)

        def pieces() -> PyGenerator[ChatPiece | ToolCallDelta, None, Result]:
            for event in gen.events():
                if event.row == 0 and (event.text or event.finish_reason):
                    yield from reply.push(event.text, last=event.finish_reason is not None)
            return request.read(gen.result())

        return pieces()

    def _chat_request(self, messages: Sequence[Message], options: GenerationOptions | None,
                      overrides: dict[str, Any], tools: Tools | None, tool_choice: Any,
                      parallel: bool, template_vars: dict[str, Any] | None,
                      ) -> tuple[ChatRequest, GenerationOptions]:
        """The prompt, constraint and options of one chat reply."""
        self.require_generation()
        opts = self.options(options, overrides)
        checked = check_tools(list(tools) if tools is not None and not isinstance(
            tools, (str, bytes, dict)) else tools)
        choice = check_tool_choice(tool_choice, checked)
        messages, images = split_images(messages, getattr(self.engine, "manifest", None))
        prompt = self.render_chat(messages, tools=checked if choice != "none" else None,
                                  template_vars=template_vars)
        request = ChatRequest(self, prompt, opts.constraint, checked, choice, parallel, images)
        return request, request.options_for(opts)

    def image_row(self, ids: Sequence[int], images: Sequence[tuple[Any, str]],
                  text: str | None = None) -> RowImages:
        """A prompt's images (each with the name its errors give) in place: what a generator's
        row runs (generation/images.py). ``text``: the rendered chat prompt ``ids`` came from
        (Gemma 3 expands it as text)."""
        if self.image_inputs is None:
            raise text_only_error(getattr(getattr(self.engine, "manifest", None), "folder",
                                          "this model folder"), images[0][1])
        return self.image_inputs.row(ids, images, text)

    def chat_prompt(self, messages: Sequence[Message], *, tools: Tools | None = None,
                    template_vars: dict[str, Any] | None = None) -> list[int]:
        """The token ids of ``messages`` rendered with the model's chat template, ready for the
        assistant's answer (the template writes any BOS token itself)."""
        return self.encode_chat(self.render_chat(messages, tools=tools,
                                                  template_vars=template_vars))

    def reuse_points(self, messages: Sequence[Message], prompt: Sequence[int], *,
                     tools: Tools | None = None,
                     template_vars: dict[str, Any] | None = None) -> list[int]:
        """Where a later conversation's prompt may part from ``prompt`` (``messages`` rendered),
        for a recurrent state's checkpoints (see chat_session.reuse_points)."""
        return reuse_points(self, messages, prompt, tools, template_vars)

    def chat_session(self, system: str | None = None, *, tools: Tools | None = None,
                     template_vars: dict[str, Any] | None = None) -> ChatSession:
        """A multi-turn conversation that keeps earlier turns in the KV cache."""
        self.require_generation()
        return ChatSession(self, system, tools=tools, template_vars=template_vars)

    def embed(self, inputs: str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]],
              dimensions: int | None = None, *, batch_size: int | None = None) -> np.ndarray:
        """Embeddings of an embedding model's folder (``llm-onnx export --task embed``): one
        text (or one list of token ids) gives (E,), a list of them (N, E), float32, pooled and
        normalised as the folder's manifest says. Texts are tokenized with the tokenizer's
        special tokens (as sentence-transformers does); nothing is truncated: an input past the
        context is an error naming it. ``dimensions``: keep the first d values (re-normalised
        where the model normalises: Matryoshka models). ``batch_size``: most inputs a run."""
        rows, single = self.embedding_ids(inputs)
        out = self.engine.embed(rows, dimensions, **({"batch_size": batch_size}
                                                     if batch_size else {}))
        return out[0] if single else out

    def embedding_ids(self, inputs: str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]],
                      ) -> tuple[list[list[int]], bool]:
        """``embed``'s inputs as checked token-id rows, and whether they were one input."""
        return embedding_rows(self.engine, inputs, self.encode, self.context_length)

    def encode_chat(self, prompt: str) -> list[int]:
        """A rendered chat prompt's token ids (the template wrote any special tokens)."""
        return self.encode(prompt, add_special_tokens=False)

    def reasoning_splitter(self, prompt: str) -> ThinkingReader | None:
        """A reader of the thinking apart from the answer in the reply to ``prompt`` (None: the
        model does not think, the reply is all answer)."""
        return self.dialect.splitter(prompt)

    def _start(self, prompts: list[list[int]], opts: GenerationOptions,
               images: list[RowImages] | None = None) -> Generator:
        """A generator with one row per prompt, every prompt in place. One prompt: the cache is
        sized to it and its answer; several: to the longest and its answer, once."""
        longest = max(len(p) for p in prompts)
        gen = self.generator(opts, batch=len(prompts),
                             max_length=None if len(prompts) == 1 else longest + opts.max_new_tokens)
        for row, ids in enumerate(prompts):
            gen.append_tokens(ids, row=row, options=row_options(opts, row),
                              images=images[row] if images else None)
        return gen

