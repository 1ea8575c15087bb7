"""Speculative decoding: a row drafts k tokens, one model run checks them all, and every drafted
token the model would have picked itself is kept.

A step of a speculating row (Generator.decode_step): the row's last picked token t0 and its
draft d1..dk run as one chunk (``Engine.verify``: the logits of each of the k + 1 positions);
the sequence then picks from those logits in order, exactly as it would one step at a time
(penalties, constraint masks, logprobs, stop strings, limits), and goes on to the next
position while its pick equals the drafted token. The first pick that differs is kept (it came
from the right logits) and the rest of the draft is dropped, with its cached positions
(``cache.truncate``). So a step yields 1 to k + 1 tokens for one run.

Exactness: a token is accepted only when the pick from the model's own distribution equals the
draft, which draws the sampler's random numbers in the same order as plain decoding: greedy and
seeded sampling give the same tokens with and without speculation, as far as the model's
logits are the same for a chunk of k + 1 tokens as for k + 1 single steps (fp32: to ~1e-5;
8-bit MatMulNBits rounds a chunk differently, see docs/speculative-decoding.md). This is the
"accept when the sample agrees" rule; rejection sampling against a draft model's probabilities
would accept more sampled tokens but draws differently, so seeded output would change with the
draft.

Drafters:
    ngram  prompt lookup: the latest earlier occurrence of the sequence's last n tokens (n from
           ``ngram_max`` down to ``ngram_min``) in its own prompt and output, and the k tokens
           that followed it. Free: no model runs.
    draft  another model folder with the same tokenizer (an int4 export drafting for an fp32
           one, a small model of the same family) picks k tokens greedily, batch 1 over its own
           KV cache, which follows the sequence by common prefix (rewinds and rejections
           included).

Never slower (``Speculator.plan``): each row keeps an estimate of how often a drafted token is
accepted (an exponential average; the n-gram drafter also scores its first token against every
plain step's pick, for free) and the engine's cost of a verify run relative to a decode run
(measured as it runs); a row drafts the k that maximises expected tokens per unit of cost, and
none (a plain decode step) when no k pays. Speculation is for small batches: with more rows
decoding than ``max_rows``, rows decode together in one batched run, which already uses the
memory bandwidth a verify run would.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from llm_onnx.errors import GenerationError
from llm_onnx.runtime.generation.prefix import common_prefix

METHODS = ("off", "ngram", "draft")


@dataclass(frozen=True, kw_only=True)
class SpeculativeOptions:
    """How the generator speculates.

    Args:
        method: "off", "ngram" (prompt lookup) or "draft" (``draft_model`` drafts).
        num_tokens: most tokens drafted per step (k); the generator drafts fewer while
            acceptance is low, and none when drafting does not pay.
        draft_model: for "draft": a model folder (loaded with the target's runtime options) or
            a loaded ``Model``; it must have the target's tokenizer.
        max_rows: speculate only while at most this many rows decode (the batching scheduler);
            above it, rows decode together in one batched run (measured crossover on SmolLM2
            fp32, 2 threads: 2 rows editing 2.06x, 2 rows of free text 0.99x; at 4 rows free
            text lost 9%).
        ngram_max, ngram_min: the longest and shortest suffix the n-gram drafter looks up.
        adaptive: False drafts ``num_tokens`` whenever a draft is found (tests, measurements).
    """

    method: str = "off"
    num_tokens: int = 6
    draft_model: Any = None
    max_rows: int = 2
    ngram_max: int = 4
    ngram_min: int = 2
    adaptive: bool = True

    def validated(self) -> SpeculativeOptions:
        if self.method not in METHODS:
            raise GenerationError(f"speculative method {self.method!r} is not one of "
                                  f"{', '.join(METHODS)}.")
        if not isinstance(self.num_tokens, int) or not 1 <= self.num_tokens <= 32:
            raise GenerationError(f"num_speculative_tokens must be an integer from 1 to 32, got "
                                  f"{self.num_tokens!r}.")
        if not isinstance(self.max_rows, int) or self.max_rows < 0:
            raise GenerationError(f"speculative max_rows must be an integer >= 0, got "
                                  f"{self.max_rows!r}.")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise GenerationError(f"ngram_min ({self.ngram_min}) must be at least 1 and at most "
                                  f"ngram_max ({self.ngram_max}).")
        if self.method == "draft" and self.draft_model is None:
            raise GenerationError("speculative method 'draft' needs a draft model "
                                  "(--draft-model DIR).")
        if self.method != "draft" and self.draft_model is not None:
            raise GenerationError(f"a draft model is given but the speculative method is "
                                  f"{self.method!r}; use method 'draft'.")
        return self

    @property
    def on(self) -> bool:
        return self.method != "off"


def speculative_options(value: Any, **fields: Any) -> SpeculativeOptions:
    """SpeculativeOptions from None / a method name / SpeculativeOptions, with ``fields``
    (num_tokens, draft_model, ...) that are not None applied."""
    if value is None:
        opts = SpeculativeOptions()
    elif isinstance(value, SpeculativeOptions):
        opts = value
    elif isinstance(value, str):
        opts = SpeculativeOptions(method=value)
    else:
        raise GenerationError(f"speculative must be 'off', 'ngram', 'draft' or "
                              f"SpeculativeOptions, got {type(value).__name__}.")
    given = {k: v for k, v in fields.items() if v is not None}
    if given.get("draft_model") is not None and "method" not in given and opts.method == "off":
        given["method"] = "draft"
    return dataclasses.replace(opts, **given).validated()


# ----------------------------------------------------------------------------- drafters


def ngram_draft(tokens: Seq[int], k: int, longest: int = 4, shortest: int = 2) -> list[int]:
    """Prompt lookup: the k tokens that followed the latest earlier occurrence of the last n
    tokens of ``tokens`` (n from ``longest`` down to ``shortest``); [] when none occurs."""
    n_tokens = len(tokens)
    if n_tokens < shortest + 1 or k < 1:
        return []
    arr = np.asarray(tokens, dtype=np.int64)
    for n in range(min(longest, n_tokens - 1), shortest - 1, -1):
        suffix = arr[n_tokens - n:]
        span = n_tokens - n  # starts i < span: a token follows arr[i:i + n]
        hits = np.ones(span, dtype=bool)
        for j in range(n):
            hits &= arr[j:j + span] == suffix[j]
        starts = np.flatnonzero(hits)
        if starts.shape[0]:
            follow = int(starts[-1]) + n
            draft = arr[follow:follow + k]
            if draft.shape[0]:
                return [int(t) for t in draft]
    return []


class DraftModel:
    """A draft model's engine and KV cache over the same rows as the target's generator; each
    row's cache follows its sequence by common prefix."""

    def __init__(self, model: Any, target: Any, rows: int) -> None:
        self.model = model
        self.engine = model.engine
        check_same_tokenizer(model, target)
        self.vocab = min(self.engine.vocab_size, target.engine.vocab_size)
        self.rows = rows
        self.cache: Any = None
        self.held: list[list[int]] = [[] for _ in range(rows)]
        self.runs = 0
        self.seconds = 0.0

    def draft(self, row: int, tokens: Seq[int], k: int) -> list[int]:
        """k tokens the draft model picks greedily after ``tokens``."""
        tokens = list(tokens)
        need = len(tokens) + k
        if need > self.engine.context_length:
            return []
        if self.cache is None:
            self.cache = self.engine.new_cache(self.rows, min(self.engine.context_length,
                                                              max(need, 256)))
        elif self.cache.length < need:
            self.cache.grow(min(self.engine.context_length, max(need, 2 * self.cache.length)))
        held = self.held[row][:self.cache.length_of(row)]
        keep = min(common_prefix(held, tokens), len(tokens) - 1)
        self.cache.truncate(row, keep)
        began = time.perf_counter()
        logits = self.engine.prefill(self.cache, row, tokens[keep:])
        out: list[int] = []
        while True:
            nxt = int(np.argmax(logits[:self.vocab]))
            out.append(nxt)
            if len(out) == k:
                break
            logits = self.engine.prefill(self.cache, row, [nxt])
        self.runs += k
        self.seconds += time.perf_counter() - began
        self.held[row] = tokens + out[:-1]
        return out


def check_same_tokenizer(draft: Any, target: Any) -> None:
    a, b = draft.tokenizer, target.tokenizer
    if a is None or b is None:
        raise GenerationError("a draft model needs tokenizer.json in both model folders, to "
                              "check that they share a tokenizer.")
    if a.get_vocab(with_added_tokens=True) != b.get_vocab(with_added_tokens=True):
        where = getattr(draft.engine, "manifest", None)
        name = f"{where.folder}: " if where is not None else ""
        raise GenerationError(f"{name}the draft model's tokenizer differs from the target "
                              "model's; a draft model must share the target's vocabulary.")


# ----------------------------------------------------------------------------- the controller


@dataclass
class _Row:
    accept: float = 0.3  # estimated probability that a drafted token is accepted
    skip: int = 0  # plain steps left before the draft model tries again (backoff)
    misses: int = 0  # verify steps in a row that accepted nothing


class Speculator:
    """Drafts and the decision to speculate, per row (see the module docstring)."""

    ALPHA = 0.3  # weight of the newest observation in the acceptance average
    # A verify run of k drafted tokens costs about 1 + FIXED + PER_TOKEN * k decode runs until
    # measured (SmolLM2 fp32 on 2 cores: 1.18 at k = 1-2, 1.4-1.5 at k = 6).
    FIXED, PER_TOKEN = 0.1, 0.06
    MARGIN = 1.05  # drafting must promise this many tokens per decode run's cost, or no draft

    def __init__(self, options: SpeculativeOptions, model: Any, rows: int, stats: Any) -> None:
        self.options = options
        self.k = options.num_tokens
        self.rows = [self._new_row() for _ in range(rows)]
        self.stats = stats  # the generator's RunStats: verify_runs, drafted_tokens, ...
        self.draft_model: DraftModel | None = None
        if options.method == "draft":
            if isinstance(options.draft_model, (str, Path)):
                raise GenerationError("the draft model must be loaded before a Speculator is "
                                      "made (Model.load_draft_model).")
            self.draft_model = DraftModel(options.draft_model, model, rows)
        self._decode_s: float | None = None  # average batch-1 decode run
        # cost of a verify run of k drafted tokens, in batch-1 decode runs (measured as it runs)
        self._ratio = [1.0] + [1 + self.FIXED + self.PER_TOKEN * k for k in range(1, self.k + 1)]

    def _new_row(self) -> _Row:
        # Priors: a draft model of the same family agrees often; prompt lookup rarely on free
        # text (its estimate then follows every plain step's would-be first draft, for free).
        return _Row(accept=0.6 if self.options.method == "draft" else 0.3)

    def reset(self, row: int) -> None:
        self.rows[row] = self._new_row()

    # ------------------------------------------------------------------ deciding

    def length(self, row: int) -> int:
        """How many tokens to draft for ``row`` now (0: decode plainly)."""
        if not self.options.adaptive:
            return self.k
        state = self.rows[row]
        if self._decode_s is None and self.draft_model is not None:
            return 0  # one plain step first: the draft model's cost is measured against it
        if state.skip > 0:
            state.skip -= 1
            return 0
        a, best, best_gain = min(state.accept, 0.99), 0, self.MARGIN
        drafting = self._draft_ratio()
        for k in range(1, self.k + 1):
            tokens = (1 - a ** (k + 1)) / (1 - a)  # expected tokens a verify of k yields
            gain = tokens / (self._ratio[k] + drafting * k)
            if gain > best_gain:
                best, best_gain = k, gain
        return best

    def _draft_ratio(self) -> float:
        """A draft model's seconds per drafted token, in decode runs of the target (0 for
        prompt lookup; an optimistic 0.1 until both are measured)."""
        if self.draft_model is None:
            return 0.0
        s = self.stats
        if self._decode_s is None or s.drafted_tokens == 0:
            return 0.1
        return s.draft_s / s.drafted_tokens / self._decode_s

    def draft(self, row: int, tokens: Seq[int]) -> list[int]:
        k = self.length(row)
        if k == 0:
            return []
        if self.draft_model is None:
            o = self.options
            return ngram_draft(tokens, k, o.ngram_max, o.ngram_min)
        before = self.draft_model.seconds, self.draft_model.runs
        out = self.draft_model.draft(row, tokens, k)
        self.stats.draft_s += self.draft_model.seconds - before[0]
        self.stats.draft_runs += self.draft_model.runs - before[1]
        return out

    # ------------------------------------------------------------------ verifying

    def verify(self, engine: Any, cache: Any, row: int, seq: Any, draft: list[int]) -> list[Any]:
        """Row ``row``'s last picked token and ``draft`` in one run (``engine.verify``); the
        sequence picks from each position's logits while its picks follow the draft, exactly as
        it would one step at a time. Rejected positions leave the cache (a recurrent state goes
        back to its copy from before the run, and the accepted tokens run again as the row's
        next chunk); returns the sequence's TokenEvents."""
        base = cache.length_of(row)
        run = seq.tokens[base:base + 1] + draft
        began = time.perf_counter()
        cache.checkpoint(row, transient=True)  # a recurrent state comes back here on a rejection
        logits = engine.verify(cache, row, run)
        took = time.perf_counter() - began
        events: list[Any] = []
        index = 0
        while True:  # the sequence fills its own constraint masks, one position at a time
            forced = seq.forced_tokens
            events += seq.accept(logits[index], row, None)
            self.stats.forced_tokens += seq.forced_tokens - forced
            if seq.done:
                break
            new = seq.tokens[base:]
            if len(new) > len(run) or new != run[:len(new)]:
                break
            index = len(new) - 1
        new = seq.tokens[base:]
        matched = common_prefix(new, run)
        cache.truncate(row, base + min(matched, max(len(new) - 1, 0)))
        accepted = max(0, min(matched, len(run)) - 1)
        self.verified(row, len(draft), min(accepted, len(draft)), took)
        return events

    # ------------------------------------------------------------------ learning

    def verified(self, row: int, drafted: int, accepted: int, seconds: float) -> None:
        """A verify run of ``drafted`` tokens kept ``accepted`` of them in ``seconds``."""
        s = self.stats
        s.verify_runs += 1
        s.verify_s += seconds
        s.drafted_tokens += drafted
        s.accepted_tokens += accepted
        state = self.rows[row]
        # Tokens compared: the accepted ones and the first rejected (if any).
        for hit in [1.0] * accepted + ([0.0] if accepted < drafted else []):
            state.accept += self.ALPHA * (hit - state.accept)
        if self._decode_s is not None and 0 < drafted <= self.k:
            self._ratio[drafted] += 0.3 * (seconds / self._decode_s - self._ratio[drafted])
        state.misses = state.misses + 1 if accepted == 0 else 0
        if self.draft_model is not None and state.misses >= 2:
            state.skip = min(64, 2 ** state.misses)  # the draft model's runs are not free

    def decoded(self, rows: int, seconds: float) -> None:
        """A plain decode run of ``rows`` rows took ``seconds`` (batch 1 runs set the cost)."""
        if rows == 1:
            self._decode_s = seconds if self._decode_s is None else \
                self._decode_s + 0.2 * (seconds - self._decode_s)

    def observed(self, row: int, tokens: Seq[int], picked: int) -> None:
        """A plain step picked ``picked`` after ``tokens``: the n-gram drafter scores the token
        it would have drafted first (free; keeps its estimate current while it does not draft)."""
        if self.draft_model is not None or not self.options.adaptive:
            return
        o = self.options
        guess = ngram_draft(tokens, 1, o.ngram_max, o.ngram_min)
        if guess:
            state = self.rows[row]
            state.accept += self.ALPHA * (float(guess[0] == picked) - state.accept)


def make_speculator(model: Any, engine: Any, batch: int, stats: Any,
                    speculative: SpeculativeOptions | str | None) -> Speculator | None:
    """A generator's Speculator: ``speculative`` (None: the model's own setting), or None when
    it is off, or on by default for a folder that cannot verify (an error when asked for)."""
    explicit = speculative is not None
    opts = speculative_options(speculative if explicit else getattr(model, "speculative", None))
    if not opts.on:
        return None
    if not getattr(engine, "verifies", False):
        if explicit or not getattr(model, "speculative_is_default", False):
            why = getattr(engine, "cannot_verify", None)
            raise GenerationError(why() if why is not None else "this engine has no verify "
                                  "step; speculative decoding needs one.")
        return None  # on by default, but this folder cannot verify: plain decoding
    if opts.method == "draft" and isinstance(opts.draft_model, (str, Path)):
        opts = dataclasses.replace(opts, draft_model=model.load_draft_model(opts.draft_model))
    elif opts.method == "draft" and getattr(model, "draft_model", None) is not None:
        opts = dataclasses.replace(opts, draft_model=model.draft_model)
    return Speculator(opts, model, batch, stats)
