"""Speculative decoding over real ONNX graphs: every tiny family's fp32 export and SmolLM2 give
the same greedy tokens with and without speculation (the verify run's logits are those of
single steps), and an editing prompt takes fewer runs."""

from __future__ import annotations

import numpy as np
import pytest

from llm_onnx.errors import GenerationError
from llm_onnx.runtime import Model
from llm_onnx.runtime.generation.speculative import SpeculativeOptions
from tests.conftest import FAMILY_ARCHS, TINY_ARCHS

ALWAYS = SpeculativeOptions(method="ngram", adaptive=False, ngram_min=1)


def _generate(model: Model, prompt: list[int], n: int, speculative=None, **options):
    gen = model.generator(model.options(max_new_tokens=n, **options), speculative=speculative)
    gen.append_tokens(prompt)
    for _ in gen.events():
        pass
    return gen.result(), gen.stats


@pytest.mark.parametrize("arch", TINY_ARCHS + FAMILY_ARCHS)
def test_greedy_with_speculation_equals_greedy_without(arch, tiny_export):
    model = Model.load(tiny_export(arch, "fp32"), provider="cpu", threads=1)
    rng = np.random.default_rng(5)
    part = rng.integers(3, model.engine.vocab_size, 10).tolist()
    prompt = part + part[:5]
    plain, _ = _generate(model, prompt, 24, "off", temperature=0)
    fast, stats = _generate(model, prompt, 24, ALWAYS, temperature=0)
    assert (fast.token_ids, fast.finish_reason) == (plain.token_ids, plain.finish_reason)
    assert stats.verify_runs > 0


EDIT = ("Fix the spelling in this paragraph and return it unchanged otherwise:\n\n"
        "The quick brown fox jumpd over the lazy dog. It was a sunny day in the village, and "
        "the children were playing in the park while their parents watched from the benches. "
        "Nobody noticed the fox, who was very pleased with himself.")


@pytest.mark.slow
def test_smollm2_edit_is_the_same_in_fewer_runs_with_ngram_and_with_a_draft_model(
        smollm2_export):
    model = Model.load(smollm2_export("fp32"), threads=2)
    prompt = model.chat_prompt([{"role": "user", "content": EDIT}])
    plain, base = _generate(model, prompt, 64, "off", temperature=0)
    fast, stats = _generate(model, prompt, 64, "ngram", temperature=0)
    assert fast.token_ids == plain.token_ids
    assert stats.accepted_tokens > 10
    assert stats.decode_runs + stats.verify_runs < base.decode_runs - 10
    drafted = Model.load(smollm2_export("fp32"), threads=2, draft_model=smollm2_export("int8"))
    assert drafted.speculative.method == "draft"
    out, dstats = _generate(drafted, prompt, 64, temperature=0)
    assert out.token_ids == plain.token_ids
    assert dstats.acceptance > 0.5 and dstats.draft_runs > 0


def test_a_draft_model_with_another_tokenizer_is_refused(tiny_export, byte_model_folder):
    with pytest.raises(GenerationError, match="tokenizer differs") as e:
        Model.load(tiny_export("gpt2_tiny", "fp32"), draft_model=byte_model_folder)
    assert str(byte_model_folder) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("seed", range(3))
def test_constrained_rows_speculate_to_the_same_tokens(byte_model_folder, seed):
    """A drafted token the grammar forbids ends the draft; forced tokens come as they would."""
    model = Model.load(byte_model_folder, provider="cpu", threads=1)
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "tags": {"type": "array", "items": {"enum": ["a", "bb"]},
                                                        "maxItems": 4}},
              "required": ["name", "tags"]}
    prompt = model.encode('{"name": "ab", "tags": ["a", "bb"]} {"name": "a')
    opts = dict(temperature=1.0, seed=seed, json_schema=schema)
    plain, _ = _generate(model, prompt, 60, "off", **opts)
    fast, stats = _generate(model, prompt, 60, ALWAYS, **opts)
    assert (fast.token_ids, fast.text) == (plain.token_ids, plain.text)
    assert stats.verify_runs > 0
