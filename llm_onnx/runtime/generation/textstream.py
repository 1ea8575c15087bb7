"""Streaming text out of generated token ids: incremental detokenization and stop strings.

``StreamDecoder`` decodes a small sliding window instead of the whole sequence per token (the idea of
the incremental detokenizers in text-generation-inference and vLLM): the window holds the last piece
already emitted (left context for the decoder) plus the tokens not yet emitted. A new piece is emitted
only when the window's text grows and does not end in U+FFFD, i.e. when the pending bytes form whole
characters; then the window slides forward. Cost per token: one or two decodes of a few tokens.

What it guarantees (``pieces`` = everything ``push`` returned, then ``flush``):

* Without ``prompt_ids``: ``"".join(pieces) == tokenizer.decode(generated, skip_special_tokens=...)``
  for decoders that work token by token or on the concatenated bytes: ByteLevel (GPT-2, Llama 3,
  Qwen), Metaspace and Replace+Fuse+Strip (SentencePiece) and ByteFallback when its byte runs are
  valid UTF-8. No piece contains U+FFFD unless the full text has one at that place.
* With ``prompt_ids``: the last few prompt tokens are left context, so the result is what
  ``decode(context + generated)`` adds after ``decode(context)``; for SentencePiece this keeps the
  space before the first generated word that ``decode(generated)`` would strip. For ByteLevel it is
  still exactly ``decode(generated)``. If the prompt ends inside a character, the context is dropped
  and the first guarantee holds.
* A tokenizer whose decoder changes earlier text when later tokens arrive (ByteFallback with an
  invalid byte run: every byte of the run becomes U+FFFD) cannot be streamed exactly; pieces already
  emitted stay, and later pieces continue from the longest common prefix.

``StopMatcher`` scans the streamed text for stop strings and holds back only the tail that could still
be the start of one.
"""

from __future__ import annotations

from collections.abc import Sequence

import tokenizers

__all__ = ["StopMatcher", "StreamDecoder"]

_REPLACEMENT = "\ufffd"


class StreamDecoder:
    """Turns generated token ids into text pieces as soon as they are valid UTF-8.

    Byte-level BPE can split one character over several tokens; those tokens produce no text until
    the character is complete. Special tokens produce no text when ``skip_special_tokens`` is true.

    Args:
        tokenizer: the model's ``tokenizers.Tokenizer``.
        prompt_ids: the prompt, whose last tokens are used as left context (see the module docstring).
        skip_special_tokens: as in ``Tokenizer.decode``.
        shown: special tokens decoded as text all the same (tool-call markers such as Mistral's
            ``[TOOL_CALLS]``, which a tool-call parser reads).
    """

    CONTEXT_TOKENS = 5  # prompt tokens used as left context, as TGI and vLLM do
    # A run of pending tokens this long that still ends in U+FFFD is invalid UTF-8 the model keeps
    # producing; look for a boundary where the text can no longer change, so the window stays small.
    MAX_PENDING = 16

    def __init__(
        self, tokenizer: tokenizers.Tokenizer, prompt_ids: Sequence[int] = (), skip_special_tokens: bool = True,
        shown: frozenset[int] = frozenset(),
    ) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._special: frozenset[int] = frozenset()
        if skip_special_tokens:
            # Tokenizer.decode drops these before its decoder runs, so leaving them out of the
            # window changes nothing and keeps runs of special tokens from growing it.
            added = tokenizer.get_added_tokens_decoder()
            self._special = frozenset(i for i, token in added.items() if token.special) - shown
            # The window then holds no special token but the shown ones: decode keeps them.
            self._skip = not shown
        self._start(self._context(prompt_ids))

    def push(self, token_id: int) -> str:
        """Add one generated token; return the text that became final (often "")."""
        token_id = int(token_id)
        if token_id in self._special:
            return ""
        self._window.append(token_id)
        text = self._decode(self._window)
        if text.endswith(_REPLACEMENT):  # an incomplete character, or real garbage
            if len(self._window) - self._read > self.MAX_PENDING:
                return self._release_garbage(text)
            return ""
        if len(text) <= len(self._prefix_text):  # tokens without text yet: keep them as pending
            return ""
        piece = _after(self._prefix_text, text)
        self._slide(len(self._window))
        return piece

    def flush(self) -> str:
        """The text still pending at the end (incomplete bytes become U+FFFD, as decode does).

        The decoder is then empty, as if created without a prompt.
        """
        piece = _after(self._prefix_text, self._decode(self._window))
        self._start([])
        return piece

    def _context(self, prompt_ids: Sequence[int]) -> list[int]:
        """The last CONTEXT_TOKENS prompt ids that decode produces text for (scanned from the end)."""
        context: list[int] = []
        for token_id in reversed(prompt_ids):
            if len(context) == self.CONTEXT_TOKENS:
                break
            if int(token_id) not in self._special:
                context.append(int(token_id))
        context.reverse()
        if self._decode(context).endswith(_REPLACEMENT):
            return []  # the prompt ends inside a character: the output cannot extend it, start clean
        return context

    def _start(self, context: list[int]) -> None:
        # Invariants: the window starts at a token boundary where the text so far is final;
        # _prefix_text == decode(window[:_read]) has already been emitted (or is prompt context).
        self._window = context
        self._read = len(context)
        self._prefix_text = self._decode(context)

    def _slide(self, cut: int) -> None:
        """The text of window[:cut] is emitted: the piece just read becomes the new left context."""
        self._window = self._window[self._read :]
        self._read = cut - self._read
        self._prefix_text = self._decode(self._window[: self._read])

    def _release_garbage(self, text: str) -> str:
        """Emit up to the latest pending boundary where the text is already final, if any."""
        for cut in range(len(self._window) - 1, self._read, -1):
            head = self._decode(self._window[:cut])
            # The split is final if decoding both sides apart gives the same text as together:
            # the bytes after the cut already decided how the bytes before it decode.
            if head + self._decode(self._window[cut:]) == text and len(head) >= len(self._prefix_text):
                piece = _after(self._prefix_text, head)
                self._slide(cut)
                return piece
        return ""

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip) if ids else ""


def _after(prefix: str, text: str) -> str:
    """``text`` without ``prefix``; if the decoder rewrote earlier text, without the common prefix."""
    if text.startswith(prefix):
        return text[len(prefix) :]
    common = 0
    for a, b in zip(prefix, text, strict=False):
        if a != b:
            break
        common += 1
    return text[common:]


class StopMatcher:
    """Finds stop strings in streamed text, including ones split across pieces.

    Text that could still become a stop string (a tail that is a proper prefix of one) is held back
    until the next piece shows whether it matches. The stop string that completes first wins, as a
    character-by-character scan would see it. After a stop, every later push returns ("", True).

    Args:
        stops: stop strings; an empty sequence lets everything through.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        # Every proper prefix of every stop string: the tails worth holding back.
        self._prefixes = frozenset(s[:i] for s in self._stops for i in range(1, len(s)))
        self._longest_prefix = max((len(s) - 1 for s in self._stops), default=0)
        self._held = ""
        self.stopped = False
        self.stop_string: str | None = None  # the stop string that matched

    def push(self, text: str) -> tuple[str, bool]:
        """Return (text safe to emit now, stopped?); when stopped, the text ends right before the stop."""
        if self.stopped:
            return "", True
        if not self._stops:
            return text, False
        buffer = self._held + text
        found = self._first_match(buffer)
        if found is not None:
            index, stop = found
            self._held = ""
            self.stopped = True
            self.stop_string = stop
            return buffer[:index], True
        keep = self._held_back(buffer)
        self._held = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep], False

    def flush(self) -> str:
        """The held-back text at the end of the stream (it never became a stop string)."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _first_match(self, buffer: str) -> tuple[int, str] | None:
        """(start, stop) of the stop string that ends first (ties: the one starting first).

        Ending first is what a character-by-character scan sees, so the result does not depend on
        how the text was cut into pieces ("abcd" and "bc" in "abcd" stop at "bc" either way).
        """
        best: tuple[int, int, str] | None = None
        for stop in self._stops:
            start = buffer.find(stop)
            if start >= 0:
                candidate = (start + len(stop), start, stop)
                if best is None or candidate[:2] < best[:2]:
                    best = candidate
        return None if best is None else (best[1], best[2])

    def _held_back(self, buffer: str) -> int:
        """Length of the longest tail of ``buffer`` that is a proper prefix of a stop string."""
        for size in range(min(len(buffer), self._longest_prefix), 0, -1):
            if buffer[len(buffer) - size :] in self._prefixes:
                return size
        return 0
