"""Shared by the batching tests: the same requests through a batching scheduler and one by one."""

from __future__ import annotations

from llm_onnx.runtime import GenerationOptions, Model, Result
from llm_onnx.runtime.generation.scheduler import Scheduler


def together_and_alone(model: Model, prompts: list[list[int]], options: list[GenerationOptions],
                       **scheduler: int) -> list[tuple[Result, Result]]:
    """(result among the others, result alone) per request, logprobs recorded: the requests go
    through one Scheduler(model, **scheduler) stepped to the end, then each through its own
    one-row generator."""
    batch = Scheduler(model, **scheduler)
    requests = [batch.submit(p, o, logprobs=0) for p, o in zip(prompts, options)]
    while batch.step():
        pass
    pairs = []
    for prompt, opts, request in zip(prompts, options, requests):
        gen = model.generator(opts)
        gen.append_tokens(prompt, logprobs=0)
        while not gen.is_done():
            gen.generate_next_token()
        pairs.append((request.result(), gen.result()))
    return pairs
