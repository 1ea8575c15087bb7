"""A Lark grammar's language written inside a JSON string: the grammar whose sentences are the
original's with each character escaped as JSON escapes it (``"`` as ``\\"``, a newline as
``\\n``, other control characters as ``\\u00XX``), without the quotes.

A custom tool of OpenAI's Responses API takes free text in a Lark grammar (Codex's
``apply_patch``); a model that writes its calls as JSON (Hermes' ``<tool_call>{"name": ...,
"arguments": {"input": "..."}}``) writes that text inside a JSON string. Escaping maps single
characters, so each terminal is rewritten on its own: a string literal escaped, a regular
expression's character sets split into the characters that stand for themselves and the escaped
ones.

One thing does not carry over: a lexeme that ends where the next begins. ``/(.*)/ LF`` lexes
greedily up to a newline, but written escaped both the text and the newline begin with a
backslash, and a greedy lexer that took the backslash cannot give it back. So regular
expressions and terminal definitions become rules over one-character lexemes (the grammar's
parser, not its lexer, decides where each ends); string literals stay lexemes. The language is
the grammar's own (what its greedy lexer would have refused for a lexeme boundary it could not
see is accepted). Terminals that ``%ignore`` names stay terminals.

    json_string_grammar('start: "a" LF\\n%import common.LF')

Supported: string literals (with ``i``), ``"a".."z"`` ranges, regular expressions in the syntax
Python's ``re`` and Rust's ``regex`` share (``\\w`` and ``\\s`` read as ASCII), ``%import
common.NAME`` for Lark's common terminals, ``%ignore``. Refused (``ConstraintError``): ``%json``,
special tokens (``<...>``), back-references and look-around.
"""

from __future__ import annotations

import ast
import re
import re._constants as sre  # type: ignore[import-not-found]
import re._parser as sre_parse  # type: ignore[import-not-found]
from typing import Any

from llm_onnx.runtime.structured.constraint import ConstraintError

MAX_CHAR = 0x10FFFF
_SURROGATES = (0xD800, 0xDFFF)
_SHORT = {0x08: "b", 0x09: "t", 0x0A: "n", 0x0C: "f", 0x0D: "r"}  # JSON's short escapes
_TOKEN = re.compile(r'''
    (?P<comment>//[^\n]*)
  | (?P<range>"(?:[^"\\\n]|\\.)*"\s*\.\.\s*"(?:[^"\\\n]|\\.)*")
  | (?P<string>"(?:[^"\\\n]|\\.)*"i?)
  | (?P<regex>/(?:[^/\\\n]|\\.)+/[imsux]*)
  | (?P<special><[^>\n]*>)
  | (?P<directive>%[a-z]+)
''', re.VERBOSE)
_IMPORT = re.compile(r"^%import\s+common\s*(?:\.\s*(\w+)|\(([\w\s,]+)\))\s*$", re.MULTILINE)
# Lark's common.lark terminals, as Lark writes them
COMMON = {
    "DIGIT": '"0".."9"', "HEXDIGIT": '"a".."f" | "A".."F" | DIGIT', "INT": "DIGIT+",
    "SIGNED_INT": '["+"|"-"] INT', "DECIMAL": 'INT "." INT? | "." INT',
    "_EXP": '("e"|"E") SIGNED_INT', "FLOAT": "INT _EXP | DECIMAL _EXP?",
    "SIGNED_FLOAT": '["+"|"-"] FLOAT', "NUMBER": "FLOAT | INT",
    "SIGNED_NUMBER": '["+"|"-"] NUMBER', "LCASE_LETTER": '"a".."z"',
    "UCASE_LETTER": '"A".."Z"', "LETTER": "UCASE_LETTER | LCASE_LETTER", "WORD": "LETTER+",
    "CNAME": '("_"|LETTER) ("_"|LETTER|DIGIT)*', "WS_INLINE": '(" "|/\\t/)+',
    "WS": "/[ \\t\\f\\r\\n]/+", "CR": "/\\r/", "LF": "/\\n/", "NEWLINE": "(CR? LF)+",
    "SH_COMMENT": "/#[^\\n]*/", "CPP_COMMENT": "/\\/\\/[^\\n]*/",
}

Ranges = list[tuple[int, int]]


_DEFINITION = re.compile(r"^([?!]?)(_?[A-Za-z][A-Za-z0-9_]*)(\.-?\d+)?\s*:(.*)$", re.DOTALL)
_TERMINAL = re.compile(r"_?[A-Z][A-Z0-9_]*")


def json_string_grammar(grammar: str, where: str = "grammar") -> str:
    """``grammar`` (Lark) rewritten so that it matches its sentences as JSON string contents
    (see the module docstring); a construct it cannot rewrite is a ConstraintError naming
    ``where``."""
    rules, terminals, directives = [], {}, []
    for statement in _statements(_IMPORT.sub("", grammar)):
        m = _DEFINITION.match(statement)
        if m is None:
            directives.append(statement)
        elif _TERMINAL.fullmatch(m.group(2)):
            terminals[m.group(2)] = m.group(4)
        else:
            rules.append((m.group(1) + m.group(2), m.group(4)))
    for name in _imports(grammar, where):
        terminals.setdefault(name, COMMON[name])
    ignored = _closure([d.split(None, 1)[1].strip() for d in directives
                        if d.startswith("%ignore")], terminals)
    out = []
    for statement in directives:
        if not statement.startswith(("%ignore", "%llguidance")):
            raise ConstraintError(f"{where}: {statement.split()[0]} cannot be written inside "
                                  "a JSON string.", where)
        head, _, rest = statement.partition(" ")
        out.append(head + " " + (_body(rest, {}, where, lexemes=True)
                                 if head == "%ignore" else rest))
    names = {name: f"json_t_{name.lower().lstrip('_')}" for name in terminals}
    out += [f"{name}: {_body(body, names, where)}" for name, body in rules]
    out += [f"{names[name]}: {_body(body, names, where)}" for name, body in terminals.items()]
    out += [f"{name}: {_body(terminals[name], {}, where, lexemes=True)}" for name in ignored]
    return "\n".join(out) + "\n"


def checked_grammar(grammar: str, where: str = "grammar") -> str:
    """``grammar`` if llguidance compiles it and its JSON-string form (else a ConstraintError
    naming ``where`` with llguidance's message)."""
    import llguidance

    for text in (grammar, json_string_grammar(grammar, where)):
        try:
            error = llguidance.LLMatcher.validate_grammar(llguidance.grammar_from("lark", text))
        except (ValueError, RuntimeError) as e:
            error = str(e)
        if error:
            raise ConstraintError(f"{where}: {error.strip().splitlines()[0]}", where)
    return grammar


def _statements(grammar: str) -> list[str]:
    """The grammar's definitions and directives, each with its continuation lines."""
    out: list[str] = []
    for line in grammar.splitlines():
        bare = line.strip()
        if not bare or bare.startswith("//"):
            continue
        if out and (line[0].isspace() or bare.startswith("|")):
            out[-1] += " " + bare
        else:
            out.append(bare)
    return out


def _closure(names: list[str], terminals: dict[str, str]) -> list[str]:
    """The terminals ``names`` name (those %ignore takes by name) and the ones they use."""
    todo, found = [n for n in names if n in terminals], set()
    while todo:
        name = todo.pop()
        if name not in found:
            found.add(name)
            todo += [t for t in _TERMINAL.findall(_strip_literals(terminals[name]))
                     if t in terminals]
    return [name for name in terminals if name in found]


def _strip_literals(text: str) -> str:
    return _TOKEN.sub(" ", text)


def _body(body: str, names: dict[str, str], where: str, lexemes: bool = False) -> str:
    """A definition's body rewritten: its literals and regular expressions escaped (as one
    lexeme each with ``lexemes``, else regular expressions as rules over one-character
    lexemes), terminal names replaced by ``names``."""
    out, at = [], 0
    for m in _TOKEN.finditer(body):
        out.append(_renamed(body[at:m.start()], names))
        at = m.end()
        kind, text = m.lastgroup, m.group()
        if kind == "comment":
            continue
        if kind == "special":
            raise ConstraintError(f"{where}: special tokens ({text}) cannot be written in a JSON "
                                  "string.", where)
        if kind == "directive":
            raise ConstraintError(f"{where}: {text} cannot be written inside a JSON string.",
                                  where)
        if kind == "range":
            low, high = (ast.literal_eval(s.strip()) for s in text.split(".."))
            if len(low) != 1 or len(high) != 1 or low > high:
                raise ConstraintError(f"{where}: {text} is not a range of characters.", where)
            out.append(f"/{_escaped_set([(ord(low), ord(high))])}/")
        elif kind == "string":
            out.append(_string(text, where))
        else:
            out.append(_regex(text, where, lexemes))
    out.append(_renamed(body[at:], names))
    return "".join(out).strip()


def _renamed(text: str, names: dict[str, str]) -> str:
    return _TERMINAL.sub(lambda m: names.get(m.group(), m.group()), text) if names else text


def _imports(grammar: str, where: str) -> list[str]:
    """The common terminals ``grammar`` imports, with those they use, in definition order."""
    names: list[str] = []
    for m in _IMPORT.finditer(grammar):
        names += [m.group(1)] if m.group(1) else re.split(r"[\s,]+", m.group(2).strip())
    if re.search(r"^\s*%import\b", _IMPORT.sub("", grammar), re.MULTILINE):
        raise ConstraintError(f"{where}: only Lark's common terminals can be imported "
                              "(%import common.NAME).", where)
    todo, needed = list(names), set()
    while todo:
        name = todo.pop()
        if name in needed:
            continue
        if name not in COMMON:
            raise ConstraintError(f"{where}: %import common.{name} is not one of "
                                  f"{', '.join(sorted(COMMON))}.", where)
        needed.add(name)
        todo += _TERMINAL.findall(_strip_literals(COMMON[name]))
    return [name for name in COMMON if name in needed]


def _string(literal: str, where: str) -> str:
    folded = literal.endswith("i")
    try:
        value = ast.literal_eval(literal[:-1] if folded else literal)
    except (ValueError, SyntaxError):
        raise ConstraintError(f"{where}: {literal} is not a string literal.", where) from None
    if not folded:
        escaped = "".join(_escape(ord(c)) for c in value)
        return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return "/" + "".join(_escaped_set(_cased([(ord(c), ord(c))])) for c in value) + "/"


def _escape(code: int) -> str:
    """A character as JSON writes it in a string."""
    if code == 0x22:
        return '\\"'
    if code == 0x5C:
        return "\\\\"
    if code < 0x20:
        return "\\" + _SHORT[code] if code in _SHORT else f"\\u{code:04x}"
    return chr(code)


def _regex(literal: str, where: str, lexemes: bool) -> str:
    """A regular expression escaped: one lexeme (``lexemes``), or a rule expression over
    one-character lexemes."""
    pattern, flags = literal[1:literal.rindex("/")], literal[literal.rindex("/") + 1:]
    pattern = pattern.replace("\\/", "/")
    bits = sum({"i": re.IGNORECASE, "m": re.MULTILINE, "s": re.DOTALL, "x": re.VERBOSE,
                "u": 0}[f] for f in flags)
    try:
        parsed = sre_parse.parse(pattern, bits)
    except re.error as e:
        raise ConstraintError(f"{where}: the regular expression {literal} does not parse "
                              f"({e}).", where) from None
    walk = _Walk(bool(bits & re.DOTALL), bool(bits & re.IGNORECASE), where, literal, lexemes)
    text = walk.sequence(list(parsed), True)
    return f"/{text}/" if lexemes else f"({text})"


class _Walk:
    """A parsed regular expression rewritten (``lexemes``: as regex text, else as Lark rule
    syntax whose lexemes are single escaped characters)."""

    def __init__(self, dotall: bool, folded: bool, where: str, literal: str,
                 lexemes: bool) -> None:
        self.dotall, self.folded = dotall, folded
        self.where, self.literal, self.lexemes = where, literal, lexemes

    def sequence(self, items: list[Any], whole: bool = False) -> str:
        out = []
        for k, (op, arg) in enumerate(items):
            if op is sre.AT:
                edge = (k == 0 and arg in (sre.AT_BEGINNING, sre.AT_BEGINNING_STRING)) or \
                    (k == len(items) - 1 and arg in (sre.AT_END, sre.AT_END_STRING))
                if whole and edge:
                    continue  # a terminal is matched whole: its anchors add nothing
                raise self.refused("anchors")
            out.append(self.item(op, arg))
        if not out:
            raise self.refused("an empty expression")
        return ("" if self.lexemes else " ").join(out)

    def item(self, op: Any, arg: Any) -> str:
        chars = _chars(op, arg, self.dotall)
        if chars is not None:
            one = _escaped_set(_cased(chars) if self.folded else chars)
            return one if self.lexemes else f"/{one}/"
        if op is sre.BRANCH:
            bar = "|" if self.lexemes else " | "
            return "(" + ("?:" if self.lexemes else "") + bar.join(
                self.sequence(list(b)) for b in arg[1]) + ")"
        if op is sre.SUBPATTERN or op is getattr(sre, "ATOMIC_GROUP", None):
            inner, saved = (arg[3] if op is sre.SUBPATTERN else arg), (self.dotall, self.folded)
            if op is sre.SUBPATTERN:
                add, remove = arg[1], arg[2]
                self.folded = (self.folded or bool(add & re.IGNORECASE)) and \
                    not remove & re.IGNORECASE
                self.dotall = (self.dotall or bool(add & re.DOTALL)) and not remove & re.DOTALL
            try:
                return self.group(self.sequence(list(inner)))
            finally:
                self.dotall, self.folded = saved
        if op in (sre.MAX_REPEAT, sre.MIN_REPEAT, getattr(sre, "POSSESSIVE_REPEAT", None)):
            low, high, inner = arg
            body = self.group(self.sequence(list(inner)))
            if (low, high) == (0, sre.MAXREPEAT):
                return body + "*"
            if (low, high) == (1, sre.MAXREPEAT):
                return body + "+"
            if (low, high) == (0, 1):
                return body + "?"
            return body + (f"{{{low},}}" if high == sre.MAXREPEAT else f"{{{low},{high}}}")
        raise self.refused(str(op).lower())

    def group(self, text: str) -> str:
        return f"(?:{text})" if self.lexemes else f"({text})"

    def refused(self, what: str) -> ConstraintError:
        return ConstraintError(f"{self.where}: {self.literal} uses {what}, which has no "
                               "JSON-string form here (back-references, look-around and "
                               "anchors inside an expression are refused).", self.where)


def _chars(op: Any, arg: Any, dotall: bool) -> Ranges | None:
    """The characters a single-character item matches (None: not such an item)."""
    if op is sre.LITERAL:
        return [(arg, arg)]
    if op is sre.NOT_LITERAL:
        return _complement([(arg, arg)])
    if op is sre.ANY:
        return [(0, MAX_CHAR)] if dotall else _complement([(0x0A, 0x0A)])
    if op is sre.IN:
        ranges: Ranges = []
        negate = False
        for kind, value in arg:
            if kind is sre.NEGATE:
                negate = True
            elif kind is sre.LITERAL:
                ranges.append((value, value))
            elif kind is sre.RANGE:
                ranges.append(value)
            elif kind is sre.CATEGORY:
                ranges += _category(value)
            else:
                return None
        return _complement(ranges) if negate else _normal(ranges)
    return None


_DIGIT = [(0x30, 0x39)]
_WORD = [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)]
_SPACE = [(0x09, 0x0D), (0x20, 0x20)]


def _category(category: Any) -> Ranges:
    table = {sre.CATEGORY_DIGIT: _DIGIT, sre.CATEGORY_WORD: _WORD, sre.CATEGORY_SPACE: _SPACE}
    negated = {sre.CATEGORY_NOT_DIGIT: _DIGIT, sre.CATEGORY_NOT_WORD: _WORD,
               sre.CATEGORY_NOT_SPACE: _SPACE}
    if category in table:
        return list(table[category])
    return _complement(negated[category])


def _normal(ranges: Ranges) -> Ranges:
    """Sorted, merged, without surrogates (no string holds one)."""
    out: Ranges = []
    for low, high in sorted(ranges):
        if out and low <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], high))
        else:
            out.append((low, high))
    return _minus(out, [_SURROGATES])


def _complement(ranges: Ranges) -> Ranges:
    return _minus([(0, MAX_CHAR)], _normal(ranges))


def _minus(ranges: Ranges, cut: Ranges) -> Ranges:
    out = []
    for low, high in ranges:
        pieces = [(low, high)]
        for c_low, c_high in cut:
            pieces = [p for a, b in pieces for p in ((a, min(b, c_low - 1)),
                                                       (max(a, c_high + 1), b)) if p[0] <= p[1]]
        out += pieces
    return out


def _cased(ranges: Ranges) -> Ranges:
    """``ranges`` and the other case of the ASCII letters in them."""
    extra = [(c ^ 0x20, c ^ 0x20) for low, high in ranges
             for c in range(max(low, 0x41), min(high, 0x7A) + 1) if chr(c).isalpha()]
    return _normal(ranges + extra)


def _escaped_set(ranges: Ranges) -> str:
    """A regex matching the JSON-string form of any one character of ``ranges``."""
    ranges = _normal(ranges)
    if not ranges:
        raise ConstraintError("a character set of the grammar matches nothing.")
    plain = _minus(ranges, [(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C)])
    escaped = [code for low, high in ranges for code in range(low, min(high, 0x5C) + 1)
               if code < 0x20 or code in (0x22, 0x5C)]
    shorts = [_char(ord(_escape(c)[1])) for c in escaped if c in _SHORT or c >= 0x20]
    long = [f"{c:02x}" for c in escaped if c < 0x20 and c not in _SHORT]
    alternatives = [_class(plain)] if plain else []
    if shorts:  # \" \\ \n ...: a backslash and one character
        alternatives.append(_char(0x5C) + (shorts[0] if len(shorts) == 1 else
                                           "[" + "".join(shorts) + "]"))
    if long:  # \u00XX
        alternatives.append(_char(0x5C) + "u00(?:" + "|".join(long) + ")")
    return alternatives[0] if len(alternatives) == 1 else "(?:" + "|".join(alternatives) + ")"


def _class(ranges: Ranges) -> str:
    if len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
        return _char(ranges[0][0])
    return "[" + "".join(_char(a) if a == b else f"{_char(a)}-{_char(b)}"
                         for a, b in ranges) + "]"


def _char(code: int) -> str:
    return chr(code) if chr(code).isascii() and chr(code).isalnum() else f"\\x{{{code:X}}}"
