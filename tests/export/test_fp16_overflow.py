"""fp16 exports keep the residual stream, norm statistics and logits in fp32: activations far past
fp16's range (65504) in the residual stream stay finite and correct."""

from __future__ import annotations

import numpy as np
import torch

from llm_onnx.checkpoints import build_model, random_checkpoint
from llm_onnx.checkpoints.sources import RandomSource
from llm_onnx.export import ExportOptions, export_model
from llm_onnx.families import get_config
from tests.ort_helpers import Graphs


class LoudAttention(RandomSource):
    """Random weights whose attention branches each add up to ~57000 to the residual stream:
    every fp16 weight and branch output fits under 65504, their sum in the residual does not."""

    def get(self, name: str) -> torch.Tensor:
        t = super().get(name)
        return t * 1e3 if name.endswith(("v_proj.weight", "o_proj.weight")) else t


def test_huge_residuals_stay_finite_in_fp16(tmp_path):
    cfg = get_config("llama_tiny")
    ckpt = random_checkpoint(cfg, "loud")
    ckpt.source = LoudAttention(cfg, seed=3, dtype=torch.float32)
    folder = export_model(ckpt, tmp_path / "m", ExportOptions(precision="fp16", max_seq_len=32),
                          progress=False)
    ids = [5, 17, 42, 99, 7]
    graphs = Graphs(folder)
    cache = graphs.new_cache(1, 8)
    logits, _ = graphs.run("prefill", np.array([ids]), [len(ids) - 1], len(ids), cache)
    assert np.isfinite(logits).all()
    reference = build_model(cfg, ckpt.source, max_positions=32)
    sums: list[float] = []
    for layer in reference.model.layers:  # record the residual stream's largest value
        add = layer.post_attention_layernorm.add
        layer.post_attention_layernorm.add = lambda x, r, add=add: _record(add(x, r), sums)
    with torch.no_grad():
        want = reference(torch.tensor([ids]), torch.tensor([len(ids) - 1], dtype=torch.int32),
                         torch.tensor(len(ids), dtype=torch.int32), *reference.new_cache(1, 8),
                         last_only=True)[0]
    assert max(sums) > 65504  # the residual stream really leaves fp16's range
    scale = float(want.abs().max())
    assert np.abs(logits[0, -1] - want[0, -1].numpy()).max() < 5e-2 * max(1.0, scale)


def _record(out, sums):
    sums.append(float(out[1].abs().max()))
    return out
