"""Rung 1 and 2 of the parity ladder: our decoder vs transformers with the same random weights
(saved with save_pretrained, loaded through our HF loader), and the KV path vs a full forward."""

from __future__ import annotations

import pytest
import torch

from llm_onnx.checkpoints import build_model, open_checkpoint
from llm_onnx.families import TINY as TINY_PRESETS
from llm_onnx.families import get_config
from llm_onnx.modeling.config import MoEConfig
from llm_onnx.modeling.decoder import Fusion
from tests.hf_models import save_hf_checkpoint
from tests.perturb import perturbed
from tests.tolerances import KV_PATH_FP32, TORCH_VS_HF_FP32

# Every tiny preset of every family module, and the MoE router without renormalisation.
TINY = sorted(TINY_PRESETS) + ["qwen3_moe_tiny_unnormalized"]


def tiny_config(name: str):
    if name == "qwen3_moe_tiny_unnormalized":  # the router path without renormalisation
        base = get_config("qwen3_moe_tiny")
        assert base.moe is not None
        return base.replace(moe=MoEConfig(num_experts=4, num_experts_per_tok=2,
                                          moe_intermediate_size=32, norm_topk_prob=False))
    return get_config(name)


def run_full(model, ids: torch.Tensor) -> torch.Tensor:
    b, t = ids.shape
    seqlens = torch.full((b,), t - 1, dtype=torch.int32)
    return model(ids, seqlens, torch.tensor(t, dtype=torch.int32), *model.new_cache(b, t))[0]


@pytest.fixture(scope="module", params=TINY)
def pair(request, tmp_path_factory):
    cfg = tiny_config(request.param)
    folder = tmp_path_factory.mktemp(request.param)
    hf = save_hf_checkpoint(cfg, folder, seed=1)
    ckpt = open_checkpoint(folder)
    assert ckpt.config == cfg.replace(max_position_embeddings=cfg.max_position_embeddings)
    return hf, build_model(ckpt.config, ckpt.source), cfg, ckpt


# Every fusion computes the same function; unfused RoPE goes through the RotaryEmbedding op.
FUSIONS = [Fusion(), Fusion(rotary=False), Fusion(qkv=True, gate_up=True),
           Fusion(rotary=False, qkv=True, gate_up=True)]


@pytest.mark.parametrize("fusion", FUSIONS, ids=str)
def test_logits_match_transformers(pair, fusion):
    hf, _, cfg, ckpt = pair
    ours = build_model(cfg, ckpt.source, fusion=fusion)
    # 11 tokens: longer than mistral_tiny's window of 4, so the window slides.
    ids = torch.randint(0, cfg.vocab_size, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = hf(ids).logits
        got = run_full(ours, ids)
    assert (got - expected).abs().max().item() <= TORCH_VS_HF_FP32
    # The comparison can fail: the logits are far from trivial.
    assert expected.std().item() > 0.1


def test_kv_path_equals_full_forward(pair):
    _, model, cfg, _ = pair
    n, k = 6, 4
    ids = torch.randint(0, cfg.vocab_size, (1, n + k), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = run_full(model, ids)
        cache = model.new_cache(1, n + k)
        out = model(ids[:, :n], torch.tensor([n - 1], dtype=torch.int32),
                    torch.tensor(n, dtype=torch.int32), *cache)
        steps = [out[0]]
        cache = model.next_cache(out[1:])
        for i in range(n, n + k):
            out = model(ids[:, i:i + 1], torch.tensor([i], dtype=torch.int32),
                        torch.tensor(i + 1, dtype=torch.int32), *cache)
            steps.append(out[0])
            cache = model.next_cache(out[1:])
    incremental = torch.cat(steps, dim=1)
    assert (incremental - full).abs().max().item() <= KV_PATH_FP32
    # The twin: the full forward of a model with one perturbed weight is outside the tolerance.
    with torch.no_grad(), perturbed(model) as moved_model:
        moved = run_full(moved_model, ids)
    assert (incremental - moved).abs().max().item() > KV_PATH_FP32


def test_batch_with_different_lengths(pair):
    """Right-padded batch prefill then decode steps equal each row run alone."""
    _, model, cfg, _ = pair
    gen = torch.Generator().manual_seed(3)
    lens = [7, 4]
    rows = [torch.randint(0, cfg.vocab_size, (1, n + 3), generator=gen) for n in lens]
    t = max(lens)
    batch = torch.zeros(2, t, dtype=torch.long)
    for b, n in enumerate(lens):
        batch[b, :n] = rows[b][0, :n]
    with torch.no_grad():
        out = model(batch, torch.tensor([n - 1 for n in lens], dtype=torch.int32),
                    torch.tensor(t, dtype=torch.int32), *model.new_cache(2, t + 3), last_only=True)
        last = [out[0][:, 0]]
        cache = model.next_cache(out[1:])
        for step in range(3):
            ids = torch.stack([rows[b][0, lens[b] + step] for b in range(2)])[:, None]
            seqlens = torch.tensor([n + step for n in lens], dtype=torch.int32)
            out = model(ids, seqlens, torch.tensor(t + step + 1, dtype=torch.int32), *cache)
            last.append(out[0][:, 0])
            cache = model.next_cache(out[1:])
        for b, n in enumerate(lens):
            alone = run_full(model, rows[b])
            for step in range(4):
                assert (last[step][b] - alone[0, n - 1 + step]).abs().max().item() <= KV_PATH_FP32


def test_perturbed_weight_breaks_parity(pair):
    """The parity test can fail: one perturbed weight moves the logits past the tolerance."""
    hf, ours, cfg, _ = pair
    ids = torch.randint(0, cfg.vocab_size, (1, 8), generator=torch.Generator().manual_seed(4))
    with torch.no_grad(), perturbed(ours) as moved:
        diff = (run_full(moved, ids) - hf(ids).logits).abs().max().item()
    assert diff > TORCH_VS_HF_FP32
