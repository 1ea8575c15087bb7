"""An int8 KV cache (--kv-cache int8) through the runtime's paths that reuse or share the cache,
on the tiny byte model (tests/byte_model.py): greedy generation, rows of a continuous batch,
prefix reuse across requests, a rewind, a chat session's next turn and speculative verify runs
each give the tokens of a fresh run. The scales are per layer, not per row, so copying a row's
int8 positions or cutting them back is exact. The cache holds a quarter of fp32's bytes."""

from __future__ import annotations

import numpy as np
import pytest

from llm_onnx.runtime import GenerationOptions, Model
from llm_onnx.runtime.generation.scheduler import Scheduler
from llm_onnx.runtime.generation.speculative import SpeculativeOptions
from tests.byte_model import export_byte_model


def greedy(n: int) -> GenerationOptions:
    return GenerationOptions(max_new_tokens=n, temperature=0.0, ignore_eos=True)


def _ids(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(9, 200, n).tolist()


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder = export_byte_model(tmp_path_factory, kv_cache="int8")
    return Model.load(folder, provider="cpu", threads=1, speculative="off")


@pytest.fixture(scope="module")
def float_model(tmp_path_factory):
    return Model.load(export_byte_model(tmp_path_factory), provider="cpu", threads=1,
                      speculative="off")


def _fresh(model: Model, prompt: list[int], n: int) -> list[int]:
    return model.generate(prompt, greedy(n)).token_ids


def test_the_cache_is_int8_a_quarter_of_float32(model, float_model):
    assert model.engine.layout.dtype == np.int8
    assert model.engine.kv_bytes_per_position * 4 == float_model.engine.kv_bytes_per_position
    prompt = _ids(20, 2)
    tokens = _fresh(model, prompt, 12)
    assert len(tokens) == 12
    # a random model's near-ties aside, int8 keeps most of the float cache's greedy tokens
    same = sum(a == b for a, b in zip(tokens, _fresh(float_model, prompt, 12)))
    assert same >= 4  # 5 of 12 with the scales' headroom (2026-11-25)


def test_scheduled_rows_with_shared_prefixes_equal_fresh_runs(model):
    system = _ids(12, 1)
    prompts = [system + _ids(n, 10 + n) for n in (3, 9, 5)] + [_ids(7, 3)]
    batch = Scheduler(model, max_batch=2, max_length=64, prefill_chunk=4)
    requests = [batch.submit(p, greedy(8)) for p in prompts]
    while batch.step():
        pass
    for prompt, request in zip(prompts, requests):
        assert request.result().token_ids == _fresh(model, prompt, 8)
    # the shared prefix was kept in (or copied to) a row, not run again
    assert batch.generator.stats.prefill_tokens < sum(len(p) for p in prompts)


def test_a_rewind_continues_as_a_fresh_run(model):
    prompt = _ids(14, 4)
    gen = model.generator(greedy(10), prefill_chunk=3)
    gen.append_tokens(prompt)
    for _ in range(6):
        gen.generate_next_token()
    gen.rewind(8)  # 6 generated and 2 of the prompt
    gen.append_tokens([50, 51, 52])
    while not gen.is_done():
        gen.generate_next_token()
    tokens = gen.tokens()
    assert tokens[:15] == prompt[:12] + [50, 51, 52]
    assert tokens[15:] == _fresh(model, prompt[:12] + [50, 51, 52], len(tokens) - 15)


def test_a_chat_session_reuses_its_prefix_and_answers_as_a_fresh_chat(model):
    session = model.chat_session()
    session.send("Hello there, model.", max_new_tokens=6, temperature=0)
    second = session.send("And again?", max_new_tokens=6, temperature=0)
    assert second.timings.prefill_tokens < len(model.chat_prompt(session.messages[:-1]))
    fresh = model.chat(session.messages[:-1], max_new_tokens=6, temperature=0)
    assert second.token_ids == fresh.token_ids


def test_speculative_verify_runs_equal_plain_decoding(model):
    part = _ids(8, 6)
    prompt = part + part[:5]
    gen = model.generator(greedy(20), speculative=SpeculativeOptions(
        method="ngram", adaptive=False, ngram_min=1))
    gen.append_tokens(prompt)
    for _ in gen.events():
        pass
    assert gen.result().token_ids == _fresh(model, prompt, 20)
    assert gen.stats.verify_runs > 0
