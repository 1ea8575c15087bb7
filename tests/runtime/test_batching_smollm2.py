"""Continuous batching on the real SmolLM2-135M-Instruct: each answer of requests decoding
together (rows joining and leaving, prompts in chunks) equals its solo run, token for token, and
its logprobs agree within fp32 tolerance."""

from __future__ import annotations

import pytest

from llm_onnx.runtime import GenerationOptions, Model
from tests.runtime.batching import together_and_alone

pytestmark = pytest.mark.slow

QUESTIONS = ["What is the capital of France?", "Write a short poem about autumn leaves.",
             "Explain what a KV cache is in one paragraph.", "List the planets of the solar system.",
             "Translate 'good morning' into Spanish and German.", "Hi"]


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_batched_answers_equal_solo_runs(smollm2_export, precision):
    model = Model.load(smollm2_export(precision))
    prompts = [model.chat_prompt([{"role": "user", "content": q}]) for q in QUESTIONS]
    options = [GenerationOptions(max_new_tokens=24 + 4 * i, temperature=0.0).validated()
               for i in range(len(prompts))]
    for together, alone in together_and_alone(model, prompts, options, max_batch=3,
                                              max_length=512, prefill_chunk=16):
        assert together.token_ids == alone.token_ids
        assert together.text == alone.text
        assert [lp.logprob for lp in together.logprobs] == pytest.approx(
            [lp.logprob for lp in alone.logprobs], abs=1e-3)
