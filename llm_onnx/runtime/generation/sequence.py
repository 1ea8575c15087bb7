"""One sequence being generated (``SequenceState``): its tokens, sampler, detokenizer, stop
rules, limits and timings, and the logprob of a token under its logits (``token_logprob``).

Pure bookkeeping, no model: the Generator runs the model and hands each sequence the logits of its
next token (``accept``), which picks the token, turns it into text and decides whether the
sequence is finished; ``result`` is what it gives back (results.py). The same object serves a
lone ``Model.generate`` and a row of the batching scheduler, which is why a request's tokens do
not depend on what else runs beside it.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence

import numpy as np
import tokenizers

from llm_onnx.errors import GenerationError
from llm_onnx.runtime.generation.options import GenerationOptions
from llm_onnx.runtime.generation.results import Result, Timings, TokenEvent, TokenLogprob
from llm_onnx.runtime.generation.sampling import Sampler
from llm_onnx.runtime.generation.textstream import StopMatcher, StreamDecoder
from llm_onnx.runtime.structured.matcher import RowConstraint


def token_logprob(logits: np.ndarray, token_id: int, top: int) -> TokenLogprob:
    """Log-softmax of (V,) logits at ``token_id`` and the ``top`` largest (ties: lower id first);
    NaN logits count as -inf. Accumulates in float64."""
    x = np.asarray(logits, dtype=np.float64)
    if np.isnan(x).any():
        x = np.where(np.isnan(x), -np.inf, x)
    m = x.max()
    if not math.isfinite(m):  # +inf shares all the mass; all -inf means nothing is possible
        lse = m
    else:
        lse = m + math.log(float(np.exp(x - m).sum()))
    alternatives: tuple[tuple[int, float], ...] = ()
    if top > 0:
        k = min(top, x.shape[0])
        idx = np.argpartition(-x, k - 1)[:k]
        idx = idx[np.lexsort((idx, -x[idx]))]
        alternatives = tuple((int(i), _logprob(x[i], lse)) for i in idx if x[i] > -np.inf)
    return TokenLogprob(int(token_id), _logprob(x[token_id], lse), alternatives)


# Most logits (positions x vocabulary) one run that scores a prompt returns: 128 MiB of float32.
SCORED_LOGITS = 1 << 25


def scoring_chunk(vocab_size: int) -> int:
    """Most prompt tokens one run may score (each position's logits are kept until scored)."""
    return max(2, SCORED_LOGITS // max(1, vocab_size))


def _bias_arrays(bias: tuple[tuple[int, float], ...], vocab: int,
                 ) -> tuple[np.ndarray, np.ndarray] | None:
    """logit_bias as (ids, amounts) arrays; ids must be inside the vocabulary."""
    if not bias:
        return None
    ids = np.array([i for i, _ in bias], dtype=np.int64)
    outside = ids[ids >= vocab]
    if outside.shape[0]:
        raise GenerationError(f"logit_bias names token id {int(outside[0])}, outside the "
                              f"vocabulary (0..{vocab - 1}).")
    return ids, np.array([b for _, b in bias], dtype=np.float32)


def _logprob(value: float, lse: float) -> float:
    if value == lse:  # also inf - inf
        return 0.0
    return float(value - lse)


class SequenceState:
    """The state of one sequence (see the module docstring).

    Args:
        prompt: token ids the model reads before generating.
        options: validated generation options.
        vocab_size: the logits' width.
        tokenizer: for text (None: token ids only, no stop strings).
        eos_token_ids: the model's end-of-sequence ids (``options.stop_token_ids`` are added;
            ``options.ignore_eos`` drops both).
        limit: most tokens to generate (``options.max_new_tokens`` cut to the room left).
        logprobs: None = off; k >= 0 = the chosen token's logprob and k alternatives.
        prompt_logprobs: None = off; k >= 0 = each prompt token's logprob given the tokens
            before it, and k alternatives (the generator runs the prompt with every position's
            logits: ``score_prompt``).
        rng: the sampler's random generator (default: from ``options.seed``).
        constraint: the matcher of ``options.constraint`` (llm_onnx.runtime.structured.constraint): each
            pick is masked to what it allows, tokens it forces are appended without a pick.
        shown_special: special tokens whose text the reply keeps (tool-call markers).
    """

    # the reply's text pieces and generated tokens' logprobs (reset by _restart_text)
    _pieces: list[str]
    _logprobs: list[TokenLogprob]

    def __init__(self, prompt: Sequence[int], options: GenerationOptions, *, vocab_size: int,
                 tokenizer: tokenizers.Tokenizer | None, eos_token_ids: Sequence[int], limit: int,
                 logprobs: int | None = None, rng: np.random.Generator | None = None,
                 constraint: RowConstraint | None = None,
                 shown_special: frozenset[int] = frozenset(),
                 prompt_logprobs: int | None = None) -> None:
        self.options = options
        self.vocab_size = vocab_size
        self.tokenizer = tokenizer
        self.eos = frozenset() if options.ignore_eos else \
            frozenset(eos_token_ids) | frozenset(options.stop_token_ids)
        self.limit = limit
        self.logprobs_top = logprobs
        self.tokens: list[int] = [int(t) for t in prompt]
        self.prompt_len = len(self.tokens)
        self.finish_reason: str | None = None
        self.prefill_tokens = 0  # set by the generator: prompt tokens not found in the cache
        self.reuse_points: tuple[int, ...] = ()  # where a later prompt may part from this one
        self.started = time.perf_counter()
        self.first_token_at: float | None = None
        self.ended_at: float | None = None
        self._sampler = Sampler(options, 1, vocab_size, [self.tokens], rng=rng)
        self.constraint = constraint
        self.forced_tokens = 0  # appended by fast-forward, without a pick
        self._bias = _bias_arrays(options.logit_bias, vocab_size)
        self._own_mask: np.ndarray | None = None
        self._shown_special = shown_special
        self.constraint_error: str | None = None
        self.prompt_logprobs_top = prompt_logprobs
        self._prompt_logprobs: list[TokenLogprob | None] | None = \
            None if prompt_logprobs is None else [None] * self.prompt_len
        self._restart_text()

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.prompt_len:]

    @property
    def rng(self) -> np.random.Generator:
        return self._sampler.rng

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def text(self) -> str:
        return "".join(self._pieces)

    @property
    def scores_prompt(self) -> bool:
        """Whether the prompt's runs must return every position's logits (``score_prompt``)."""
        return self._prompt_logprobs is not None

    def score_prompt(self, start: int, logits: np.ndarray) -> None:
        """Record the logprobs of the prompt tokens at ``start + 1`` ... from the (T, V) logits
        of a run of the tokens at ``start`` ... ``start + T - 1`` (row i predicts the token
        after position start + i; a row past the prompt is the first pick's, not scored)."""
        assert self._prompt_logprobs is not None
        top = self.prompt_logprobs_top or 0
        for i in range(min(logits.shape[0], self.prompt_len - 1 - start)):
            at = start + i + 1
            self._prompt_logprobs[at] = token_logprob(logits[i], self.tokens[at], top)

    def accept(self, logits: np.ndarray | None, row: int = 0,
               mask: np.ndarray | None = None, token: int | None = None) -> list[TokenEvent]:
        """Pick the next token from its (V,) logits and record it; then any tokens the constraint
        forces. One event per token; the last carries the finish reason if the sequence ended.
        A sequence with no tokens to generate (limit 0) ends here, with one event and no token.

        Args:
            mask: the constraint's bitmask for this step, filled by the caller (MaskBatch);
                None: filled here.
            token: a ``greedy_only`` sequence's token, picked already where the logits are
                (Engine.decode(greedy=True)); ``logits`` is then not read.
        """
        now = time.perf_counter()
        if self.first_token_at is None:
            self.first_token_at = now
        first = not self.generated
        events = self._pick(logits, row, mask, now, token)
        if first and self._prompt_logprobs is not None:
            events[0] = dataclasses.replace(events[0],
                                            prompt_logprobs=tuple(self._prompt_logprobs))
        return events

    @property
    def greedy_only(self) -> bool:
        """Whether the next pick is the logits' plain argmax, nothing else read (no penalty,
        bias, constraint or logprobs): one another place may make (``accept``'s ``token``)."""
        return (self.options.temperature == 0.0 and not self._sampler.observes
                and self._bias is None and self.constraint is None
                and self.logprobs_top is None and self._prompt_logprobs is None)

    def _pick(self, logits: np.ndarray | None, row: int, mask: np.ndarray | None,
              now: float, token: int | None = None) -> list[TokenEvent]:
        if self.limit <= len(self.generated):  # nothing to generate: the prompt was scored
            return [TokenEvent(row, -1, self._finish("length", now), None, "length")]
        if token is not None:  # picked elsewhere: greedy_only, so nothing below reads logits
            return [self._record(int(token), row, None, now)]
        assert logits is not None
        if self._bias is not None:
            logits = np.asarray(logits, dtype=np.float32).copy()
            np.add.at(logits, self._bias[0], self._bias[1])
        if self.constraint is not None:
            logits = self._masked(logits, mask)
            if logits is None:  # the matcher allows nothing: end here, no token
                return [TokenEvent(row, -1, self._fail(now), None, "error")]
        token = self._sampler.pick_one(logits)
        lp = None
        if self.logprobs_top is not None:
            lp = token_logprob(logits, token, self.logprobs_top)
        events = [self._record(token, row, lp, now)]
        while self.constraint is not None and not self.done:  # fast-forward
            forced = self.constraint.forced()[:self.limit - len(self.generated)]
            if not forced:
                break
            for t in forced:
                self.forced_tokens += 1
                lp = None if self.logprobs_top is None else \
                    TokenLogprob(t, 0.0, ((t, 0.0),) if self.logprobs_top else ())
                events.append(self._record(t, row, lp, now))
                if self.done:
                    break
        return events

    def _record(self, token: int, row: int, lp: TokenLogprob | None, now: float) -> TokenEvent:
        """Append one token (picked or forced): matcher, penalties, text, stop rules, limit."""
        complete, failed = False, False
        constraint = self.constraint
        if constraint is not None and token not in self.eos:
            failed = not constraint.consume(token)
            complete = not failed and constraint.stopped
            failed = failed or (complete and constraint.error is not None)
        self.tokens.append(token)
        if self._sampler.observes:
            self._sampler.observe(np.array([token]))
        if lp is not None:
            self._logprobs.append(lp)
        text, finish = "", None
        if token in self.eos:
            finish = "stop"
        else:
            text, stopped = self._push_text(token)
            if failed:
                finish = "error"
            elif stopped:
                finish = "stop_string"
            elif complete:  # the grammar is complete: nothing may follow
                finish = "stop"
            elif len(self.tokens) - self.prompt_len >= self.limit:
                finish = "length"
        if finish == "error":
            text += self._fail(now)
        elif finish is not None:
            text += self._finish(finish, now)
        return TokenEvent(row, token, text, lp, finish)

    def _masked(self, logits: np.ndarray, mask: np.ndarray | None) -> np.ndarray | None:
        constraint = self.constraint
        assert constraint is not None
        if mask is None:
            if self._own_mask is None:
                self._own_mask = np.zeros(constraint.words, dtype=np.int32)
            constraint.fill(self._own_mask)
            mask = self._own_mask
        return constraint.masked(np.asarray(logits), mask, self.eos)

    def _fail(self, now: float) -> str:
        """The matcher failed (a grammar past its per-step limits, or no token allowed): the
        sequence ends with finish_reason "error" and the text so far; returns the held-back
        text."""
        constraint = self.constraint
        self.constraint_error = (constraint.error if constraint is not None else None) or \
            "no token is allowed by the constraint"
        return self._finish("error", now)

    def cancel(self) -> bool:
        """End the sequence now (finish_reason "cancelled"); False if it had already ended."""
        if self.done:
            return False
        self._finish("cancelled", time.perf_counter())
        return True

    def rewind(self, n: int) -> None:
        """Drop the last ``n`` tokens (generated first, then prompt tokens). Penalty counts and
        text are rebuilt from what remains; the random generator keeps its state."""
        keep = len(self.tokens) - n
        if self.constraint is not None:  # it holds the generated tokens (end-of-sequence aside)
            dropped = self.tokens[max(keep, self.prompt_len):]
            self.constraint.rollback(sum(1 for t in dropped if t not in self.eos)
                                     if keep >= self.prompt_len else self.constraint.consumed)
        self.tokens = self.tokens[:keep]
        self.prompt_len = min(self.prompt_len, keep)
        self.finish_reason, self.ended_at = None, None
        self.constraint_error = None
        if not self.generated:
            self.first_token_at = None
        self._sampler = Sampler(self.options, 1, self.vocab_size, [self.tokens[:self.prompt_len]],
                                rng=self._sampler.rng)
        generated = self.generated
        for token in generated:
            self._sampler.observe(np.array([token]))
        logprobs = self._logprobs[:len(generated)]
        self._restart_text()
        self._logprobs = logprobs
        if self._prompt_logprobs is not None:
            self._prompt_logprobs = self._prompt_logprobs[:self.prompt_len]
        for token in generated:
            if token not in self.eos:
                self._push_text(token)

    def result(self) -> Result:
        end = self.ended_at or time.perf_counter()
        first = self.first_token_at or end
        t = Timings(ttft_s=first - self.started, prefill_s=first - self.started,
                    prefill_tokens=self.prefill_tokens, decode_s=end - first,
                    decode_tokens=max(0, len(self.generated) - 1))
        return Result(self.text, self.generated, self.finish_reason or "length", self.prompt_len,
                      t, list(self._logprobs) if self.logprobs_top is not None else None,
                      error=self.constraint_error, stop_string=self._stops.stop_string,
                      prompt_logprobs=None if self._prompt_logprobs is None
                      else list(self._prompt_logprobs))

    # ------------------------------------------------------------------ text

    def _restart_text(self) -> None:
        prompt = self.tokens[:self.prompt_len]
        self._decoder = StreamDecoder(self.tokenizer, prompt, shown=self._shown_special) \
            if self.tokenizer else None
        self._stops = StopMatcher(self.options.stop)
        self._pieces = []
        self._logprobs = []

    def _push_text(self, token: int) -> tuple[str, bool]:
        if self._decoder is None:
            return "", False
        piece, stopped = self._stops.push(self._decoder.push(token))
        if piece:
            self._pieces.append(piece)
        return piece, stopped

    def _finish(self, reason: str, now: float) -> str:
        """Mark the end; returns the text held back until now (none after a stop string)."""
        self.finish_reason, self.ended_at = reason, now
        if reason in ("stop_string", "cancelled") or self._decoder is None:
            return ""
        tail = self._stops.push(self._decoder.flush())[0] + self._stops.flush()
        if tail:
            self._pieces.append(tail)
        return tail
