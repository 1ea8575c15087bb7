"""The constraint engine: llguidance over a model's tokenizer. ``Constraints`` compiles each
``Constraint`` once (cached by content; a schema the engine refuses as written is tightened,
never loosened, see schema_rewrite.py) and hands every sequence a ``RowConstraint`` of its own;
``MaskBatch`` fills the masks of a batch's constrained rows in one parallel call, on a helper
thread while ONNX Runtime runs the model."""

from __future__ import annotations

import concurrent.futures
import json
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from llm_onnx.errors import GenerationError
from llm_onnx.runtime.structured.constraint import Constraint, ConstraintError
from llm_onnx.runtime.structured.schema_check import dotted, locate
from llm_onnx.runtime.structured.schema_rewrite import default_rewrite, tighten

CACHE_SIZE = 64  # compiled grammars kept per model
REWRITE_BUDGET_S = 8.0  # most time spent tightening a schema the engine refuses as written


class _Compiled:
    """A validated grammar and a matcher in its start state (copied for each sequence); the
    constraint it was compiled from (tightened, if the engine refused the original)."""

    def __init__(self, matcher: Any, constraint: Constraint) -> None:
        self.matcher = matcher
        self.constraint = constraint
        self.lock = threading.Lock()


class Constraints:
    """The constraint engine of one model: its tokenizer converted once, compiled grammars cached.

    Args:
        tokenizer_json: the model's tokenizer.json text.
        vocab_size: the width of the model's logits (the mask's length).
        eos_token_ids: the model's end-of-sequence ids.
    """

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        self._tokenizer_json = tokenizer_json
        self.vocab_size = vocab_size
        self.eos_token_ids = tuple(int(i) for i in eos_token_ids)
        self._tokenizer: Any = None
        self._executor: Any = None
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, _Compiled] = OrderedDict()
        self.compiles = 0  # grammars compiled (cache misses)
        # Append the tokens a grammar forces without a pick each (False: the model picks them
        # one step at a time under a one-token mask; for measuring what fast-forward saves).
        self.fast_forward = True

    @property
    def tokenizer(self) -> Any:
        """llguidance's LLTokenizer of the model (converted on first use)."""
        with self._lock:
            if self._tokenizer is None:
                llguidance = _import()
                try:
                    self._tokenizer = llguidance.LLTokenizer(
                        self._tokenizer_json, n_vocab=self.vocab_size,
                        eos_token=list(self.eos_token_ids) or None)
                except (ValueError, RuntimeError) as e:
                    raise ConstraintError(
                        "constrained decoding (JSON schemas, grammars, tool calls) is not "
                        "available for this model: the constraint engine cannot read its "
                        f"tokenizer.json ({e}).") from None
            return self._tokenizer

    @property
    def executor(self) -> Any:
        with self._lock:
            if self._executor is None:
                self._executor = _import().LLExecutor()
            return self._executor

    def compile(self, constraint: Constraint) -> Constraint:
        """Check and compile ``constraint`` now (it is then cached). Returns the constraint the
        engine runs: ``constraint`` itself, or a schema tightened where the engine would refuse
        it as written (llm_onnx.runtime.structured.schema_rewrite: never looser). Raises ConstraintError
        naming the field, and for a schema the path and keyword, of what is wrong."""
        return self._compiled(constraint).constraint

    def start(self, constraint: Constraint) -> RowConstraint:
        """A fresh matcher of ``constraint`` for one sequence."""
        compiled = self._compiled(constraint)
        with compiled.lock:
            matcher = compiled.matcher.deep_copy()
        return RowConstraint(matcher, self)

    def token_id(self, text: str) -> int | None:
        """The id of a token whose text is exactly ``text`` (special tokens included)."""
        ids = self.tokenizer.tokenize_str(text, parse_special=True)
        return ids[0] if len(ids) == 1 else None

    def special_token(self, text: str) -> int | None:
        """The id of ``text`` if it is one token the engine treats as special (every added
        token: ``<tool_call>``, ``<think>``, ...): a grammar must name it as a token
        (``<[id]>``), since no string spells it. None if ``text`` is plain text."""
        token = self.token_id(text)
        return token if token is not None and self.tokenizer.is_special_token(token) else None

    def _compiled(self, constraint: Constraint) -> _Compiled:
        if not isinstance(constraint, Constraint):
            raise ConstraintError(f"a constraint must be a Constraint, got "
                                  f"{type(constraint).__name__}.")
        key = constraint.grammar_text()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        llguidance = _import()
        limits = llguidance.LLParserLimits(verbose_errors=False)
        tokenizer = self.tokenizer
        current, closing = constraint, False
        if constraint.kind == "json_schema":  # closed objects, bounded integers (schema_rewrite)
            closed = default_rewrite(json.loads(constraint.source))
            if closed is not None:
                current, closing = _with_schema(constraint, closed), True
        grammar = current.grammar_text()
        errors: list[str] = []
        deadline = time.monotonic() + REWRITE_BUDGET_S
        while True:  # each round removes one reason for a refusal
            error = llguidance.LLMatcher.validate_grammar(grammar, tokenizer, limits=limits)
            if not error:
                break
            errors.append(error)
            if closing and "Unsatisfiable" in error:  # closing left nothing: as written
                current, closing = constraint, False
            else:
                tightened = tighten(json.loads(current.source), error) \
                    if current.kind == "json_schema" and time.monotonic() < deadline else None
                if tightened is None:
                    raise _error(constraint, _reason(errors))
                current = _with_schema(current, tightened)
            grammar = current.grammar_text()
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0, limits=limits)
        if matcher.is_error():
            raise _error(constraint, matcher.get_error())
        compiled = _Compiled(matcher, current)
        with self._lock:
            self.compiles += 1
            self._cache[key] = compiled
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return compiled


def _reason(errors: list[str]) -> str:
    """The refusal to report: the last, unless the rewrites themselves ended in a schema that
    is unsatisfiable or too large; then the first the user can act on."""
    last = errors[-1]
    if "Unsatisfiable" in last or "too large" in last:
        return next((e for e in errors if not e.startswith("Unknown format")), last)
    return last


def _with_schema(constraint: Constraint, schema: Any) -> Constraint:
    return replace(constraint, source=json.dumps(schema, ensure_ascii=False))


def _import() -> Any:
    try:
        import llguidance
        import llguidance.numpy  # noqa: F401  (fill_next_token_bitmask_par)
    except ImportError:
        raise GenerationError("constrained decoding needs llguidance: pip install llguidance "
                              "(a dependency of llm-onnx; reinstall it).") from None
    return llguidance


def _one_line(message: str, kind: str) -> str:
    """llguidance's message on one line: the grammar excerpts and carets it prints under a
    parse error are dropped; a regex error keeps its reason; a grammar error its position."""
    lines = [line.rstrip() for line in message.strip().split("\n<state>")[0].splitlines()]
    head = lines[0].strip() if lines else message
    position = re.match(r"at (\d+)\((\d+)\): ", head)
    if position:
        head = head[position.end():]
        if kind == "grammar":
            head += f" (line {position.group(1)}, column {position.group(2)})"
    head = head.replace(" (in regex)", "").rstrip(":").rstrip(".")
    reasons = [line.strip()[len("error: "):] for line in lines[1:]
               if line.strip().startswith("error: ")]
    return f"{head}: {'; '.join(reasons)}" if reasons else head


def _error(c: Constraint, message: str) -> ConstraintError:
    """The engine's message with the path and keyword it is about, where they can be found."""
    message = _one_line(message, c.kind)
    where = c.where
    if c.kind == "json_schema":
        found = locate(json.loads(c.source), message)
        if found is not None:
            path, keyword = found
            where = dotted(c.where, path)
            if "Unimplemented" in message or "not supported" in message:
                return ConstraintError(
                    f"{where}: the schema keyword '{keyword}' cannot be enforced by this "
                    "server's constraint engine; remove it or rewrite the schema without it (a "
                    "looser constraint is never applied silently).", where)
    elif c.kind == "grammar" and "::=" in c.source:
        message = f"the GBNF grammar (converted to Lark) is invalid: {message}"
    return ConstraintError(f"{where}: {message}.", where)


class RowConstraint:
    """One sequence's matcher: the mask of allowed tokens, consuming picked tokens, fast-forward
    tokens, rollback. Used by that sequence only (and by MaskBatch between its steps)."""

    def __init__(self, matcher: Any, constraints: Constraints) -> None:
        self.matcher = matcher
        self.constraints = constraints
        self.consumed = 0  # tokens the matcher holds (for rewinds)
        self.words = (constraints.vocab_size + 31) // 32

    @property
    def accepting(self) -> bool:
        return bool(self.matcher.is_accepting())

    @property
    def stopped(self) -> bool:
        """Nothing more may follow: the reply is complete (or the matcher failed)."""
        return bool(self.matcher.is_stopped())

    @property
    def error(self) -> str | None:
        return self.matcher.get_error() or None if self.matcher.is_error() else None

    def fill(self, bitmask: np.ndarray) -> None:
        """Write the allowed tokens' bits into ``bitmask`` ((words,) int32, C-contiguous)."""
        self.matcher.unsafe_compute_mask_ptr(bitmask.ctypes.data, bitmask.nbytes)

    def masked(self, logits: np.ndarray, bitmask: np.ndarray,
               eos: frozenset[int]) -> np.ndarray | None:
        """A float32 copy of the (V,) logits with every disallowed token at -inf; ``eos`` (the
        sequence's end-of-sequence ids) allowed exactly where the grammar accepts. None if no
        token is allowed."""
        vocab = logits.shape[0]
        allowed = np.unpackbits(bitmask.view(np.uint8), count=vocab, bitorder="little").view(bool)
        ends = [i for i in self.constraints.eos_token_ids if i < vocab]
        allowed[ends] = False
        if eos and self.accepting:
            allowed[[i for i in eos if i < vocab]] = True
        if not allowed.any():
            return None
        out = np.full(vocab, -np.inf, dtype=np.float32)
        np.copyto(out, logits, where=allowed)
        return out

    def consume(self, token: int) -> bool:
        ok = bool(self.matcher.consume_token(int(token)))
        if ok:
            self.consumed += 1
        return ok

    def forced(self) -> list[int]:
        """The tokens the grammar allows as the only continuation (fast-forward; none when the
        engine's ``fast_forward`` is off)."""
        if not self.constraints.fast_forward:
            return []
        return [int(t) for t in self.matcher.compute_ff_tokens()]

    def rollback(self, n: int) -> None:
        """Forget the last ``n`` consumed tokens (all of them: back to the start state)."""
        n = min(n, self.consumed)
        if n == self.consumed:
            self.matcher.reset()
        elif n:
            self.matcher.rollback(n)
        self.consumed -= n


class MaskBatch:
    """The bitmasks of a batch's constrained rows, filled in one parallel llguidance call, on a
    helper thread so that the fill overlaps the model run (``start`` before it, ``wait`` after).

    Args:
        constraints: the model's engine (its executor and vocabulary).
        rows: rows of the batch.
        overlap: fill on the helper thread (False: ``start`` fills at once; for measuring).
    """

    def __init__(self, constraints: Constraints, rows: int, overlap: bool = True) -> None:
        self.constraints = constraints
        self.bits = np.zeros((rows, (constraints.vocab_size + 31) // 32), dtype=np.int32)
        self.overlap = overlap
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.fill_s = 0.0  # seconds inside fills
        self.fills = 0  # rows filled

    def start(self, rows: list[tuple[RowConstraint, int]]) -> concurrent.futures.Future | None:
        if not rows:
            return None
        if not self.overlap:
            self._fill(rows)
            return None
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="llm-onnx-mask")
        return self._pool.submit(self._fill, rows)

    @staticmethod
    def wait(pending: concurrent.futures.Future | None) -> None:
        if pending is not None:
            pending.result()

    def row(self, index: int) -> np.ndarray:
        return self.bits[index]

    def _fill(self, rows: list[tuple[RowConstraint, int]]) -> None:

        began = time.perf_counter()
        if len(rows) == 1:
            constraint, index = rows[0]
            constraint.fill(self.bits[index])
        else:
            bits = self.bits
            self.constraints.executor.unsafe_compute_mask_ptr(
                [(c.matcher, i) for c, i in rows], bits.ctypes.data, bits.shape[1] * 4,
                bits.shape[0])
        self.fill_s += time.perf_counter() - began
        self.fills += len(rows)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
