"""`llm-onnx serve` whose model writes the replies a script gives: the real command, app,
scheduler and graphs, with each reply's tokens forced on top of the model's logits.

    python -m tests.serve.scripted_server SCRIPT.json serve --model DIR ...

SCRIPT.json is a list of [key, reply] pairs: a request whose prompt text ends with ``key``
gets ``reply``, tokenized with the
folder's tokenizer (special tokens by their text), one token a step; after it, the model's own
logits. A pair with a third element, "last", matches a prompt that holds ``key`` anywhere; of
those, the one whose key comes latest in the prompt wins (an agent's prompt ends with its own
boilerplate: what the turn is about is the latest thing said), after any ``key`` the prompt
ends with. A tiny random model then writes what a trained one would (gpt-oss's harmony messages,
say), so that reading replies, streaming them and the clients' parsing are checked on the text
real models write.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np


class ScriptedEngine:
    """An engine whose logits put each row's scripted next token first."""

    def __init__(self, engine: Any, tokenizer: Any, script: list[tuple[str, ...]]) -> None:
        self._engine = engine
        self._tokenizer = tokenizer
        self._script = [(key, tokenizer.encode(reply, add_special_tokens=False).ids,
                         bool(rest) and rest[0] == "last") for key, reply, *rest in script]
        # (cache, row) -> [unused, scripted reply, tokens written, a token picked since]
        self._rows: dict[tuple[int, int], list] = {}
        self._held: dict[tuple[int, int], list[int]] = {}  # (cache, row) -> the tokens it holds

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def _force(self, logits: np.ndarray, key: tuple[int, int]) -> np.ndarray:
        state = self._rows.get(key)
        if state is None or state[1] is None or state[2] >= len(state[1]):
            return logits
        logits = np.array(logits, copy=True)
        logits[state[1][state[2]]] = float(logits.max()) + 50.0
        return logits

    def prefill(self, cache: Any, row: int, ids: Any) -> np.ndarray:
        key = (id(cache), row)
        state = self._rows.get(key)
        new = [int(i) for i in np.asarray(ids).reshape(-1)]
        held = self._held.get(key, [])[:cache.length_of(row)]  # a reused prefix stays
        self._held[key] = held + new
        if state is not None and state[1] is not None and \
                state[1][state[2]:state[2] + len(new)] == new:
            # tokens a constraint forced after a pick (fast-forward): the reply goes on
            state[2] += len(new)
            return self._force(self._engine.prefill(cache, row, ids), key)
        if state is None or state[3]:  # a new prompt (its first chunk): the row has replied
            state = self._rows[key] = [None, None, 0, False]
        text = self._tokenizer.decode(self._held[key], skip_special_tokens=False)
        state[1] = self._reply(text)
        state[2] = 0
        return self._force(self._engine.prefill(cache, row, ids), key)

    def _reply(self, text: str) -> list[int] | None:
        """The scripted reply to a prompt (None: the model's own)."""
        ending = next((reply for k, reply, last in self._script
                       if not last and text.endswith(k)), None)
        if ending is not None:
            return ending
        found = [(text.rfind(k), reply) for k, reply, last in self._script if last and k in text]
        return max(found, key=lambda f: f[0])[1] if found else None

    def decode(self, cache: Any, tokens: Any, active: Any = None, first_row: int = 0) -> Any:
        n = len(tokens)
        active = np.ones(n, bool) if active is None else np.asarray(active, bool)
        for i in range(n):
            if active[i]:
                key = (id(cache), first_row + i)
                held = self._held.get(key, [])[:cache.length_of(first_row + i)]
                self._held[key] = held + [int(tokens[i])]
        out = np.array(self._engine.decode(cache, tokens, active, first_row), copy=True)
        for i in range(n):
            if active[i]:
                key = (id(cache), first_row + i)
                state = self._rows.get(key)
                if state is not None:
                    state[2] += 1
                    state[3] = True
                out[i] = self._force(out[i], key)
        return out


def main(argv: list[str]) -> None:
    from llm_onnx.cli import main as cli
    from llm_onnx.runtime import Model

    script = [tuple(entry) for entry in json.loads(Path(argv[0]).read_text(encoding="utf-8"))]
    load = Model.load.__func__  # type: ignore[attr-defined]

    def scripted_load(cls: type, *args: Any, **kwargs: Any) -> Model:
        model = load(cls, *args, **kwargs)
        model.engine = ScriptedEngine(model.engine, model.tokenizer, script)
        return model

    Model.load = classmethod(scripted_load)  # type: ignore[method-assign,assignment]
    cli(args=argv[1:], prog_name="llm-onnx")


if __name__ == "__main__":
    main(sys.argv[1:])
