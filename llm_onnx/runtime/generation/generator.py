"""The step-wise generator: sequences in the rows of one KV cache, advanced a step at a time.

    gen = Generator(model, GenerationOptions(max_new_tokens=64))
    gen.append_tokens(model.encode("Once upon a time"))
    while not gen.is_done():
        event = gen.generate_next_token()
        print(event.text, end="", flush=True)

Several rows are several sequences decoding together (``Model.generate`` of a list, the batching
scheduler): ``append_tokens(ids, row=r)`` puts a prompt in row r at any time, and ``step()``
advances every row once:

    prefill_step: rows with two or more tokens waiting, oldest first, each run alone (batch 1)
                  over its row, up to ``prefill_chunk`` tokens in all per step (at least one
                  chunk); a row whose prompt is complete picks its first token
    decode_step:  every row with exactly one token waiting, in one batched run; each picks its
                  next token (and may have a constraint force more: alone, a row runs those as
                  one chunk; beside other rows, they ride along in the batched runs, one a run)

A row keeps its keys and values when its sequence is released; a new prompt runs only the tokens
after the longest prefix it shares with its row's cache or with a free row's (copied over): a
continued conversation, a shared system prompt.
"""

from __future__ import annotations

import collections
import itertools
import math
import time
from collections.abc import Iterator, Sequence
from typing import Any, cast

import numpy as np

from llm_onnx.errors import GenerationError
from llm_onnx.runtime.core.engine_protocol import EngineProtocol, VerifyingEngine
from llm_onnx.runtime.core.state import CacheProtocol
from llm_onnx.runtime.generation.images import RowImages
from llm_onnx.runtime.generation.model_like import ModelLike
from llm_onnx.runtime.generation.options import GenerationOptions
from llm_onnx.runtime.generation.prefix import Prefixes, last_run_start
from llm_onnx.runtime.generation.results import Result, TokenEvent
from llm_onnx.runtime.generation.sequence import SequenceState, scoring_chunk
from llm_onnx.runtime.generation.speculative import SpeculativeOptions, make_speculator
from llm_onnx.runtime.generation.stats import RunStats
from llm_onnx.runtime.structured.matcher import MaskBatch


class Generator:
    """Step-wise generation over one KV cache of ``batch`` rows (not thread-safe: one thread
    drives it).

    Args:
        model: the loaded Model (its engine, tokenizer and end-of-sequence ids).
        options: default generation options of the rows (the model's defaults if None);
            keywords override fields.
        batch: rows (sequences that can run at once).
        max_length: positions per row (prompt and answer). Given: allocated once, at that size.
            None: sized to the first request and grown as needed, up to the model's context.
        prefill_chunk: most prompt tokens run per step, over all rows; None: a whole prompt at
            once. A long prompt then delays the rows already decoding by at most one chunk.
        speculative: "off", "ngram", "draft" or SpeculativeOptions (llm_onnx.runtime.generation.speculative);
            None: the model's (``Model(..., speculative=...)``).
    """

    def __init__(self, model: ModelLike, options: GenerationOptions | None = None, *, batch: int = 1,
                 max_length: int | None = None, prefill_chunk: int | None = None,
                 speculative: SpeculativeOptions | str | None = None,
                 **overrides: Any) -> None:
        if batch < 1:
            raise GenerationError(f"batch must be at least 1, got {batch}.")
        if prefill_chunk is not None and prefill_chunk < 1:
            raise GenerationError(f"prefill_chunk must be at least 1, got {prefill_chunk}.")
        self.model = model
        self.engine: EngineProtocol = model.engine
        self.options = model.options(options, overrides)
        self.batch = batch
        self.prefill_chunk = prefill_chunk
        context = model.context_length
        self._fixed = max_length is not None
        self.max_length = min(max_length, context) if max_length is not None else context
        if self.max_length < 2:
            raise GenerationError(f"max_length must be at least 2, got {max_length}.")
        self._cache: CacheProtocol | None = None
        self._seqs: list[SequenceState | None] = [None] * batch
        self._prefixes = Prefixes(batch)  # the tokens each row's cache holds
        self._images: list[RowImages | None] = [None] * batch  # a row's prompt's images
        self._admitted = [0] * batch  # admission order (oldest prompt chunks run first)
        self._counter = itertools.count()
        self.stats = RunStats()
        self._masks: MaskBatch | None = None  # constrained rows' bitmasks (made when first needed)
        self.overlap_masks = True  # fill them while the model runs (False: before; to measure)
        self._pending: collections.deque[TokenEvent] = collections.deque()
        self.speculator = make_speculator(model, self.engine, batch, self.stats, speculative)

    # ------------------------------------------------------------------ rows

    def append_tokens(self, ids: Sequence[int], *, row: int = 0, options: GenerationOptions | None = None,
                      logprobs: int | None = None, reuse_points: Sequence[int] = (),
                      prompt_logprobs: int | None = None,
                      images: RowImages | None = None) -> None:
        """Feed token ids to row ``row``. An empty row starts a sequence with ``ids`` as its
        prompt (reusing whatever prefix of it the row's cache still holds); a row with a sequence
        continues it: everything so far becomes prompt, and generation resumes after ``ids``.

        Args:
            options: generation options of this sequence (default: the generator's; when
                continuing, the sequence's own).
            logprobs: None, or k >= 0 to record each generated token's logprob and the k most
                likely alternatives (of the model's raw distribution).
            reuse_points: lengths of the prompt at which a later prompt may part from this one
                (the end of a chat's system message, of its earlier turns): a cache that keeps
                checkpoints of a recurrent state takes them there (see HybridCache).
            prompt_logprobs: None, or k >= 0 to score the prompt (``Result.prompt_logprobs``, on
                the first event too): all of it runs, no cached prefix reused, every position's
                logits returned (``engine.verify``); max_new_tokens 0 then generates nothing.
            images: a new prompt's images (``ids`` is ``images.ids``; generation/images.py).
        """
        self._check_row(row)
        new = [int(i) for i in ids]
        vocab = self.engine.vocab_size
        bad = [i for i in new if not 0 <= i < vocab]
        if bad:
            raise GenerationError(f"token id {bad[0]} is outside the vocabulary (0..{vocab - 1}).")
        if not new:
            raise GenerationError("append_tokens needs at least one token id.")
        if prompt_logprobs is not None and not getattr(self.engine, "verifies", False):
            raise GenerationError("prompt logprobs need every position's logits, which this "
                                  "engine does not return (re-export the folder).")
        old = self._seqs[row]
        if images is not None and (old is not None or new != images.ids):
            raise GenerationError("images come with a new prompt, whose ids are images.ids.")
        prompt = (old.tokens if old is not None else []) + new
        opts = self.options if options is None and old is None else \
            options.validated() if options is not None else old.options  # type: ignore[union-attr]
        logprobs = old.logprobs_top if logprobs is None and old is not None else logprobs
        if len(prompt) >= self.max_length:
            what = "the model's context" if self.max_length == self.model.context_length else \
                "this generator's max_length"
            raise GenerationError(f"the prompt has {len(prompt)} tokens but {what} is "
                                  f"{self.max_length} tokens (prompt and answer together).")
        limit = min(opts.max_new_tokens, self.max_length - len(prompt))
        constraint = None
        shown: frozenset[int] = frozenset()
        if opts.constraint is not None:  # compiled (or taken from the cache) before any change
            constraints = self.model.constraints
            constraint = constraints.start(opts.constraint)
            shown = frozenset(i for i in map(constraints.token_id, opts.constraint.markers)
                              if i is not None)
        if opts.keep_special and self.model.tokenizer is not None:
            shown |= frozenset(i for i in map(self.model.tokenizer.token_to_id, opts.keep_special)
                               if i is not None)
        cache = self._reserve(len(prompt) + limit)
        self._images[row] = images if old is None else self._images[row]
        keyed = self._keyed(row)
        reuse = 0 if prompt_logprobs is not None else self._prefixes.reuse(
            self._cache, row, keyed(prompt), self.free_rows,
            keyed(old.tokens) if old is not None else None, self.stats)
        cache.truncate(row, reuse)
        if hasattr(cache, "position_deltas"):  # where the row's positions run after its prompt
            row_images = self._images[row]
            cache.position_deltas[row] = row_images.delta if row_images else 0
        rng = old.rng if old is not None and opts.seed == old.options.seed else None
        seq = SequenceState(prompt, opts, vocab_size=vocab, tokenizer=self.model.tokenizer,
                            eos_token_ids=self.model.eos_token_ids, limit=limit,
                            logprobs=logprobs, rng=rng, constraint=constraint,
                            shown_special=shown, prompt_logprobs=prompt_logprobs)
        seq.prefill_tokens = len(prompt) - reuse
        seq.reuse_points = tuple(sorted(p for p in reuse_points if 0 < p < len(prompt)))
        self._seqs[row] = seq
        if self.speculator is not None and old is None:
            self.speculator.reset(row)
        self._pending.clear()
        self._admitted[row] = next(self._counter)

    def release(self, row: int = 0) -> Result | None:
        """End row ``row``'s sequence (its Result, or None if the row was empty). Its keys and
        values stay in the cache for a later prompt that starts the same way."""
        self._check_row(row)
        seq = self._seqs[row]
        if seq is None:
            return None
        self._prefixes.released[row] = self._prefixes.held(self._cache, row,
                                                           self._keyed(row)(seq.tokens))
        self._seqs[row] = None
        return seq.result()

    def cancel(self, row: int = 0) -> Result | None:
        """Stop row ``row``'s sequence now (finish_reason "cancelled" unless it had finished)
        and release the row."""
        seq = self._seqs[row]
        if seq is not None:
            seq.cancel()
        return self.release(row)

    def clear(self) -> None:
        """Release every row and forget every cached prefix."""
        for row in range(self.batch):
            self.release(row)
            self._prefixes.released[row] = []
            self._images[row] = None
            if self._cache is not None:
                self._cache.truncate(row, 0)

    def rewind(self, n: int, row: int = 0) -> None:
        """Drop the last ``n`` tokens of row ``row``'s sequence (generated ones first, then prompt
        tokens) and their cached positions; generation continues from what remains."""
        seq = self._sequence(row)
        if not 0 <= n <= len(seq.tokens):
            raise GenerationError(f"cannot rewind {n} tokens of a sequence of {len(seq.tokens)}.")
        seq.rewind(n)
        self._pending.clear()
        assert self._cache is not None
        # The last remaining token runs again (its logits were the ones dropped): one decode
        # step after a generated token, a prompt's last run (see last_run_start) otherwise.
        length = len(seq.tokens)
        self._cache.truncate(row, length - 1 if seq.generated else last_run_start(length))

    @property
    def free_rows(self) -> list[int]:
        return [r for r, seq in enumerate(self._seqs) if seq is None]

    @property
    def running_rows(self) -> list[int]:
        """Rows whose sequence is still generating."""
        return [r for r, seq in enumerate(self._seqs) if seq is not None and not seq.done]

    @property
    def decoding_rows(self) -> list[int]:
        """Running rows past their prompt that the next decode run takes: those with exactly
        one token (the last picked) waiting, and, when two or more rows decode, those with
        tokens a constraint forced waiting (they ride along one token a run: a row's cost in a
        batched run is small, a chunk of its own is a whole run). A row decoding alone runs
        its forced tokens as one chunk instead (see prefill_step)."""
        cache = self._cache
        if cache is None:
            return []
        single, forced = [], []
        for r in self.running_rows:
            seq = self._seqs[r]
            held = cache.length_of(r)
            waiting = len(seq.tokens) - held  # type: ignore[union-attr]
            if waiting == 1:
                single.append(r)
            elif waiting >= 2 and held >= seq.prompt_len:  # type: ignore[union-attr]
                forced.append(r)
        return sorted(single + forced) if len(single) + len(forced) >= 2 else single

    def is_done(self, row: int = 0) -> bool:
        """True when row ``row`` has no sequence or it has finished (and generate_next_token
        has handed out every token it produced)."""
        if self._pending and row == 0:
            return False
        seq = self._seqs[row]
        return seq is None or seq.done

    def all_done(self) -> bool:
        return not self.running_rows

    def tokens(self, row: int = 0) -> list[int]:
        """Every token of row ``row``'s sequence: prompt, then generated."""
        return list(self._sequence(row).tokens)

    def result(self, row: int = 0) -> Result:
        return self._sequence(row).result()

    # ------------------------------------------------------------------ steps

    def generate_next_token(self) -> TokenEvent:
        """Run what the (single) sequence needs and pick its next token."""
        if self.batch != 1:
            raise GenerationError("generate_next_token drives a one-row generator; use step() "
                                  "to advance several rows.")
        if self._pending:  # tokens a constraint forced along with the last pick
            return self._pending.popleft()
        seq = self._sequence(0)
        if seq.done:
            raise GenerationError(f"the sequence has finished ({seq.finish_reason}); append "
                                  "tokens or rewind to continue.")
        if not seq.tokens:
            raise GenerationError("the sequence is empty: append_tokens first.")
        while True:  # one token: a completed prompt picks it, else the decode run does
            events = self.prefill_step() or self.decode_step()
            if events:
                self._pending.extend(events[1:])
                return events[0]

    def step(self) -> list[TokenEvent]:
        """Advance every row once: prompt chunks, then one batched decode (see the module
        docstring). Returns the tokens picked, one event per row that picked one."""
        return self.prefill_step() + self.decode_step()

    def prefill_step(self, budget: float | None = None) -> list[TokenEvent]:
        """Run waiting prompt tokens of rows with two or more, oldest row first, up to ``budget``
        tokens (default ``prefill_chunk``; math.inf: all; at least one chunk runs)."""
        if self._cache is None:
            return []
        cache = self._cache
        left = budget or self.prefill_chunk or math.inf
        riding = set(self.decoding_rows)
        prompting = [r for r in self.running_rows if r not in riding
                     and len(self._seqs[r].tokens) - cache.length_of(r) >= 2]  # type: ignore[union-attr]
        events = []
        for row in sorted(prompting, key=self._admitted.__getitem__):
            if left <= 0:
                break
            seq = self._seqs[row]
            assert seq is not None
            start = cache.length_of(row)
            waiting = len(seq.tokens) - start
            scoring = seq.scores_prompt and start < seq.prompt_len
            n = int(min(waiting, left, scoring_chunk(self.engine.vocab_size) if scoring
                        else waiting))
            n = images.run_length(start, n, waiting) if (images := self._images[row]) else n
            if waiting - n == 1:  # never leave a prompt's last token alone (see last_run_start)
                n = n - 1 if n > 1 else n + 1
            pause = cache.checkpoint_at(start, start + n, seq.prompt_len, seq.reuse_points) \
                if start < seq.prompt_len else None
            if pause is not None:  # a recurrent state keeps a copy here (see HybridCache)
                n = pause - start
            last = start + n == len(seq.tokens)
            pending = self._start_masks([row]) if last else None
            began = time.perf_counter()
            extra = {} if images is None else {"images": images.chunk(start, start + n)}
            if scoring:  # every position's logits (append_tokens checked the engine verifies)
                window = cast(VerifyingEngine, self.engine).verify(
                    cache, row, seq.tokens[start:start + n], **extra)
                seq.score_prompt(start, window)
                logits = window[-1]
            else:
                logits = self.engine.prefill(cache, row, seq.tokens[start:start + n], **extra)
            self.stats.prefill_s += time.perf_counter() - began
            self.stats.prefill_tokens += n
            left -= n
            if pause is not None:
                cache.checkpoint(row)
            if last:
                events += self._accept(seq, logits, row, pending)
        return events

    def decode_step(self) -> list[TokenEvent]:
        """One batched run of the decoding rows (see decoding_rows): each runs its next waiting
        token; those with no more waiting pick their next. With speculation on and few rows
        decoding, a row with a draft runs it instead, alone (see llm_onnx.runtime.generation.speculative)."""
        if self._cache is None:
            return []
        cache = self._cache
        ready = self.decoding_rows
        if not ready:
            return []
        events: list[TokenEvent] = []
        spec = self.speculator
        if spec is not None and len(ready) <= spec.options.max_rows:
            plain = []
            for r in ready:
                seq = self._seqs[r]
                assert seq is not None
                draft = spec.draft(r, seq.tokens) \
                    if len(seq.tokens) - cache.length_of(r) == 1 else []
                room = min(cache.length - cache.length_of(r) - 1,
                           seq.limit - len(seq.generated) - 1)
                if draft and room > 0:
                    events += spec.verify(self.engine, cache, r, seq, draft[:room])
                else:
                    plain.append(r)
            ready = plain
            if not ready:
                return events
        first, n = ready[0], ready[-1] + 1 - ready[0]  # rows in between ride along
        tokens = np.zeros(n, dtype=np.int64)
        active = np.zeros(n, dtype=bool)
        picking = []
        for r in ready:
            seq = self._seqs[r]
            held = cache.length_of(r)
            tokens[r - first] = seq.tokens[held]  # type: ignore[union-attr]
            active[r - first] = True
            if len(seq.tokens) - held == 1:  # type: ignore[union-attr]
                picking.append(r)
        pending = self._start_masks(picking)
        greedy = getattr(self.engine, "picks_on_device", False) and all(  # ids, not logits
            self._seqs[r].greedy_only for r in picking)  # type: ignore[union-attr]
        began = time.perf_counter()
        logits = cast(VerifyingEngine, self.engine).decode(cache, tokens, active, first,
                                                           greedy=True) if greedy \
            else self.engine.decode(cache, tokens, active, first)
        took = time.perf_counter() - began
        self.stats.decode_s += took
        self.stats.decode_runs += 1
        self.stats.decode_rows += len(ready)
        self.stats.decode_row_slots += n
        if spec is not None:
            spec.decoded(n, took)
        self._wait_masks(pending)
        for r in picking:
            seq = self._seqs[r]
            assert seq is not None
            before = len(seq.tokens)
            events += seq.accept(None, r, token=logits[r - first]) if logits.ndim == 1 else \
                self._accept(seq, logits[r - first], r, None)
            if spec is not None and len(seq.tokens) > before:
                spec.observed(r, seq.tokens[:before], seq.tokens[before])
        return events

    def events(self) -> Iterator[TokenEvent]:
        """Step until every row has finished, yielding each token as it is picked."""
        while not self.all_done():
            yield from self.step()

    def texts(self, row: int = 0) -> Iterator[str]:
        """``events``, as row ``row``'s text pieces (valid UTF-8 each)."""
        for event in self.events():
            if event.text and event.row == row:
                yield event.text

    # ------------------------------------------------------------------ internals

    def _start_masks(self, rows: list[int]) -> Any:
        """Start filling the masks of the constrained ones among ``rows`` (see MaskBatch)."""
        constrained = [(seq.constraint, r) for r in rows
                       if (seq := self._seqs[r]) is not None and seq.constraint is not None]
        if not constrained:
            return None
        if self._masks is None:
            self._masks = MaskBatch(self.model.constraints, self.batch, self.overlap_masks)
        self._masks.overlap = self.overlap_masks
        before = self._masks.fill_s
        pending = self._masks.start(constrained)
        self.stats.mask_rows += len(constrained)
        if pending is None:  # filled at once (no overlap)
            self.stats.mask_s += self._masks.fill_s - before
            self.stats.mask_wait_s += self._masks.fill_s - before
            return True
        return (pending, before)

    def _wait_masks(self, pending: Any) -> None:
        if pending is None or pending is True:
            return
        assert self._masks is not None
        future, before = pending
        began = time.perf_counter()
        MaskBatch.wait(future)
        self.stats.mask_wait_s += time.perf_counter() - began
        self.stats.mask_s += self._masks.fill_s - before

    def _accept(self, seq: SequenceState, logits: np.ndarray, row: int, pending: Any,
                ) -> list[TokenEvent]:
        """``seq`` picks from ``logits`` (its mask, if constrained, waited for first)."""
        self._wait_masks(pending)
        mask = self._masks.row(row) if seq.constraint is not None and self._masks is not None \
            else None
        forced = seq.forced_tokens
        events = seq.accept(logits, row, mask)
        self.stats.forced_tokens += seq.forced_tokens - forced
        return events

    def _keyed(self, row: int):
        """Row ``row``'s tokens as its cached prefix is matched (images by their pixels)."""
        images = self._images[row]
        return images.keyed if images is not None else (lambda tokens: tokens)

    def _check_row(self, row: int) -> None:
        if not 0 <= row < self.batch:
            raise GenerationError(f"row {row} is outside this generator's {self.batch} rows.")

    def _sequence(self, row: int) -> SequenceState:
        self._check_row(row)
        seq = self._seqs[row]
        if seq is None:
            raise GenerationError(f"row {row} has no sequence: append_tokens first.")
        return seq

    def _reserve(self, positions: int) -> CacheProtocol:
        """The cache, with room for ``positions`` per row (allocated or grown as needed)."""
        positions = min(positions, self.max_length)
        if self._cache is None:
            self._cache = self.engine.new_cache(self.batch, self.max_length if self._fixed
                                                else positions)
        elif self._cache.length < positions:
            self._cache.grow(positions)
        return self._cache
