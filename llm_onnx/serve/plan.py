"""The plan of a generation request, whatever its API: what to run on the scheduler (prompts,
options, choices) and what its answer needs (the chat request that reads each reply, logprobs,
echo). Each API's module reads its body into one; the pipeline runs it."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from llm_onnx.runtime.chat.request import ChatRequest
from llm_onnx.runtime.generation.options import GenerationOptions, row_options
from llm_onnx.runtime.structured.constraint import Constraint

CHAT, COMPLETION = "chat.completion", "text_completion"


@dataclass
class Plan:
    """A checked request: what to run and how to answer."""

    kind: str  # CHAT or COMPLETION
    model: str
    prompts: list[list[int]]  # token ids, one list per prompt
    options: list[GenerationOptions]  # one per prompt (max_new_tokens fitted to its length)
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    logprobs: int | None = None  # None: off; k: the chosen token and k alternatives
    echo: bool = False
    prompt_texts: list[str] = field(default_factory=list)
    # Chat: the reply's tools, tool choice and think block (how it is constrained and read back)
    chat: ChatRequest | None = None
    # The constraint of the answer (before tools and thinking compose it; see structured.prepare)
    constraint: Constraint | None = None
    # Chat: where later prompts may part from this one (a recurrent state's checkpoints)
    reuse_points: list[int] = field(default_factory=list)
    # Completions with echo and logprobs: each prompt token's logprob and k alternatives
    prompt_logprobs: int | None = None
    # Chat with images: the prompt's (RowImages: prompts[0] is its ids; every choice shares it)
    images: Any = None
    id: str = ""
    created: int = 0

    def __post_init__(self) -> None:
        prefix = "chatcmpl" if self.kind == CHAT else "cmpl"
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    @property
    def thinking(self) -> bool | None:
        """Chat with a reasoning model: True if the prompt leaves a <think> block open (replies
        are split into reasoning_content and content). None: no split."""
        return self.chat.thinking if self.chat is not None else None

    @property
    def constraint_kind(self) -> str | None:
        """What constrains the replies, for the metrics: tools, json_schema, regex, ..."""
        if self.chat is not None and self.chat.calls_tools:
            return "tools"
        return self.constraint.kind if self.constraint is not None else None

    def jobs(self) -> list[tuple[list[int], GenerationOptions]]:
        """(prompt, options) of every choice, prompt-major: choice index = prompt * n + j; the
        j-th choice of a prompt samples with seed + j."""
        return [(p, row_options(o, j)) for p, o in zip(self.prompts, self.options)
                for j in range(self.n)]
