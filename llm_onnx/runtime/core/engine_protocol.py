"""What the generation loop needs of an engine, as interfaces: ``EngineProtocol`` (a cache, a
chunk of one row, a token of many rows), which Engine and the tests' fakes implement, and
``VerifyingEngine``, Engine's optional abilities on top."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from llm_onnx.runtime.core.state import CacheProtocol


@runtime_checkable
class EngineProtocol(Protocol):
    """What a Generator needs of an engine: Engine runs the ONNX graphs; tests' fakes implement
    the same four members with scripted logits."""

    vocab_size: int
    context_length: int

    def new_cache(self, batch: int, length: int) -> CacheProtocol:
        """A cache of ``batch`` empty rows of ``length`` positions."""
        ...

    def prefill(self, cache: CacheProtocol, row: int, ids: Sequence[int] | np.ndarray,
                ) -> np.ndarray:
        """Run T tokens through one row after its valid positions; (V,) logits of the last."""
        ...

    def decode(self, cache: CacheProtocol, tokens: np.ndarray, active: np.ndarray | None = None,
               first_row: int = 0) -> np.ndarray:
        """One token for each of rows [first_row, first_row + len(tokens)); (n, V) logits;
        inactive rows ride along without advancing."""
        ...


class VerifyingEngine(EngineProtocol, Protocol):
    """An engine with Engine's two optional abilities, which the generator uses only where the
    engine says it has them: ``verify`` (every position's logits; ``verifies``) and greedy ids
    picked on the device (``decode(greedy=True)``; ``picks_on_device``)."""

    def verify(self, cache: CacheProtocol, row: int, ids: Sequence[int] | np.ndarray,
               ) -> np.ndarray: ...

    def decode(self, cache: CacheProtocol, tokens: np.ndarray, active: np.ndarray | None = None,
               first_row: int = 0, greedy: bool = False) -> np.ndarray: ...
