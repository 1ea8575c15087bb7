"""Reading JSON that may still be growing: where the values of an object's keys start and end in
the text, before the object is complete (the streamed arguments of a tool call).

``scan_object(text, i)`` reads the object starting at ``text[i]`` (after whitespace) as far as the
text goes and returns each key's value span; a value still being written has ``end`` None and
its text so far is ``text[start:]``. Nothing here decodes more than the keys, so a long argument
costs one pass per call.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

WHITESPACE = " \t\n\r"


@dataclass
class ObjectScan:
    """What ``scan_object`` read: ``fields`` maps each key to its value's (start, end) span, end
    None while the value is incomplete; ``end`` is the index after the closing brace (None:
    not closed yet); ``broken`` is set when the text cannot be JSON."""

    start: int
    fields: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    end: int | None = None
    broken: bool = False

    def text(self, source: str, key: str) -> str | None:
        """The value text of ``key`` so far (None: the key has not appeared)."""
        span = self.fields.get(key)
        if span is None:
            return None
        start, end = span
        return source[start:end] if end is not None else source[start:]

    def value(self, source: str, key: str) -> object:
        """The decoded value of a complete ``key`` (None if absent or incomplete)."""
        span = self.fields.get(key)
        if span is None or span[1] is None:
            return None
        return json.loads(source[span[0]:span[1]])


def skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i] in WHITESPACE:
        i += 1
    return i


def scan_object(text: str, i: int) -> ObjectScan:
    """Scan the JSON object at ``text[i:]`` (leading whitespace skipped); see the module
    docstring."""
    i = skip_space(text, i)
    scan = ObjectScan(i)
    if i >= len(text):
        return scan
    if text[i] != "{":
        scan.broken = True
        return scan
    i += 1
    while True:
        i = skip_space(text, i)
        if i >= len(text):
            return scan
        if text[i] == "}":
            scan.end = i + 1
            return scan
        if text[i] == "," and scan.fields:
            i = skip_space(text, i + 1)
            if i >= len(text):
                return scan
        if text[i] != '"':
            scan.broken = True
            return scan
        key_end = value_end(text, i)
        if key_end is None:
            return scan
        key = json.loads(text[i:key_end])
        i = skip_space(text, key_end)
        if i >= len(text):
            return scan
        if text[i] != ":":
            scan.broken = True
            return scan
        i = skip_space(text, i + 1)
        if i >= len(text):
            return scan
        end = value_end(text, i)
        scan.fields[key] = (i, end)
        if end is None:
            return scan
        i = end


def value_end(text: str, i: int) -> int | None:
    """The index after the JSON value starting at ``text[i]``; None if the text ends first.
    Assumes well-formed JSON (a constraint makes it so); only brackets and strings are
    tracked."""
    first = text[i]
    if first == '"':
        j = i + 1
        while j < len(text):
            c = text[j]
            if c == "\\":
                j += 2
                continue
            if c == '"':
                return j + 1
            j += 1
        return None
    if first in "{[":
        depth, j, in_string = 0, i, False
        while j < len(text):
            c = text[j]
            if in_string:
                if c == "\\":
                    j += 1
                elif c == '"':
                    in_string = False
            elif c == '"':
                in_string = True
            elif c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    return j + 1
            j += 1
        return None
    j = i  # a number, true, false or null: ends at a delimiter
    while j < len(text) and text[j] not in ",}] \t\n\r":
        j += 1
    return j if j < len(text) else None
