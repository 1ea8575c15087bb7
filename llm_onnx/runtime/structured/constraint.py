"""Constrained decoding: a request's JSON schema, regex, grammar or choice as a mask on its logits.

A ``Constraint`` says what a reply must match; it is a generation option like the temperature
(``GenerationOptions.constraint``). The engine is llguidance: ``Constraints`` (one per model)
converts the tokenizer once, compiles each constraint once (cached by content) and hands every
sequence a ``RowConstraint`` of its own, which its ``SequenceState`` consults at each step:

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

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from llm_onnx.errors import GenerationError
from llm_onnx.runtime.structured.schema_check import SchemaProblem, check_schema, dotted

if TYPE_CHECKING:  # llguidance is imported where a grammar is compiled; its stub has the type
    from llguidance._lib import JsonCompileOptions

KINDS = ("json_schema", "json_object", "regex", "grammar", "choice", "llguidance")
THINKING = ("none", "optional", "open")

# JSON whitespace between tokens: none, one space, or a newline and an indent (as llama.cpp's
# schema grammars allow). Unbounded whitespace lets a weak model pad forever.
JSON_OPTIONS: JsonCompileOptions = {"whitespace_pattern": r"(?:\n[ \t]{0,20}| )?"}


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
        think_tokens: the ids of ``<think>`` and ``</think>`` (Gemma 4: ``<|channel>`` and
            ``<channel|>``, its block's text after the first is free) where they are tokens
            the engine treats as special (the grammar names them as tokens); None: written as
            text.
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
        grammars = grammar_list(body)
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
    grammars = grammar_list(body)
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


def grammar_list(text: str) -> list[dict[str, Any]]:
    """A grammar text's list of (sub)grammars: JSON ``{"grammars": [...]}``, or plain Lark."""
    if text.lstrip().startswith("{"):
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and isinstance(parsed.get("grammars"), list):
            return [dict(g) for g in parsed["grammars"]]
    return [{"lark_grammar": text}]
