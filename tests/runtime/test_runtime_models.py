"""The runtime on exported tiny models: greedy tokens equal transformers' generate, batches of
different lengths, the KV cache updated in place, concurrent requests."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from llm_onnx.runtime import Model
from llm_onnx.runtime import Engine
from tests.conftest import FAMILY_ARCHS, TINY_ARCHS

NEW = 16


def prompts_for(vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(5)
    return [rng.integers(0, vocab, n).tolist() for n in (9, 4)]


def hf_greedy(hf, prompt: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n,
                          do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("arch", TINY_ARCHS + FAMILY_ARCHS)
def test_greedy_batch_equals_transformers(arch, tiny_hf, tiny_export):
    """mistral_tiny: prompts of 9 and 4 tokens and 16 new ones slide its window of 4."""
    hf, _ = tiny_hf(arch)
    model = Model.load(tiny_export(arch, "fp32"), provider="cpu")
    prompts = prompts_for(hf.config.vocab_size)
    results = model.generate(prompts, max_new_tokens=NEW, temperature=0)
    for prompt, result in zip(prompts, results):
        assert result.token_ids == hf_greedy(hf, prompt, NEW)
        assert result.finish_reason == "length"


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


def test_quantized_export_runs(tiny_export):
    model = Model.load(tiny_export("qwen3_moe_tiny", "int8"))
    r = model.generate([[1, 2, 3, 4], [5, 6]], max_new_tokens=6)
    assert [len(x.token_ids) for x in r] == [6, 6]
