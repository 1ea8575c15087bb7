"""python -m benchmarks.fidelity.moe's model: a dense checkpoint's MLPs split into experts that every
token takes is the dense model itself (so a quantized form's KL is measured on real weights), and
the off-grid noise moves the projections and nothing else."""

from __future__ import annotations

import torch

from benchmarks.fidelity import moe as bench
from llm_onnx.checkpoints import build_model, open_checkpoint


def _logits(ck, ids: torch.Tensor) -> torch.Tensor:
    model = build_model(ck.config, ck.source).eval()
    n = ids.shape[1]
    with torch.no_grad():
        return model(ids, torch.tensor([n - 1], dtype=torch.int32),
                     torch.tensor(n, dtype=torch.int32), *model.new_cache(1, n))[0]


def test_the_split_model_equals_the_dense_one(tiny_hf):
    base = open_checkpoint(tiny_hf("qwen3_tiny")[1])
    cks = bench.checkpoints(base, 4, 0.3, 0)
    moe_cfg = cks["moe"].config.moe
    assert (moe_cfg.num_experts, moe_cfg.num_experts_per_tok) == (4, 4)
    assert moe_cfg.moe_intermediate_size * 4 == base.config.intermediate_size
    ids = torch.randint(0, base.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0))
    dense, moe = _logits(cks["dense"], ids), _logits(cks["moe"], ids)
    assert (dense - moe).abs().max() < 1e-4 * dense.abs().max()
    # the noise moved the projections off the checkpoint's own, and only those
    assert (dense - _logits(base, ids)).abs().max() > 1e-3
    name = "model.layers.0.self_attn.q_proj.weight"
    moved = cks["dense"].source.get(name) - base.source.get(name)
    assert 0 < moved.abs().max() < 0.5 * base.source.get(name).abs().max()
    norm = "model.layers.0.input_layernorm.weight"
    assert torch.equal(cks["dense"].source.get(norm), base.source.get(norm))
    # a router that is not flat chooses unequally: the split is then no longer the dense model
    source = cks["moe"].source
    flat = source.get
    source.get = lambda n: torch.randn(*source.shape(n)) if ".mlp.gate." in n else flat(n)
    assert (dense - _logits(cks["moe"], ids)).abs().max() > 1e-3
