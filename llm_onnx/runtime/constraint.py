"""Constrained decoding: a request's JSON schema, regex, grammar or choice as a mask on its logits.

A ``Constraint`` says what a reply must match; it is a generation option like the temperature
(``GenerationOptions.constraint``). The engine is llguidance: ``Constraints`` (one per model)
converts the tokenizer once, compiles each constraint once (cached by content) and hands every
sequence a ``RowConstraint`` of its own, which its ``Sequence`` consults at each step:

    mask  -> penalties -> temperature / top-k / top-p -> pick -> consume the token
    (allowed tokens of the grammar's state; end-of-sequence only where the grammar accepts)

and, when the grammar allows exactly one continuation, its tokens are appended without a sampling
step each (fast-forward: one model run for all of them instead of one each). A row whose grammar
is complete ends at once (finish_reason "stop"); one that runs out of tokens first ends with
"length" and its partial text. ``MaskBatch`` fills the masks of every constrained row of a batch
in one parallel call, on a helper thread while ONNX Runtime runs the model (both release the GIL).

Reasoning models: ``Constraint.after_thinking`` leaves a ``<think>`` block free and constrains
the answer after it. Log probabilities of a constrained row are those of the masked distribution
(disallowed tokens have probability 0), as vLLM reports them.
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import re
import time
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from llm_onnx.errors import GenerationError
from llm_onnx.runtime.schema_check import SchemaProblem, check_schema, dotted, locate
from llm_onnx.runtime.schema_rewrite import default_rewrite, tighten

KINDS = ("json_schema", "json_object", "regex", "grammar", "choice", "llguidance")
THINKING = ("none", "optional", "open")
# JSON whitespace between tokens: none, one space, or a newline and an indent (as llama.cpp's
# schema grammars allow). Unbounded whitespace lets a weak model pad forever.
JSON_OPTIONS = {"whitespace_pattern": r"(?:\n[ \t]{0,20}| )?"}
CACHE_SIZE = 64  # compiled grammars kept per model
REWRITE_BUDGET_S = 8.0  # most time spent tightening a schema the engine refuses as written


class ConstraintError(GenerationError):
    """A constraint that is invalid or that the engine cannot honour. ``where`` names the
    field (and, for a schema, the path and keyword) it is about."""

    def __init__(self, message: str, where: str | None = None) -> None:
        super().__init__(message)
        self.where = where


@dataclass(frozen=True)
class Constraint:
    """What a reply must match. Build one with the class methods.

    Args:
        kind: json_schema, json_object, regex, grammar (Lark or GBNF), choice, or llguidance
            (a grammar already in llguidance's JSON form, as tool calls make).
        source: the schema (JSON text), pattern, grammar, or the choices (a JSON list).
        where: the field it came from, named in error messages.
        thinking: "none"; "optional" (a reply may open with a free ``<think>`` block);
            "open" (the prompt opened the block: the reply starts inside it).
        markers: special tokens of the format (tool-call markers) kept in the reply's text.
        think_tokens: the ids of ``<think>`` and ``</think>`` where they are tokens the engine
            treats as special (the grammar names them as tokens); None: written as text.
        fence: a JSON answer may come in a Markdown fence, ```json ... ``` (chat replies: a
            model trained to fence its JSON keeps to its own habits, as llama-server allows
            it); the reader strips it (``FenceStripper``).
    """

    kind: str
    source: str
    where: str = "constraint"
    thinking: str = "none"
    markers: tuple[str, ...] = ()
    think_tokens: tuple[int, int] | None = None
    fence: bool = False

    @classmethod
    def json_schema(cls, schema: Any, where: str = "json_schema") -> Constraint:
        """Replies that are JSON documents valid under ``schema`` (a dict or JSON text)."""
        if isinstance(schema, (str, bytes)):
            try:
                schema = json.loads(schema)
            except ValueError as e:
                raise ConstraintError(f"{where}: not valid JSON ({e}).", where) from None
        try:
            check_schema(schema)
            text = json.dumps(schema, ensure_ascii=False)  # key order kept: it is the output's
        except SchemaProblem as e:
            at = dotted(where, e.path)
            raise ConstraintError(f"{at}: {e.message}.", at) from None
        except (TypeError, ValueError) as e:
            raise ConstraintError(f"{where}: the schema is not JSON data ({e}).", where) from None
        return cls("json_schema", text, where)

    @classmethod
    def json_object(cls, where: str = "json_object") -> Constraint:
        """Replies that are one JSON object (any keys and values)."""
        return cls("json_object", '{"type": "object"}', where)

    @classmethod
    def regex(cls, pattern: str, where: str = "regex") -> Constraint:
        """Replies that match ``pattern`` as a whole (Rust regex syntax, as Python's for the
        common cases; ``\\d`` is ASCII digits only)."""
        return cls("regex", _text(pattern, where, "a regular expression"), where)

    @classmethod
    def grammar(cls, grammar: str, where: str = "grammar") -> Constraint:
        """Replies in the language of ``grammar``: Lark syntax (llguidance's variant, with
        ``%json``), or llama.cpp's GBNF (recognised by its ``::=`` rules)."""
        return cls("grammar", _text(grammar, where, "a grammar"), where)

    @classmethod
    def choice(cls, choices: Sequence[str], where: str = "choice") -> Constraint:
        """Replies that are exactly one of ``choices``."""
        if isinstance(choices, (str, bytes)) or not isinstance(choices, Sequence) or not choices \
                or not all(isinstance(c, str) and c for c in choices):
            raise ConstraintError(f"{where} must be a non-empty list of non-empty strings.", where)
        return cls("choice", json.dumps(list(choices), ensure_ascii=False), where)

    def after_thinking(self, thinking: str,
                       think_tokens: tuple[int, int] | None = None) -> Constraint:
        """This constraint on the answer after a free ``<think>`` block (see ``thinking`` and
        ``think_tokens``)."""
        if thinking not in THINKING:
            raise ValueError(f"thinking must be one of {THINKING}, got {thinking!r}")
        return replace(self, thinking=thinking, think_tokens=think_tokens)

    def fenced(self) -> Constraint:
        """This JSON constraint, with the answer allowed in a ```json fence (other kinds: as
        they are)."""
        return replace(self, fence=True) if self.kind in ("json_schema", "json_object") else self

    def grammar_text(self) -> str:
        """The constraint in llguidance's grammar form (its thinking block included)."""
        return _grammar_text(self)


SHORTHAND = ("json_schema", "json_object", "regex", "grammar", "choice")


def constraint_shorthand(fields: dict[str, Any]) -> Constraint | None:
    """Pop ``json_schema=``, ``json_object=True``, ``regex=``, ``grammar=`` or ``choice=`` from
    generation keywords and return the Constraint it names (None: none given). At most one, and
    not together with ``constraint=``."""
    values = {k: fields.pop(k) for k in SHORTHAND if k in fields}
    given = [k for k, v in values.items() if v is not None and v is not False]
    if not given:
        return None
    if len(given) > 1 or fields.get("constraint") is not None:
        names = given + (["constraint"] if fields.get("constraint") is not None else [])
        raise ConstraintError(f"give one constraint, not {' and '.join(names)}.")
    kind = given[0]
    return Constraint.json_object() if kind == "json_object" else \
        getattr(Constraint, kind)(values[kind])


def _text(value: Any, where: str, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConstraintError(f"{where} must be {what} (a non-empty string).", where)
    return value


@functools.lru_cache(maxsize=256)
def _grammar_text(c: Constraint) -> str:
    import llguidance

    if c.kind in ("json_schema", "json_object"):
        body = llguidance.LLMatcher.grammar_from_json_schema(c.source, defaults=JSON_OPTIONS)
    elif c.kind == "regex":  # \d is [0-9], as in JSON Schema and JavaScript (not Unicode digits)
        body = f"start: /{llguidance.regex_to_lark(c.source, 'd')}/"
    elif c.kind == "grammar":
        try:
            body = llguidance.grammar_from("grammar", c.source)
        except ValueError as e:  # GBNF that does not convert
            raise ConstraintError(f"{c.where}: {e}.", c.where) from None
    elif c.kind == "choice":
        body = llguidance.grammar_from("choice", c.source)
    elif c.kind == "llguidance":
        body = c.source
    else:
        raise ConstraintError(f"unknown constraint kind {c.kind!r} (known: {', '.join(KINDS)}).")
    if c.fence:  # ```json <the document> ```, or the document alone; a little whitespace around
        grammars = _grammars(body)
        grammars[0] = {**grammars[0], "name": "llm_onnx_json"}
        top = ('start: "```json" WS @llm_onnx_json WS "```" | WS @llm_onnx_json WS\n'
               "WS: /[ \\t\\n]{0,4}/\n")
        body = json.dumps({"grammars": [{"lark_grammar": top}, *grammars]})
    if c.thinking == "none":
        return body
    # The answer becomes a subgrammar after the think block: any text (end-of-sequence not
    # allowed inside) up to the first </think>, then a little whitespace. Tags that are tokens
    # end the free text by themselves (no text regex matches a special token); tags written as
    # text need a lazy regex, which stops at the first </think>.
    grammars = _grammars(body)
    grammars[0] = {**grammars[0], "name": "llm_onnx_answer"}
    if c.think_tokens is not None:
        start, end = c.think_tokens
        opening = "" if c.thinking == "open" else f"/[ \\n]*/ <[{start}]> "
        thought = f"thought: {opening}/(?s:.*)/ <[{end}]>"
    else:
        opening = "" if c.thinking == "open" else "[ \\n]*<think>"
        thought = f"thought[lazy]: /{opening}(?s:.*)<\\/think>/"
    top = (f"start: thought{'?' if c.thinking == 'optional' else ''} answer\n{thought}\n"
           "answer: /[ \\t\\n]{0,4}/ @llm_onnx_answer\n")
    return json.dumps({"grammars": [{"lark_grammar": top}, *grammars]})


def _grammars(text: str) -> list[dict[str, Any]]:
    """A grammar text's list of (sub)grammars: JSON ``{"grammars": [...]}``, or plain Lark."""
    if text.lstrip().startswith("{"):
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and isinstance(parsed.get("grammars"), list):
            return [dict(g) for g in parsed["grammars"]]
    return [{"lark_grammar": text}]


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
        it as written (llm_onnx.runtime.schema_rewrite: never looser). Raises ConstraintError
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
