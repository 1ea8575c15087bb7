"""The runtime on exported tiny models: greedy tokens equal transformers' generate, batches of
different lengths, the KV cache updated in place, concurrent requests."""

from __future__ import annotations

import threading
from typing import Iterable

import numpy as np
import pytest
import torch

from llm_onnx.runtime import Engine, Model
from tests.conftest import FAMILY_ARCHS, TINY_ARCHS
from tests.ort_helpers import Graphs
from tests.perturb import ATTENTION_OUTPUT, perturbed

NEW = 16


def prompts_for(vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(5)
    return [rng.integers(0, vocab, n).tolist() for n in (9, 4)]


def hf_greedy_run(hf, prompt: list[int], n: int, eos: Iterable[int] = ()) -> tuple[list[int], str]:
    """transformers' argmax, one full forward per token, stopping where the runtime stops: at a
    token of ``eos`` (not included) or after ``n`` tokens. No generate() logits processors."""
    ids, out, eos = list(prompt), [], set(eos)
    with torch.no_grad():
        for _ in range(n):
            token = int(hf(torch.tensor([ids])).logits[0, -1].argmax())
            if token in eos:
                return out, "stop"
            out.append(token)
            ids.append(token)
    return out, "length"


def hf_greedy(hf, prompt: list[int], n: int, eos: Iterable[int] = ()) -> list[int]:
    return hf_greedy_run(hf, prompt, n, eos)[0]


@pytest.mark.parametrize("arch", TINY_ARCHS + FAMILY_ARCHS)
def test_greedy_batch_equals_transformers(arch, tiny_hf, tiny_export):
    """mistral_tiny: prompts of 9 and 4 tokens and 16 new ones slide its window of 4."""
    hf, _ = tiny_hf(arch)
    model = Model.load(tiny_export(arch, "fp32"), provider="cpu")
    prompts = prompts_for(hf.config.get_text_config().vocab_size)
    results = model.generate(prompts, max_new_tokens=NEW, temperature=0)
    for prompt, result in zip(prompts, results):
        tokens, reason = hf_greedy_run(hf, prompt, NEW, model.eos_token_ids)
        assert (result.token_ids, result.finish_reason) == (tokens, reason)
    # The twin: greedy tokens of transformers with one perturbed weight differ somewhere.
    with perturbed(hf, scale=0.3, pattern=ATTENTION_OUTPUT) as moved:
        assert any(hf_greedy(moved, p, NEW, model.eos_token_ids) != r.token_ids
                   for p, r in zip(prompts, results))


def test_kv_cache_is_updated_in_place(tiny_export):
    engine = Engine(tiny_export("llama_tiny", "fp32"))
    cache = engine.new_cache(1, 16)
    n = 2 * engine.layout.num_layers
    views = [cache.host_view(i) for i in range(n)]
    pointers = [v.ctypes.data for v in views]
    engine.prefill(cache, 0, [1, 2, 3])
    engine.decode(cache, np.array([4]))
    assert [cache.host_view(i).ctypes.data for i in range(n)] == pointers
    assert all(np.abs(v[:, :, :4]).sum() > 0 for v in views)  # rows written through the binding
    assert all(not v[:, :, 4:].any() for v in views)  # rows past the valid length untouched
    assert cache.length_of(0) == 4


def test_cache_is_sized_to_the_request_not_the_context(tiny_export, monkeypatch):
    model = Model.load(tiny_export("qwen3_tiny", "fp32"))
    sizes = []
    real = model.engine.new_cache
    monkeypatch.setattr(model.engine, "new_cache", lambda b, n: sizes.append((b, n)) or real(b, n))
    model.generate([1, 2, 3], max_new_tokens=5)
    assert sizes == [(1, 8)] and model.context_length == 64


def test_concurrent_requests_match_sequential(tiny_export):
    model = Model.load(tiny_export("qwen3_moe_tiny", "fp32"))
    rng = np.random.default_rng(9)
    prompts = [rng.integers(0, 256, int(n)).tolist() for n in rng.integers(2, 20, 12)]
    kwargs = dict(max_new_tokens=8, temperature=0.9, top_k=20)
    sequential = [model.generate(p, seed=i, **kwargs).token_ids for i, p in enumerate(prompts)]
    concurrent: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def worker(indices):
        try:
            for i in indices:
                concurrent[i] = model.generate(prompts[i], seed=i, **kwargs).token_ids
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(range(k, 12, 4),)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert [concurrent[i] for i in range(12)] == sequential


@pytest.mark.parametrize("arch", ["llama_tiny", "qwen3_moe_tiny"])
def test_quantized_greedy_batch_equals_the_graphs_run_alone(arch, tiny_export):
    """An int8 folder through the runtime (a ragged batch of two, the KV cache bound in place)
    gives the tokens a bare ONNX Runtime loop over the same graphs gives each prompt alone.
    (Fidelity of int8 to the float model is tests/export's concern.)"""
    folder = tiny_export(arch, "int8")
    model = Model.load(folder, provider="cpu")
    prompts = prompts_for(model.engine.vocab_size)
    results = model.generate(prompts, max_new_tokens=NEW, temperature=0, ignore_eos=True)
    graphs = Graphs(folder)
    for prompt, result in zip(prompts, results):
        assert result.token_ids == graphs.greedy(prompt, NEW)
    assert results[0].token_ids != results[1].token_ids
