"""What the generation loop (Generator, Scheduler) needs of its model: llm_onnx.runtime.Model is
one, and so is any object with these members (tests drive the loop with scripted engines)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import tokenizers

from llm_onnx.runtime.core.engine_protocol import EngineProtocol
from llm_onnx.runtime.generation.options import GenerationOptions
from llm_onnx.runtime.structured.matcher import Constraints


class ModelLike(Protocol):
    """What a Generator needs of its model (llm_onnx.runtime.Model is one)."""

    engine: EngineProtocol
    tokenizer: tokenizers.Tokenizer | None
    eos_token_ids: tuple[int, ...]

    @property
    def context_length(self) -> int: ...

    @property
    def constraints(self) -> Constraints: ...

    def options(self, options: GenerationOptions | None = None,
                overrides: dict[str, Any] | None = None, **fields: Any) -> GenerationOptions: ...

    def load_draft_model(self, folder: str | Path) -> Any:
        """A draft model loaded from ``folder`` (speculative method "draft")."""
        ...
