"""Prompt logprobs: each prompt token's log P given the tokens before it, from one run of the
prompt with every position's logits (``Generator.append_tokens(..., prompt_logprobs=k)``,
``Model.prompt_logprobs``). Checked against transformers' log_softmax of the same prompt, and
the same however the prompt is cut into runs, whatever the cache held before, and beside other
rows in the scheduler."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from llm_onnx.errors import GenerationError
from llm_onnx.runtime import GenerationOptions, Model
from llm_onnx.runtime.generation import sequence
from llm_onnx.runtime.generation.scheduler import Scheduler
from tests.runtime.fakes import HistoryEngine

PROMPT = [5, 17, 99, 3, 42, 7, 7, 120, 64, 1, 250, 33, 18]
TOP = 3


def hf_log_softmax(hf_model, ids: list[int]) -> np.ndarray:
    """(T, V) log_softmax of transformers' logits over ``ids``, float64."""
    with torch.no_grad():
        logits = hf_model(torch.tensor([ids])).logits[0].double()
    return torch.log_softmax(logits, dim=-1).numpy()


def check_against(scored, ref: np.ndarray, ids: list[int], top: int) -> None:
    assert len(scored) == len(ids) and scored[0] is None
    for at in range(1, len(ids)):
        lp, want = scored[at], ref[at - 1]
        assert lp.token_id == ids[at]
        assert lp.logprob == pytest.approx(want[ids[at]], abs=1e-4), at
        order = np.argsort(-want, kind="stable")[:top]
        assert [t for t, _ in lp.top] == order.tolist(), at
        assert [v for _, v in lp.top] == pytest.approx(want[order].tolist(), abs=1e-4)


ARCHS = ["llama_tiny", "qwen3_5_tiny"]  # and a hybrid: a recurrent state through the runs


@pytest.fixture(scope="module")
def models(tiny_hf, tiny_export):
    made = {}

    def get(arch: str):
        if arch not in made:
            made[arch] = tiny_hf(arch)[0], Model.load(tiny_export(arch, "fp32"), provider="cpu",
                                                      threads=1)
        return made[arch]

    return get


@pytest.fixture
def tiny(models):
    return models("llama_tiny")


@pytest.mark.parametrize("arch", ARCHS)
def test_prompt_logprobs_are_transformers_log_softmax(models, arch):
    hf_model, model = models(arch)
    scored = model.prompt_logprobs(PROMPT, top=TOP)
    check_against(scored, hf_log_softmax(hf_model, PROMPT), PROMPT, TOP)
    # their sum is the prompt's log-likelihood; a one-token prompt has nothing to score
    assert sum(lp.logprob for lp in scored[1:]) < 0
    assert model.prompt_logprobs([9]) == [None]


@pytest.mark.parametrize("arch", ARCHS)
def test_the_same_in_chunks_after_a_cached_prefix_and_while_generating(models, arch,
                                                                     monkeypatch):
    """Runs of 4 positions' logits (SCORED_LOGITS cut down) or prefill chunks of 3 tokens give
    the same numbers; a row whose cache already holds the prompt runs it again (a reused prefix
    has no logits); generation goes on as without scoring."""
    hf_model, model = models(arch)
    ref = hf_log_softmax(hf_model, PROMPT)
    monkeypatch.setattr(sequence, "SCORED_LOGITS", 4 * model.engine.vocab_size)
    options = GenerationOptions(max_new_tokens=5, temperature=0.0, ignore_eos=True)
    plain = model.generate(PROMPT, options)
    for chunk in (None, 3):
        gen = model.generator(options, prefill_chunk=chunk)
        gen.append_tokens(PROMPT)
        list(gen.events())
        gen.release()
        gen.append_tokens(PROMPT, prompt_logprobs=TOP)  # the cache holds all of it
        events = list(gen.events())
        result = gen.result()
        check_against(result.prompt_logprobs, ref, PROMPT, TOP)
        assert result.token_ids == plain.token_ids and result.prompt_tokens == len(PROMPT)
        assert events[0].prompt_logprobs == tuple(result.prompt_logprobs)
        assert all(e.prompt_logprobs is None for e in events[1:])


def test_max_new_tokens_0_scores_the_prompt_and_generates_nothing(tiny):
    _hf, model = tiny
    gen = model.generator(GenerationOptions(max_new_tokens=0))
    gen.append_tokens(PROMPT, prompt_logprobs=0)
    events = list(gen.events())
    assert len(events) == 1 and events[0].token_id == -1 and events[0].finish_reason == "length"
    result = gen.result()
    assert (result.token_ids, result.text, result.finish_reason) == ([], "", "length")
    assert [lp.logprob for lp in result.prompt_logprobs[1:]] == pytest.approx(
        [lp.logprob for lp in model.prompt_logprobs(PROMPT)[1:]], abs=1e-6)
    assert all(lp.top == () for lp in result.prompt_logprobs[1:])


def test_the_scheduler_scores_prompts_beside_other_rows(tiny):
    """Three requests decoding together in 4-token chunks, one of them scoring its prompt and
    one generating nothing: the numbers are the solo run's."""
    _hf, model = tiny
    solo = model.prompt_logprobs(PROMPT, top=TOP)
    options = GenerationOptions(max_new_tokens=6, temperature=0.0, ignore_eos=True)
    with Scheduler(model, max_batch=3, prefill_chunk=4) as scheduler:
        other = scheduler.submit([8, 9, 10, 11, 12], options)
        scored = scheduler.submit_many([(PROMPT, options)], prompt_logprobs=TOP)[0]
        only = scheduler.submit_many([(PROMPT[:6], GenerationOptions(max_new_tokens=0))],
                                     prompt_logprobs=1)[0]
        results = [r.result(60) for r in (other, scored, only)]
    assert results[0].prompt_logprobs is None and len(results[0].token_ids) == 6
    for got, want in zip(results[1].prompt_logprobs[1:], solo[1:]):
        assert got.token_id == want.token_id and got.logprob == pytest.approx(want.logprob,
                                                                             abs=1e-5)
        assert [t for t, _ in got.top] == [t for t, _ in want.top]
    assert results[1].token_ids == model.generate(PROMPT, options).token_ids
    assert results[2].token_ids == [] and len(results[2].prompt_logprobs) == 6


def test_an_engine_without_every_positions_logits_is_refused_in_one_line():
    engine = HistoryEngine()
    engine.verifies = False
    gen = Model.from_parts(engine, None).generator(GenerationOptions(max_new_tokens=2))
    with pytest.raises(GenerationError, match="prompt logprobs need every position's logits"):
        gen.append_tokens([1, 2, 3], prompt_logprobs=0)
